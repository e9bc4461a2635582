//! The simulated model servers of a simulated-time run: the simulator's engine
//! (`headroom_sim::engine`, the same continuous batching the HTTP simulator runs), stepped
//! by the world's clock instead of a timer, with what its HTTP front adds: the API overhead
//! before a request reaches the engine, the context check, the metrics a scrape reads
//! (published after each step, as the front does) and the bytes of its replies.

use headroom_loadgen::profile::Sweep;
use headroom_predictor_config::profile::{Metadata, Stats, TpotFile, TpotRow, TtftFile, TtftRow};
use headroom_predictor_core::pool::{DecodeCounter, EngineMetrics};
use headroom_protocol::openai::InferenceBody;
use headroom_protocol::tokens::prefix_block_hashes;
use headroom_sim::engine::{Engine, NewRequest, RequestId, Token};
use headroom_sim::profile::Profile;

/// One simulated server.
pub struct Server {
    pub address: String,
    pub profile: Profile,
    engine: Engine,
    /// The step under way: when it ends (ns) and the tokens it makes.
    stepping: Option<(u64, Vec<Token>)>,
    /// What `/metrics` shows: the engine as its last step left it.
    published: EngineMetrics,
    /// The inter-token latency histogram's running sum (engine seconds) and count.
    decode: DecodeCounter,
    /// When each running request's last token came (ns), for the inter-token sum.
    last_token_ns: std::collections::HashMap<RequestId, u64>,
}

impl Server {
    pub fn new(address: String, profile: Profile) -> Server {
        Server {
            address,
            engine: Engine::new(profile.clone()),
            profile,
            stepping: None,
            published: EngineMetrics::default(),
            decode: DecodeCounter::default(),
            last_token_ns: std::collections::HashMap::new(),
        }
    }

    /// Whether a request of `body` fits the server's context (the front answers 400 otherwise).
    pub fn fits(&self, body: &InferenceBody) -> bool {
        let max_tokens = body.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        u64::from(body.approximate_prompt_tokens()) + u64::from(max_tokens) <= u64::from(self.profile.max_model_len)
    }

    /// Hands the request to the engine. Returns when the step it may start ends, if the
    /// engine was idle (the world schedules [`Server::step_done`] then).
    pub fn submit(&mut self, id: RequestId, body: &InferenceBody, now: u64, time_scale: f64) -> Option<u64> {
        let block_hashes = prefix_block_hashes(&body.prompt_text, self.profile.max_model_len as usize);
        let max_tokens = body.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        self.engine.submit(NewRequest {
            id,
            prompt_tokens: body.approximate_prompt_tokens(),
            max_tokens,
            block_hashes,
        });
        self.last_token_ns.insert(id, now);
        if self.stepping.is_some() {
            return None;
        }
        self.next_step(now, time_scale)
    }

    /// Drops a request whose client went away.
    pub fn abort(&mut self, id: RequestId) {
        self.engine.abort(id);
        self.last_token_ns.remove(&id);
    }

    /// The step that ends at `now` is done: its tokens, and when the next one ends (if any).
    pub fn step_done(&mut self, now: u64, time_scale: f64) -> (Vec<Token>, Option<u64>) {
        let tokens = match self.stepping.take() {
            Some((end, tokens)) if end == now => tokens,
            other => {
                self.stepping = other;
                return (Vec::new(), None);
            }
        };
        for t in &tokens {
            let Some(last) = self.last_token_ns.get_mut(&t.id) else { continue };
            if t.index > 1 {
                self.decode.sum_s += (now - *last) as f64 / 1e9 * time_scale;
                self.decode.tokens += 1.0;
            }
            *last = now;
            if t.last {
                self.last_token_ns.remove(&t.id);
            }
        }
        self.published = EngineMetrics {
            running: self.engine.num_running() as u32,
            waiting: self.engine.num_waiting() as u32,
            kv_usage: self.engine.kv_usage(),
            decode: Some(self.decode),
            queue_read: true,
        };
        (tokens, self.next_step(now, time_scale))
    }

    /// Starts the engine's next step, if it has work: when it ends.
    fn next_step(&mut self, now: u64, time_scale: f64) -> Option<u64> {
        let step = self.engine.step()?;
        let end = now + (step.duration_ms * 1e6 / time_scale).round().max(1.0) as u64;
        self.stepping = Some((end, step.tokens));
        Some(end)
    }

    /// The metrics a scrape reads now.
    pub fn metrics(&self) -> EngineMetrics {
        self.published
    }
}

/// `max_tokens` when a request names none (the HTTP simulator's default).
const DEFAULT_MAX_TOKENS: u32 = headroom_sim::server::DEFAULT_MAX_TOKENS;

