//! Per-run numbers of the benchmark and the 90%-attainment capacity of a sweep.

use std::collections::BTreeMap;

use crate::engines::EngineQueue;
use headroom_loadgen::report::quantile;
use headroom_loadgen::runner::Outcome;
use headroom_protocol::RouteSource;
use serde::{Deserialize, Serialize};

/// The attainment the capacity is measured at.
pub const TARGET: f64 = 0.9;

/// A router's ladder stops after a rate where it met fewer SLOs than this, over all requests
/// and over the non-sheddable classes alike ([`ladder_done`]).
pub const STOP_BELOW: f64 = 0.75;

/// What one router did with one workload at one rate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Requests sent.
    pub requests: usize,
    /// Requests per second actually offered (requests / window).
    pub offered_rps: f64,
    /// Share of requests that met both SLOs (shed and failed ones count as misses).
    pub attainment: f64,
    /// Requests per second that met their SLOs.
    pub goodput_rps: f64,
    /// TTFT p50 / p90 / p99 (ms) of successful streaming requests.
    pub ttft_ms: [Option<f64>; 3],
    /// TPOT p50 / p90 / p99 (ms) of successful streaming requests.
    pub tpot_ms: [Option<f64>; 3],
    /// Share of requests shed (429).
    pub shed: f64,
    /// Share of requests that failed otherwise (not 200, not 429).
    pub failed: f64,
    /// Requests served per model server (`x-served-by`, which the local stack's Envoy adds for
    /// vLLM; without it, the endpoint headroom chose).
    pub per_server: BTreeMap<String, usize>,
    /// Attainment of the non-sheddable requests (priority >= 0) alone: what the SLO
    /// classes exist to protect. Shed sheddable requests do not count against it.
    /// (`None` in results written before it existed, or with no such request.)
    #[serde(default)]
    pub critical_attainment: Option<f64>,
    /// The same figures per SLO class (`interactive`, `batch`, `sheddable`, ...).
    #[serde(default)]
    pub per_class: BTreeMap<String, ClassSummary>,
    /// The requests headroom placed in its positive tier (predicted to meet their SLOs where
    /// they went; `x-headroom-tier: positive`) and how many did: how far its "will meet"
    /// can be trusted at this load (`None`: no such request, or older results).
    #[serde(default)]
    pub positive_tier: Option<TierCount>,
    /// The requests placed in the negative tier (predicted to miss wherever they went) and how
    /// many met their SLOs anyway: the other side of the tiers, how pessimistic "will miss"
    /// was; it decides sheds, as a sheddable request predicted to miss everywhere is shed.
    #[serde(default)]
    pub negative_tier: Option<TierCount>,
    /// Times Envoy's circuit breakers held back a request to the model servers during the
    /// measurement (`Stack::gateway_overflow`): non-zero means the gateway's connection cap,
    /// not the routing, set some latencies. Read from Envoy, not from the outcomes, so a
    /// recomputed summary keeps it (`None`: not read, or results written before it existed).
    #[serde(default)]
    pub gateway_overflow: Option<u64>,
    /// Share of the host's CPU time spent busy during the measurement (`host`): near 1 the
    /// host, not the simulated servers, set latencies. Kept like `gateway_overflow`.
    #[serde(default)]
    pub host_cpu_busy: Option<f64>,
    /// Share of the requests headroom placed by its fallback (`x-headroom-tier: fallback`):
    /// in the benchmark the predictor never fails, so a fallback means its answer came too late
    /// (the filter's callout timed out), which is the gateway or the host running out of CPU,
    /// not the routing. `None` for routers that place nothing themselves (plain Envoy).
    #[serde(default)]
    pub fallback: Option<f64>,
    /// TTFT p50 / p90 (ms) of the successful later turns of conversations (turn >= 1), in
    /// the workloads with sessions: a later turn whose conversation is cached where it goes
    /// prefills only its new message, so these show cache placement where the overall TTFT
    /// mixes it with first turns' full prefills (`None`: no sessions, or older results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub later_turn_ttft_ms: Option<[Option<f64>; 2]>,
    /// What the model servers' own metrics said while it ran (`engines`): whether requests
    /// waited in the engines. Kept like `gateway_overflow` (`None`: not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_queue: Option<EngineQueue>,
    /// Each part of the stack's share of the host's CPU while it ran (`headroom_stack::host::
    /// ProcessTimes`: the engines, the servers' API processes, Envoy, the predictor, the load
    /// generator, the rest). Kept like `gateway_overflow` (`None`: not read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_by_part: Option<BTreeMap<String, f64>>,
}

/// Requests placed in one tier, and how many of them met their SLOs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TierCount {
    pub placed: usize,
    pub met: usize,
}

