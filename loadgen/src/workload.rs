//! Workloads: when each request is sent and what it asks for.
//!
//! Every synthetic workload is Poisson arrivals (seeded) plus a request shape;
//! the trace replay takes arrivals and sizes from a real trace; the conversational
//! workloads (`multi-turn`, `rag`) send turns whose prompts share what came before. Each
//! request carries an SLO class.

use headroom_protocol::tokens::BYTES_PER_TOKEN;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// A class of traffic with its own SLOs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SloClass {
    pub name: String,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub priority: i32,
}

impl SloClass {
    /// Tight TTFT and TPOT: a person is waiting.
    pub fn interactive() -> SloClass {
        SloClass { name: "interactive".into(), ttft_ms: Some(400.0), tpot_ms: Some(40.0), priority: 0 }
    }

    /// Loose: a pipeline is waiting.
    pub fn batch() -> SloClass {
        SloClass { name: "batch".into(), ttft_ms: Some(4000.0), tpot_ms: Some(150.0), priority: 0 }
    }

    /// Background work that may be shed when nothing can serve it in time.
    pub fn sheddable() -> SloClass {
        SloClass { name: "sheddable".into(), ttft_ms: Some(1000.0), tpot_ms: Some(80.0), priority: -1 }
    }
}

/// One request of a workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RequestSpec {
    /// Seconds after the start of the run.
    pub at_s: f64,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub stream: bool,
    pub class: SloClass,
    /// `(id, tokens)`: the prompt starts with shared system prompt `id` of this many tokens.
    #[serde(default)]
    pub shared_prefix: Option<(u32, u32)>,
    /// Which sending of a workload this request belongs to, part of its prompt's unique
    /// text: the same workload sent again (the next rate of a ladder, after a warm-up with
    /// the same indices) then finds none of its prompts in the servers' prefix caches.
    #[serde(default)]
    pub run: u32,
    /// The conversation it is a turn of: its prompt is the conversation so far
    /// ([`Conversation::prompt`]), and the client names the session (`x-session-id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<Conversation>,
}

/// One turn of a conversation about a document: the document, every earlier turn (the
/// user's message and the model's answer), then this turn's message. A chat resends the
/// whole conversation each turn, so each prompt starts with the last one: where the last
/// turn ran, its prefix is cached. Many conversations may open with the same document
/// (shared documents: `rag`), or each with its own (`multi-turn`). The answers in later
/// prompts are text made here, not what the model said: the prefix cached from the last
/// turn's prompt still matches, its answer's few dozen tokens do not.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Conversation {
    /// The session, named to the gateway in `x-session-id` (with the run).
    pub session: u32,
    /// This turn, from 0.
    pub turn: u32,
    /// The document it opens with, and its tokens (by the shared approximation).
    pub document: (u32, u32),
    /// Each user message's tokens, and each earlier answer's.
    pub message_tokens: u32,
    pub answer_tokens: u32,
}

impl Conversation {
    /// The prompt's tokens: the document, every earlier message and answer, this message.
    pub fn prompt_tokens(&self) -> u32 {
        self.document.1 + self.turn * (self.message_tokens + self.answer_tokens) + self.message_tokens
    }

    /// The prompt of this turn in sending `run` of its workload: every piece made to its
    /// exact size from its place in the conversation, so each turn's prompt begins with the
    /// last one's (and with every other conversation's on the same document).
    pub fn prompt(&self, run: u32) -> String {
        let mut text = String::with_capacity(self.prompt_tokens() as usize * BYTES_PER_TOKEN);
        piece(&mut text, &format!("document {run:04}-{:06}: ", self.document.0), self.document.1);
        for t in 0..=self.turn {
            piece(&mut text, &format!(" user {run:04}-{:08}-{t}: ", self.session), self.message_tokens);
            if t < self.turn {
                piece(&mut text, &format!(" assistant {t}: "), self.answer_tokens);
            }
        }
        text
    }

