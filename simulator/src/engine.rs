//! A continuous-batching engine, stepped by its owner: no clocks, no I/O.
//!
//! Each [`Engine::step`] schedules one batch the way vLLM does (running
//! decodes first, then prefill chunks under a token budget and a sequence cap,
//! FCFS admission), returns how long that step takes on the profile's GPU, and
//! the tokens it produced. KV blocks are 16 tokens; when decodes need blocks
//! and none are free, the most recently admitted request is preempted: its
//! blocks are freed and it goes back to the head of the queue to recompute
//! its prompt and the tokens it had generated.
//!
//! Prefix caching: a request's full prompt blocks are keyed by chained hashes
//! ([`headroom_protocol::tokens::prefix_block_hashes`]). At admission the
//! leading blocks already cached skip their prefill (and are reported as cached
//! tokens); when a prefill completes its blocks join the cache. Cached blocks
//! that no running request holds live in free KV and are evicted least
//! recently used as running requests need room.

use std::collections::VecDeque;

use headroom_protocol::prefix::PrefixCache;
use headroom_protocol::tokens::BLOCK_TOKENS;

use crate::profile::{Profile, StepShape};

/// Engine-wide request id.
pub type RequestId = u64;

/// A request handed to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRequest {
    pub id: RequestId,
    pub prompt_tokens: u32,
    /// Output tokens to produce (the simulator ignores EOS).
    pub max_tokens: u32,
    /// Chained hashes of the prompt's full 16-token blocks (may be empty).
    pub block_hashes: Vec<u64>,
}

/// One output token of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub id: RequestId,
    /// 1 for the first token.
    pub index: u32,
    /// True for the request's last token; the request is done.
    pub last: bool,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
}

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub duration_ms: f64,
    pub tokens: Vec<Token>,
    /// Sequences that took part (decodes + prefill chunks).
    pub sequences: u32,
    pub batched_tokens: u32,
}

#[derive(Debug, Clone)]
struct Seq {
    req: NewRequest,
    /// Tokens of context computed into KV.
    computed: u32,
    generated: u32,
    /// Admission order (0: never admitted).
    admitted: u64,
    cached_tokens: u32,
}

impl Seq {
    /// Tokens a prefill must put in KV: the prompt plus any tokens generated
    /// before a preemption (recomputed).
    fn prefill_target(&self) -> u32 {
        self.req.prompt_tokens + self.generated
    }
    /// Decoding: every token but the newest is in KV (the next step feeds it).
    fn is_decoding(&self) -> bool {
        self.generated >= 1 && self.computed + 1 >= self.prefill_target()
    }
}

/// Counters an engine keeps for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub preemptions: u64,
    pub finished: u64,
    /// Prompt tokens looked up in the prefix cache (first admissions).
    pub prefix_queries: u64,
    /// Of those, tokens found cached.
    pub prefix_hits: u64,
}

/// The engine of one simulated server (`Clone`: the error floor replays futures from a copy).
#[derive(Debug, Clone)]
pub struct Engine {
    profile: Profile,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    admissions: u64,
    capacity_blocks: u32,
    prefix: PrefixCache,
    pub counters: Counters,
}

fn blocks(tokens: u32) -> u32 {
    tokens.div_ceil(BLOCK_TOKENS as u32)
}