/// One SLO class's share of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClassSummary {
    pub requests: usize,
    /// Share that met both SLOs (shed and failed ones count as misses).
    pub attainment: f64,
    /// Share shed (429).
    pub shed: f64,
}

impl ClassSummary {
    fn of<'a>(outcomes: impl Iterator<Item = &'a Outcome>) -> Option<ClassSummary> {
        let (mut n, mut met, mut shed) = (0usize, 0usize, 0usize);
        for o in outcomes {
            n += 1;
            met += usize::from(o.met_slo());
            shed += usize::from(o.shed());
        }
        (n > 0).then(|| ClassSummary { requests: n, attainment: met as f64 / n as f64, shed: shed as f64 / n as f64 })
    }
}

impl TierCount {
    /// The outcomes whose `x-headroom-tier` names `tier`.
    fn in_tier(outcomes: &[Outcome], tier: RouteSource) -> Option<TierCount> {
        let (mut placed, mut met) = (0, 0);
        for o in outcomes.iter().filter(|o| o.tier.as_deref() == Some(tier.tier())) {
            placed += 1;
            met += usize::from(o.met_slo());
        }
        (placed > 0).then_some(TierCount { placed, met })
    }
}

impl Summary {
    /// Summarizes the outcomes of a `window_s`-second run.
    pub fn of(outcomes: &[Outcome], window_s: f64) -> Summary {
        let n = outcomes.len().max(1) as f64;
        let met = outcomes.iter().filter(|o| o.met_slo()).count() as f64;
        let shed = outcomes.iter().filter(|o| o.shed()).count() as f64;
        let failed = outcomes.iter().filter(|o| o.status != 200 && !o.shed()).count() as f64;
        let ok = || outcomes.iter().filter(|o| o.status == 200);
        let ttft: Vec<f64> = ok().filter_map(|o| o.ttft_ms).collect();
        let tpot: Vec<f64> = ok().filter_map(|o| o.tpot_ms).collect();
        let q = |v: &[f64]| [quantile(v, 0.5), quantile(v, 0.9), quantile(v, 0.99)];
        let later: Vec<f64> = ok().filter(|o| o.turn.is_some_and(|t| t > 0)).filter_map(|o| o.ttft_ms).collect();
        let mut per_server = BTreeMap::new();
        for s in outcomes.iter().filter_map(|o| o.served_by.as_ref().or(o.chosen.as_ref())) {
            *per_server.entry(s.clone()).or_default() += 1;
        }
        let mut classes: Vec<&str> = outcomes.iter().map(|o| o.class.as_str()).collect();
        classes.sort_unstable();
        classes.dedup();
        let per_class = classes
            .into_iter()
            .filter_map(|c| Some((c.to_string(), ClassSummary::of(outcomes.iter().filter(|o| o.class == c))?)))
            .collect();
        Summary {
            requests: outcomes.len(),
            offered_rps: outcomes.len() as f64 / window_s,
            attainment: met / n,
            goodput_rps: met / window_s,
            ttft_ms: q(&ttft),
            tpot_ms: q(&tpot),
            shed: shed / n,
            failed: failed / n,
            per_server,
            critical_attainment: ClassSummary::of(outcomes.iter().filter(|o| o.priority >= 0)).map(|c| c.attainment),
            per_class,
            positive_tier: TierCount::in_tier(outcomes, RouteSource::PredictedPositive),
            negative_tier: TierCount::in_tier(outcomes, RouteSource::PredictedNegative),
            gateway_overflow: None,
            host_cpu_busy: None,
            fallback: outcomes
                .iter()
                .any(|o| o.tier.is_some())
                .then(|| TierCount::in_tier(outcomes, RouteSource::Fallback).map_or(0, |t| t.placed) as f64 / n),
            later_turn_ttft_ms: (!later.is_empty()).then(|| [quantile(&later, 0.5), quantile(&later, 0.9)]),
            engine_queue: None,
            cpu_by_part: None,
        }
    }

    /// The host's CPU outside the engines' own processes and in them, from `cpu_by_part`
    /// (`None`: not read, or no real engine ran: the simulator's servers are no engine's
    /// core). On a CPU host an engine that queues keeps its core busy, so the first is what
    /// could set latencies instead of the routing.
    pub fn cpu_outside_engines(&self) -> Option<(f64, f64)> {
        let parts = self.cpu_by_part.as_ref()?;
        let engines = *parts.get(headroom_stack::host::ENGINES)?;
        Some((parts.values().sum::<f64>() - engines, engines))
    }

    /// Fewest and most requests any server took (a server that took none counts when `servers` says it exists).
    pub fn load_spread(&self, servers: usize) -> (usize, usize) {
        let mut counts: Vec<usize> = self.per_server.values().copied().collect();
        counts.resize(counts.len().max(servers), 0);
        (counts.iter().copied().min().unwrap_or(0), counts.iter().copied().max().unwrap_or(0))
    }
}

