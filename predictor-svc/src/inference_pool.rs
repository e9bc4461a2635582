//! Kubernetes discovery from an `InferencePool` (the Gateway API Inference Extension's
//! `inference.networking.k8s.io/v1`): the ready pods its `spec.selector` matches, each
//! on every one of its `spec.targetPorts`, as the endpoint picker of that pool sees them.
//!
//! Two watches per source: the pool object (its selector and ports can change) and the
//! pods of the current selector, restarted when the selector changes. The pods' addresses
//! replace what the source contributed to the pool on every change, so endpoints that stay
//! keep their metrics, prefix cache and requests in flight (as with EndpointSlices).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::watch;

use crate::listing::{publish, Listing};
use crate::state::AppState;
use headroom_predictor_core::config::InferencePoolSource;

/// What of an InferencePool decides its endpoints: the pods' label selector
/// (`k=v,...`, sorted) and the ports each pod serves on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolShape {
    pub selector: String,
    pub ports: Vec<u16>,
}

/// The shape of an InferencePool object, or why it has none: `spec.selector.matchLabels`
/// must name at least one label (an empty selector would take every pod of the namespace)
/// and `spec.targetPorts` at least one port in 1..=65535.
pub fn shape(pool: &serde_json::Value) -> Result<PoolShape, String> {
    let labels: BTreeMap<&str, &str> = pool["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))).collect())
        .unwrap_or_default();
    if labels.is_empty() {
        return Err("spec.selector.matchLabels names no label".into());
    }
    let selector = labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let mut ports: Vec<u16> = pool["spec"]["targetPorts"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| u16::try_from(p["number"].as_u64()?).ok()).filter(|p| *p > 0).collect())
        .unwrap_or_default();
    ports.sort_unstable();
    ports.dedup();
    if ports.is_empty() {
        return Err("spec.targetPorts names no port in 1..=65535".into());
    }
    Ok(PoolShape { selector, ports })
}

/// A pod's serving addresses: `podIP:port` for each port, when the pod is Ready, has an
/// IP and is not being deleted (a terminating pod finishes what it has, takes nothing new).
pub fn pod_addresses(pod: &Pod, ports: &[u16]) -> Vec<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let Some(status) = &pod.status else { return Vec::new() };
    let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
    let Some(ip) = status.pod_ip.as_deref().filter(|ip| ready && !ip.is_empty()) else { return Vec::new() };
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() };
    ports.iter().map(|p| format!("{host}:{p}")).collect()
}

/// The API resource of an InferencePool.
fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool"),
        "inferencepools",
    )
}

/// Follows one source forever: the pool object on one task, its pods on another.
pub async fn watch(
    state: Arc<AppState>,
    client: kube::Client,
    pool: String,
    index: usize,
    source: InferencePoolSource,
) {
    let (shape_tx, shape_rx) = watch::channel(None);
    let pods = tokio::spawn(watch_pods(state, client.clone(), pool.clone(), index, source.clone(), shape_rx));
    watch_pool_object(client, &pool, &source, shape_tx).await;
    pods.abort();
}

/// Publishes the pool object's shape (`None`: deleted, or not a usable shape).
async fn watch_pool_object(
    client: kube::Client,
    pool: &str,
    source: &InferencePoolSource,
    shape_tx: watch::Sender<Option<PoolShape>>,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(client, &source.namespace, &resource());
    let config = watcher::Config::default().fields(&format!("metadata.name={}", source.name));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut seen_in_relist = false;
    while let Some(event) = events.next().await {
        let object = match event {
            Ok(Event::Apply(o) | Event::InitApply(o)) => {
                seen_in_relist = true;
                Some(o)
            }
            Ok(Event::Delete(_)) => None,
            Ok(Event::Init) => {
                seen_in_relist = false;
                continue;
            }
            Ok(Event::InitDone) if seen_in_relist => continue,
            Ok(Event::InitDone) => None, // listed, and not there
            Err(e) => {
                tracing::warn!(pool = %pool, namespace = %source.namespace, inference_pool = %source.name, error = %e,
                    "InferencePool watch failed; retrying");
                continue;
            }
        };
        let shape = match object.map(|o| shape(&o.data)) {
            None => {
                tracing::warn!(pool = %pool, namespace = %source.namespace, inference_pool = %source.name,
                    "InferencePool not found: the pool has no endpoints from it");
                None
            }
            Some(Err(why)) => {
                tracing::warn!(pool = %pool, namespace = %source.namespace, inference_pool = %source.name,
                    problem = %why, "InferencePool not usable: the pool has no endpoints from it");
                None
            }
            Some(Ok(s)) => Some(s),
        };
        shape_tx.send_if_modified(|current| {
            let changed = *current != shape;
            *current = shape;
            changed
        });
    }
}

