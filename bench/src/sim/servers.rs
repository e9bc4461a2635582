//! The simulated model servers of a simulated-time run: the simulator's engine
//! (`headroom_sim::engine`, the same continuous batching the HTTP simulator runs), stepped
//! by the world's clock instead of a timer, with what its HTTP front adds: the API overhead
//! before a request reaches the engine, the context check, and the metrics a scrape reads
//! (published after each step, as the front does).

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
        u64::from(body.prompt_tokens) + u64::from(max_tokens) <= u64::from(self.profile.max_model_len)
    }

    /// Hands the request to the engine. Returns when the step it may start ends, if the
    /// engine was idle (the world schedules [`Server::step_done`] then).
    pub fn submit(&mut self, id: RequestId, body: &InferenceBody, now: u64, time_scale: f64) -> Option<u64> {
        let block_hashes = prefix_block_hashes(&body.prompt_text, self.profile.max_model_len as usize);
        let max_tokens = body.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        self.engine.submit(NewRequest { id, prompt_tokens: body.prompt_tokens, max_tokens, block_hashes });
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