    /// The session's name in `x-session-id`: unique to the session and the run.
    pub fn session_id(&self, run: u32) -> String {
        format!("{run:04}-{:08}", self.session)
    }
}

/// Appends `tokens` tokens of text (by the shared approximation) starting with `label`.
fn piece(text: &mut String, label: &str, tokens: u32) {
    let end = text.len() + tokens as usize * BYTES_PER_TOKEN;
    text.push_str(label);
    while text.len() < end {
        text.push_str(FILLER);
    }
    text.truncate(end);
}

const FILLER: &str = "lorem ipsum dolor sit amet ";

/// The requests marked as sending `run` of their workload: their prompts differ from every
/// other run's, so nothing sent in one run (a rate of a ladder, a warm-up, a phase) is a
/// prefix-cache hit in the next.
pub fn as_run(mut specs: Vec<RequestSpec>, run: u32) -> Vec<RequestSpec> {
    for s in &mut specs {
        s.run = run;
    }
    specs
}

impl RequestSpec {
    /// A prompt of exactly `prompt_tokens` tokens (by the shared approximation):
    /// the shared system prompt if any, then text unique to request `index` of `run`.
    pub fn prompt(&self, index: usize) -> String {
        if let Some(c) = &self.conversation {
            return c.prompt(self.run);
        }
        let target = self.prompt_tokens as usize * BYTES_PER_TOKEN;
        let mut text = String::with_capacity(target + FILLER.len());
        if let Some((id, tokens)) = self.shared_prefix {
            let prefix_bytes = (tokens as usize * BYTES_PER_TOKEN).min(target.saturating_sub(BYTES_PER_TOKEN));
            text.push_str(&format!("system prompt {id:04}: "));
            while text.len() < prefix_bytes {
                text.push_str("you are a careful assistant. ");
            }
            text.truncate(prefix_bytes);
        }
        text.push_str(&format!("request {:04}-{index:08} ", self.run));
        while text.len() < target {
            text.push_str(FILLER);
        }
        text.truncate(target.max(1));
        text
    }
}

/// Poisson arrivals at `rate` per second for `duration_s`; `shape` draws each request.
fn poisson(
    seed: u64,
    rate: f64,
    duration_s: f64,
    mut shape: impl FnMut(&mut StdRng, f64) -> RequestSpec,
) -> Vec<RequestSpec> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += -rng.gen_range(f64::EPSILON..1.0).ln() / rate;
        if t >= duration_s {
            return out;
        }
        out.push(shape(&mut rng, t));
    }
}

/// 50% interactive, 35% batch, 15% sheddable.
fn mixed_class(rng: &mut StdRng) -> SloClass {
    match rng.gen_range(0.0..1.0) {
        x if x < 0.5 => SloClass::interactive(),
        x if x < 0.85 => SloClass::batch(),
        _ => SloClass::sheddable(),
    }
}

/// A plain request: no shared prefix, no conversation, run 0 (set `run` for a later sending).
pub fn spec(at_s: f64, prompt_tokens: u32, max_tokens: u32, stream: bool, class: SloClass) -> RequestSpec {
    RequestSpec { at_s, prompt_tokens, max_tokens, stream, class, shared_prefix: None, run: 0, conversation: None }
}

/// The demo's mix: short-prompt/long-answer, long-prompt/short-answer and medium
/// requests; interactive, batch and sheddable classes; 85% streaming.
pub fn mixed(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    poisson(seed, rate, duration_s, |rng, t| {
        let class = mixed_class(rng);
        let (prompt, output) = match rng.gen_range(0..3) {
            0 => (rng.gen_range(50..400), rng.gen_range(150..400)),
            1 => (rng.gen_range(1500..4000), rng.gen_range(10..60)),
            _ => (rng.gen_range(300..1500), rng.gen_range(50..200)),
        };
        spec(t, prompt, output, rng.gen_bool(0.85), class)
    })
}

