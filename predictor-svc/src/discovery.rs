//! Kubernetes discovery: a pool's endpoints from EndpointSlices, watched.
//!
//! Each `[[pool.kubernetes]]` source is one watch (namespace + label selector). The
//! ready addresses of all its slices replace what that source contributed to the pool,
//! so an added, deleted or no-longer-ready endpoint takes effect on the next event.
//! Endpoints that stay keep their metrics, prefix cache and requests in flight.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Api;

use crate::inference_pool;
use crate::listing::{publish, Listing};
use crate::state::AppState;
use headroom_predictor_core::config::{Config, KubernetesSource};

/// The serving addresses (`ip:port`, `[ip6]:port`) of one slice for `source`.
/// Ready means `conditions.ready` is true or unset (the API's meaning of unset).
/// FQDN slices and slices without a usable port give nothing.
pub fn ready_addresses(slice: &EndpointSlice, source: &KubernetesSource) -> Vec<String> {
    let ports = slice.ports.as_deref().unwrap_or_default();
    let port = source.port.map(i32::from).or_else(|| match &source.port_name {
        Some(name) => ports.iter().find(|p| p.name.as_deref() == Some(name.as_str())).and_then(|p| p.port),
        None if ports.len() == 1 => ports[0].port,
        None => None,
    });
    let Some(port) = port.filter(|p| (1..=65535).contains(p)) else { return Vec::new() };
    let ipv6 = match slice.address_type.as_str() {
        "IPv4" => false,
        "IPv6" => true,
        _ => return Vec::new(),
    };
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter())
        .map(|a| if ipv6 { format!("[{a}]:{port}") } else { format!("{a}:{port}") })
        .collect()
}

/// A client for the configured API server, or the in-cluster / kubeconfig one.
pub async fn client(config: &Config) -> anyhow::Result<kube::Client> {
    let kube_config = match &config.kubernetes.api_server {
        Some(url) => kube::Config::new(url.parse().map_err(|e| anyhow::anyhow!("kubernetes.api_server {url:?}: {e}"))?),
        None => kube::Config::infer().await.map_err(|e| anyhow::anyhow!("no Kubernetes API configuration: {e}"))?,
    };
    kube::Client::try_from(kube_config).map_err(|e| anyhow::anyhow!("Kubernetes client: {e}"))
}

/// Starts one watch task per source, EndpointSlice and InferencePool alike; returns their
/// handles (empty when no pool has sources). A pool's sources are numbered in that order,
/// each replacing only its own share of the pool's endpoints.
pub async fn start(state: Arc<AppState>) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let pools = state.core.config.pools.clone();
    if pools.iter().all(|p| p.kubernetes.is_empty() && p.inference_pool.is_empty()) {
        return Ok(Vec::new());
    }
    let client = client(&state.core.config).await?;
    let mut tasks = Vec::new();
    for p in pools {
        let slices = p.kubernetes.len();
        for (index, source) in p.kubernetes.into_iter().enumerate() {
            tasks.push(tokio::spawn(watch(state.clone(), client.clone(), p.name.clone(), index, source)));
        }
        for (i, source) in p.inference_pool.into_iter().enumerate() {
            let task = inference_pool::watch(state.clone(), client.clone(), p.name.clone(), slices + i, source);
            tasks.push(tokio::spawn(task));
        }
    }
    Ok(tasks)
}

/// Follows one source forever (the watcher relists and rewatches with backoff on errors).
async fn watch(state: Arc<AppState>, client: kube::Client, pool: String, index: usize, source: KubernetesSource) {
    let api: Api<EndpointSlice> = Api::namespaced(client, &source.namespace);
    let hardware = source.hardware.as_deref().map_or(0, |h| state.core.config.hardware_class(h));
    let config = watcher::Config::default().labels(&source.selector);
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let described = format!("EndpointSlices {}/{}", source.namespace, source.selector);
    let mut slices = Listing::default();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if slices.apply(event, |s| ready_addresses(s, &source)) {
                    publish(&state, &pool, index, hardware, slices.addresses(), &described);
                }
            }
            Err(e) => tracing::warn!(pool = %pool, source = %described, error = %e, "watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(port: Option<u16>, port_name: Option<&str>) -> KubernetesSource {
        KubernetesSource {
            namespace: "llm".into(),
            selector: "app=vllm".into(),
            port,
            port_name: port_name.map(String::from),
            hardware: None,
        }
    }

    fn slice(json: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(json).unwrap()
    }

    /// A slice as the API server records it (trimmed).
    fn recorded() -> EndpointSlice {
        slice(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "vllm-abc12", "namespace": "llm", "labels": {"kubernetes.io/service-name": "vllm"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.1.5"], "conditions": {"ready": true, "serving": true, "terminating": false}},
                {"addresses": ["10.0.1.6"], "conditions": {"ready": false, "serving": false, "terminating": false}},
                {"addresses": ["10.0.1.7"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                {"addresses": ["10.0.1.8"]}
            ],
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}, {"name": "metrics", "port": 9090}]
        }))
    }

    #[test]
    fn ready_or_unset_endpoints_on_the_named_port() {
        assert_eq!(ready_addresses(&recorded(), &source(None, Some("http"))), ["10.0.1.5:8000", "10.0.1.8:8000"]);
        assert_eq!(ready_addresses(&recorded(), &source(Some(8080), None)), ["10.0.1.5:8080", "10.0.1.8:8080"]);
    }

    #[test]
    fn ambiguous_or_missing_port_and_fqdn_give_nothing() {
        assert!(ready_addresses(&recorded(), &source(None, None)).is_empty(), "two ports, none named");
        assert!(ready_addresses(&recorded(), &source(None, Some("grpc"))).is_empty());
        let mut fqdn = recorded();
        fqdn.address_type = "FQDN".into();
        assert!(ready_addresses(&fqdn, &source(Some(1), None)).is_empty());
    }

    #[test]
    fn ipv6_addresses_are_bracketed_and_a_single_port_needs_no_name() {
        let s = slice(serde_json::json!({
            "metadata": {"name": "v6"}, "addressType": "IPv6",
            "endpoints": [{"addresses": ["fd00::5"]}], "ports": [{"port": 8000}]
        }));
        assert_eq!(ready_addresses(&s, &source(None, None)), ["[fd00::5]:8000"]);
    }
}
