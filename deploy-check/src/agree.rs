//! What must agree between the documents of one file or rendering, which no schema sees:
//! - the endpoint picker's `objectives` (its filter.json) and the InferenceObjectives it
//!   serves. The picker reads priorities from its own config, so an objective added to the
//!   cluster but not to the config would silently run at the caller's claimed priority;
//! - a PodMonitor's ports and the containers of the Deployments it selects: a port name
//!   the pods do not have is scraped nowhere, silently;
//! - the pools a gateway's filter config names (`pool`, `model_pools`) and the predictor's
//!   `[[pool]]`s: a pool the predictor does not have fails every predict call naming it,
//!   and a coalesced call fails for every request riding it.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// The ConfigMap key holding predictor-svc's TOML (`istio/base/predictor/configmap.yaml`).
pub const PREDICTOR_CONFIG_KEY: &str = "predictor.toml";
/// The ConfigMap key holding the filter's JSON for headroom-epp
/// (`istio/endpoint-picker/picker/configmap.yaml`).
pub const FILTER_CONFIG_KEY: &str = "filter.json";

/// Problems as `(Kind/name, message)`.
pub fn check(docs: &[Value]) -> Vec<(String, String)> {
    let mut out = objectives(docs);
    out.extend(pod_monitor_ports(docs));
    out.extend(pools(docs));
    out
}

/// Each filter config's pools (the picker's filter.json, a WasmPlugin's pluginConfig)
/// against the `[[pool]]`s of the predictor configs beside them (none beside: not judged).
fn pools(docs: &[Value]) -> Vec<(String, String)> {
    let served: BTreeSet<String> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .filter_map(|d| d["data"][PREDICTOR_CONFIG_KEY].as_str())
        .filter_map(|toml| headroom_predictor_config::Config::parse(toml).ok())
        .flat_map(|c| c.pools.into_iter().map(|p| p.name))
        .collect();
    if served.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for doc in docs {
        let object =
            format!("{}/{}", doc["kind"].as_str().unwrap_or("?"), doc["metadata"]["name"].as_str().unwrap_or("?"));
        let (at, config) = match doc["kind"].as_str() {
            Some("ConfigMap") => match doc["data"][FILTER_CONFIG_KEY].as_str().map(serde_json::from_str::<Value>) {
                Some(Ok(c)) => (format!("data.{FILTER_CONFIG_KEY}"), c),
                _ => continue,
            },
            Some("WasmPlugin") if doc["spec"]["pluginConfig"].is_object() => {
                ("spec.pluginConfig".to_string(), doc["spec"]["pluginConfig"].clone())
            }
            _ => continue,
        };
        let default = config["pool"].as_str().unwrap_or("default").to_string();
        let mapped = config["model_pools"].as_object().into_iter().flatten();
        let named = std::iter::once(("pool".to_string(), default))
            .chain(mapped.filter_map(|(m, p)| Some((format!("model_pools.{m}"), p.as_str()?.to_string()))));
        for (field, pool) in named {
            if !served.contains(&pool) {
                out.push((
                    object.clone(),
                    format!("{at}.{field}: pool {pool:?} is not one of the predictor's {served:?}"),
                ));
            }
        }
    }
    out
}

/// Each PodMonitor endpoint's `port` against the named container ports of every Deployment
/// whose pod labels its selector matches.
fn pod_monitor_ports(docs: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for monitor in docs.iter().filter(|d| d["kind"] == "PodMonitor") {
        let Some(wanted) = monitor["spec"]["selector"]["matchLabels"].as_object() else { continue };
        let object = format!("PodMonitor/{}", monitor["metadata"]["name"].as_str().unwrap_or("?"));
        for deployment in docs.iter().filter(|d| d["kind"] == "Deployment") {
            let labels = &deployment["spec"]["template"]["metadata"]["labels"];
            if !wanted.iter().all(|(k, v)| &labels[k] == v) {
                continue;
            }
            let ports: Vec<&str> = deployment["spec"]["template"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|c| c["ports"].as_array().into_iter().flatten())
                .filter_map(|p| p["name"].as_str())
                .collect();
            for (i, endpoint) in monitor["spec"]["podMetricsEndpoints"].as_array().into_iter().flatten().enumerate() {
                let Some(port) = endpoint["port"].as_str() else { continue };
                if !ports.contains(&port) {
                    let name = deployment["metadata"]["name"].as_str().unwrap_or("?");
                    out.push((
                        object.clone(),
                        format!("spec.podMetricsEndpoints[{i}].port: {port:?} is not a port of Deployment {name} (it has {ports:?})"),
                    ));
                }
            }
        }
    }
    out
}

