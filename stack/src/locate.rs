//! Where the stack finds its parts. Each can be overridden by an environment
//! variable; the defaults are where `make setup` and `make build` put them.

use std::path::{Path, PathBuf};

/// The repository root (`HEADROOM_ROOT`, else where this crate was built from).
pub fn root() -> PathBuf {
    match std::env::var_os("HEADROOM_ROOT") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default(),
    }
}

/// Directory of the `headroom-sim` and `headroom-predictor` binaries
/// (`HEADROOM_BIN_DIR`, else beside the running executable).
pub fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HEADROOM_BIN_DIR") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop(); // test binaries live in target/<profile>/deps
    }
    for bin in ["headroom-sim", "headroom-predictor"] {
        anyhow::ensure!(dir.join(bin).exists(), "{} not found in {}: run `make build` first", bin, dir.display());
    }
    Ok(dir)
}

/// The Envoy binary (`HEADROOM_ENVOY`, else the one `make setup` put in `.venv`).
pub fn envoy() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("HEADROOM_ENVOY") {
        return Ok(PathBuf::from(p));
    }
    let lib = root().join(".venv/lib");
    if let Ok(entries) = std::fs::read_dir(&lib) {
        for e in entries.flatten() {
            let candidate = e.path().join("site-packages/envoy/_bin/envoy");
            if candidate.exists() {
                return Ok(candidate);
            }
        }
    }
    anyhow::bail!("envoy not found under {}: run `make setup`", lib.display())
}

/// The Python of the real-vLLM environment (`HEADROOM_VLLM_PYTHON`, else the one
/// `make setup-vllm` made in `.venv-vllm`).
pub fn vllm_python() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("HEADROOM_VLLM_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => root().join(".venv-vllm/bin/python"),
    };
    anyhow::ensure!(path.exists(), "{} not found: run `make setup-vllm` (real vLLM, about 3 GB)", path.display());
    Ok(path)
}

/// The local model real vLLM serves (`HEADROOM_VLLM_MODEL`, else the one `make setup-vllm`
/// made with `stack/vllm/make_model.py`).
pub fn vllm_model() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("HEADROOM_VLLM_MODEL") {
        Some(p) => PathBuf::from(p),
        None => root().join(".venv-vllm/headroom-model"),
    };
    anyhow::ensure!(path.join("config.json").exists(), "no model in {}: run `make setup-vllm`", path.display());
    Ok(path)
}

/// The filter `.wasm` (`HEADROOM_WASM`, else the `make wasm` output).
pub fn wasm() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("HEADROOM_WASM") {
        Some(p) => PathBuf::from(p),
        None => root().join("target/wasm32-wasip1/wasm/headroom_filter.wasm"),
    };
    anyhow::ensure!(path.exists(), "{} not found: run `make wasm`", path.display());
    Ok(path.canonicalize()?)
}