/// The SLO classes of [`mixed`] with every SLO scaled by `factor`: the same mix of goals
/// for an engine `1 / factor` times as fast.
fn scaled(class: SloClass, factor: f64) -> SloClass {
    SloClass { ttft_ms: class.ttft_ms.map(|t| t * factor), tpot_ms: class.tpot_ms.map(|t| t * factor), ..class }
}

/// SLOs of [`mixed_small`] against [`mixed`]'s: the small local model on one CPU core
/// takes 20-40% of the time the simulated H100 takes for the same tokens (its profile:
/// 2,048 prompt tokens in ~190 ms, decode steps of 2-10 ms), so its goals are tighter.
pub const SMALL_SLO_FACTOR: f64 = 0.4;

/// [`mixed`] sized for a small real model on CPU (the local vLLM servers, a 4,096-token
/// context): the same three shapes and classes, every SLO scaled by [`SMALL_SLO_FACTOR`],
/// with prompts of 20-500 tokens by the shared approximation (about twice that to the
/// model's tokenizer, which packs about 2 bytes a token of the filler text) and answers of
/// 5-200. As in [`mixed`] on the simulated H100, an idle server meets every class's goals
/// with room to spare (the longest prompt, ~1,000 model tokens, prefills in ~75 ms against
/// the interactive class's 160 ms), so what misses them is load and placement. Sized to
/// 1,400 tokens, a tenth of the requests (interactive prompts of ~2,000-2,800 model tokens,
/// 200-600 ms even alone) missed at every rate on every router, and the benchmark measured
/// the workload, not the routing.
pub fn mixed_small(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    poisson(seed, rate, duration_s, |rng, t| {
        let class = scaled(mixed_class(rng), SMALL_SLO_FACTOR);
        let (prompt, output) = match rng.gen_range(0..3) {
            0 => (rng.gen_range(20..150), rng.gen_range(40..200)),
            1 => (rng.gen_range(200..500), rng.gen_range(5..40)),
            _ => (rng.gen_range(50..300), rng.gen_range(20..100)),
        };
        spec(t, prompt, output, rng.gen_bool(0.85), class)
    })
}

/// [`long_prompts`] sized as [`mixed_small`]: the accuracy run's shift on the local vLLM servers.
pub fn long_prompts_small(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    let class = scaled(
        SloClass { name: "long-prompt".into(), ttft_ms: Some(1500.0), tpot_ms: Some(60.0), priority: 0 },
        SMALL_SLO_FACTOR,
    );
    poisson(seed, rate, duration_s, |rng, t| {
        spec(t, rng.gen_range(800..1600), rng.gen_range(10..40), true, class.clone())
    })
}

/// Decode-heavy: short prompts (50-300 tokens), long answers (300-800).
pub fn short_prompt_long_answer(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    poisson(seed, rate, duration_s, |rng, t| {
        let class = mixed_class(rng);
        spec(t, rng.gen_range(50..300), rng.gen_range(300..800), true, class)
    })
}

/// Prefill-heavy: long prompts (2k-6k tokens), short answers (20-100).
pub fn long_prompt_short_answer(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    poisson(seed, rate, duration_s, |rng, t| {
        let class = mixed_class(rng);
        spec(t, rng.gen_range(2000..6000), rng.gen_range(20..100), true, class)
    })
}

/// Shared prefixes: one of 8 system prompts (1,500 tokens each) then a 50-300-token question.
pub fn shared_prefix(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    poisson(seed, rate, duration_s, |rng, t| {
        let class = mixed_class(rng);
        let (system, question) = (1500u32, rng.gen_range(50..300));
        let mut s = spec(t, system + question, rng.gen_range(30..200), true, class);
        s.shared_prefix = Some((rng.gen_range(0..8), system));
        s
    })
}

