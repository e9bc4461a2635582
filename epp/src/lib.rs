//! headroom's endpoint picker (EPP): the Wasm filter's decisions served over Envoy's
//! external processing protocol, the plug every Gateway API Inference Extension gateway
//! (Istio, kgateway, Envoy AI Gateway, GKE) routes an `InferencePool` through.
//!
//! It is one more host of `filter/core`, beside the Wasm adapter: the same `Vm` and `Flow`,
//! the same configuration, the same calls to the predictor; only the way a decision reaches
//! Envoy differs (the pick in `x-gateway-destination-endpoint` and in the `envoy.lb`
//! metadata, a shed as an immediate 429).
//!
//! - `proto`: the ext_proc messages.
//! - `grpc`: the port: streams in, answers out; health; metrics.
//! - `worker`: one VM per worker thread and its streams; steps become answers.
//! - `host`: `filter/core`'s `Host` over one stream.
//! - `calls`: the calls to the predictor.
//! - `stats`: the core's stats on `/metrics`.

pub mod calls;
pub mod grpc;
pub mod host;
pub mod inbox;
pub mod proto;
pub mod stats;
pub mod worker;

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::Arc;

use headroom_filter_core::FilterConfig;

/// Starts `workers` workers, each with its own VM configured from `config`, calling the
/// predictor clusters at `clusters`; returns what the routes share.
pub fn start(
    config: &FilterConfig,
    clusters: HashMap<String, SocketAddr>,
    workers: usize,
) -> anyhow::Result<Arc<grpc::Shared>> {
    for cluster in config.predictor_clusters() {
        anyhow::ensure!(
            clusters.contains_key(&cluster),
            "--predictor: the configuration calls predictor cluster {cluster:?}, and no --predictor {cluster}=ADDRESS says where it is"
        );
    }
    let clusters = Arc::new(clusters);
    let stats = Arc::new(stats::Stats::default());
    let senders = (0..workers.max(1))
        .map(|i| {
            let seed = RandomState::new().hash_one((i, std::process::id()));
            worker::spawn(i, config.clone(), clusters.clone(), stats.clone(), seed)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(grpc::Shared::new(senders, stats)))
}

/// A `--predictor NAME=ADDRESS` argument.
pub fn parse_cluster(arg: &str) -> Result<(String, SocketAddr), String> {
    let (name, address) = arg.split_once('=').ok_or_else(|| format!("{arg:?} is not NAME=ADDRESS"))?;
    let address = address.parse().map_err(|e| format!("{address:?} is not an ip:port address: {e}"))?;
    Ok((name.to_string(), address))
}
