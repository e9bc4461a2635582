//! The routers a benchmark compares, by name, and the filter configuration each runs.

use serde_json::Map;

use headroom_stack::Router;

/// One router setup.
#[derive(Debug, Clone, Copy)]
pub struct Contender {
    pub name: &'static str,
    pub router: Router,
    /// `x-prediction-based-scheduling` sent by the clients (headroom only).
    pub prediction_based: Option<bool>,
    /// Filter `strategy` for the positive tier (headroom only).
    pub strategy: &'static str,
    /// Filter `default_profile`: how requests without SLO routing are placed (headroom only).
    pub default_profile: &'static str,
    /// A router users run today (what headroom has to beat).
    pub baseline: bool,
    /// Filter `flow_control`: SLO-routed requests without headroom wait in the predictor's
    /// queue (docs/flow-control.md), with a dispatch horizon of [`FLOW_HORIZON_MS`].
    pub flow_control: bool,
    /// The predictor's training objective (headroom only): `mean`, or `p90` (tiers judged
    /// on the 90th percentile).
    pub objective: &'static str,
    /// The predictor's `model.train`: `false` serves the analytic prior with the live
    /// correction, no trained model (headroom only).
    pub train: bool,
}

/// The flow-control contender's dispatch horizon (engine time): the filter's default, about
/// a third of the workloads' tightest TTFT SLO (interactive, 400 ms).
pub const FLOW_HORIZON_MS: f64 = 150.0;

/// The longest a flow-control contender's request waits in the queue (engine time): the
/// filter's default `flow_max_wait_ms`, 10 s. Scaled like the horizon: left at 10 s of wall
/// time, azure at 0.25x held a batch request (TTFT SLO 4 s) at most 2.5 simulated seconds,
/// where a deployment at real time holds it until its deadline. In wall time it is capped at
/// the predictor's own longest wait (its `[flow] max_wait_ms`, 60 s, which the stack leaves at
/// its default): the queue holds nothing longer, and a very slow run (under 1/60x) would
/// otherwise ask for more than the filter accepts (600 s).
pub const FLOW_MAX_WAIT_MS: f64 = 10_000.0;

/// How long the filter waits for the predictor's answer before the fallback places the
/// request (engine time): the filter's default, 50 ms. Set like the SLOs, in wall time
/// divided by the time scale: on a slowed run the client's latencies are scaled back to
/// engine time, so a request that waited 100 ms of wall time for its prediction at 0.15x
/// lost 15 ms. Left at 50 ms of wall time, the timeout sent requests to the fallback
/// whenever this host's Envoy, metering thousands of slowed streams, answered late
/// (docs/notebook/performance.md, "Streaming"): the host's CPU in the result, which the slowed
/// run is there to keep out.
pub const PREDICTOR_TIMEOUT_MS: f64 = 50.0;

/// Headroom's SLO routing with the filter's defaults; the other headroom contenders are it
/// with one setting changed.
pub(crate) const PREDICTED: Contender = Contender {
    name: "headroom predicted",
    router: Router::Headroom,
    prediction_based: Some(true),
    strategy: "most",
    default_profile: "composite",
    baseline: false,
    flow_control: false,
    objective: "mean",
    train: true,
};

/// Flow control on the p90 objective: requests wait at the gateway until an endpoint is
/// 90% sure to meet them (docs/notebook/flow-control.md, "Flow control on the p90 objective").
pub(crate) const FLOW_P90: Contender =
    Contender { name: "headroom flow control p90", flow_control: true, objective: "p90", ..PREDICTED };

/// Plain Envoy balancing as `router` does: a baseline without the filter (the filter's and
/// the predictor's settings mean nothing to it).
pub(crate) const fn plain_envoy(name: &'static str, router: Router) -> Contender {
    Contender {
        name,
        router,
        prediction_based: None,
        strategy: "",
        default_profile: "",
        baseline: true,
        flow_control: false,
        objective: "mean",
        train: true,
    }
}