impl Engine {
    pub fn new(profile: Profile) -> Engine {
        let capacity_blocks = (profile.kv_capacity_tokens / BLOCK_TOKENS as u32).max(1);
        Engine {
            profile,
            waiting: VecDeque::new(),
            running: Vec::new(),
            admissions: 0,
            capacity_blocks,
            prefix: PrefixCache::new(capacity_blocks as usize),
            counters: Counters::default(),
        }
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Queues a request (FCFS).
    pub fn submit(&mut self, req: NewRequest) {
        self.counters.prompt_tokens += u64::from(req.prompt_tokens);
        self.waiting.push_back(Seq { req, computed: 0, generated: 0, admitted: 0, cached_tokens: 0 });
    }

    /// Drops a request wherever it is (client gone). True if it was there.
    pub fn abort(&mut self, id: RequestId) -> bool {
        let before = self.waiting.len() + self.running.len();
        self.waiting.retain(|s| s.req.id != id);
        self.running.retain(|s| s.req.id != id);
        before != self.waiting.len() + self.running.len()
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    fn used_blocks(&self) -> u32 {
        self.running.iter().map(|s| blocks(s.computed.max(s.prefill_target()))).sum()
    }

    /// Share of KV blocks in use, 0..=1.
    pub fn kv_usage(&self) -> f64 {
        f64::from(self.used_blocks().min(self.capacity_blocks)) / f64::from(self.capacity_blocks)
    }

    /// Frees blocks for this step's decodes by preempting the newest admissions.
    fn preempt_for_decodes(&mut self) {
        loop {
            let need: u32 = self
                .running
                .iter()
                .map(|s| if s.is_decoding() { blocks(s.prefill_target() + 1) } else { blocks(s.prefill_target()) })
                .sum();
            if need <= self.capacity_blocks || self.running.len() <= 1 {
                return;
            }
            let newest = (0..self.running.len()).max_by_key(|&i| self.running[i].admitted).unwrap_or(0);
            let mut victim = self.running.remove(newest);
            victim.computed = 0;
            self.counters.preemptions += 1;
            self.waiting.push_front(victim);
        }
    }

    /// Runs one step; `None` when there is nothing to do.
    pub fn step(&mut self) -> Option<Step> {
        if self.is_idle() {
            return None;
        }
        self.preempt_for_decodes();
        let (mut budget, max_seqs) = (self.profile.max_batched_tokens, self.profile.max_num_seqs);
        let mut seqs = 0u32;
        // (index into running, chunk tokens); chunk 0 marks a decode.
        let mut plan: Vec<(usize, u32)> = Vec::new();
        for (i, s) in self.running.iter().enumerate() {
            if s.is_decoding() && seqs < max_seqs && budget > 0 {
                plan.push((i, 0));
                budget -= 1;
                seqs += 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            if !s.is_decoding() && seqs < max_seqs && budget > 0 {
                let chunk = (s.prefill_target() - s.computed).min(budget);
                plan.push((i, chunk));
                budget -= chunk;
                seqs += 1;
            }
        }
        let mut free = self.capacity_blocks.saturating_sub(self.used_blocks());
        while seqs < max_seqs && budget > 0 {
            let Some(front) = self.waiting.front() else { break };
            let need = blocks(front.prefill_target());
            if need > free && !self.running.is_empty() {
                break; // wait for room; an empty engine admits anyway so nothing starves.
            }
            let Some(mut s) = self.waiting.pop_front() else { break };
            free = free.saturating_sub(need);
            self.use_prefix_cache(&mut s);
            self.admissions += 1;
            s.admitted = self.admissions;
            let chunk = (s.prefill_target() - s.computed).min(budget);
            self.running.push(s);
            plan.push((self.running.len() - 1, chunk));
            budget -= chunk;
            seqs += 1;
        }

        let mut shape = StepShape { sequences: seqs, ..StepShape::default() };
        for &(i, chunk) in &plan {
            let s = &self.running[i];
            if chunk == 0 {
                shape.batched_tokens += 1;
                shape.decode_context_tokens += f64::from(s.computed);
            } else {
                shape.batched_tokens += chunk;
                let (pc, k) = (f64::from(chunk), f64::from(s.computed));
                shape.attention_pairs += pc * (k + pc / 2.0);
            }
        }
        let duration_ms = self.profile.step_ms(&shape);

        let mut tokens = Vec::new();
        for &(i, chunk) in &plan {
            let s = &mut self.running[i];
            // A decode feeds its newest token; a prefill chunk its prompt tokens.
            s.computed += chunk.max(1);
            // A decode, or a prefill that completed this step, yields one new token.
            if chunk == 0 || s.computed >= s.prefill_target() {
                if chunk > 0 {
                    self.prefix.insert(&s.req.block_hashes);
                }
                s.generated += 1;
                tokens.push(Token {
                    id: s.req.id,
                    index: s.generated,
                    last: s.generated >= s.req.max_tokens,
                    cached_tokens: s.cached_tokens,
                });
            }
        }
        self.counters.generation_tokens += tokens.len() as u64;
        let finished = tokens.iter().filter(|t| t.last).count() as u64;
        self.counters.finished += finished;
        self.running.retain(|s| s.generated < s.req.max_tokens);
        // Cached blocks only keep the KV that running requests leave free.
        let free_blocks = self.capacity_blocks.saturating_sub(self.used_blocks());
        self.prefix.shrink_to(free_blocks as usize);
        Some(Step { duration_ms, tokens, sequences: seqs, batched_tokens: shape.batched_tokens })
    }

    /// At admission: skip the prefill of the leading cached blocks (at least
    /// one token is always computed, to produce the next token).
    fn use_prefix_cache(&mut self, s: &mut Seq) {
        let hit_blocks = self.prefix.matched_blocks(&s.req.block_hashes);
        self.prefix.insert(&s.req.block_hashes[..hit_blocks]);
        let hit_tokens = u32::try_from(hit_blocks * BLOCK_TOKENS).unwrap_or(u32::MAX);
        let reuse = hit_tokens.min(s.prefill_target().saturating_sub(1));
        if s.admitted == 0 {
            let cached = reuse.min(s.req.prompt_tokens);
            s.cached_tokens = cached;
            self.counters.prefix_queries += u64::from(s.req.prompt_tokens);
            self.counters.prefix_hits += u64::from(cached);
        }
        s.computed = reuse;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_alone(profile: Profile, prompt: u32, out: u32) -> (f64, f64) {
        let mut e = Engine::new(profile);
        e.submit(NewRequest { id: 1, prompt_tokens: prompt, max_tokens: out, block_hashes: vec![] });
        let mut t = 0.0;
        let mut first = None;
        let mut last = 0.0;
        while let Some(step) = e.step() {
            t += step.duration_ms;
            for tok in step.tokens {
                if tok.index == 1 {
                    first = Some(t);
                }
                last = t;
            }
        }
        let first = first.unwrap_or(0.0);
        (first, (last - first) / f64::from(out - 1))
    }

    #[test]
    fn isolated_latency_matches_calibration() {
        // H100: 2k prompt ~53 ms TTFT (engine part, without API overhead), TPOT ~6.8 ms.
        let (ttft, tpot) = run_alone(Profile::h100(), 2048, 64);
        assert!((ttft - 53.0).abs() / 53.0 < 0.1, "ttft {ttft}");
        assert!((tpot - 6.8).abs() / 6.8 < 0.1, "tpot {tpot}");
        let (_, tpot) = run_alone(Profile::a100(), 128, 64);
        assert!((tpot - 11.4).abs() / 11.4 < 0.1, "a100 tpot {tpot}");
    }

    #[test]
    fn every_request_gets_exactly_max_tokens() {
        let mut e = Engine::new(Profile::h100());
        for id in 0..20 {
            e.submit(NewRequest {
                id,
                prompt_tokens: 100 + id as u32 * 37,
                max_tokens: 5 + id as u32,
                block_hashes: vec![],
            });
        }
        let mut counts = std::collections::HashMap::new();
        while let Some(step) = e.step() {
            for t in step.tokens {
                let c = counts.entry(t.id).or_insert(0u32);
                *c += 1;
                assert_eq!(t.index, *c);
                assert_eq!(t.last, t.index == 5 + t.id as u32);
            }
        }
        for id in 0..20u64 {
            assert_eq!(counts[&id], 5 + id as u32);
        }
        assert!(e.is_idle());
        assert_eq!(e.counters.finished, 20);
    }

    #[test]
    fn load_slows_decodes() {
        let mut e = Engine::new(Profile::h100());
        for id in 0..64 {
            e.submit(NewRequest { id, prompt_tokens: 2048, max_tokens: 200, block_hashes: vec![] });
        }
        // Run until all are decoding, then measure one step.
        let mut step = e.step().unwrap();
        while step.tokens.len() < 64 {
            step = e.step().unwrap();
        }
        let busy = e.step().unwrap().duration_ms;
        assert!((busy - 15.6).abs() / 15.6 < 0.1, "64 x 2k decode step {busy} ms");
    }

    #[test]
    fn full_kv_preempts_newest() {
        let mut profile = Profile::h100();
        profile.kv_capacity_tokens = 1024;
        let mut e = Engine::new(profile);
        e.submit(NewRequest { id: 1, prompt_tokens: 400, max_tokens: 300, block_hashes: vec![] });
        e.submit(NewRequest { id: 2, prompt_tokens: 400, max_tokens: 300, block_hashes: vec![] });
        let mut produced = 0;
        while let Some(step) = e.step() {
            produced += step.tokens.len();
        }
        assert!(e.counters.preemptions > 0);
        assert_eq!(produced, 600, "preempted requests still finish with all their tokens");
    }

    /// Runs `e` until request `id` yields its first token; returns the time taken.
    fn time_to_first_token(e: &mut Engine, id: RequestId) -> f64 {
        let mut t = 0.0;
        while let Some(step) = e.step() {
            t += step.duration_ms;
            if step.tokens.iter().any(|tok| tok.id == id && tok.index == 1) {
                return t;
            }
        }
        panic!("request {id} never produced a token");
    }

    #[test]
    fn prefix_cache_hit_cuts_ttft() {
        use headroom_protocol::tokens::{estimate_tokens, prefix_block_hashes};
        let system = "You are a helpful assistant. ".repeat(250); // ~1.8k tokens shared
        let prompt = |q: &str| format!("{system}{q}");
        let req = |id, text: &str| NewRequest {
            id,
            prompt_tokens: estimate_tokens(text),
            max_tokens: 2,
            block_hashes: prefix_block_hashes(text, usize::MAX),
        };
        let mut e = Engine::new(Profile::h100());
        let first = prompt("What is the capital of France?");
        e.submit(req(1, &first));
        let cold = time_to_first_token(&mut e, 1);
        while e.step().is_some() {}
        let second = prompt("How tall is the Eiffel tower, in metres?");
        e.submit(req(2, &second));
        let warm = time_to_first_token(&mut e, 2);
        assert!(warm < cold / 3.0, "cached system prompt: {warm:.1} ms vs {cold:.1} ms cold");
        let mut last = None;
        while let Some(step) = e.step() {
            last = step.tokens.last().copied().or(last);
        }
        let cached = last.map(|t| t.cached_tokens).unwrap_or(0);
        assert!(cached >= 1700 && cached < estimate_tokens(&second), "cached tokens {cached}");
        assert_eq!(e.counters.prefix_hits, u64::from(cached));
        assert_eq!(e.counters.prefix_queries, u64::from(estimate_tokens(&first) + estimate_tokens(&second)));
    }

    #[test]
    fn long_prefill_slows_running_decodes() {
        let mut e = Engine::new(Profile::h100());
        for id in 0..64 {
            e.submit(NewRequest { id, prompt_tokens: 2048, max_tokens: 500, block_hashes: vec![] });
        }
        let mut step = e.step().unwrap_or_else(|| unreachable!());
        while step.tokens.len() < 64 {
            step = e.step().unwrap_or_else(|| unreachable!());
        }
        let decode_only = e.step().map(|s| s.duration_ms).unwrap_or(0.0);
        e.submit(NewRequest { id: 99, prompt_tokens: 2048, max_tokens: 5, block_hashes: vec![] });
        let shared = e.step().map(|s| s.duration_ms).unwrap_or(0.0);
        assert!(shared > decode_only * 3.0, "decode step {decode_only:.1} ms, with a 2k prefill {shared:.1} ms");
        assert!(
            (shared - 63.0).abs() / 63.0 < 0.15,
            "calibration: ~63 ms when a 2k chunk joins 64 x 2k decodes, got {shared:.1}"
        );
    }

    #[test]
    fn abort_removes_request() {
        let mut e = Engine::new(Profile::h100());
        e.submit(NewRequest { id: 7, prompt_tokens: 10, max_tokens: 100, block_hashes: vec![] });
        e.step();
        assert!(e.abort(7));
        assert!(e.is_idle());
        assert!(!e.abort(7));
    }
}
