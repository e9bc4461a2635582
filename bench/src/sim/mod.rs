//! `headroom-bench sim`: the benchmark's ladders in simulated time. Each router's fleet is
//! a [`world::World`]: the load generator's requests, the filter's decisions
//! (`filter/core`), the predictor's (`predictor-core`, flow control and training included)
//! and the simulator's engines, composed in one process on one clock, with what Envoy and
//! the network add modelled as delays ([`world::DELAYS`]). The ladder, the repeats, the
//! cliffs, the report and the charts are the real benchmark's ([`crate::run_on`]); only
//! where a fleet runs differs ([`SimLab`] against [`crate::StackLab`]). docs/benchmark.md
//! says what it does not model and how far it agrees with the real bench.

pub mod envoy;
pub mod headroom;
pub mod servers;
pub mod world;

use headroom_filter_core::FilterConfig;
use headroom_loadgen::runner;
use std::collections::BTreeMap;
use std::path::Path;

use headroom_predictor_config::{PoolConfig, ProfilePaths};
use headroom_predictor_core::config::Config;
use headroom_stack::{Engine, Router};

use crate::progress::Progress;
use crate::summary::Summary;
use crate::{
    measured_step, print_step, requests_file, step_work, warm_up, write_requests, BenchOptions, Contender, Ladder,
    Measure, LONGEST_REQUEST_S,
};
use world::{Balancer, Gateway, Setup, World};

/// What the results record as a simulated-time workload's engine.
pub use crate::results::SIM_ENGINE as ENGINE;

/// Envoy's worker threads on the real stack (`EnvoyLaunch::new`): one filter VM each.
const ENVOY_WORKERS: usize = 2;

/// The seed of a world's own random picks (plain Envoy's balancers, the filter VMs'):
/// fixed, so a run is the same for the same traffic.
const WORLD_SEED: u64 = 0x5eed;

/// The simulated-time lab.
pub struct SimLab<'a> {
    pub opts: &'a BenchOptions,
    /// Ladders measured side by side.
    pub threads: usize,
    /// Write every measurement's per-request outcomes under `requests/` (`analyze` reads
    /// them): off by default, a full run makes thousands.
    pub keep_requests: bool,
}

impl crate::Lab for SimLab<'_> {
    fn start<'a>(
        &'a self,
        c: &'a Contender,
        workload: &'a str,
        ladder: &'a Ladder,
        progress: &'a Progress,
    ) -> anyhow::Result<Box<dyn Measure + 'a>> {
        let mut world = World::new(setup(c, ladder, &self.opts.run_dir.join("profiles"))?)?;
        if let Some(warm) = warm_up(self.opts, c, workload, ladder)? {
            world.run(&warm, warm.len())?;
        }
        Ok(Box::new(SimFleet { lab: self, contender: c, workload, ladder, progress, world }))
    }

    fn workers(&self) -> usize {
        self.threads
    }

    fn engine(&self) -> Option<String> {
        Some(ENGINE.to_string())
    }
}

/// The simulated classes whose costs the analytic prior's constants describe (the A100's
/// scaled, `headroom_stack::predictor_setup::predictor_config`): every other class's prior is its profile
/// ([`prior_profiles`]).
const ANALYTIC_CLASSES: [&str; 2] = ["h100", "a100"];

/// What a world is built from for `c` on the ladder's fleet: plain Envoy's balancer, or the
/// filter configured as the real bench configures it (the stack's defaults and
/// `crate::plugin`) and the predictor as the stack writes its configuration. Profiles of the
/// classes that need one are written under `profiles_dir`.
pub fn setup(c: &Contender, ladder: &Ladder, profiles_dir: &Path) -> anyhow::Result<Setup> {
    let time_scale = ladder.time_scale;
    let gateway = match c.router {
        Router::RoundRobin => Gateway::Envoy(Balancer::RoundRobin),
        Router::LeastRequest => Gateway::Envoy(Balancer::LeastRequest),
        Router::StickySession => Gateway::Envoy(Balancer::SessionHash),
        Router::Headroom | Router::HeadroomFilterSkipped | Router::Epp => {
            let mut plugin = headroom_stack::default_plugin_config();
            plugin.extend(crate::plugin(c, time_scale));
            let filter = FilterConfig::parse(&serde_json::to_vec(&plugin)?).map_err(|e| anyhow::anyhow!("{e}"))?;
            let addresses: Vec<String> = (0..ladder.fleet.len()).map(world::address).collect();
            let pool = PoolConfig {
                name: "default".into(),
                endpoints: addresses.clone(),
                kubernetes: Vec::new(),
                inference_pool: Vec::new(),
                hardware: addresses.into_iter().zip(ladder.fleet.iter().cloned()).collect(),
                engine: headroom_predictor_config::engine::DEFAULT_ENGINE.into(),
            };
            let mut predictor =
                headroom_stack::predictor_setup::predictor_config(pool, c.objective, &ladder.fleet, Some(time_scale));
            // Trained for every router that runs the predictor, as on the real stack: even a
            // router that does not route on predictions (llm-d's default) reads the books,
            // whose prompt tokens leave at each request's predicted TTFT.
            if !c.train {
                predictor.model.train = false;
            }
            predictor.model.prior_profiles = prior_profiles(&ladder.fleet, time_scale, profiles_dir)?;
            // Through its file format, as predictor-svc reads it: the same checks and defaults.
            let predictor = Config::parse(&predictor.to_toml()?)?;
            Gateway::Headroom { filter: Box::new(filter), predictor: Box::new(predictor), workers: ENVOY_WORKERS }
        }
    };
    Ok(Setup {
        profiles: ladder.fleet.clone(),
        time_scale,
        model: Engine::Simulator.model().to_string(),
        timeout_s: LONGEST_REQUEST_S / time_scale,
        target: runner::Target {
            url: String::new(),
            model: Engine::Simulator.model().to_string(),
            slo_headers: true,
            prediction_based: c.prediction_based,
            timeout: std::time::Duration::from_secs_f64(LONGEST_REQUEST_S / time_scale),
        },
        gateway,
        seed: WORLD_SEED,
    })
}