/// Follows the pods of the current shape; a new shape restarts the watch on its selector.
async fn watch_pods(
    state: Arc<AppState>,
    client: kube::Client,
    pool: String,
    index: usize,
    source: InferencePoolSource,
    mut shapes: watch::Receiver<Option<PoolShape>>,
) {
    let hardware = source.hardware.as_deref().map_or(0, |h| state.core.config.hardware_class(h));
    let described = format!("InferencePool {}/{}", source.namespace, source.name);
    loop {
        let shape = shapes.borrow_and_update().clone();
        let Some(shape) = shape else {
            publish(&state, &pool, index, hardware, Vec::new(), &described);
            if shapes.changed().await.is_err() {
                return;
            }
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &source.namespace);
        let config = watcher::Config::default().labels(&shape.selector);
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut pods = Listing::default();
        loop {
            let event = tokio::select! {
                changed = shapes.changed() => match changed {
                    Ok(()) => break, // a new selector or ports: watch again
                    Err(_) => return,
                },
                event = events.next() => match event {
                    Some(e) => e,
                    None => return,
                },
            };
            match event {
                Ok(event) => {
                    if pods.apply(event, |p| pod_addresses(p, &shape.ports)) {
                        publish(&state, &pool, index, hardware, pods.addresses(), &described);
                    }
                }
                Err(e) => tracing::warn!(pool = %pool, source = %described, selector = %shape.selector, error = %e,
                    "pod watch failed; retrying"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_shape_is_the_sorted_selector_and_ports() {
        let pool = json!({"spec": {"selector": {"matchLabels": {"b": "2", "app": "vllm"}},
            "targetPorts": [{"number": 8001}, {"number": 8000}, {"number": 8000}]}});
        assert_eq!(shape(&pool), Ok(PoolShape { selector: "app=vllm,b=2".into(), ports: vec![8000, 8001] }));
    }

    #[test]
    fn an_empty_selector_or_no_port_is_no_shape() {
        let no_labels = json!({"spec": {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]}});
        assert!(shape(&no_labels).unwrap_err().contains("matchLabels"));
        let no_port = json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 70000}]}});
        assert!(shape(&no_port).unwrap_err().contains("targetPorts"));
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn only_ready_pods_with_an_ip_not_being_deleted_serve_on_every_port() {
        let ready = json!({"metadata": {"name": "a"}, "status": {"podIP": "10.0.0.5",
            "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(pod_addresses(&pod(ready.clone()), &[8000, 8001]), ["10.0.0.5:8000", "10.0.0.5:8001"]);
        let mut unready = ready.clone();
        unready["status"]["conditions"][0]["status"] = json!("False");
        assert!(pod_addresses(&pod(unready), &[8000]).is_empty());
        let mut deleting = ready.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(pod_addresses(&pod(deleting), &[8000]).is_empty());
        let pending =
            json!({"metadata": {"name": "b"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(pod_addresses(&pod(pending), &[8000]).is_empty());
        let v6 = json!({"metadata": {"name": "c"}, "status": {"podIP": "fd00::5",
            "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(pod_addresses(&pod(v6), &[8000]), ["[fd00::5]:8000"]);
    }
}
