//! The gateway's Envoy config as Istio would assemble it from our manifests, checked by
//! the real Envoy (`envoy --mode validate`).
//!
//! What is assembled: every EnvoyFilter `CLUSTER ADD` (as a cluster), `CLUSTER MERGE` on a
//! service's cluster (merged into that cluster as Istio generates it: `outbound|PORT||HOST`,
//! least request), `HTTP_FILTER INSERT_BEFORE` the router and `INSERT_FIRST` in the chain,
//! `NETWORK_FILTER MERGE` on the HTTP connection manager, and every WasmPlugin translated
//! into the Wasm filter Istio would insert (local code, the plugin config as JSON, its fail
//! strategy). Any other patch is refused rather than skipped.

use std::path::Path;

use serde_json::{json, Map, Value};

/// Istio's generated name for a service port's cluster.
fn outbound(service: &str, port: u64) -> String {
    format!("outbound|{port}||{service}")
}

/// Merges `patch` into `base` the way protobuf merge does for these configs:
/// messages recursively, lists appended, scalars replaced.
fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (Value::Array(b), Value::Array(p)) => b.extend(p.iter().cloned()),
        (b, p) => *b = p.clone(),
    }
}

/// The Wasm filter Istio inserts for a WasmPlugin (code fetched to a local file).
fn wasm_plugin_filter(plugin: &Value, wasm: &Path) -> Value {
    let spec = &plugin["spec"];
    let name = plugin["metadata"]["name"].as_str().unwrap_or("wasmplugin");
    let failure = match spec["failStrategy"].as_str() {
        Some("FAIL_OPEN") => "FAIL_OPEN",
        Some("FAIL_RELOAD") => "FAIL_RELOAD",
        _ => "FAIL_CLOSED",
    };
    let config = spec.get("pluginConfig").cloned().unwrap_or_else(|| json!({}));
    // `vmConfig.env`: HOST entries pass the gateway's own variables, INLINE ones a value.
    let env = spec["vmConfig"]["env"].as_array().cloned().unwrap_or_default();
    let (host, inline): (Vec<&Value>, Vec<&Value>) =
        env.iter().partition(|e| e["valueFrom"].as_str().unwrap_or("INLINE") == "HOST");
    let host_keys: Vec<Value> = host.iter().map(|e| e["name"].clone()).collect();
    let key_values: serde_json::Map<String, Value> =
        inline.iter().filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].clone()))).collect();
    json!({
        "name": format!("istio.wasmplugin.{name}"),
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": spec["pluginName"].as_str().unwrap_or(""),
                "failure_policy": failure,
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": config.to_string()
                },
                "vm_config": {
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": wasm.display().to_string()}},
                    "environment_variables": {"host_env_keys": host_keys, "key_values": key_values}
                }
            }
        }
    })
}

