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
use std::sync::Arc;

use headroom_filter_core::FilterConfig;

/// Starts `workers` workers, each with its own VM configured from `config`, calling the
/// predictor clusters at `clusters`; returns what the routes share, its streams held to
/// `limits`.
pub fn start(
    config: &FilterConfig,
    clusters: HashMap<String, String>,
    workers: usize,
    limits: grpc::StreamLimits,
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
    Ok(Arc::new(grpc::Shared::new(senders, stats, limits)))
}

/// A `--predictor NAME=HOST:PORT` argument (a host name is resolved at each new connection,
/// as a Kubernetes Service's is).
pub fn parse_cluster(arg: &str) -> Result<(String, String), String> {
    let (name, address) = arg.split_once('=').ok_or_else(|| format!("{arg:?} is not NAME=HOST:PORT"))?;
    let (host, port) = address.rsplit_once(':').ok_or_else(|| format!("{address:?} is not HOST:PORT"))?;
    let host_ok = !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c));
    if name.is_empty() || !host_ok || port.parse::<u16>().is_err() {
        return Err(format!("{arg:?} is not NAME=HOST:PORT"));
    }
    Ok((name.to_string(), address.to_string()))
}

#[cfg(test)]
mod tests {
    use super::parse_cluster;

    #[test]
    fn a_predictor_is_named_by_host_and_port() {
        assert_eq!(parse_cluster("p=127.0.0.1:9000"), Ok(("p".into(), "127.0.0.1:9000".into())));
        assert_eq!(
            parse_cluster("p=headroom-predictor.llm:9000").map(|(_, a)| a),
            Ok("headroom-predictor.llm:9000".into())
        );
        for bad in ["p", "p=host", "=host:1", "p=:1", "p=host:port", "p=host:70000", "p=a/b:1"] {
            assert!(parse_cluster(bad).is_err(), "{bad}");
        }
    }
}
