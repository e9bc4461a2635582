//! Kubernetes discovery against a fake API server: the real predictor and the real
//! kube-rs watcher (list, then watch) over 127.0.0.1, fed recorded EndpointSlice objects.
//! Covers add, remove and a readiness flip, and that requests in flight survive on
//! endpoints that stay.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use headroom_predictor::config::Config;
use serde_json::{json, Value};
use tokio::sync::broadcast;

/// What the fake API server holds: the current slices and a feed of watch events.
struct FakeApi {
    slices: Mutex<Vec<Value>>,
    version: Mutex<u64>,
    events: broadcast::Sender<String>,
    /// `(namespace, labelSelector, watch)` of every call, to check what was asked.
    calls: Mutex<Vec<(String, String, bool)>>,
}

impl FakeApi {
    /// Applies a change as the API server would and streams it to watchers.
    fn event(&self, kind: &str, mut slice: Value) {
        let mut version = self.version.lock().unwrap();
        *version += 1;
        slice["metadata"]["resourceVersion"] = json!(version.to_string());
        let name = slice["metadata"]["name"].clone();
        let mut slices = self.slices.lock().unwrap();
        slices.retain(|s| s["metadata"]["name"] != name);
        if kind != "DELETED" {
            slices.push(slice.clone());
        }
        let _ = self.events.send(json!({"type": kind, "object": slice}).to_string() + "\n");
    }
}

async fn endpoint_slices(
    State(api): State<Arc<FakeApi>>,
    Path(namespace): Path<String>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let selector = q.get("labelSelector").cloned().unwrap_or_default();
    api.calls.lock().unwrap().push((namespace, selector, watch));
    if watch {
        let rx = api.events.subscribe();
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(line) => return Some((Ok::<_, std::io::Error>(line), rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        return ([("content-type", "application/json")], Body::from_stream(stream)).into_response();
    }
    let version = api.version.lock().unwrap().to_string();
    let items = api.slices.lock().unwrap().clone();
    axum::Json(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
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
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen = pool_endpoints(predictor).await;
        if seen == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("pool endpoints: want {want:?}, have {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_slices_add_remove_and_readiness_flip() {
    let (events, _) = broadcast::channel(64);
    let api = Arc::new(FakeApi {
        slices: Mutex::new(Vec::new()),
        version: Mutex::new(1),
        events,
        calls: Mutex::new(Vec::new()),
    });
    api.event("ADDED", slice("vllm-a", &[("127.0.0.11", true), ("127.0.0.12", true), ("127.0.0.13", false)]));
    let fake = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake_addr = fake.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", get(endpoint_slices))
        .with_state(api.clone());
    tokio::spawn(async move { axum::serve(fake, app).await });

    let config = Config::parse(&format!(
        "scrape_interval_ms = 50\nscrape_timeout_ms = 50\n[kubernetes]\napi_server = \"http://{fake_addr}\"\n\
         [[pool]]\nname = \"llama\"\n[[pool.kubernetes]]\nnamespace = \"llm\"\n\
         selector = \"kubernetes.io/service-name=vllm\"\nport_name = \"http\"\nhardware = \"h100\"\n"
    ))
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let predictor = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(headroom_predictor::serve(config, listener, async {
        let _ = stopped.await;
    }));

    // Initial list: the two ready endpoints, not the unready one.
    wait_for(&predictor, &[("127.0.0.11:8000", 0), ("127.0.0.12:8000", 0)]).await;
    let calls = api.calls.lock().unwrap().clone();
    assert!(calls.iter().all(|(ns, sel, _)| ns == "llm" && sel == "kubernetes.io/service-name=vllm"), "{calls:?}");

    // A request in flight on .12, tracked by the pool.
    let request = json!({"model": "m", "input_tokens": 100, "streaming": true});
    let dispatch = json!({"dispatches": [{"pool": "llama", "request_id": "r1", "endpoint": "127.0.0.12:8000", "request": request}]});
    let client = reqwest::Client::new();
    let res = client.post(format!("http://{predictor}/v1/dispatch")).json(&dispatch).send().await.unwrap();
    assert_eq!(res.status(), 200);
    wait_for(&predictor, &[("127.0.0.11:8000", 0), ("127.0.0.12:8000", 1)]).await;

    // Add: a second slice (a scale-up) joins the pool.
    api.event("ADDED", slice("vllm-b", &[("127.0.0.21", true)]));
    wait_for(&predictor, &[("127.0.0.11:8000", 0), ("127.0.0.12:8000", 1), ("127.0.0.21:8000", 0)]).await;

    // Readiness flip: .11 goes unready and .13 becomes ready; .12 keeps its request in flight.
    api.event("MODIFIED", slice("vllm-a", &[("127.0.0.11", false), ("127.0.0.12", true), ("127.0.0.13", true)]));
    wait_for(&predictor, &[("127.0.0.12:8000", 1), ("127.0.0.13:8000", 0), ("127.0.0.21:8000", 0)]).await;

    // Remove: the second slice is deleted.
    api.event("DELETED", slice("vllm-b", &[("127.0.0.21", true)]));
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
    assert!(api.calls.lock().unwrap().iter().any(|(_, _, watch)| *watch), "the watcher never watched");

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
