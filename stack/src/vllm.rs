//! Real vLLM as an engine of the local stack: how one server is started on this host.
//!
//! `make setup-vllm` installs vLLM's CPU build into `.venv-vllm` and makes the model it
//! serves (`stack/vllm/make_model.py`: a small random-weight Llama and a tokenizer trained
//! on a corpus the project ships; nothing comes from a model hub). Each server runs
//! `vllm.entrypoints.openai.api_server` (the `vllm` console script looks for a distribution
//! named `vllm` and fails with the CPU build) with its OpenMP threads bound to a core of its
//! own, so two servers on a 2-core host do not take turns on one core.

use std::net::SocketAddr;
use std::path::Path;

/// The name the local vLLM servers serve their model under (what clients put in `model`).
pub const MODEL_NAME: &str = "headroom-tiny-llama";

/// The hardware class the stack gives a local vLLM server: a CPU core of this host.
pub const HARDWARE: &str = "cpu";

/// Context length the servers are started with.
pub const MAX_MODEL_LEN: u32 = 4096;

/// Sequences one server batches at most.
pub const MAX_NUM_SEQS: u32 = 32;

/// Seconds a server may take to answer `/health` after it starts: loading torch and the
/// engine, then profiling and warming up, took 60-90 s here.
pub const START_TIMEOUT_S: u64 = 300;

/// The command line of a server for `model` on `address`.
pub fn server_args(model: &Path, address: SocketAddr) -> Vec<String> {
    let mut args: Vec<String> = vec!["-m".into(), "vllm.entrypoints.openai.api_server".into()];
    for (flag, value) in [
        ("--model", model.display().to_string()),
        ("--served-model-name", MODEL_NAME.to_string()),
        ("--host", address.ip().to_string()),
        ("--port", address.port().to_string()),
        ("--dtype", "bfloat16".to_string()),
        ("--max-model-len", MAX_MODEL_LEN.to_string()),
        ("--max-num-seqs", MAX_NUM_SEQS.to_string()),
    ] {
        args.extend([flag.to_string(), value]);
    }
    // Prefix caching is vLLM's default; said here so the stack does not depend on it.
    args.push("--enable-prefix-caching".into());
    args
}

/// The environment of server `index`: offline, 1 GiB of KV cache, its OpenMP threads bound
/// to core `index` modulo the host's cores.
pub fn server_env(index: usize) -> Vec<(String, String)> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    [
        ("VLLM_CPU_KVCACHE_SPACE", "1".to_string()),
        ("VLLM_CPU_OMP_THREADS_BIND", (index % cores).to_string()),
        ("HF_HUB_OFFLINE", "1".to_string()),
        ("TRANSFORMERS_OFFLINE", "1".to_string()),
        ("VLLM_NO_USAGE_STATS", "1".to_string()),
        ("DO_NOT_TRACK", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_binds_its_own_core_and_stays_offline() {
        let args = server_args(Path::new("/m"), "127.0.0.1:9000".parse().unwrap());
        let at = |flag: &str| args.iter().position(|a| a == flag).map(|i| args[i + 1].clone());
        assert_eq!(at("--port").as_deref(), Some("9000"));
        assert_eq!(at("--host").as_deref(), Some("127.0.0.1"));
        assert_eq!(at("--served-model-name").as_deref(), Some(MODEL_NAME));
        let env = |i| server_env(i).into_iter().find(|(k, _)| k == "VLLM_CPU_OMP_THREADS_BIND").map(|(_, v)| v);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(env(0).as_deref(), Some("0"));
        assert_eq!(env(cores).as_deref(), Some("0"), "wraps around the host's cores");
        assert!(server_env(1).iter().any(|(k, v)| k == "HF_HUB_OFFLINE" && v == "1"));
    }
}
