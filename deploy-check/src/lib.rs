//! Offline validation of headroom's Istio/Kubernetes manifests (`istio/`), run by `make test`.
//!
//! Three checks, none needing a cluster:
//! - custom resources (WasmPlugin, EnvoyFilter) against Istio's CRD schemas, vendored in
//!   `istio/schemas/` (`crd`);
//! - Kubernetes' own kinds against the typed API of `k8s-openapi` (`builtin`);
//! - the Envoy config those manifests add to the gateway, assembled into a bootstrap and
//!   checked by the real Envoy (`envoy`).
//!
//! Every resource file is checked as written, and every kustomization as rendered (by
//! `kubectl kustomize`, when kubectl is installed), and what must agree across its
//! documents (`agree`); the monitoring's PromQL against the series headroom serves
//! (`monitoring`). `oci` packages the filter as an OCI
//! image for the WasmPlugin (`make oci`).

pub mod agree;
pub mod builtin;
pub mod crd;
pub mod envoy;
pub mod monitoring;
pub mod oci;
pub mod yaml;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use agree::{FILTER_CONFIG_KEY, PREDICTOR_CONFIG_KEY};
pub use yaml::{documents, read_schema, schema_files};

/// One problem in one document.
#[derive(Debug, Clone)]
pub struct Problem {
    /// File, or `kustomize <dir>` for a rendered kustomization.
    pub source: String,
    /// `Kind/name` of the document.
    pub object: String,
    /// `path: message`.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.source, self.object, self.message)
    }
}

/// The checker: Istio CRD schemas plus the built-in kinds.
pub struct Checker {
    pub schemas: crd::Schemas,
    /// The series headroom serves, for the monitoring's queries.
    pub catalog: monitoring::Catalog,
}

impl Checker {
    /// Loads the CRD schemas from a CRD YAML text (`istio/schemas/istio-crds.gen.yaml`).
    pub fn new(crds_yaml: &str) -> anyhow::Result<Checker> {
        Ok(Checker { schemas: crd::Schemas::load(crds_yaml)?, catalog: monitoring::Catalog::served() })
    }

    /// Loads the CRD schemas of every file of a schemas folder (`istio/schemas`).
    pub fn from_dir(dir: &Path) -> anyhow::Result<Checker> {
        let mut text = String::new();
        for file in schema_files(dir)? {
            text.push_str(&read_schema(&file)?);
            text.push_str("\n---\n");
        }
        Checker::new(&text)
    }

    /// Problems of one resource document, each `path: message`.
    pub fn check_document(&self, doc: &Value) -> Vec<String> {
        let (Some(api_version), Some(kind)) = (doc["apiVersion"].as_str(), doc["kind"].as_str()) else {
            return vec!["a resource needs apiVersion and kind".into()];
        };
        let mut problems = builtin::check_metadata(doc);
        match builtin::check(api_version, kind, doc).or_else(|| self.schemas.check(api_version, kind, doc)) {
            Some(p) => problems.extend(p),
            None => problems.push(format!("no schema for {api_version} {kind}")),
        }
        // The predictor's own configuration, as predictor-svc will read it at start.
        if let Some(toml) = doc["data"][PREDICTOR_CONFIG_KEY].as_str().filter(|_| kind == "ConfigMap") {
            if let Err(e) = headroom_predictor_config::Config::parse(toml) {
                problems.push(format!("data.{PREDICTOR_CONFIG_KEY}: {e:#}"));
            }
        }
        // Grafana dashboards (the sidecar loads ConfigMaps labelled grafana_dashboard), and alert rules.
        if kind == "ConfigMap" && !doc["metadata"]["labels"]["grafana_dashboard"].is_null() {
            for (key, text) in doc["data"].as_object().into_iter().flatten() {
                if let (true, Some(text)) = (key.ends_with(".json"), text.as_str()) {
                    problems.extend(self.catalog.check_dashboard(&format!("data.{key}"), text));
                }
            }
        }
        if kind == "PrometheusRule" {
            problems.extend(self.catalog.check_rules(doc));
        }
        // The endpoint picker's, as headroom-epp will read it.
        if let Some(json) = doc["data"][FILTER_CONFIG_KEY].as_str().filter(|_| kind == "ConfigMap") {
            if let Err(e) = headroom_filter_core::FilterConfig::parse(json.as_bytes()) {
                problems.push(format!("data.{FILTER_CONFIG_KEY}: {e}"));
            }
        }
        problems
    }

