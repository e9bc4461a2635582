//! The prediction error nothing known at dispatch can go under, measured on the
//! engine itself in simulated time.
//!
//! A request's TTFT and TPOT depend on two things the predictor cannot know when it
//! places the request, however good its features:
//!
//! - **the future**: requests that arrive after it share its decode steps (a long
//!   prompt's prefill chunk landing in the middle of a short answer's decode slows
//!   every remaining token of it);
//! - **the step clock**: a request that reaches a busy engine waits for the step in
//!   progress to end; nothing outside the engine says how far into its step it is.
//!
//! [`floor`] plays a fleet of engines through a list of arrivals (the *world*) and, at
//! each request's arrival, replays the fleet from a copy of its exact state under
//! fresh futures (Poisson arrivals at the same rate, sizes drawn from the same
//! distribution, routed by the same policy). The replays give the distribution of
//! that request's latency given everything that was knowable; the best single
//! prediction under MAPE is its 1/y-weighted median, and the floor is that
//! prediction's error against what the world did. With the step clock unknown, the
//! replays also draw where in the step in progress the request arrived.
//!
//! The oracle knows more than any real predictor (every engine's queue, batch and KV,
//! exactly), so the floors are lower bounds: a predictor with dispatch-time features
//! cannot do better on this traffic, whatever it learns. Routing in the world and the
//! replays is least outstanding requests (ties to the first server), a stand-in for
//! headroom's placement at low load; the API overhead of the profile is part of TTFT,
//! as the gateway measures it.

use std::collections::HashMap;

use headroom_protocol::rng::Rng;

use crate::engine::{Engine, NewRequest, RequestId, Token};
use crate::profile::Profile;
use crate::virtual_time::Shape;

/// A request reaching the gateway.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    pub at_ms: f64,
    pub shape: Shape,
}

/// How to measure.
#[derive(Debug, Clone)]
pub struct FloorOptions {
    /// Replayed futures per request.
    pub futures: usize,
    /// Requests arriving before this are not scored (the fleet fills first).
    pub warmup_ms: f64,
    /// Mean arrival rate of the replayed futures (requests per ms).
    pub rate_per_ms: f64,
    /// Sizes of replayed arrivals, drawn uniformly (the workload's distribution).
    pub future_shapes: Vec<Shape>,
    pub seed: u64,
    /// How late a tracking predictor learns of a dispatch or a first token (the
    /// filter's flush tick): [`Record::lagged`] draws its lag uniformly up to this.
    pub report_lag_ms: f64,
}

/// What a predictor that tracks dispatches and first tokens knows of a server.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tracked {
    /// Requests dispatched there and not finished.
    pub in_flight: u32,
    /// Prompt tokens of those not yet past their first token.
    pub prefill_tokens: u64,
    /// Prompt plus output tokens of those requests.
    pub tokens: u64,
}

/// One scored request: its server's state when it arrived, and what it took. For
/// analysis offline (`headroom-stack accuracy --floor N --floor-dump DIR`): how much
/// of the latency the state a predictor can know explains, fresh and a tick late.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record {
    pub server: usize,
    pub shape: Shape,
    /// The engine's running and waiting requests (what a scrape at that instant reads).
    pub running: u32,
    pub waiting: u32,
    /// Exactly as it is.
    pub fresh: Tracked,
    /// As a predictor sees it when dispatches and first tokens reach it a random
    /// share of [`FloorOptions::report_lag_ms`] late.
    pub lagged: Tracked,
    /// Time left of the step in progress when the request reaches the engine (no
    /// predictor outside the engine knows it).
    pub step_left_ms: f64,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
}

/// Mean relative error of the best prediction, one target.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TargetFloor {
    /// Only the future unknown (the oracle knows where in its step each engine is).
    pub future: f64,
    /// The future and the step clock unknown: what a predictor outside the engine faces.
    pub future_and_step: f64,
    /// The same, predicting the replays' median instead (a median-calibrated predictor).
    pub future_and_step_median: f64,
    /// Requests scored.
    pub requests: usize,
}

