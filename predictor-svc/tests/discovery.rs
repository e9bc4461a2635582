//! Kubernetes discovery against a fake API server: the real predictor and the real
//! kube-rs watcher (list, then watch) over 127.0.0.1, fed recorded EndpointSlice objects.
//! Covers add, remove and a readiness flip, and that requests in flight survive on
//! endpoints that stay.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use headroom_predictor::config::Config;
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// What the fake API server holds: the objects of each resource (`endpointslices`, `pods`,
/// `inferencepools`) and a feed of watch events.
struct FakeApi {
    objects: Mutex<HashMap<String, Vec<Value>>>,
    version: Mutex<u64>,
    /// `(resource, watch event line)`.
    events: broadcast::Sender<(String, Value)>,
    /// `(resource, namespace, selector, watch)` of every call, to check what was asked.
    calls: Mutex<Vec<(String, String, String, bool)>>,
}

impl FakeApi {
    fn new() -> Arc<FakeApi> {
        let (events, _) = broadcast::channel(64);
        Arc::new(FakeApi {
            objects: Mutex::new(HashMap::new()),
            version: Mutex::new(1),
            events,
            calls: Mutex::new(Vec::new()),
        })
    }

    /// Applies a change as the API server would and streams it to watchers.
    fn event(&self, resource: &str, kind: &str, mut object: Value) {
        let mut version = self.version.lock().unwrap();
        *version += 1;
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        let name = object["metadata"]["name"].clone();
        let mut objects = self.objects.lock().unwrap();
        let list = objects.entry(resource.to_string()).or_default();
        list.retain(|o| o["metadata"]["name"] != name);
        if kind != "DELETED" {
            list.push(object.clone());
        }
        let _ = self.events.send((resource.to_string(), json!({"type": kind, "object": object})));
    }

    /// Serves `/apis/...` on 127.0.0.1; returns its address.
    async fn serve(self: &Arc<FakeApi>) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", get(endpoint_slices))
            .route("/api/v1/namespaces/{ns}/pods", get(pods))
            .route("/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools", get(inference_pools))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    /// Whether a watch of `resource` with `selector` has been opened.
    fn watching(&self, resource: &str, selector: &str) -> bool {
        self.calls.lock().unwrap().iter().any(|(r, _, s, w)| r == resource && s == selector && *w)
    }
}

/// Whether `object` passes a `labelSelector` (`k=v,...`) and a `fieldSelector` (`metadata.name=x`).
fn selected(object: &Value, labels: &str, fields: &str) -> bool {
    let label_ok = labels.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap();
        object["metadata"]["labels"][k] == v
    });
    let field_ok = fields.strip_prefix("metadata.name=").is_none_or(|name| object["metadata"]["name"] == name);
    label_ok && field_ok
}

async fn endpoint_slices(api: State<Arc<FakeApi>>, ns: Path<String>, q: Query<HashMap<String, String>>) -> Response {
    list_or_watch(api, ns, q, "endpointslices", "discovery.k8s.io/v1", "EndpointSliceList").await
}

async fn pods(api: State<Arc<FakeApi>>, ns: Path<String>, q: Query<HashMap<String, String>>) -> Response {
    list_or_watch(api, ns, q, "pods", "v1", "PodList").await
}

async fn inference_pools(api: State<Arc<FakeApi>>, ns: Path<String>, q: Query<HashMap<String, String>>) -> Response {
    list_or_watch(api, ns, q, "inferencepools", "inference.networking.k8s.io/v1", "InferencePoolList").await
}