/// The highest offered rate that keeps attainment at or above a threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Capacity {
    /// Already under the threshold at the lowest rate tried (that rate).
    Below(f64),
    /// Interpolated between the last rate at or above and the first below.
    At(f64),
    /// Never under the threshold up to the highest rate tried (that rate).
    AtLeast(f64),
}

impl Capacity {
    /// A number to compare and chart (the bound for open-ended results).
    pub fn rps(self) -> f64 {
        match self {
            Capacity::Below(x) | Capacity::At(x) | Capacity::AtLeast(x) => x,
        }
    }

    /// `"< 20.0"`, `"43.5"`, `"≥ 120.0"` req/s.
    pub fn label(self) -> String {
        match self {
            Capacity::Below(x) => format!("< {x:.1}"),
            Capacity::At(x) => format!("{x:.1}"),
            Capacity::AtLeast(x) => format!("≥ {x:.1}"),
        }
    }
}

/// Capacity at `threshold` from `(offered rps, attainment)` points in increasing
/// rate order: the first crossing from at-or-above to below, linearly interpolated.
/// `None` for no points.
pub fn capacity(points: &[(f64, f64)], threshold: f64) -> Option<Capacity> {
    let first = points.first()?;
    if first.1 < threshold {
        return Some(Capacity::Below(first.0));
    }
    for pair in points.windows(2) {
        let ((r0, a0), (r1, a1)) = (pair[0], pair[1]);
        if a1 < threshold {
            let share = if a0 > a1 { (a0 - threshold) / (a0 - a1) } else { 0.0 };
            return Some(Capacity::At(r0 + share * (r1 - r0)));
        }
    }
    points.last().map(|p| Capacity::AtLeast(p.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::{Observation, Report, RequestFeatures, Slo};

    /// The benchmark's attainment and the predictor's `headroom_slo_requests` judge the same
    /// requests alike, every case of a goal stated or not and a latency met, missed or
    /// unmeasured: one definition (`Slo::met_by`). A whole response is where they part, by
    /// that definition's named parameter: the benchmark judges it by its deadline, the metric
    /// not at all.
    #[test]
    fn the_benchmark_and_the_slo_metric_agree_on_the_same_requests() {
        let metrics = headroom_predictor_core::metrics::Metrics::default();
        let (mut outcomes, mut id) = (Vec::new(), 0);
        let goals = [Some(100.0), None];
        let ttfts = [Some(50.0), Some(150.0), None];
        let tpots = [Some(5.0), Some(20.0), None];
        for (ttft_goal, tpot_goal) in goals.iter().flat_map(|t| [(*t, Some(10.0)), (*t, None)]) {
            if ttft_goal.is_none() && tpot_goal.is_none() {
                continue;
            }
            for (ttft_ms, tpot_ms) in ttfts.iter().flat_map(|t| tpots.map(|p| (*t, p))) {
                for stream in [true, false] {
                    id += 1;
                    let slo = Slo { ttft_ms: ttft_goal, tpot_ms: tpot_goal };
                    let (tpot_ms, e2e_ms) = if stream { (tpot_ms, 400.0) } else { (None, ttft_ms.unwrap_or(99.0)) };
                    outcomes.push(Outcome {
                        stream,
                        status: 200,
                        max_tokens: 10,
                        slo_ttft_ms: slo.ttft_ms,
                        slo_tpot_ms: slo.tpot_ms,
                        ttft_ms,
                        tpot_ms,
                        e2e_ms,
                        ..Default::default()
                    });
                    let report = Report {
                        pool: "p".into(),
                        request_id: format!("r{id}"),
                        endpoint: "e:1".into(),
                        source: RouteSource::PredictedPositive,
                        ttft_ms,
                        tpot_ms,
                        e2e_ms,
                        output_tokens: Some(10),
                        cached_tokens: None,
                        status: 200,
                        failed_at: None,
                    };
                    let request = RequestFeatures { model: "m".into(), streaming: stream, slo, ..Default::default() };
                    metrics.observed(&Observation { request, ..Observation::unrecorded(report) });
                }
            }
        }
        let counted = |result: &str| -> f64 {
            let text = metrics.render();
            let series = text.lines().filter(|l| l.starts_with("headroom_slo_requests_total{"));
            let of = series.filter(|l| l.contains(&format!("result=\"{result}\"")));
            of.filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
        };
        let streamed: Vec<Outcome> = outcomes.iter().filter(|o| o.stream).cloned().collect();
        let (met, missed) = (counted("met"), counted("missed"));
        // Judged where a goal can be: a TPOT goal alone, with one token, judges nothing (met).
        let unjudged = streamed.iter().filter(|o| o.slo_ttft_ms.is_none() && o.tpot_ms.is_none()).count() as f64;
        assert_eq!(met + missed + unjudged, streamed.len() as f64, "every other streamed request is judged");
        assert_eq!(Summary::of(&streamed, 1.0).attainment, (met + unjudged) / streamed.len() as f64);
        assert!(met > 0.0 && missed > 0.0, "both verdicts are exercised: {met} met, {missed} missed");
        // The whole responses: judged by the benchmark's deadline, some met and some missed.
        let whole: Vec<bool> = outcomes.iter().filter(|o| !o.stream).map(Outcome::met_slo).collect();
        assert!(whole.contains(&true) && whole.contains(&false), "{whole:?}");
    }

    #[test]
    fn capacity_interpolates_the_first_crossing() {
        let pts = [(10.0, 0.99), (20.0, 0.95), (30.0, 0.85), (40.0, 0.95)];
        let Some(Capacity::At(x)) = capacity(&pts, 0.9) else { panic!("no crossing") };
        assert!((x - 25.0).abs() < 1e-9, "{x}");
    }

    #[test]
    fn capacity_is_open_ended_when_never_or_always_below() {
        assert_eq!(capacity(&[(10.0, 0.5), (20.0, 0.4)], 0.9), Some(Capacity::Below(10.0)));
        assert_eq!(capacity(&[(10.0, 0.95), (20.0, 0.91)], 0.9), Some(Capacity::AtLeast(20.0)));
        assert_eq!(capacity(&[], 0.9), None);
        assert_eq!(Capacity::AtLeast(20.0).label(), "≥ 20.0");
    }

    #[test]
    fn capacity_at_exactly_the_threshold_counts_as_kept() {
        assert_eq!(capacity(&[(10.0, 0.9), (20.0, 0.9)], 0.9), Some(Capacity::AtLeast(20.0)));
    }

    fn outcome(status: u16, ttft: f64, served_by: &str) -> Outcome {
        Outcome {
            index: 0,
            class: "interactive".into(),
            at_s: 0.0,
            stream: true,
            prompt_tokens: 10,
            max_tokens: 10,
            slo_ttft_ms: Some(100.0),
            slo_tpot_ms: None,
            priority: 0,
            status,
            ttft_ms: (status == 200).then_some(ttft),
            tpot_ms: None,
            e2e_ms: ttft,
            output_tokens: Some(10),
            served_by: Some(served_by.into()),
            chosen: None,
            tier: None,
            predicted_ttft_ms: None,
            predicted_tpot_ms: None,
            flow: None,
            queued_ms: None,
            error: None,
            ..Default::default()
        }
    }

    #[test]
    fn summary_counts_misses_sheds_and_load() {
        let outs = [outcome(200, 50.0, "a"), outcome(200, 150.0, "a"), outcome(429, 0.0, "b"), outcome(503, 0.0, "b")];
        let s = Summary::of(&outs, 2.0);
        assert_eq!(s.requests, 4);
        assert!((s.attainment - 0.25).abs() < 1e-9);
        assert!((s.goodput_rps - 0.5).abs() < 1e-9);
        assert!((s.shed - 0.25).abs() < 1e-9 && (s.failed - 0.25).abs() < 1e-9);
        assert_eq!(s.load_spread(3), (0, 2));
        assert_eq!(s.ttft_ms[0], Some(50.0));
        assert_eq!(s.fallback, None, "plain Envoy places nothing itself");
        assert_eq!(s.later_turn_ttft_ms, None, "no sessions");
    }

    #[test]
    fn later_turns_ttft_leaves_out_first_turns_and_failures() {
        let turn =
            |t: u32, status: u16, ttft: f64| Outcome { turn: Some(t), session: Some(1), ..outcome(status, ttft, "a") };
        let outs = [turn(0, 200, 2000.0), turn(1, 200, 100.0), turn(2, 200, 300.0), turn(3, 503, 0.0)];
        let s = Summary::of(&outs, 1.0);
        let [p50, p90] = s.later_turn_ttft_ms.expect("sessions");
        assert!(
            p50.is_some_and(|v| (100.0..=300.0).contains(&v)) && p90.is_some_and(|v| v <= 300.0),
            "{p50:?} {p90:?}"
        );
    }

    #[test]
    fn the_fallback_share_counts_every_request_of_a_router_that_tiers() {
        let mut outs = vec![outcome(200, 50.0, "a"); 4];
        outs[0].tier = Some(RouteSource::PredictedPositive.tier().into());
        outs[1].tier = Some(RouteSource::Fallback.tier().into());
        let s = Summary::of(&outs, 2.0);
        assert_eq!(s.fallback, Some(0.25));
    }
}