/// Sizes over two orders of magnitude, for a fleet of mixed GPU classes: prompts
/// log-uniform over 50-5,000 tokens, answers over 10-500, the mixed SLO classes, 85%
/// streaming. Where a long prompt lands (a fast or a slow GPU) decides its TTFT, which
/// per-request prediction sees and request counting does not.
pub fn heterogeneous(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    let log_uniform = |rng: &mut StdRng, lo: f64, hi: f64| rng.gen_range(lo.ln()..hi.ln()).exp().round() as u32;
    poisson(seed, rate, duration_s, |rng, t| {
        let class = mixed_class(rng);
        let (prompt, output) = (log_uniform(rng, 50.0, 5000.0), log_uniform(rng, 10.0, 500.0));
        spec(t, prompt, output, rng.gen_bool(0.85), class)
    })
}

/// All-interactive prefill-heavy traffic, the shift of the predictor's accuracy run.
pub fn long_prompts(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    let class = SloClass { name: "long-prompt".into(), ttft_ms: Some(1500.0), tpot_ms: Some(60.0), priority: 0 };
    poisson(seed, rate, duration_s, |rng, t| {
        spec(t, rng.gen_range(2000..6000), rng.gen_range(20..100), true, class.clone())
    })
}

/// SLOs of the conversational workloads against [`mixed`]'s: an engine that queues (the
/// ~100M-parameter local model on a CPU core prefills 1,024 tokens in ~1.5 s) is ~4x slower
/// than the simulated H100 for the same tokens, and the interactive class's goals become
/// those of the real-engine issue's measurement (TTFT 1.5 s, TPOT 150 ms).
pub const ENGINE_BOUND_SLO_FACTOR: f64 = 3.75;

/// Turns of a `multi-turn` session, and the seconds between their sends.
pub const TURNS: u32 = 6;
pub const TURN_GAP_S: f64 = 5.0;

/// Chat and agent sessions arriving open-loop (Poisson, `rate` turns a second over all
/// sessions): each opens with a document of its own (600-1,000 tokens by the shared
/// approximation, about twice that to the local model's tokenizer), then [`TURNS`] turns
/// [`TURN_GAP_S`] apart (an answer's time plus a person's thinking), each a 20-40-token
/// message answered in 24-48 tokens, streamed. The last turn's prompt is 860-1,480
/// approximate tokens (about 1.7-3k model tokens). A session keeps one SLO class of [`mixed`]'s,
/// scaled by [`ENGINE_BOUND_SLO_FACTOR`]. The turns are sent on a schedule, not after the
/// last answer: past a router's cliff a turn can go before its predecessor ended, as an
/// impatient user's does.
pub fn multi_turn(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    let mut out = Vec::new();
    let mut session = 0u32;
    let starts = poisson(seed, rate / f64::from(TURNS), duration_s, |rng, t| {
        let class = scaled(mixed_class(rng), ENGINE_BOUND_SLO_FACTOR);
        let (document, message, answer) = (rng.gen_range(600..1000), rng.gen_range(20..40), rng.gen_range(24..48));
        let mut s = spec(t, 0, answer, true, class);
        let conversation = Conversation {
            session,
            turn: 0,
            document: (session, document),
            message_tokens: message,
            answer_tokens: answer,
        };
        session += 1;
        s.conversation = Some(conversation);
        s
    });
    for first in starts {
        let Some(c) = first.conversation else { continue };
        for turn in 0..TURNS {
            let at_s = first.at_s + f64::from(turn) * TURN_GAP_S;
            if at_s >= duration_s {
                break;
            }
            let c = Conversation { turn, ..c };
            out.push(RequestSpec { at_s, prompt_tokens: c.prompt_tokens(), conversation: Some(c), ..first.clone() });
        }
    }
    out.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    out
}

/// Documents of a `rag` workload.
pub const RAG_DOCUMENTS: u32 = 32;