/// Floors of both targets, and the scored requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Floor {
    pub ttft: TargetFloor,
    pub tpot: TargetFloor,
    pub records: Vec<Record>,
}

/// One server as its driver runs it (`server::driver`): a step's tokens are delivered
/// when it ends; requests that arrive meanwhile join at the next step.
#[derive(Debug, Clone)]
struct Server {
    engine: Engine,
    overhead_ms: f64,
    /// Start and end of the step in progress, with the tokens it delivers at its end.
    step: Option<(f64, f64, Vec<Token>)>,
    inbox: Vec<NewRequest>,
    outstanding: usize,
}

impl Server {
    fn start_step(&mut self, now: f64) {
        for req in self.inbox.drain(..) {
            self.engine.submit(req);
        }
        self.step = self.engine.step().map(|s| (now, now + s.duration_ms, s.tokens));
    }
}

/// What happened to one request.
#[derive(Debug, Clone, Copy)]
struct Life {
    arrived: f64,
    first: Option<f64>,
    tokens: u32,
    done: Option<f64>,
}

impl Life {
    fn ttft(&self) -> Option<f64> {
        self.first.map(|f| f - self.arrived)
    }
    fn tpot(&self) -> Option<f64> {
        match (self.first, self.done) {
            (Some(f), Some(d)) if self.tokens >= 2 => Some((d - f) / f64::from(self.tokens - 1)),
            _ => None,
        }
    }
}

/// A fleet and its requests.
#[derive(Debug, Clone)]
struct Fleet {
    servers: Vec<Server>,
    /// Requests in flight: where they are and how far they got.
    live: HashMap<RequestId, (usize, Life)>,
    /// Requests routed to a server and waiting out its API overhead before they reach
    /// its engine: (when they reach it, server, request).
    pending: Vec<(f64, usize, NewRequest)>,
}

/// Where the next event is.
enum Event {
    /// A request's API overhead is over: it reaches its server's engine.
    Reach(usize),
    /// A server's step ends.
    StepEnd(usize),
}

impl Fleet {
    fn new(profiles: &[Profile]) -> Fleet {
        let servers = profiles
            .iter()
            .map(|p| Server {
                engine: Engine::new(p.clone()),
                overhead_ms: p.api_overhead_ms,
                step: None,
                inbox: Vec::new(),
                outstanding: 0,
            })
            .collect();
        Fleet { servers, live: HashMap::new(), pending: Vec::new() }
    }

    /// Routes a request arriving at the gateway at `at` (least outstanding).
    fn arrive(&mut self, id: RequestId, at: f64, shape: Shape) -> usize {
        let s = (0..self.servers.len()).min_by_key(|&i| self.servers[i].outstanding).unwrap_or(0);
        let server = &mut self.servers[s];
        server.outstanding += 1;
        let req = NewRequest {
            id,
            prompt_tokens: shape.prompt_tokens,
            max_tokens: shape.output_tokens,
            block_hashes: vec![],
        };
        self.pending.push((at + server.overhead_ms, s, req));
        self.live.insert(id, (s, Life { arrived: at, first: None, tokens: 0, done: None }));
        s
    }

