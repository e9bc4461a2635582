//! The predict stream's gRPC framing as the predictor reads it (`protocol::stream`): any
//! bytes, cut into chunks anywhere, give the same messages (or the same error) as the
//! whole pushed at once; never a panic, never a message over the limit; and each message
//! framed again reads back as itself.
#![no_main]

use headroom_protocol::stream::{frame, Deframer};
use libfuzzer_sys::fuzz_target;

/// Every message `d` yields until it runs dry or fails: (messages, the error's status).
fn drain(d: &mut Deframer) -> (Vec<Vec<u8>>, Option<u32>) {
    let mut messages = Vec::new();
    loop {
        match d.next_message() {
            Ok(Some(m)) => messages.push(m),
            Ok(None) => return (messages, None),
            Err(e) => return (messages, Some(e.status)),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else { return };
    let mut whole = Deframer::default();
    whole.push(bytes);
    let (expected, error) = drain(&mut whole);

    // The same bytes in chunks of 1..=32 bytes, drained after each.
    let step = usize::from(cut % 32) + 1;
    let mut chunked = Deframer::default();
    let (mut got, mut failed) = (Vec::new(), None);
    for chunk in bytes.chunks(step) {
        chunked.push(chunk);
        let (messages, e) = drain(&mut chunked);
        got.extend(messages);
        if e.is_some() {
            failed = e;
            break;
        }
    }
    assert_eq!(got, expected, "chunks of {step} bytes read other messages");
    assert_eq!(failed, error, "chunks of {step} bytes failed otherwise");

    for m in &expected {
        let mut again = Deframer::default();
        again.push(&frame(m));
        assert_eq!(again.next_message().ok().flatten().as_ref(), Some(m));
        assert!(again.is_empty());
    }
});