/// Questions on shared documents, interleaved: each request asks a 10-40-token question
/// about one of [`RAG_DOCUMENTS`] documents of 600-1,000 tokens (by the shared
/// approximation; each document's size fixed by the seed), answered in 16-64 tokens,
/// streamed, from a session of its own. A document's questions share its prefix wherever
/// one of them ran; a session-hashing router spreads them over every server. The SLO
/// classes of [`multi_turn`].
pub fn rag(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    let mut sizes = StdRng::seed_from_u64(seed ^ 0x5eed_d0c5);
    let documents: Vec<u32> = (0..RAG_DOCUMENTS).map(|_| sizes.gen_range(600..1000)).collect();
    let mut session = 0u32;
    poisson(seed, rate, duration_s, |rng, t| {
        let class = scaled(mixed_class(rng), ENGINE_BOUND_SLO_FACTOR);
        let d = rng.gen_range(0..RAG_DOCUMENTS);
        let c = Conversation {
            session,
            turn: 0,
            document: (d, documents[d as usize]),
            message_tokens: rng.gen_range(10..40),
            answer_tokens: 0,
        };
        session += 1;
        let mut s = spec(t, c.prompt_tokens(), rng.gen_range(16..64), true, class);
        s.conversation = Some(c);
        s
    })
}

/// One request of a trace: arrival (s), prompt and output tokens.
type TraceRow = (f64, u32, u32);

/// The rows of a trace in the `arrived_at,num_prefill_tokens,num_decode_tokens` format,
/// sizes clamped to the simulator's 32k context.
fn parse_trace(csv: &str) -> Result<Vec<TraceRow>, String> {
    let mut rows = Vec::new();
    for (n, line) in csv.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split(',').collect();
        let bad =
            || format!("trace line {}: expected arrived_at,num_prefill_tokens,num_decode_tokens: {line:?}", n + 1);
        if cols.len() != 3 {
            return Err(bad());
        }
        let at: f64 = cols[0].trim().parse().map_err(|_| bad())?;
        let prompt: u32 = cols[1].trim().parse().map_err(|_| bad())?;
        let output: u32 = cols[2].trim().parse().map_err(|_| bad())?;
        rows.push((at, prompt.clamp(1, 24_000), output.clamp(1, 8_000)));
    }
    Ok(rows)
}

/// A replay of a trace in the `arrived_at,num_prefill_tokens,num_decode_tokens`
/// format (`loadgen/workloads/azure-conv-2023.csv`): arrivals divided by
/// `speedup`, the first `duration_s` seconds (after speed-up), sizes clamped to
/// the simulator's 32k context, SLO classes drawn as in [`mixed`].
pub fn trace_replay(csv: &str, seed: u64, speedup: f64, duration_s: f64) -> Result<Vec<RequestSpec>, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for (at, prompt, output) in parse_trace(csv)? {
        let at_s = at / speedup;
        if at_s >= duration_s {
            break;
        }
        let class = mixed_class(&mut rng);
        out.push(spec(at_s, prompt, output, true, class));
    }
    Ok(out)
}

/// The same stretch of a trace at any rate: its first `window` requests, their arrival
/// times compressed so they come at `rate` on average, replayed back to back for
/// `duration_s`. Every rate gets the same requests (sizes, SLO classes, the shape of
/// their bursts), only faster or slower, so neighbouring rates of a ladder measure the
/// same traffic. (Speeding the whole trace up instead plays a longer, different stretch
/// at each higher rate.)
pub fn trace_window(
    csv: &str,
    seed: u64,
    window: usize,
    rate: f64,
    duration_s: f64,
) -> Result<Vec<RequestSpec>, String> {
    if rate.is_nan() || rate <= 0.0 || window == 0 {
        return Err(format!("trace window: rate {rate} and window {window} must be > 0"));
    }
    let rows = parse_trace(csv)?;
    let rows = &rows[..window.min(rows.len())];
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else { return Err("empty trace".into()) };
    // The window's native mean rate, counting one mean gap after its last request, so a
    // replay's cycles join without a pause or a pile-up.
    let n = rows.len() as f64;
    let span = (last.0 - first.0).max(f64::EPSILON) * n / (n - 1.0).max(1.0);
    let scale = n / span / rate; // native seconds -> seconds at `rate`
    let cycle = n / rate;
    let mut rng = StdRng::seed_from_u64(seed);
    let classes: Vec<SloClass> = rows.iter().map(|_| mixed_class(&mut rng)).collect();
    let mut out = Vec::new();
    for k in 0.. {
        for ((at, prompt, output), class) in rows.iter().zip(&classes) {
            let at_s = f64::from(k) * cycle + (at - first.0) * scale;
            if at_s >= duration_s {
                return Ok(out);
            }
            out.push(spec(at_s, *prompt, *output, true, class.clone()));
        }
    }
    Ok(out)
}