    /// The state of `server` as request `id` (just arrived at `a`) finds it.
    fn record(&self, id: RequestId, server: usize, a: &Arrival, arrivals: &[Arrival], lag: f64) -> Record {
        let (mut fresh, mut lagged) = (Tracked::default(), Tracked::default());
        let seen_by = a.at_ms - lag;
        for (other, (s, life)) in &self.live {
            let Some(shape) = arrivals.get(*other as usize).map(|o| o.shape).filter(|_| *s == server && *other != id)
            else {
                continue;
            };
            let (prompt, tokens) =
                (u64::from(shape.prompt_tokens), u64::from(shape.prompt_tokens + shape.output_tokens));
            fresh.in_flight += 1;
            fresh.tokens += tokens;
            if life.first.is_none() {
                fresh.prefill_tokens += prompt;
            }
            // Its dispatch has reached the predictor; its first token has not yet.
            if life.arrived <= seen_by {
                lagged.in_flight += 1;
                lagged.tokens += tokens;
                if life.first.is_none_or(|f| f > seen_by) {
                    lagged.prefill_tokens += prompt;
                }
            }
        }
        let s = &self.servers[server];
        let reach = a.at_ms + s.overhead_ms;
        Record {
            server,
            shape: a.shape,
            running: s.engine.num_running() as u32,
            waiting: (s.engine.num_waiting() + s.inbox.len()) as u32,
            fresh,
            lagged,
            step_left_ms: s.step.as_ref().map_or(0.0, |st| (st.1 - reach).max(0.0)),
            ttft_ms: None,
            tpot_ms: None,
        }
    }

    fn next_event(&self) -> Option<(f64, Event)> {
        let reach = self.pending.iter().enumerate().map(|(i, p)| (p.0, Event::Reach(i)));
        let ends =
            self.servers.iter().enumerate().filter_map(|(i, s)| s.step.as_ref().map(|st| (st.1, Event::StepEnd(i))));
        reach.chain(ends).min_by(|a, b| a.0.total_cmp(&b.0))
    }

    /// Runs events until `until` (exclusive); returns the requests finished, with their lives.
    fn run_until(&mut self, until: f64, finished: &mut Vec<(RequestId, Life)>) {
        while let Some((t, event)) = self.next_event() {
            if t >= until {
                return;
            }
            match event {
                Event::Reach(i) => {
                    let (_, s, req) = self.pending.remove(i);
                    let server = &mut self.servers[s];
                    server.inbox.push(req);
                    if server.step.is_none() {
                        server.start_step(t);
                    }
                }
                Event::StepEnd(s) => {
                    let Some((_, _, tokens)) = self.servers[s].step.take() else { continue };
                    for token in tokens {
                        let Some((_, life)) = self.live.get_mut(&token.id) else { continue };
                        life.first.get_or_insert(t);
                        life.tokens = token.index;
                        if token.last {
                            life.done = Some(t);
                            if let Some((_, life)) = self.live.remove(&token.id) {
                                finished.push((token.id, life));
                            }
                            self.servers[s].outstanding = self.servers[s].outstanding.saturating_sub(1);
                        }
                    }
                    self.servers[s].start_step(t);
                }
            }
        }
    }
}

/// The 1/y-weighted median of `values`: the single prediction with the least expected
/// relative error over them.
fn mape_optimal(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let total: f64 = values.iter().map(|v| 1.0 / v).sum();
    let mut acc = 0.0;
    for v in values.iter() {
        acc += 1.0 / v;
        if acc >= total / 2.0 {
            return *v;
        }
    }
    values.last().copied().unwrap_or(0.0)
}

