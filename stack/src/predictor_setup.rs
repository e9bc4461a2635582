//! The predictor as the stack configures it: its configuration for a stack's pool, the
//! prior scaled to each simulated GPU as an operator would set it, and the profiles the
//! prior is built from, measured on the servers themselves.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use headroom_loadgen::profile;
use headroom_predictor_config::{Config as PredictorConfig, PoolConfig, ProfilePaths, PRIOR_HARDWARE_SCALE};

use crate::vllm;

/// The predictor's configuration for a stack's pool: scraped every 100 ms, models considered
/// for retraining every 2 s, tiers judged on `objective`; on simulated servers (`simulated`:
/// their time scale) the prior scaled to each profile as an operator would set it. What the
/// stack writes for predictor-svc, and what the simulated-time benchmark builds its predictor
/// from (`headroom-bench sim`).
pub fn predictor_config(
    pool: PoolConfig,
    objective: &str,
    profiles: &[String],
    simulated: Option<f64>,
) -> PredictorConfig {
    let mut config = PredictorConfig::new(vec![pool]);
    config.scrape_interval_ms = 100;
    config.model.retrain_interval_ms = 2000;
    config.model.objective = objective.to_string();
    if let Some(time_scale) = simulated {
        prior_scale_as_an_operator_would(&mut config, profiles, time_scale);
    }
    config
}

/// The analytic prior's speed of each simulated GPU, as an operator of this fleet would set
/// `model.prior_hardware_scale`: the simulated A100 runs 1.75x (decode) to 2.7x (prefill) slower
/// than the H100 the prior is calibrated on (docs/simulator.md), and the prefill's 2.7 is the
/// one to give it. Under load the prior's TPOT is set by the share of time prompts take, whose
/// slope is the prefill cost; an idle decode's error is a constant factor, which the live
/// correction takes out, and a wrong slope is not (with 2.0: azure's interactive class at 160
/// req/s 89.1% against 90.3%, docs/notebook/benchmark.md "The prior at the simulator's speed"). A simulator at
/// `--time-scale` s runs every GPU 1/s times slower in wall time, which is all the predictor
/// sees. Without the time scale, at 0.25x every engine term of the prior was 4x under, which
/// the live correction's factor absorbs, but its prefill share (the wall-time rate of prompt
/// tokens times a batched token's cost) was 4x under too, which no factor restores. Held within
/// what the predictor accepts (`PRIOR_HARDWARE_SCALE`): the stacks that run the simulator 100 or
/// 1000 times off real time measure the gateway, not predictions.
fn prior_scale_as_an_operator_would(config: &mut PredictorConfig, profiles: &[String], time_scale: f64) {
    for profile in profiles {
        let gpu = if profile == "a100" { 2.7 } else { 1.0 };
        let scale = (gpu / time_scale).clamp(*PRIOR_HARDWARE_SCALE.start(), *PRIOR_HARDWARE_SCALE.end());
        if scale != 1.0 {
            config.model.prior_hardware_scale.insert(profile.clone(), scale);
        }
    }
}

/// Profiles the first server of each hardware class with `headroom-profile`'s sweep, on the
/// idle fleet, into `dir` (`<class>-ttft.json`, `<class>-tpot.json`; a simulated class as
/// `<class>-<scale>x-...`), and returns the predictor's `model.prior_profiles` for them.
///
/// A simulated class's costs are the simulator's constants at its time scale: its profile
/// is reused while it is newer than the simulator binary (an operator profiles a GPU type
/// once too), so a benchmark starting a stack per router pays the sweep once per class and
/// speed. A real engine is measured at every start: the host it shares may be busier.
pub(crate) fn profile_servers(
    servers: &[(SocketAddr, String)],
    model: &str,
    dir: &Path,
    simulated: Option<(f64, &Path)>,
) -> anyhow::Result<BTreeMap<String, ProfilePaths>> {
    let mut out = BTreeMap::new();
    let runtime = tokio::runtime::Runtime::new()?;
    for (server, class) in servers {
        if out.contains_key(class) {
            continue;
        }
        let name = match simulated {
            Some((scale, _)) => format!("{class}-{scale}x"),
            None => class.clone(),
        };
        let (ttft, tpot) = (dir.join(format!("{name}-ttft.json")), dir.join(format!("{name}-tpot.json")));
        if let Some((_, binary)) = simulated {
            if [&ttft, &tpot].iter().all(|file| newer_than(file, binary)) {
                out.insert(class.clone(), ProfilePaths { ttft, tpot });
                continue;
            }
        }
        let url = format!("http://{server}");
        let (_, context) = runtime.block_on(profile::served(&url))?;
        let sweep = profile::Sweep::for_engine(context, vllm::MAX_NUM_SEQS);
        let profiled = runtime.block_on(profile::run(&url, model, &sweep, |_| {}))?;
        let (ttft, tpot) = profile::write(&profiled, dir, &name)?;
        out.insert(class.clone(), ProfilePaths { ttft, tpot });
    }
    Ok(out)
}

/// Whether `file` exists and was written after `than` was.
fn newer_than(file: &Path, than: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    matches!((modified(file), modified(than)), (Some(f), Some(t)) if f > t)
}

/// The model a fleet serves: the first of `/v1/models` of the first server that answers.
pub(crate) fn served_model(servers: &[SocketAddr]) -> anyhow::Result<String> {
    let runtime = tokio::runtime::Runtime::new()?;
    for s in servers {
        if let Ok((model, _)) = runtime.block_on(profile::served(&format!("http://{s}"))) {
            return Ok(model);
        }
    }
    anyhow::bail!(
        "no server of {servers:?} answered /v1/models with a model: are they OpenAI-compatible model servers?"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prior_runs_each_gpu_at_its_wall_time_speed() {
        let profiles: Vec<String> = ["h100", "a100", "h100"].map(String::from).into();
        let mut config = PredictorConfig::new(Vec::new());
        prior_scale_as_an_operator_would(&mut config, &profiles, 1.0);
        assert_eq!(config.model.prior_hardware_scale.into_iter().collect::<Vec<_>>(), [("a100".to_string(), 2.7)]);
        let mut config = PredictorConfig::new(Vec::new());
        prior_scale_as_an_operator_would(&mut config, &profiles, 0.25);
        let scales = config.model.prior_hardware_scale;
        assert_eq!((scales["h100"], scales["a100"]), (4.0, 10.8));
        // The gateway's stacks run the simulator far off real time: the scale stays one the
        // predictor starts with.
        for time_scale in [0.01, 1000.0] {
            let mut config = PredictorConfig::new(Vec::new());
            prior_scale_as_an_operator_would(&mut config, &profiles, time_scale);
            assert!(config.model.prior_hardware_scale.values().all(|s| PRIOR_HARDWARE_SCALE.contains(s)));
        }
    }
}