/// Every router the benchmark knows, baselines first.
pub const CONTENDERS: [Contender; 11] = [
    plain_envoy("envoy round robin", Router::RoundRobin),
    plain_envoy("envoy least request", Router::LeastRequest),
    // Sticky sessions: a consistent hash of the client's `x-session-id`, what operators run
    // for chat so a conversation's turns find their prefix cached. On traffic without
    // sessions it is a random pick.
    plain_envoy("envoy sticky sessions", Router::StickySession),
    Contender {
        name: "headroom composite",
        router: Router::Headroom,
        prediction_based: Some(false),
        strategy: "least",
        default_profile: "composite",
        baseline: true,
        flow_control: false,
        objective: "mean",
        train: true,
    },
    // llm-d's default scheduler (prefix-cache affinity filter + token-load scorer), run by
    // the filter as its `prefix_load` profile (filter/core/src/prefix_load.rs).
    Contender {
        name: "llm-d prefix + token load",
        router: Router::Headroom,
        prediction_based: Some(false),
        strategy: "least",
        default_profile: "prefix_load",
        baseline: true,
        flow_control: false,
        objective: "mean",
        train: true,
    },
    PREDICTED,
    Contender { name: "headroom predicted, least", strategy: "least", ..PREDICTED },
    Contender { name: "headroom flow control", flow_control: true, ..PREDICTED },
    // Tiers on the 90th percentile: a positive placement is one the predictor is 90% sure
    // of, and a sheddable request nowhere that sure is shed (docs/benchmark.md, "p90").
    Contender { name: "headroom predicted p90", objective: "p90", ..PREDICTED },
    FLOW_P90,
    // The same, served by the analytic prior with the live correction, no trained model
    // (`model.train = false`; docs/notebook/predictor.md, "Trained models past the cliff").
    Contender { name: "headroom flow control p90 prior", train: false, ..FLOW_P90 },
];

/// The routers named in a comma-separated list (`--routers`), in its order. Split on commas
/// alone, "headroom predicted, least" would read as two names and could not be chosen, so each
/// name is matched against [`CONTENDERS`], the longest that ends at a comma or the list's end.
pub fn parse_routers(list: &str) -> anyhow::Result<Vec<String>> {
    let mut rest = list.trim_start_matches([',', ' ']);
    let mut names = Vec::new();
    while !rest.is_empty() {
        let ends_a_name = |n: &str| {
            rest.strip_prefix(n)
                .is_some_and(|after| after.trim_start().is_empty() || after.trim_start().starts_with(','))
        };
        let name = CONTENDERS
            .iter()
            .map(|c| c.name)
            .filter(|n| ends_a_name(n))
            .max_by_key(|n| n.len())
            .ok_or_else(|| unknown_router(rest.split(',').next().unwrap_or(rest).trim()))?;
        names.push(name.to_string());
        rest = rest[name.len()..].trim_start_matches([',', ' ']);
    }
    Ok(names)
}

/// A router name that is none of [`CONTENDERS`], with the names that are.
pub(crate) fn unknown_router(given: &str) -> anyhow::Error {
    let known: Vec<&str> = CONTENDERS.iter().map(|c| c.name).collect();
    anyhow::anyhow!("unknown router {given:?}: one of {known:?}")
}

/// The headroom filter's settings for `contender` on a simulator at `time_scale`. Its
/// durations are wall time, like the SLOs the clients send: engine time divided by the
/// time scale.
pub(crate) fn plugin(contender: &Contender, time_scale: f64) -> Map<String, serde_json::Value> {
    let wall_ms = |engine_ms: f64| serde_json::json!((engine_ms / time_scale).round() as u64);
    let mut plugin = Map::new();
    plugin.insert("strategy".into(), contender.strategy.into());
    // Without SLO routing the filter places by this profile.
    plugin.insert("default_profile".into(), contender.default_profile.into());
    plugin.insert("flow_control".into(), contender.flow_control.into());
    plugin.insert("flow_dispatch_horizon_ms".into(), wall_ms(FLOW_HORIZON_MS));
    let predictor_longest = headroom_predictor_config::FlowConfig::default().max_wait_ms as f64;
    plugin.insert("flow_max_wait_ms".into(), wall_ms(FLOW_MAX_WAIT_MS.min(predictor_longest * time_scale)));
    plugin.insert("predictor_timeout_ms".into(), wall_ms(PREDICTOR_TIMEOUT_MS));
    plugin
}
