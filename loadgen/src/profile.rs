//! `headroom-profile`: an engine's costs, measured by sweeping one server directly.
//!
//! Two sweeps, each on the idle server, written in Llumnix's profiling schema
//! (`headroom_predictor_config::profile`), which the predictor takes as its prior per
//! hardware class (`model.prior_profiles`):
//! - TTFT by prompt length: one request at a time of `tokens_num` prompt tokens and one
//!   output token, streamed; the time to its first token.
//! - TPOT by batch size and context: `batch_size` streams started together, each with a
//!   prompt of `tokens_per_request` tokens and `decode_tokens` output tokens; each stream's
//!   TPOT as the gateway measures it. The first steps share the engine with the others'
//!   prefills; enough output tokens keep that share small.
//!
//! Prompts are token ids (`prompt: [..]`), so the lengths are the engine's own counts
//! whatever its tokenizer, and each request's ids start with a nonce of its own, so no
//! prompt is a prefix-cache hit of another (ids stay below [`MAX_TOKEN_ID`], inside any
//! vocabulary of a few thousand tokens).

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use headroom_predictor_config::profile::{Metadata, Stats, TpotFile, TpotRow, TtftFile, TtftRow};

/// Token ids the prompts use lie in `MIN_TOKEN_ID..MAX_TOKEN_ID`: clear of most special
/// tokens at the bottom of a vocabulary, inside a small one.
pub const MIN_TOKEN_ID: u64 = 100;
pub const MAX_TOKEN_ID: u64 = 3000;

/// What to sweep.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Prompt lengths of the TTFT sweep (tokens).
    pub prompts: Vec<u32>,
    /// Requests per prompt length.
    pub repeats: usize,
    /// Batch sizes of the TPOT sweep.
    pub batches: Vec<u32>,
    /// Context per request of the TPOT sweep (prompt tokens).
    pub contexts: Vec<u32>,
    /// Output tokens of each TPOT stream.
    pub decode_tokens: u32,
}

impl Sweep {
    /// The default sweep for an engine whose context is `max_context` tokens and which
    /// batches `max_batch` sequences: about a minute on the local stack's vLLM servers.
    pub fn for_engine(max_context: u32, max_batch: u32) -> Sweep {
        let cap = |v: &[u32], max: u32| -> Vec<u32> {
            let mut out: Vec<u32> = v.iter().map(|&x| x.min(max)).collect();
            out.dedup();
            out
        };
        Sweep {
            prompts: cap(&[16, 256, 1024, 2048, 3072], max_context.saturating_sub(8).max(16)),
            repeats: 3,
            batches: cap(&[1, 4, 16, 32], max_batch.max(1)),
            contexts: cap(&[128, 1024], max_context.saturating_sub(64).max(16)),
            decode_tokens: 64,
        }
    }
}

/// One server's profile, and how long the sweep took.
#[derive(Debug, Clone)]
pub struct Profiled {
    pub ttft: TtftFile,
    pub tpot: TpotFile,
    pub took: Duration,
}

/// Sweeps the server at `url` (`http://host:port`) serving `model`; `say` hears a line
/// per point.
pub async fn run(url: &str, model: &str, sweep: &Sweep, mut say: impl FnMut(&str)) -> anyhow::Result<Profiled> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(300)).build()?;
    let started = Instant::now();
    // Prompts unique to this sweep too: a server keeps an earlier sweep's prompts in its cache.
    let mut nonce =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    // One request first: the engine's first steps (warm-up, lazy allocations) are not a cost.
    let _ = stream_one(&client, url, model, 16, 2, next(&mut nonce)).await?;
    let mut ttft = Vec::new();
    for &tokens in &sweep.prompts {
        let mut samples = Vec::with_capacity(sweep.repeats);
        for _ in 0..sweep.repeats {
            let timing = stream_one(&client, url, model, tokens, 1, next(&mut nonce)).await?;
            samples.extend(timing.ttft_ms());
        }
        let stats = Stats::of(&samples).ok_or_else(|| anyhow::anyhow!("no TTFT measured at {tokens} tokens"))?;
        say(&format!("ttft  {tokens:>5} tokens: p50 {:.1} ms", stats.p50));
        ttft.push(TtftRow { tokens_num: tokens, stats });
    }
    let mut tpot = Vec::new();
    for &context in &sweep.contexts {
        for &batch in &sweep.batches {
            let streams = (0..batch).map(|_| {
                let id = next(&mut nonce);
                let client = client.clone();
                async move { stream_one(&client, url, model, context, sweep.decode_tokens, id).await }
            });
            let timings: Vec<Timing> =
                futures_util::future::join_all(streams).await.into_iter().collect::<Result<_, _>>()?;
            let samples: Vec<f64> = timings.iter().filter_map(Timing::tpot_ms).collect();
            let stats = Stats::of(&samples)
                .ok_or_else(|| anyhow::anyhow!("no TPOT measured at batch {batch}, context {context}"))?;
            say(&format!("tpot  batch {batch:>3} x {context:>5} tokens: p50 {:.2} ms", stats.p50));
            tpot.push(TpotRow { batch_size: batch, tokens_per_request: context, stats });
        }
    }
    let unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let metadata = |what: &str| Metadata {
        model: model.to_string(),
        timestamp: unix_s.to_string(),
        description: format!("headroom-profile {what} of {url}, p50 over the requests of each point (ms)"),
    };
    Ok(Profiled {
        ttft: TtftFile { metadata: metadata("TTFT by prompt tokens"), results: ttft },
        tpot: TpotFile { metadata: metadata("TPOT by batch size and context"), results: tpot },
        took: started.elapsed(),
    })
}

