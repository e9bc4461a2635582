//! Every predictor configuration the project ships under `istio/` (TOML files and
//! ConfigMaps that embed one) parses and validates, so a typo fails here rather
//! than at pod start.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};

use headroom_predictor::config::Config;

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// `(where, TOML text)` of each predictor config shipped under `istio/`.
fn shipped() -> Vec<(String, String)> {
    let mut files = Vec::new();
    files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../istio"), &mut files);
    let mut configs = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => configs.push((path.display().to_string(), text)),
            Some("yaml") if text.contains("predictor.toml:") => {
                for doc in serde_yaml::Deserializer::from_str(&text) {
                    let doc: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
                    if let Some(toml) = doc["data"]["predictor.toml"].as_str() {
                        configs.push((format!("{} (ConfigMap data)", path.display()), toml.to_string()));
                    }
                }
            }
            _ => {}
        }
    }
    configs
}

#[test]
fn every_shipped_predictor_config_is_valid() {
    let configs = shipped();
    assert!(configs.len() >= 2, "expected the base ConfigMap and the example overlay's file: {configs:?}");
    for (place, text) in configs {
        if let Err(e) = Config::parse(&text) {
            panic!("{place}: {e:#}");
        }
    }
}