/// The prior of each class of `fleet` outside [`ANALYTIC_CLASSES`]: its engine swept alone
/// at `time_scale` ([`servers::swept`]), as an operator profiles a GPU type before serving on
/// it, written under `dir` for the predictor's configuration to name.
fn prior_profiles(fleet: &[String], time_scale: f64, dir: &Path) -> anyhow::Result<BTreeMap<String, ProfilePaths>> {
    let mut out = BTreeMap::new();
    for class in fleet {
        if ANALYTIC_CLASSES.contains(&class.as_str()) || out.contains_key(class) {
            continue;
        }
        let profile = headroom_sim::profile::Profile::by_name(class)
            .ok_or_else(|| anyhow::anyhow!("no simulated profile named {class:?}"))?;
        let (ttft, tpot) = servers::swept(&profile, time_scale);
        std::fs::create_dir_all(dir)?;
        let name = format!("{class}-{time_scale}x");
        let paths =
            ProfilePaths { ttft: dir.join(format!("{name}-ttft.json")), tpot: dir.join(format!("{name}-tpot.json")) };
        std::fs::write(&paths.ttft, serde_json::to_string_pretty(&ttft)?)?;
        std::fs::write(&paths.tpot, serde_json::to_string_pretty(&tpot)?)?;
        out.insert(class.clone(), paths);
    }
    Ok(out)
}

/// One router's world on one workload, as the ladder measures it.
struct SimFleet<'a> {
    lab: &'a SimLab<'a>,
    contender: &'a Contender,
    workload: &'a str,
    ladder: &'a Ladder,
    progress: &'a Progress,
    world: World,
}

impl Measure for SimFleet<'_> {
    fn measure(&mut self, rate: f64, seed: u64, run: u32) -> anyhow::Result<Summary> {
        let step_s = self.lab.opts.step_s;
        let (work, measured) = step_work(self.workload, seed, rate, run, step_s, self.ladder)?;
        let outcomes = self.world.run(&work, measured)?;
        let (outcomes, s) = measured_step(outcomes, self.ladder, step_s);
        print_step(self.workload, self.contender.name, rate, seed, &s, self.progress);
        if self.lab.keep_requests {
            let file = requests_file(self.workload, self.contender.name, rate, seed);
            write_requests(&self.lab.opts.out, &file, &outcomes)?;
        }
        Ok(s)
    }
}