/// The picker's `objectives` against the InferenceObjectives beside it.
fn objectives(docs: &[Value]) -> Vec<(String, String)> {
    let objectives: BTreeMap<&str, i64> = docs
        .iter()
        .filter(|d| d["kind"] == "InferenceObjective")
        .filter_map(|d| Some((d["metadata"]["name"].as_str()?, d["spec"]["priority"].as_i64().unwrap_or(0))))
        .collect();
    let mut out = Vec::new();
    for doc in docs.iter().filter(|d| d["kind"] == "ConfigMap") {
        let Some(json) = doc["data"][FILTER_CONFIG_KEY].as_str() else { continue };
        // An unparsable config is the document check's problem, reported there.
        let Ok(config) = serde_json::from_str::<Value>(json) else { continue };
        let configured: BTreeMap<&str, i64> = config["objectives"]
            .as_object()
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_i64()?))).collect())
            .unwrap_or_default();
        let object = format!("ConfigMap/{}", doc["metadata"]["name"].as_str().unwrap_or("?"));
        for (name, priority) in &objectives {
            match configured.get(name) {
                None => out.push((
                    object.clone(),
                    format!("data.{FILTER_CONFIG_KEY}.objectives: InferenceObjective {name:?} (priority {priority}) is not listed"),
                )),
                Some(p) if p != priority => out.push((
                    object.clone(),
                    format!("data.{FILTER_CONFIG_KEY}.objectives.{name}: {p}, but InferenceObjective {name:?} has priority {priority}"),
                )),
                Some(_) => {}
            }
        }
        // Listed names without an object are only a problem where objects are shipped at all.
        if !objectives.is_empty() {
            for name in configured.keys().filter(|n| !objectives.contains_key(*n)) {
                out.push((
                    object.clone(),
                    format!("data.{FILTER_CONFIG_KEY}.objectives.{name}: no InferenceObjective of that name"),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn objective(name: &str, priority: Option<i64>) -> Value {
        let mut spec = json!({"poolRef": {"name": "vllm"}});
        if let Some(p) = priority {
            spec["priority"] = json!(p);
        }
        json!({"kind": "InferenceObjective", "metadata": {"name": name}, "spec": spec})
    }

    fn picker(objectives: Value) -> Value {
        let config = json!({"pool": "default", "objectives": objectives}).to_string();
        json!({"kind": "ConfigMap", "metadata": {"name": "headroom-epp"}, "data": {"filter.json": config}})
    }

    #[test]
    fn matching_objectives_pass_and_an_unset_priority_is_zero() {
        let docs = [objective("a", Some(2)), objective("b", None), picker(json!({"a": 2, "b": 0}))];
        assert!(check(&docs).is_empty(), "{:?}", check(&docs));
    }

    #[test]
    fn a_missing_a_different_and_an_extra_objective_are_named() {
        let docs = [objective("a", Some(2)), objective("b", Some(1)), picker(json!({"a": 3, "c": 0}))];
        let problems: Vec<String> = check(&docs).into_iter().map(|(_, m)| m).collect();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("objectives.a: 3") && problems[0].contains("priority 2"));
        assert!(problems[1].contains("\"b\"") && problems[1].contains("not listed"));
        assert!(problems[2].contains("objectives.c: no InferenceObjective"));
    }

    #[test]
    fn a_pod_monitor_must_name_a_port_of_the_pods_it_selects() {
        let deployment = json!({"kind": "Deployment", "metadata": {"name": "headroom-predictor"}, "spec": {"template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "headroom-predictor"}},
            "spec": {"containers": [{"name": "p", "ports": [{"name": "http", "containerPort": 9000}]}]}}}});
        let monitor = |port: &str, app: &str| {
            json!({"kind": "PodMonitor", "metadata": {"name": "m"}, "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
                "podMetricsEndpoints": [{"port": port, "path": "/metrics"}]}})
        };
        assert!(check(&[deployment.clone(), monitor("http", "headroom-predictor")]).is_empty());
        let problems = check(&[deployment.clone(), monitor("metrics", "headroom-predictor")]);
        assert!(problems.len() == 1 && problems[0].1.contains("\"metrics\" is not a port"), "{problems:?}");
        assert!(check(&[deployment, monitor("metrics", "other")]).is_empty(), "selects no Deployment here");
    }

    #[test]
    fn a_filter_config_names_only_pools_the_predictor_has() {
        let predictor = json!({"kind": "ConfigMap", "metadata": {"name": "headroom-predictor"}, "data": {
            "predictor.toml": "[[pool]]\nname = \"default\"\nendpoints = [\"127.0.0.1:8000\"]\n"}});
        let config = json!({"pool": "default", "model_pools": {"big": "big-pool"}}).to_string();
        let picker =
            json!({"kind": "ConfigMap", "metadata": {"name": "headroom-epp"}, "data": {"filter.json": config}});
        let problems = check(&[predictor.clone(), picker.clone()]);
        assert!(problems.len() == 1 && problems[0].1.contains("model_pools.big: pool \"big-pool\""), "{problems:?}");
        let plugin = json!({"kind": "WasmPlugin", "metadata": {"name": "headroom"}, "spec": {"pluginConfig": {"pool": "llama"}}});
        assert!(check(&[predictor, plugin.clone()])[0].1.contains("spec.pluginConfig.pool: pool \"llama\""));
        assert!(check(&[plugin, picker]).is_empty(), "no predictor config beside them: not judged");
    }

    #[test]
    fn a_config_without_objects_beside_it_is_not_judged() {
        assert!(check(&[picker(json!({"a": 1}))]).is_empty());
    }
}