/// A trace's own mean rate (requests per second over its span), in the format of
/// [`trace_window`]: where a ladder over it starts from.
pub fn trace_rate(csv: &str) -> Result<f64, String> {
    let rows = parse_trace(csv)?;
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else { return Err("empty trace".into()) };
    let span = last.0 - first.0;
    if rows.len() < 2 || span <= 0.0 {
        return Err("a trace needs at least two requests at different times".into());
    }
    Ok((rows.len() - 1) as f64 / span)
}

/// The bundled Azure conversation trace (see `loadgen/workloads/README.md`).
pub const AZURE_CONV_2023: &str = include_str!("../workloads/azure-conv-2023.csv");

/// [`trace_window`] over the bundled Azure trace.
pub fn azure_window(seed: u64, window: usize, rate: f64, duration_s: f64) -> Result<Vec<RequestSpec>, String> {
    trace_window(AZURE_CONV_2023, seed, window, rate, duration_s)
}

/// A workload by name: `mixed`, `short-long`, `long-short`, `shared-prefix`, `hetero`,
/// `multi-turn`, `rag`, or `azure` (the bundled trace, `speedup` times faster; `rate` is
/// then unused).
pub fn by_name(name: &str, seed: u64, rate: f64, duration_s: f64, speedup: f64) -> Result<Vec<RequestSpec>, String> {
    match name {
        "mixed" => Ok(mixed(seed, rate, duration_s)),
        "mixed-small" => Ok(mixed_small(seed, rate, duration_s)),
        "short-long" => Ok(short_prompt_long_answer(seed, rate, duration_s)),
        "long-short" => Ok(long_prompt_short_answer(seed, rate, duration_s)),
        "shared-prefix" => Ok(shared_prefix(seed, rate, duration_s)),
        "hetero" => Ok(heterogeneous(seed, rate, duration_s)),
        "azure" => trace_replay(AZURE_CONV_2023, seed, speedup, duration_s),
        "multi-turn" => Ok(multi_turn(seed, rate, duration_s)),
        "rag" => Ok(rag(seed, rate, duration_s)),
        other => {
            let known = "mixed, mixed-small, short-long, long-short, shared-prefix, hetero, azure, multi-turn, rag";
            Err(format!("unknown workload {other:?}: {known}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::tokens::{estimate_tokens, prefix_block_hashes};

    #[test]
    fn seeded_and_rate_shaped() {
        let a = mixed(7, 10.0, 60.0);
        assert_eq!(a, mixed(7, 10.0, 60.0));
        assert!((a.len() as f64 - 600.0).abs() < 100.0, "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        for name in ["interactive", "batch", "sheddable"] {
            assert!(a.iter().any(|r| r.class.name == name));
        }
    }

    #[test]
    fn prompt_has_the_stated_token_count() {
        let r = spec(0.0, 321, 1, true, SloClass::batch());
        assert_eq!(estimate_tokens(&r.prompt(3)), 321);
        assert_ne!(r.prompt(3)[..64], r.prompt(4)[..64]);
        let again = RequestSpec { run: 1, ..r.clone() };
        assert_eq!(estimate_tokens(&again.prompt(3)), 321);
        assert_ne!(again.prompt(3)[..64], r.prompt(3)[..64], "another run's request shares no first block");
    }

    #[test]
    fn shared_prefix_prompts_share_their_system_blocks() {
        let w = shared_prefix(3, 20.0, 10.0);
        let same: Vec<&RequestSpec> =
            w.iter().filter(|r| r.shared_prefix.map(|p| p.0) == w[0].shared_prefix.map(|p| p.0)).collect();
        assert!(same.len() >= 2);
        let (a, b) = (same[0].prompt(0), same[1].prompt(1));
        assert_eq!(estimate_tokens(&a), same[0].prompt_tokens);
        let (ha, hb) = (prefix_block_hashes(&a, 1000), prefix_block_hashes(&b, 1000));
        let shared = ha.iter().zip(&hb).take_while(|(x, y)| x == y).count();
        assert!(shared >= 90, "1,500 shared tokens are ~93 blocks: {shared}");
        assert_ne!(ha.last(), hb.last());
    }

    #[test]
    fn each_turn_resends_the_conversation_so_far() {
        let w = multi_turn(3, 3.0, 120.0);
        assert_eq!(w, multi_turn(3, 3.0, 120.0));
        assert!(w.windows(2).all(|p| p[0].at_s <= p[1].at_s));
        let first = w[0].conversation.expect("a turn");
        let turns: Vec<&RequestSpec> =
            w.iter().filter(|r| r.conversation.is_some_and(|c| c.session == first.session)).collect();
        assert_eq!(turns.len(), TURNS as usize, "every turn of an early session is sent");
        for pair in turns.windows(2) {
            let (a, b) = (pair[0].prompt(0), pair[1].prompt(0));
            assert!(b.starts_with(&a), "each turn begins with the last one's prompt");
            assert_eq!(estimate_tokens(&b), pair[1].prompt_tokens);
            assert!((pair[1].at_s - pair[0].at_s - TURN_GAP_S).abs() < 1e-9);
            assert_eq!(pair[0].class, pair[1].class, "a session keeps its class");
        }
        let last = turns[turns.len() - 1].prompt_tokens;
        assert!((860..=1_480).contains(&last), "the last turn's context: {last}");
        // Sessions share nothing: another session's first block differs; another run's too.
        let other = w.iter().find(|r| r.conversation.is_some_and(|c| c.session != first.session)).unwrap();
        let blocks = |s: &str| prefix_block_hashes(s, 1000);
        assert_ne!(blocks(&other.prompt(0))[0], blocks(&w[0].prompt(0))[0]);
        let again = RequestSpec { run: 1, ..w[0].clone() };
        assert_ne!(blocks(&again.prompt(0))[0], blocks(&w[0].prompt(0))[0]);
        assert_ne!(first.session_id(0), first.session_id(1));
        // About `rate` turns a second once the sessions are under way.
        let late = w.iter().filter(|r| r.at_s >= 40.0 && r.at_s < 120.0).count() as f64 / 80.0;
        assert!((late - 3.0).abs() < 0.8, "{late} turns/s");
    }

    #[test]
    fn rag_questions_share_their_documents_blocks() {
        let w = rag(4, 10.0, 60.0);
        let on = |d: u32| w.iter().filter(move |r| r.conversation.is_some_and(|c| c.document.0 == d));
        let (a, b) = {
            let mut same = on(w[0].conversation.unwrap().document.0);
            (same.next().unwrap().prompt(0), same.next().unwrap().prompt(0))
        };
        let (ha, hb) = (prefix_block_hashes(&a, 1000), prefix_block_hashes(&b, 1000));
        let shared = ha.iter().zip(&hb).take_while(|(x, y)| x == y).count();
        assert!(shared >= 30, "600+ shared tokens are 37+ blocks: {shared}");
        assert_ne!(ha.last(), hb.last(), "the questions differ");
        let documents: std::collections::BTreeSet<u32> =
            w.iter().filter_map(|r| r.conversation.map(|c| c.document.0)).collect();
        assert_eq!(documents.len(), RAG_DOCUMENTS as usize);
        let sessions: std::collections::BTreeSet<u32> =
            w.iter().filter_map(|r| r.conversation.map(|c| c.session)).collect();
        assert_eq!(sessions.len(), w.len(), "a session per question");
    }

    #[test]
    fn trace_replay_scales_time_and_reports_bad_lines() {
        let csv = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.0,396,109\n10.0,50000,2\n40.0,1,1\n";
        let w = trace_replay(csv, 1, 2.0, 10.0).unwrap();
        assert_eq!(w.len(), 3);
        assert_eq!((w[1].at_s, w[1].prompt_tokens, w[1].max_tokens), (2.0, 396, 109));
        assert_eq!(w[2].prompt_tokens, 24_000, "clamped to the context");
        let err = trace_replay("h\n1,2\n", 1, 1.0, 10.0).unwrap_err();
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn the_small_mix_fits_an_idle_cpu_server_within_every_goal() {
        let w = mixed_small(5, 20.0, 60.0);
        // At most ~1,000 model tokens (about 2 bytes a token), which the local vLLM server
        // prefills in ~75 ms, under half the tightest TTFT goal.
        assert!(w.iter().all(|r| r.prompt_tokens < 500), "a prompt over 500 tokens");
        let tightest = w.iter().filter_map(|r| r.class.ttft_ms).fold(f64::INFINITY, f64::min);
        assert_eq!(tightest, 400.0 * SMALL_SLO_FACTOR);
        assert!(w.iter().any(|r| r.prompt_tokens >= 450), "the long shape is there");
    }

    #[test]
    fn heterogeneous_sizes_span_two_orders_of_magnitude() {
        let w = heterogeneous(3, 50.0, 60.0);
        let prompts: Vec<u32> = w.iter().map(|r| r.prompt_tokens).collect();
        let (lo, hi) = (prompts.iter().min().copied().unwrap_or(0), prompts.iter().max().copied().unwrap_or(0));
        assert!(lo < 60 && hi > 4500, "{lo}..{hi}");
        // Log-uniform: as many prompts under 500 tokens as over.
        let short = prompts.iter().filter(|&&p| p < 500).count() as f64 / prompts.len() as f64;
        assert!((short - 0.5).abs() < 0.05, "{short}");
    }

    #[test]
    fn a_trace_window_is_the_same_requests_at_every_rate() {
        let (slow, fast) = (azure_window(5, 300, 50.0, 6.0).unwrap(), azure_window(5, 300, 100.0, 3.0).unwrap());
        // Twice the rate over half the time: the same 300 requests, in half the time.
        assert_eq!(slow.len(), 300);
        assert_eq!(fast.len(), 300);
        for (a, b) in slow.iter().zip(&fast) {
            assert_eq!((a.prompt_tokens, a.max_tokens, &a.class.name), (b.prompt_tokens, b.max_tokens, &b.class.name));
            assert!((a.at_s - 2.0 * b.at_s).abs() < 1e-9, "{} vs {}", a.at_s, b.at_s);
        }
        // Longer than the window lasts at this rate: it is replayed, not extended.
        let looped = azure_window(5, 300, 100.0, 9.0).unwrap();
        assert_eq!(looped.len(), 900);
        assert_eq!(looped[300].prompt_tokens, looped[0].prompt_tokens);
        assert!((looped[300].at_s - 3.0).abs() < 1e-9, "{}", looped[300].at_s);
        let mean_rate = looped.len() as f64 / 9.0;
        assert!((mean_rate - 100.0).abs() < 1.0, "{mean_rate}");
        assert!(looped.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        assert!(azure_window(5, 0, 10.0, 1.0).is_err() && azure_window(5, 10, 0.0, 1.0).is_err());
    }

    #[test]
    fn the_bundled_azure_trace_parses() {
        let w = by_name("azure", 1, 0.0, 3600.0, 1.0).unwrap();
        assert_eq!(w.len(), 19_366);
        let mean_prompt = w.iter().map(|r| f64::from(r.prompt_tokens)).sum::<f64>() / w.len() as f64;
        assert!((mean_prompt - 1155.0).abs() < 20.0, "{mean_prompt}");
    }
}