/// Replays `fleet` (request `id` just arrived at `at`) under a fresh future until `id`
/// finishes; with `step_unknown`, the step in progress on its server when it reaches
/// the engine ends at a random point of that step's length instead of when it did.
fn replay(
    mut fleet: Fleet,
    id: RequestId,
    at: f64,
    opts: &FloorOptions,
    rng: &mut Rng,
    step_unknown: bool,
) -> Option<Life> {
    let (server, reach) = fleet.pending.iter().find(|p| p.2.id == id).map(|p| (p.1, p.0))?;
    let mut clock_drawn = !step_unknown;
    let mut next_id = RequestId::MAX / 2;
    let mut finished = Vec::new();
    let gap = |rng: &mut Rng| -rng.next_f64().ln() / opts.rate_per_ms;
    let mut t = at + gap(rng);
    // Far enough for the longest request of these workloads on a loaded server.
    let horizon = at + 600_000.0;
    loop {
        let t_next = t.min(horizon);
        if !clock_drawn && t_next > reach {
            // Until it reaches its engine nothing new can: every later arrival reaches
            // its engine after it, so the step in progress then is the world's.
            fleet.run_until(reach, &mut finished);
            if let Some(step) = fleet.servers[server].step.as_mut() {
                let length = step.1 - step.0;
                step.1 = reach + rng.next_f64() * length;
                step.0 = step.1 - length;
            }
            clock_drawn = true;
        }
        fleet.run_until(t_next, &mut finished);
        if let Some((_, life)) = finished.iter().find(|(f, _)| *f == id) {
            return Some(*life);
        }
        if t >= horizon {
            return None;
        }
        let pick = (rng.next_u64() % opts.future_shapes.len().max(1) as u64) as usize;
        if let Some(shape) = opts.future_shapes.get(pick) {
            fleet.arrive(next_id, t, *shape);
            next_id += 1;
        }
        t += gap(rng);
    }
}

/// Running means of the three floors of one target.
#[derive(Debug, Default)]
struct Sums {
    future: f64,
    future_and_step: f64,
    median: f64,
    n: usize,
}

impl Sums {
    fn add(&mut self, actual: f64, known_step: &mut [f64], unknown_step: &mut [f64]) {
        if actual <= 0.0 || known_step.is_empty() || unknown_step.is_empty() {
            return;
        }
        let err = |p: f64| (actual - p).abs() / actual;
        self.future += err(mape_optimal(known_step));
        self.future_and_step += err(mape_optimal(unknown_step));
        self.median += err(crate::virtual_time::quantile(unknown_step, 0.5));
        self.n += 1;
    }
    fn floor(&self) -> TargetFloor {
        let n = self.n.max(1) as f64;
        TargetFloor {
            future: self.future / n,
            future_and_step: self.future_and_step / n,
            future_and_step_median: self.median / n,
            requests: self.n,
        }
    }
}