    /// Problems of every document of `text` (from `source`).
    pub fn check_text(&self, source: &str, text: &str) -> Vec<Problem> {
        let docs = match documents(text) {
            Ok(d) => d,
            Err(e) => {
                return vec![Problem { source: source.into(), object: "-".into(), message: format!("YAML: {e}") }]
            }
        };
        let mut out = Vec::new();
        for doc in &docs {
            let object =
                format!("{}/{}", doc["kind"].as_str().unwrap_or("?"), doc["metadata"]["name"].as_str().unwrap_or("?"));
            for message in self.check_document(doc) {
                out.push(Problem { source: source.into(), object: object.clone(), message });
            }
        }
        for (object, message) in agree::check(&docs) {
            out.push(Problem { source: source.into(), object, message });
        }
        out
    }
}

/// What a tree check did and found.
#[derive(Debug, Default)]
pub struct Report {
    pub files: usize,
    pub documents: usize,
    pub kustomizations: Vec<PathBuf>,
    /// Kustomizations not rendered (no kubectl).
    pub not_rendered: Vec<PathBuf>,
    pub envoy_configs: usize,
    pub problems: Vec<Problem>,
}

/// `root` and every directory below it except `schemas/`, sorted.
fn directories(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && p.file_name().is_some_and(|n| n != "schemas") {
                stack.push(p);
            }
        }
        out.push(dir);
    }
    out.sort();
    out
}

/// Resource files under `root`: `*.yaml` but kustomizations, schemas, and patch files
/// (a patch is a YAML list, or lives in a kustomization's `patches`).
pub fn resource_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in directories(root) {
        for p in std::fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.path()) {
            let yaml = p.is_file() && p.extension().is_some_and(|x| x == "yaml");
            if !yaml || p.file_name().is_some_and(|n| n == "kustomization.yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let is_patch = documents(&text).map(|d| d.iter().all(Value::is_array)).unwrap_or(false);
            if !is_patch {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Directories under `root` holding a `kustomization.yaml` of kind Kustomization (not Component).
pub fn kustomizations(root: &Path) -> Vec<PathBuf> {
    directories(root)
        .into_iter()
        .filter(|dir| {
            std::fs::read_to_string(dir.join("kustomization.yaml"))
                .is_ok_and(|text| !text.lines().any(|l| l.trim() == "kind: Component"))
        })
        .collect()
}

/// `kubectl kustomize dir`; `Ok(None)` when kubectl is not installed.
pub fn render(dir: &Path) -> anyhow::Result<Option<String>> {
    let out = match std::process::Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => anyhow::bail!("running kubectl: {e}"),
    };
    anyhow::ensure!(
        out.status.success(),
        "kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(Some(String::from_utf8(out.stdout)?))
}

/// Checks every resource file and every rendered kustomization under `root`, and has
/// Envoy validate the gateway config each rendering assembles (`envoy`: the binary;
/// `wasm`: the filter, standing in for the plugin image).
pub fn check_tree(checker: &Checker, root: &Path, envoy: &Path, wasm: &Path, scratch: &Path) -> Report {
    let mut report = Report::default();
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    for file in resource_files(root) {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        report.files += 1;
        report.documents += documents(&text).map(|d| d.len()).unwrap_or(0);
        report.problems.extend(checker.check_text(&rel(&file), &text));
    }
    for dir in kustomizations(root) {
        let source = format!("kustomize {}", rel(&dir));
        let rendered = match render(&dir) {
            Ok(Some(text)) => text,
            Ok(None) => {
                report.not_rendered.push(dir);
                continue;
            }
            Err(e) => {
                report.problems.push(Problem { source, object: "-".into(), message: e.to_string() });
                continue;
            }
        };
        report.kustomizations.push(dir.clone());
        report.problems.extend(checker.check_text(&source, &rendered));
        let docs = documents(&rendered).unwrap_or_default();
        let gateway = docs.iter().any(|d| matches!(d["kind"].as_str(), Some("EnvoyFilter" | "WasmPlugin")));
        if !gateway {
            continue;
        }
        let result = envoy::assemble(&docs, wasm).and_then(|b| {
            let dir_name = rel(&dir).replace('/', "_");
            envoy::validate(envoy, &b, &scratch.join(if dir_name.is_empty() { "root".into() } else { dir_name }))
        });
        report.envoy_configs += 1;
        if let Err(e) = result {
            report.problems.push(Problem { source, object: "assembled Envoy config".into(), message: e });
        }
    }
    report
}