/// Builds a bootstrap holding everything our manifests add to the gateway.
/// `wasm` stands in for the plugin image Istio would have pulled.
pub fn assemble(docs: &[Value], wasm: &Path) -> Result<Value, String> {
    let mut clusters: Vec<Value> = Vec::new();
    let mut merged: Vec<(String, Value)> = Vec::new();
    let mut filters: Vec<Value> = Vec::new();
    let mut first_filters: Vec<Value> = Vec::new();
    let mut hcm_patches: Vec<Value> = Vec::new();
    for doc in docs {
        let name = doc["metadata"]["name"].as_str().unwrap_or("?");
        match doc["kind"].as_str() {
            Some("WasmPlugin") => filters.push(wasm_plugin_filter(doc, wasm)),
            Some("EnvoyFilter") => {
                for (i, p) in doc["spec"]["configPatches"].as_array().into_iter().flatten().enumerate() {
                    let at = || format!("EnvoyFilter {name} configPatches[{i}]");
                    let value = p["patch"]["value"].clone();
                    match (p["applyTo"].as_str(), p["patch"]["operation"].as_str()) {
                        (Some("CLUSTER"), Some("ADD")) => clusters.push(value),
                        (Some("CLUSTER"), Some("MERGE")) => {
                            let c = &p["match"]["cluster"];
                            let (Some(service), Some(port)) = (c["service"].as_str(), c["portNumber"].as_u64()) else {
                                return Err(format!("{}: a MERGE needs match.cluster.service and portNumber", at()));
                            };
                            merged.push((outbound(service, port), value));
                        }
                        (Some("HTTP_FILTER"), Some("INSERT_BEFORE")) => {
                            let sub = &p["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"];
                            if sub != "envoy.filters.http.router" {
                                return Err(format!("{}: only INSERT_BEFORE the router is assembled", at()));
                            }
                            filters.push(value);
                        }
                        (Some("HTTP_FILTER"), Some("INSERT_FIRST")) => first_filters.push(value),
                        (Some("NETWORK_FILTER"), Some("MERGE")) => {
                            let filter = &p["match"]["listener"]["filterChain"]["filter"]["name"];
                            if filter != "envoy.filters.network.http_connection_manager" {
                                return Err(format!(
                                    "{}: only a MERGE on the HTTP connection manager is assembled",
                                    at()
                                ));
                            }
                            hcm_patches.push(value["typed_config"].clone());
                        }
                        (apply, op) => return Err(format!("{}: {apply:?}/{op:?} is not assembled", at())),
                    }
                }
            }
            _ => {}
        }
    }
    // The model servers' clusters as Istio generates them, then our MERGE patches.
    let mut model_clusters: Vec<Value> = Vec::new();
    for (cluster, patch) in &merged {
        let position = model_clusters.iter().position(|c| c["name"] == cluster.as_str());
        let i = position.unwrap_or_else(|| {
            model_clusters.push(json!({
                "name": cluster,
                "type": "STATIC",
                "connect_timeout": "10s",
                "lb_policy": "LEAST_REQUEST",
                "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8000}}}}
                ]}]}
            }));
            model_clusters.len() - 1
        });
        merge(&mut model_clusters[i], patch);
    }
    let route_to = model_clusters.first().and_then(|c| c["name"].as_str()).unwrap_or("placeholder").to_string();
    if model_clusters.is_empty() {
        model_clusters.push(json!({"name": "placeholder", "type": "STATIC", "connect_timeout": "1s"}));
    }
    filters.push(json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}));
    let mut all_clusters = clusters;
    all_clusters.extend(model_clusters);
    // INSERT_FIRST patches go first, the last applied ending up in front (as Istio does).
    first_filters.reverse();
    first_filters.extend(filters);
    let filters = first_filters;
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {"name": "models", "virtual_hosts": [{"name": "models", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": route_to}}]}]},
        "http_filters": filters
    });
    for patch in &hcm_patches {
        merge(&mut hcm, patch);
    }
    let mut bootstrap = Map::new();
    bootstrap.insert(
        "static_resources".into(),
        json!({
            "listeners": [{"name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}]}],
            "clusters": all_clusters
        }),
    );
    Ok(Value::Object(bootstrap))
}

/// Runs `envoy --mode validate` on `bootstrap`; `Err` holds Envoy's complaint.
pub fn validate(envoy: &Path, bootstrap: &Value, scratch: &Path) -> Result<(), String> {
    std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let file = scratch.join("assembled-envoy.json");
    let text = serde_json::to_string_pretty(bootstrap).map_err(|e| e.to_string())?;
    std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))?;
    let out = std::process::Command::new(envoy)
        .args(["--mode", "validate", "--log-level", "error", "--disable-hot-restart", "-c"])
        .arg(&file)
        // What the gateway's container gets from the token Secret (docs/deploy.md): the
        // filter refuses its configuration without it.
        .env(headroom_predictor_config::TOKEN_ENV, "deploy-check-stand-in-token")
        .output()
        .map_err(|e| format!("running {}: {e}", envoy.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    // Envoy names the fault on its "error initializing configuration" line, then may dump
    // the whole config: keep the lines that say what is wrong.
    let lines: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<String> = lines
        .iter()
        .filter(|l| l.contains("rror") || l.contains("nvalid") || l.contains("nable to"))
        .map(|l| l.chars().take(600).collect())
        .collect();
    if errors.is_empty() {
        return Err(lines[lines.len().saturating_sub(6)..].join("\n"));
    }
    Err(errors.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_appends_lists_and_replaces_scalars() {
        let mut a = json!({"a": 1, "l": [1], "o": {"x": 1}});
        merge(&mut a, &json!({"a": 2, "l": [2], "o": {"y": 2}}));
        assert_eq!(a, json!({"a": 2, "l": [1, 2], "o": {"x": 1, "y": 2}}));
    }

    #[test]
    fn unsupported_patches_are_refused_not_skipped() {
        let ef = json!({"kind": "EnvoyFilter", "metadata": {"name": "x"}, "spec": {"configPatches": [
            {"applyTo": "LISTENER", "patch": {"operation": "ADD", "value": {}}}]}});
        assert!(assemble(&[ef], Path::new("f.wasm")).unwrap_err().contains("not assembled"));
    }

    #[test]
    fn wasm_plugin_becomes_the_filter_istio_inserts() {
        let wp = json!({"kind": "WasmPlugin", "metadata": {"name": "headroom"},
            "spec": {"failStrategy": "FAIL_OPEN", "pluginConfig": {"pool": "p"}}});
        let b = assemble(&[wp], Path::new("/x/f.wasm")).unwrap();
        let f =
            &b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0];
        assert_eq!(f["typed_config"]["config"]["failure_policy"], "FAIL_OPEN");
        assert_eq!(f["typed_config"]["config"]["configuration"]["value"], r#"{"pool":"p"}"#);
    }
}