/// The floors of TTFT and TPOT for `arrivals` (sorted by time) on a fleet of `profiles`.
pub fn floor(profiles: &[Profile], arrivals: &[Arrival], opts: &FloorOptions) -> Floor {
    let mut world = Fleet::new(profiles);
    let mut rng = Rng::new(opts.seed);
    // Per scored request: the replays' values, [TTFT, TPOT] x [step known, unknown].
    let mut replays: HashMap<RequestId, [[Vec<f64>; 2]; 2]> = HashMap::new();
    let mut done: Vec<(RequestId, Life)> = Vec::new();
    let mut records: HashMap<RequestId, Record> = HashMap::new();
    for (i, a) in arrivals.iter().enumerate() {
        let id = i as RequestId;
        world.run_until(a.at_ms, &mut done);
        let server = world.arrive(id, a.at_ms, a.shape);
        if a.at_ms < opts.warmup_ms {
            continue;
        }
        let lag = rng.next_f64() * opts.report_lag_ms;
        records.insert(id, world.record(id, server, a, arrivals, lag));
        let mut values: [[Vec<f64>; 2]; 2] = Default::default();
        for _ in 0..opts.futures {
            // The same future for both, so they differ by the step clock alone.
            let seed = rng.next_u64();
            for (k, step_unknown) in [false, true].into_iter().enumerate() {
                let mut future = Rng::new(seed);
                if let Some(life) = replay(world.clone(), id, a.at_ms, opts, &mut future, step_unknown) {
                    values[0][k].extend(life.ttft());
                    values[1][k].extend(life.tpot());
                }
            }
        }
        replays.insert(id, values);
    }
    world.run_until(f64::INFINITY, &mut done);
    let (mut ttft, mut tpot) = (Sums::default(), Sums::default());
    let mut scored = Vec::new();
    for (id, life) in done {
        if let Some(mut r) = records.remove(&id) {
            r.ttft_ms = life.ttft();
            r.tpot_ms = life.tpot();
            scored.push((id, r));
        }
        let Some(values) = replays.get_mut(&id) else { continue };
        let [t, p] = values;
        if let Some(actual) = life.ttft() {
            let [known, unknown] = t;
            ttft.add(actual, known, unknown);
        }
        if let Some(actual) = life.tpot() {
            let [known, unknown] = p;
            tpot.add(actual, known, unknown);
        }
    }
    scored.sort_by_key(|(id, _)| *id);
    Floor { ttft: ttft.floor(), tpot: tpot.floor(), records: scored.into_iter().map(|(_, r)| r).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poisson(rate_per_ms: f64, span_ms: f64, shapes: &[Shape], seed: u64) -> Vec<Arrival> {
        let mut rng = Rng::new(seed);
        let (mut t, mut out) = (0.0, Vec::new());
        loop {
            t += -rng.next_f64().ln() / rate_per_ms;
            if t >= span_ms {
                return out;
            }
            let shape = shapes[(rng.next_u64() % shapes.len() as u64) as usize];
            out.push(Arrival { at_ms: t, shape });
        }
    }

    #[test]
    fn the_weighted_median_minimises_relative_error() {
        let mut v = vec![10.0, 10.0, 100.0];
        assert_eq!(mape_optimal(&mut v), 10.0);
        let mut one = vec![42.0];
        assert_eq!(mape_optimal(&mut one), 42.0);
    }

    #[test]
    fn a_lone_request_on_an_idle_fleet_is_fully_predictable() {
        // Requests so far apart that each finds the fleet idle: nothing is unknown.
        let shape = Shape { prompt_tokens: 500, output_tokens: 20 };
        let arrivals: Vec<Arrival> = (0..5).map(|i| Arrival { at_ms: f64::from(i) * 10_000.0, shape }).collect();
        let opts = FloorOptions {
            futures: 4,
            warmup_ms: 0.0,
            rate_per_ms: 1e-9,
            future_shapes: vec![shape],
            seed: 1,
            report_lag_ms: 0.0,
        };
        let f = floor(&[Profile::h100()], &arrivals, &opts);
        assert_eq!(f.ttft.requests, 5);
        assert!(f.ttft.future_and_step < 1e-9 && f.tpot.future_and_step < 1e-9, "{f:?}");
    }

    #[test]
    fn later_long_prompts_make_short_answers_unpredictable() {
        // Short answers among long prompts: the prefill chunks that land in a decode are
        // the future's, so TPOT has a floor well above zero; the step clock adds to TTFT.
        let shapes =
            [Shape { prompt_tokens: 4000, output_tokens: 30 }, Shape { prompt_tokens: 200, output_tokens: 30 }];
        let rate = 4.0 / 1000.0;
        let arrivals = poisson(rate, 20_000.0, &shapes, 3);
        let opts = FloorOptions {
            futures: 12,
            warmup_ms: 2_000.0,
            rate_per_ms: rate,
            future_shapes: shapes.to_vec(),
            seed: 2,
            report_lag_ms: 100.0,
        };
        let f = floor(&[Profile::h100()], &arrivals, &opts);
        assert!(f.tpot.requests > 40, "{f:?}");
        assert!(f.tpot.future > 0.05, "the future's prefills must show in TPOT: {f:?}");
        assert!(f.ttft.future_and_step > f.ttft.future + 0.01, "the step clock must show in TTFT: {f:?}");
        assert_eq!(f.records.len(), f.ttft.requests);
        let late = f.records.iter().filter(|r| r.lagged.in_flight < r.fresh.in_flight).count();
        assert!(late > 0, "a 100 ms report lag hides some dispatches");
        assert!(f.records.iter().all(|r| r.lagged.in_flight <= r.fresh.in_flight));
    }
}