/// A list, or (`watch=true`) a stream of the resource's later events that pass the selectors.
async fn list_or_watch(
    State(api): State<Arc<FakeApi>>,
    Path(namespace): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    resource: &'static str,
    api_version: &str,
    list_kind: &str,
) -> Response {
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let labels = q.get("labelSelector").cloned().unwrap_or_default();
    let fields = q.get("fieldSelector").cloned().unwrap_or_default();
    let selector = if fields.is_empty() { labels.clone() } else { fields.clone() };
    if watch {
        // Subscribed before the call is recorded: an event sent once `watching` is true is seen.
        let rx = api.events.subscribe();
        api.calls.lock().unwrap().push((resource.to_string(), namespace, selector, true));
        let stream = futures_util::stream::unfold(rx, move |mut rx| {
            let (labels, fields) = (labels.clone(), fields.clone());
            async move {
                loop {
                    match rx.recv().await {
                        Ok((r, event)) if r == resource && selected(&event["object"], &labels, &fields) => {
                            return Some((Ok::<_, std::io::Error>(event.to_string() + "\n"), rx))
                        }
                        Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        });
        return ([("content-type", "application/json")], Body::from_stream(stream)).into_response();
    }
    api.calls.lock().unwrap().push((resource.to_string(), namespace, selector, false));
    let version = api.version.lock().unwrap().to_string();
    let items: Vec<Value> = api
        .objects
        .lock()
        .unwrap()
        .get(resource)
        .into_iter()
        .flatten()
        .filter(|o| selected(o, &labels, &fields))
        .cloned()
        .collect();
    axum::Json(json!({"apiVersion": api_version, "kind": list_kind,
        "metadata": {"resourceVersion": version}, "items": items}))
    .into_response()
}

/// A recorded EndpointSlice (fields as the API server returns them), on loopback addresses
/// so the predictor's scrapes of them stay on this machine.
fn slice(name: &str, endpoints: &[(&str, bool)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, ready)| {
            json!({"addresses": [ip], "conditions": {"ready": ready, "serving": ready, "terminating": false},
                   "targetRef": {"kind": "Pod", "namespace": "llm", "name": format!("vllm-{ip}")}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "llm", "generateName": "vllm-",
                     "labels": {"kubernetes.io/service-name": "vllm", "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4", "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}]})
}

/// The real predictor on 127.0.0.1 with `config`: its address, its stop, its task.
async fn start_predictor(
    config: Config,
) -> (String, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<anyhow::Result<()>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let predictor = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(headroom_predictor::serve(config, listener, async {
        let _ = stopped.await;
    }));
    (predictor, stop, server)
}

async fn pool_endpoints(predictor: &str) -> Vec<(String, u64)> {
    let body: Value = reqwest::get(format!("http://{predictor}/v1/pools")).await.unwrap().json().await.unwrap();
    let mut out: Vec<(String, u64)> = body["pools"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["address"].as_str().unwrap().to_string(), e["in_flight"].as_u64().unwrap()))
        .collect();
    out.sort();
    out
}

async fn wait_for(predictor: &str, want: &[(&str, u64)]) {
    let want: Vec<(String, u64)> = want.iter().map(|(a, n)| (a.to_string(), *n)).collect();
    let seen = Mutex::new(Vec::new());
    let reached = poll(|| async {
        let now = pool_endpoints(predictor).await;
        let done = now == want;
        *seen.lock().unwrap() = now;
        done
    })
    .await;
    assert!(reached, "pool endpoints: want {want:?}, have {:?}", seen.lock().unwrap());
}

/// Whether `done` comes true within five seconds, asked every 50 ms.
async fn poll<F: std::future::Future<Output = bool>>(done: impl Fn() -> F) -> bool {
    for _ in 0..100 {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_slices_add_remove_and_readiness_flip() {
    let api = FakeApi::new();
    api.event(
        "endpointslices",
        "ADDED",
        slice("vllm-a", &[("127.0.0.11", true), ("127.0.0.12", true), ("127.0.0.13", false)]),
    );
    let fake_addr = api.serve().await;

    let config = Config::parse(&format!(
        "scrape_interval_ms = 50\nscrape_timeout_ms = 50\n[kubernetes]\napi_server = \"http://{fake_addr}\"\n\
         [[pool]]\nname = \"llama\"\n[[pool.kubernetes]]\nnamespace = \"llm\"\n\
         selector = \"kubernetes.io/service-name=vllm\"\nport_name = \"http\"\nhardware = \"h100\"\n"
    ))
    .unwrap();
    let (predictor, stop, server) = start_predictor(config).await;

    // Initial list: the two ready endpoints, not the unready one.
    wait_for(&predictor, &[("127.0.0.11:8000", 0), ("127.0.0.12:8000", 0)]).await;
    let calls = api.calls.lock().unwrap().clone();
    assert!(calls.iter().all(|(_, ns, sel, _)| ns == "llm" && sel == "kubernetes.io/service-name=vllm"), "{calls:?}");

    // A request in flight on .12, tracked by the pool.
    let request = json!({"model": "m", "input_tokens": 100, "streaming": true});
    let dispatch = json!({"dispatches": [{"pool": "llama", "request_id": "r1", "endpoint": "127.0.0.12:8000", "request": request}]});
    let client = reqwest::Client::new();
    let res = client.post(format!("http://{predictor}/v1/dispatch")).json(&dispatch).send().await.unwrap();
    assert_eq!(res.status(), 200);
    wait_for(&predictor, &[("127.0.0.11:8000", 0), ("127.0.0.12:8000", 1)]).await;

    // Add: a second slice (a scale-up) joins the pool.
    api.event("endpointslices", "ADDED", slice("vllm-b", &[("127.0.0.21", true)]));
    wait_for(&predictor, &[("127.0.0.11:8000", 0), ("127.0.0.12:8000", 1), ("127.0.0.21:8000", 0)]).await;

    // Readiness flip: .11 goes unready and .13 becomes ready; .12 keeps its request in flight.
    api.event(
        "endpointslices",
        "MODIFIED",
        slice("vllm-a", &[("127.0.0.11", false), ("127.0.0.12", true), ("127.0.0.13", true)]),
    );
    wait_for(&predictor, &[("127.0.0.12:8000", 1), ("127.0.0.13:8000", 0), ("127.0.0.21:8000", 0)]).await;

    // Remove: the second slice is deleted.
    api.event("endpointslices", "DELETED", slice("vllm-b", &[("127.0.0.21", true)]));
    wait_for(&predictor, &[("127.0.0.12:8000", 1), ("127.0.0.13:8000", 0)]).await;

    // Predictions cover exactly the discovered endpoints.
    let predict = json!({"pool": "llama", "request_id": "p", "request": request});
    let answer: Value = client
        .post(format!("http://{predictor}/v1/predict"))
        .json(&predict)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut predicted: Vec<&str> =
        answer["endpoints"].as_array().unwrap().iter().map(|e| e["address"].as_str().unwrap()).collect();
    predicted.sort();
    assert_eq!(predicted, ["127.0.0.12:8000", "127.0.0.13:8000"]);
    assert!(api.watching("endpointslices", "kubernetes.io/service-name=vllm"), "the watcher never watched");

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// A recorded InferencePool (`inference.networking.k8s.io/v1`).
fn inference_pool(labels: Value, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports.iter().map(|p| json!({"number": p})).collect();
    json!({"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "vllm", "namespace": "llm"},
        "spec": {"selector": {"matchLabels": labels}, "targetPorts": ports,
                 "endpointPickerRef": {"name": "headroom-epp", "port": {"number": 9002}, "failureMode": "FailOpen"}}})
}

/// A recorded Pod (trimmed), on a loopback address.
fn pod(name: &str, app: &str, ip: &str, ready: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "llm", "labels": {"app": app}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
}

async fn wait_until(what: &str, done: impl Fn() -> bool) {
    assert!(poll(|| std::future::ready(done())).await, "never: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_pools_ready_pods_follow_its_selector_and_ports() {
    let api = FakeApi::new();
    api.event("inferencepools", "ADDED", inference_pool(json!({"app": "vllm"}), &[8000]));
    api.event("pods", "ADDED", pod("a", "vllm", "127.0.0.31", true));
    api.event("pods", "ADDED", pod("b", "vllm", "127.0.0.32", false));
    api.event("pods", "ADDED", pod("c", "other", "127.0.0.33", true));
    let fake_addr = api.serve().await;
    let config = Config::parse(&format!(
        "scrape_interval_ms = 50\nscrape_timeout_ms = 50\n[kubernetes]\napi_server = \"http://{fake_addr}\"\n\
         [[pool]]\nname = \"llama\"\n[[pool.inference_pool]]\nnamespace = \"llm\"\nname = \"vllm\"\n"
    ))
    .unwrap();
    let (predictor, stop, server) = start_predictor(config).await;

    // The pool's selector picks a and b; only a is ready.
    wait_for(&predictor, &[("127.0.0.31:8000", 0)]).await;
    wait_until("the pool object watched by name", || api.watching("inferencepools", "metadata.name=vllm")).await;
    wait_until("its pods watched by its selector", || api.watching("pods", "app=vllm")).await;

    // b turns ready.
    api.event("pods", "MODIFIED", pod("b", "vllm", "127.0.0.32", true));
    wait_for(&predictor, &[("127.0.0.31:8000", 0), ("127.0.0.32:8000", 0)]).await;

    // A second target port: every pod serves on both.
    api.event("inferencepools", "MODIFIED", inference_pool(json!({"app": "vllm"}), &[8000, 8001]));
    let both = [("127.0.0.31:8000", 0), ("127.0.0.31:8001", 0), ("127.0.0.32:8000", 0), ("127.0.0.32:8001", 0)];
    wait_for(&predictor, &both).await;

    // A new selector: the pods are watched again, by it.
    api.event("inferencepools", "MODIFIED", inference_pool(json!({"app": "other"}), &[8000]));
    wait_for(&predictor, &[("127.0.0.33:8000", 0)]).await;
    assert!(api.watching("pods", "app=other"));

    // The pod goes; then the pool object itself.
    wait_until("the new selector's pods watched", || api.watching("pods", "app=other")).await;
    api.event("pods", "DELETED", pod("c", "other", "127.0.0.33", true));
    wait_for(&predictor, &[]).await;
    api.event("pods", "ADDED", pod("d", "other", "127.0.0.34", true));
    wait_for(&predictor, &[("127.0.0.34:8000", 0)]).await;
    api.event("inferencepools", "DELETED", inference_pool(json!({"app": "other"}), &[8000]));
    wait_for(&predictor, &[]).await;

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