/// The model `url` serves and its context length (`/v1/models`: its first model, and vLLM's
/// `max_model_len`, else 4,096 tokens).
pub async fn served(url: &str) -> anyhow::Result<(String, u32)> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let body = client.get(format!("{url}/v1/models")).send().await?.bytes().await?;
    let (id, context) = headroom_protocol::openai::served_model(&body)
        .ok_or_else(|| anyhow::anyhow!("{url}/v1/models lists no model with an id"))?;
    Ok((id, context.unwrap_or(4096)))
}

/// Writes `DIR/NAME-ttft.json` and `DIR/NAME-tpot.json`; returns their paths.
pub fn write(
    profiled: &Profiled,
    dir: &std::path::Path,
    name: &str,
) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let (ttft, tpot) = (dir.join(format!("{name}-ttft.json")), dir.join(format!("{name}-tpot.json")));
    std::fs::write(&ttft, serde_json::to_string_pretty(&profiled.ttft)?)?;
    std::fs::write(&tpot, serde_json::to_string_pretty(&profiled.tpot)?)?;
    Ok((ttft, tpot))
}

fn next(nonce: &mut u64) -> u64 {
    *nonce += 1;
    *nonce
}

/// When one stream's tokens arrived (ms after it was sent).
struct Timing {
    tokens_ms: Vec<f64>,
}

impl Timing {
    fn ttft_ms(&self) -> Option<f64> {
        self.tokens_ms.first().copied()
    }

    /// Mean time between its tokens after the first, as the gateway measures a TPOT:
    /// `(last - first) / (tokens - 1)`. Read per token, the gaps say little: a server under
    /// load sends several tokens in one write.
    fn tpot_ms(&self) -> Option<f64> {
        match self.tokens_ms.as_slice() {
            [first, .., last] => Some((last - first) / (self.tokens_ms.len() - 1) as f64),
            _ => None,
        }
    }
}

/// Token ids of a prompt of `tokens` tokens, unique to request `id` from its first block.
pub fn prompt_ids(tokens: u32, id: u64) -> Vec<u64> {
    let span = MAX_TOKEN_ID - MIN_TOKEN_ID;
    // The first two ids spell the request (span^2 = 8.4M requests apart); the rest vary.
    let head = [MIN_TOKEN_ID + id % span, MIN_TOKEN_ID + (id / span) % span];
    (0..u64::from(tokens))
        .map(|i| if i < 2 { head[i as usize] } else { MIN_TOKEN_ID + (i * 7919 + id * 104_729) % span })
        .collect()
}

/// One streamed completion of `tokens` prompt tokens and exactly `output` tokens.
async fn stream_one(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    tokens: u32,
    output: u32,
    id: u64,
) -> anyhow::Result<Timing> {
    let body = serde_json::json!({
        "model": model,
        "prompt": prompt_ids(tokens, id),
        "max_tokens": output,
        "min_tokens": output,
        "ignore_eos": true,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let sent = Instant::now();
    let response = client.post(format!("{url}/v1/completions")).json(&body).send().await?;
    let status = response.status();
    anyhow::ensure!(status.is_success(), "{url} answered {status}: {}", response.text().await.unwrap_or_default());
    let mut tokens_ms = Vec::new();
    let mut buffer: Vec<u8> = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let at_ms = sent.elapsed().as_secs_f64() * 1e3;
        buffer.extend_from_slice(&chunk?);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            tokens_ms.extend(std::iter::repeat_n(at_ms, text_events(&event)));
        }
    }
    anyhow::ensure!(!tokens_ms.is_empty(), "{url}: no token came back");
    Ok(Timing { tokens_ms })
}

/// 1 when an SSE event carries generated text, else 0.
fn text_events(event: &[u8]) -> usize {
    let text = String::from_utf8_lossy(event);
    let carries = |data: &str| {
        serde_json::from_str::<serde_json::Value>(data).ok().is_some_and(|v| {
            v.pointer("/choices/0/text").and_then(serde_json::Value::as_str).is_some_and(|t| !t.is_empty())
        })
    };
    text.lines().filter_map(|l| l.strip_prefix("data:")).filter(|d| carries(d.trim())).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_have_their_length_and_differ_from_the_first_block() {
        let (a, b) = (prompt_ids(64, 1), prompt_ids(64, 2));
        assert_eq!((a.len(), b.len()), (64, 64));
        assert_ne!(a[0], b[0]);
        assert!(a.iter().all(|&t| (MIN_TOKEN_ID..MAX_TOKEN_ID).contains(&t)));
        // Requests far apart still differ in their first two ids.
        let (c, d) = (prompt_ids(4, 5), prompt_ids(4, 5 + (MAX_TOKEN_ID - MIN_TOKEN_ID)));
        assert_ne!(c[..2], d[..2]);
    }

    #[test]
    fn tpot_is_the_gateways_and_only_text_counts() {
        let t = Timing { tokens_ms: vec![10.0, 50.0, 52.0, 54.0, 58.0] };
        assert_eq!(t.ttft_ms(), Some(10.0));
        assert_eq!(t.tpot_ms(), Some(12.0));
        assert_eq!(Timing { tokens_ms: vec![3.0] }.tpot_ms(), None);
        let event = b"data: {\"choices\":[{\"text\":\"ab\"}]}\n\n";
        assert_eq!(text_events(event), 1);
        assert_eq!(text_events(b"data: {\"choices\":[{\"text\":\"\"}]}\n\n"), 0);
        assert_eq!(text_events(b"data: [DONE]\n\n"), 0);
    }

    #[test]
    fn the_default_sweep_fits_the_engine() {
        let s = Sweep::for_engine(2048, 8);
        assert!(s.prompts.iter().all(|&p| p <= 2040));
        assert_eq!(s.batches, vec![1, 4, 8]);
        assert!(s.contexts.iter().all(|&c| c <= 1984));
    }
}