/// What `headroom-profile`'s sweep (`headroom_loadgen::profile::Sweep::for_engine`) measures
/// on an idle server of `profile` running at `time_scale`, stepped here on its engine alone:
/// the prior an operator gives the predictor for a class the analytic constants do not
/// describe (the stack profiles its simulated servers the same way over HTTP).
pub fn swept(profile: &Profile, time_scale: f64) -> (TtftFile, TpotFile) {
    let sweep = Sweep::for_engine(profile.max_model_len, profile.max_num_seqs);
    let wall = |engine_ms: f64| engine_ms / time_scale;
    let metadata = Metadata {
        model: profile.name.to_string(),
        timestamp: String::new(),
        description: format!("the simulator's {} engine at {time_scale}x, stepped alone", profile.name),
    };
    let ttft = sweep
        .prompts
        .iter()
        .filter_map(|&prompt| {
            let first = run_batch(profile, 1, prompt, 2).first_token_ms[0];
            let stats = Stats::of(&[wall(profile.api_overhead_ms + first)])?;
            Some(TtftRow { tokens_num: prompt, stats })
        })
        .collect();
    let mut tpot = Vec::new();
    for &batch in &sweep.batches {
        for &context in &sweep.contexts {
            let run = run_batch(profile, batch, context, sweep.decode_tokens);
            if let Some(stats) = Stats::of(&[wall(run.median_tpot_ms())]) {
                tpot.push(TpotRow { batch_size: batch, tokens_per_request: context, stats });
            }
        }
    }
    (TtftFile { metadata: metadata.clone(), results: ttft }, TpotFile { metadata, results: tpot })
}

/// When each of a batch's requests made its first and last token (engine ms from the start).
struct BatchRun {
    first_token_ms: Vec<f64>,
    last_token_ms: Vec<f64>,
    tokens: u32,
}

impl BatchRun {
    /// The median over the batch of each request's time between tokens.
    fn median_tpot_ms(&self) -> f64 {
        let mut each: Vec<f64> = self
            .first_token_ms
            .iter()
            .zip(&self.last_token_ms)
            .map(|(first, last)| (last - first) / f64::from(self.tokens.saturating_sub(1).max(1)))
            .collect();
        each.sort_by(f64::total_cmp);
        each[each.len() / 2]
    }
}

/// `batch` requests of `prompt` uncached tokens, each answered in `tokens`, sent together to
/// an idle engine of `profile` and stepped to the end.
fn run_batch(profile: &Profile, batch: u32, prompt: u32, tokens: u32) -> BatchRun {
    let mut engine = Engine::new(profile.clone());
    for id in 0..batch {
        engine.submit(NewRequest {
            id: u64::from(id),
            prompt_tokens: prompt,
            max_tokens: tokens,
            block_hashes: Vec::new(),
        });
    }
    let n = batch as usize;
    let mut run = BatchRun { first_token_ms: vec![0.0; n], last_token_ms: vec![0.0; n], tokens };
    let mut now = 0.0;
    while let Some(step) = engine.step() {
        now += step.duration_ms;
        for t in step.tokens {
            let i = t.id as usize;
            if t.index == 1 {
                run.first_token_ms[i] = now;
            }
            run.last_token_ms[i] = now;
        }
    }
    run
}

/// The OpenAI-shaped bytes of a simulated server's reply, as the HTTP simulator writes them
/// (`headroom_sim::server::replies`): the first token's event; the last token's, the finish
/// and the usage block with `[DONE]`; or a whole body. The middle tokens' events are left
/// out: the meters count tokens from the usage block and time the first and the last.
pub(super) struct ReplyText<'a> {
    pub id: u64,
    pub model: &'a str,
    pub prompt_tokens: u32,
}

impl ReplyText<'_> {
    fn event(&self, choice: &str) -> String {
        format!(
            "data: {{\"id\":\"cmpl-{}\",\"object\":\"text_completion\",\"model\":\"{}\",\"choices\":[{choice}]}}\n\n",
            self.id, self.model
        )
    }

    fn usage(&self, n: u32, cached: u32) -> String {
        format!(
            "{{\"prompt_tokens\":{p},\"completion_tokens\":{n},\"total_tokens\":{t},\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}}}",
            p = self.prompt_tokens,
            t = self.prompt_tokens + n
        )
    }

    pub(super) fn first_chunk(&self) -> String {
        self.event(r#"{"index":0,"text":" tok","finish_reason":null}"#)
    }

    pub(super) fn last_chunks(&self, n: u32, cached: u32) -> String {
        let mut out = String::new();
        if n >= 2 {
            out.push_str(&self.first_chunk());
        }
        out.push_str(&self.event(r#"{"index":0,"text":"","finish_reason":"length"}"#));
        out.push_str(&format!(
            "data: {{\"id\":\"cmpl-{}\",\"object\":\"text_completion\",\"model\":\"{}\",\"choices\":[],\"usage\":{}}}\n\n",
            self.id,
            self.model,
            self.usage(n, cached)
        ));
        out.push_str("data: [DONE]\n\n");
        out
    }

    pub(super) fn whole(&self, n: u32, cached: u32) -> String {
        format!(
            "{{\"id\":\"cmpl-{}\",\"object\":\"text_completion\",\"model\":\"{}\",\"choices\":[{{\"index\":0,\"text\":\"{}\",\"finish_reason\":\"length\"}}],\"usage\":{}}}",
            self.id,
            self.model,
            " tok".repeat(n as usize),
            self.usage(n, cached)
        )
    }
}
