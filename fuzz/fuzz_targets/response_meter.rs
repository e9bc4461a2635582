//! The response meter: the measurement must not depend on how the stream is chunked.
//! The first byte picks streaming or not, the next four where to cut.
#![no_main]

use headroom_protocol::meter::ResponseMeter;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let (head, body) = data.split_at(5);
    let streaming = head[0] & 1 == 1;
    let mut whole = ResponseMeter::new(streaming, 0, 1 << 20);
    whole.on_chunk(body, 7_000_000);
    let whole = whole.finish(9_000_000);
    let mut cuts: Vec<usize> = head[1..].iter().map(|&b| usize::from(b) * body.len() / 256).collect();
    cuts.push(body.len());
    cuts.sort_unstable();
    let mut split = ResponseMeter::new(streaming, 0, 1 << 20);
    let mut from = 0;
    for to in cuts {
        split.on_chunk(&body[from..to], 7_000_000);
        from = to;
    }
    assert_eq!(split.finish(9_000_000), whole);
});
