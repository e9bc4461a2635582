//! The shipped manifests are valid, and broken ones are caught (offline: schemas, types,
//! and the real Envoy on the assembled gateway config).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use headroom_deploy_check::{check_tree, documents, envoy, Checker};
use headroom_stack::locate;

fn checker() -> Checker {
    Checker::from_dir(&locate::root().join("istio/schemas")).unwrap()
}

/// A scratch directory for one check, removed when the guard drops (the test's temporary
/// does at the end of its statement, after the check has used it).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    Scratch(std::env::temp_dir().join(format!("headroom-deploy-check-test-{}-{name}", std::process::id())))
}

/// Schema/type problems of a file plus, for gateway resources, what Envoy says of the assembly.
fn problems_of(checker: &Checker, file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out: Vec<String> =
        checker.check_text(&file.display().to_string(), &text).iter().map(|p| p.to_string()).collect();
    let docs = documents(&text).unwrap();
    if docs.iter().any(|d| matches!(d["kind"].as_str(), Some("EnvoyFilter" | "WasmPlugin"))) {
        let stem = file.file_stem().unwrap().to_string_lossy().to_string();
        let result = envoy::assemble(&docs, &locate::wasm().unwrap())
            .and_then(|b| envoy::validate(&locate::envoy().unwrap(), &b, &scratch(&stem)));
        if let Err(e) = result {
            out.push(e);
        }
    }
    out
}

#[test]
fn every_shipped_manifest_and_kustomization_is_valid() {
    let root = locate::root().join("istio");
    let report = check_tree(&checker(), &root, &locate::envoy().unwrap(), &locate::wasm().unwrap(), &scratch("tree"));
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(report.files >= 10, "only {} manifest files found", report.files);
    if report.not_rendered.is_empty() {
        assert!(report.kustomizations.len() >= 3 && report.envoy_configs >= 2, "{report:?}");
    } else {
        eprintln!("kubectl not installed: kustomizations checked file by file only: {:?}", report.not_rendered);
    }
}

#[test]
fn the_gateway_files_assemble_into_a_config_envoy_accepts() {
    // Independent of kubectl: the raw files of both forms, header-only and body-aware.
    let root = locate::root().join("istio");
    let gateway: Vec<PathBuf> = ["wasmplugin", "envoyfilter-predictor-cluster", "envoyfilter-destination-routing"]
        .iter()
        .map(|f| root.join(format!("base/gateway/{f}.yaml")))
        .collect();
    let body_aware = root.join("components/body-aware/envoyfilter-wasm.yaml");
    for (form, files) in [("header-only", gateway.clone()), ("body-aware", [&gateway[1..], &[body_aware]].concat())] {
        let docs: Vec<_> =
            files.iter().flat_map(|f| documents(&std::fs::read_to_string(f).unwrap()).unwrap()).collect();
        let bootstrap = envoy::assemble(&docs, &locate::wasm().unwrap()).unwrap();
        let filters = bootstrap.to_string();
        assert!(filters.contains("override_host") && filters.contains("headroom_predictor"), "{form}");
        // The filter's predict stream is gRPC: the predictor cluster must speak HTTP/2.
        assert!(filters.contains("http2_protocol_options"), "{form}: the predictor cluster is not HTTP/2");
        if form == "body-aware" {
            assert!(filters.contains(r#""allow_on_headers_stop_iteration":true"#));
        }
        envoy::validate(&locate::envoy().unwrap(), &bootstrap, &scratch(form))
            .unwrap_or_else(|e| panic!("{form}: {e}"));
    }
}

#[test]
fn each_deliberately_broken_manifest_is_refused_naming_the_fault() {
    let checker = checker();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/invalid");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 8);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expect =
            text.lines().next().and_then(|l| l.strip_prefix("# expect: ")).expect("first line: # expect: <text>");
        let problems = problems_of(&checker, &file);
        assert!(
            problems.iter().any(|p| p.contains(expect)),
            "{}: expected a problem mentioning {expect:?}, got {problems:#?}",
            file.display()
        );
    }
}

#[test]
fn a_broken_file_in_the_tree_fails_the_tree_check() {
    // The same check `make test` runs, on a copy of istio/ with one manifest broken.
    let root = locate::root().join("istio");
    let guard = scratch("broken-tree");
    let copy: &Path = &guard;
    let _ = std::fs::remove_dir_all(copy);
    let status = std::process::Command::new("cp").arg("-r").arg(&root).arg(copy).status().unwrap();
    assert!(status.success());
    let deployment = copy.join("base/predictor/deployment.yaml");
    let text = std::fs::read_to_string(&deployment).unwrap().replace("replicas: 1", "replicas: one");
    std::fs::write(&deployment, text).unwrap();
    let report = check_tree(&checker(), copy, &locate::envoy().unwrap(), &locate::wasm().unwrap(), &scratch("broken"));
    let problems: Vec<String> = report.problems.iter().map(|p| p.to_string()).collect();
    assert!(problems.iter().any(|p| p.contains("deployment.yaml") && p.contains("spec.replicas")), "{problems:#?}");
}

/// The NetworkPolicy admits what docs/reliability.md says it does: the gateway, the endpoint
/// picker and monitoring, on the port the predictor serves its routes and `/metrics` on, and
/// nobody else.
#[test]
fn the_network_policy_admits_the_gateway_the_picker_and_monitoring_on_the_predictors_port() {
    let root = locate::root().join("istio/base");
    let policy: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(root.join("access/networkpolicy.yaml")).unwrap()).unwrap();
    let config = std::fs::read_to_string(root.join("predictor/configmap.yaml")).unwrap();
    let port: u64 = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("listen = \"")?.trim_end_matches('"').rsplit(':').next()?.parse().ok())
        .expect("the predictor's listen address");
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    let admitted: Vec<(String, Vec<u64>)> = rules
        .iter()
        .map(|r| {
            let from = &r["from"][0];
            let who = if from["namespaceSelector"].is_object() {
                format!("namespace {}", from["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"])
            } else {
                format!("pods {}", from["podSelector"]["matchLabels"])
            };
            (who, r["ports"].as_array().unwrap().iter().filter_map(|p| p["port"].as_u64()).collect())
        })
        .collect();
    assert_eq!(
        admitted,
        vec![
            (r#"pods {"gateway.networking.k8s.io/gateway-name":"inference-gateway"}"#.to_string(), vec![port]),
            (r#"pods {"app.kubernetes.io/name":"headroom-epp"}"#.to_string(), vec![port]),
            ("namespace \"monitoring\"".to_string(), vec![port])
        ]
    );
}

/// The dashboard loads as Grafana needs it and reads only series headroom serves, and it
/// has the panels docs/observability.md promises.
#[test]
fn the_dashboard_loads_and_charts_what_the_docs_promise() {
    let file = locate::root().join("istio/monitoring/dashboard.json");
    let text = std::fs::read_to_string(&file).unwrap();
    let problems = checker().catalog.check_dashboard("dashboard.json", &text);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let titles: Vec<&str> =
        dashboard["panels"].as_array().unwrap().iter().filter_map(|p| p["title"].as_str()).collect();
    for promised in [
        "SLO attainment by priority",
        "TTFT: predicted against actual",
        "Tier precision and recall",
        "Fallback share",
        "Waiting in the flow-control queue",
    ] {
        assert!(titles.iter().any(|t| t.starts_with(promised)), "no panel {promised:?} in {titles:?}");
    }
}
