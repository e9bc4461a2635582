//! Reading the manifests and the vendored schemas: multi-document YAML, plain or gzipped.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Every document of a multi-document YAML text, as JSON values (empty documents skipped).
pub fn documents(text: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for de in serde_yaml::Deserializer::from_str(text) {
        let v: Value = serde::Deserialize::deserialize(de)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// The CRD files of a schemas folder: every `*.yaml` and `*.yaml.gz` in it, sorted. The large
/// vendored files are kept gzipped so the repository stays light; `read_schema` opens either.
pub fn schema_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_str().is_some_and(|n| n.ends_with(".yaml") || n.ends_with(".yaml.gz")))
        .collect();
    files.sort();
    anyhow::ensure!(!files.is_empty(), "{}: no CRD files", dir.display());
    Ok(files)
}

/// The text of a CRD file, gunzipped when its name ends in `.gz`.
pub fn read_schema(file: &Path) -> anyhow::Result<String> {
    let named = |e: std::io::Error| anyhow::anyhow!("{}: {e}", file.display());
    let bytes = std::fs::read(file).map_err(named)?;
    if file.extension().is_none_or(|x| x != "gz") {
        return String::from_utf8(bytes).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut text).map_err(named)?;
    Ok(text)
}