/// A fleet given as `h100:6,a100:2` (or one profile per entry, `h100,h100,a100`): one
/// profile name per server.
pub fn parse_fleet(text: &str) -> anyhow::Result<Vec<String>> {
    let mut fleet = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, count) = match part.split_once(':') {
            Some((name, n)) => {
                let n: usize =
                    n.trim().parse().map_err(|_| anyhow::anyhow!("--fleet: {part:?}: the count must be a number"))?;
                (name.trim(), n)
            }
            None => (part, 1),
        };
        anyhow::ensure!(
            headroom_sim::profile::Profile::by_name(name).is_some(),
            "--fleet: unknown profile {name:?} ({})",
            headroom_sim::profile::Profile::NAMES.join(", ")
        );
        fleet.extend(std::iter::repeat_n(name.to_ascii_lowercase(), count));
    }
    anyhow::ensure!(!fleet.is_empty(), "--fleet: no servers in {text:?}");
    Ok(fleet)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{Lab, CONTENDERS};
    use headroom_loadgen::runner::Outcome;

    fn contender(name: &str) -> &'static Contender {
        CONTENDERS.iter().find(|c| c.name == name).unwrap()
    }

    fn opts() -> BenchOptions {
        BenchOptions {
            engine: Engine::Simulator,
            workloads: vec!["mixed".into()],
            rates: None,
            trace_window: None,
            step_s: 6.0,
            lead_in_s: Some(2.0),
            warmup_s: 4.0,
            profiles: None,
            time_scale: Some(1.0),
            routers: Vec::new(),
            seeds: 1,
            trace: None,
            run_dir: std::env::temp_dir(),
            out: std::env::temp_dir(),
        }
    }

    /// One overloaded step of `mixed` on an H100 and an A100 (about twice what they hold),
    /// after the warm-up, as the ladder measures it: the outcomes, and the world.
    fn overloaded(c: &Contender) -> (Vec<Outcome>, World) {
        let opts = opts();
        let ladder = Ladder {
            steps: vec![(1, 40.0)],
            window: 1,
            fleet: vec!["h100".into(), "a100".into()],
            time_scale: 1.0,
            lead_in_s: 2.0,
            trace: None,
        };
        let mut world = World::new(setup(c, &ladder, &std::env::temp_dir()).unwrap()).unwrap();
        if let Some(warm) = warm_up(&opts, c, "mixed", &ladder).unwrap() {
            world.run(&warm, warm.len()).unwrap();
        }
        let (work, measured) = step_work("mixed", 11, 40.0, 1, opts.step_s, &ladder).unwrap();
        let outcomes = world.run(&work, measured).unwrap();
        assert_eq!(outcomes.len(), measured, "every measured request has an outcome");
        (outcomes, world)
    }

    /// The reduced simulated bench `make test` runs: each decision comes from the product's
    /// own code, and a run is the same for the same traffic. It fails when a path is
    /// bypassed: flow control's queue (nothing waits and is released), the filter's tiers
    /// or shedding (no tier on a placement, no 429), the destination header (a request
    /// served where the filter did not send it), or the predictor's answers (a fallback).
    #[test]
    fn the_simulated_fleet_decides_with_the_products_own_code() {
        let flow = contender("headroom flow control p90 prior");
        let (outcomes, world) = overloaded(flow);
        let count = |f: &dyn Fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
        let released = count(&|o| o.flow.as_deref() == Some("released") && o.queued_ms.is_some_and(|q| q > 0.0));
        assert!(released > 10, "the flow queue held requests and released them: {released}");
        let shed = count(&|o| o.status == 429 && o.priority < 0);
        assert!(shed > 0 && count(&|o| o.status == 429 && o.priority >= 0) == 0, "only sheddable requests are shed");
        let served = count(&|o| o.status == 200);
        assert!(served > outcomes.len() / 2, "{served} of {} served", outcomes.len());
        let placed = count(&|o| o.status == 200 && o.tier.is_some() && o.chosen.is_some() && o.chosen == o.served_by);
        assert_eq!(placed, served, "every request placed by the filter's tiers, where it chose");
        assert_eq!(world.fallbacks(), 0, "the predictor answered every call in time");
        assert!(outcomes.iter().all(|o| o.ttft_ms.is_some() || o.status != 200 || !o.stream), "streams metered");
        let (again, _) = overloaded(flow);
        assert_eq!(serde_json::to_string(&outcomes).unwrap(), serde_json::to_string(&again).unwrap(), "deterministic");

        // Plain Envoy places without the filter: no tier, nothing shed, nothing queued.
        let (plain, _) = overloaded(contender("envoy least request"));
        assert!(plain.iter().all(|o| o.tier.is_none() && o.status == 200 && o.flow.is_none()));
        let (composite, _) = overloaded(contender("headroom composite"));
        assert!(composite.iter().all(|o| o.tier.as_deref() == Some("composite")), "prediction off: the composite");
    }

    #[test]
    fn the_simulated_lab_names_its_engine() {
        let opts = opts();
        let lab = SimLab { opts: &opts, threads: 1, keep_requests: false };
        assert_eq!(lab.engine().as_deref(), Some(ENGINE));
        assert_eq!(lab.workers(), 1);
    }

    #[test]
    fn a_fleet_reads_as_counts_or_one_by_one_and_refuses_what_it_cannot_simulate() {
        assert_eq!(parse_fleet("h100:2,a100:1").unwrap(), ["h100", "h100", "a100"]);
        assert_eq!(parse_fleet("H100, a100").unwrap(), ["h100", "a100"]);
        assert!(parse_fleet("b200:4").unwrap_err().to_string().contains("unknown profile"));
        assert!(parse_fleet("h100:x").unwrap_err().to_string().contains("count must be a number"));
        assert!(parse_fleet("h100:0").is_err());
    }
}
