//! What serves the model behind the gateway: simulated or real vLLM.

use crate::vllm;

/// What serves the model behind the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// headroom's simulated vLLM (`simulator/`): many servers on one host, any speed.
    #[default]
    Simulator,
    /// Real vLLM (its CPU build, `make setup-vllm`), one server per core of this host.
    Vllm,
}

impl Engine {
    /// `sim` or `vllm`, as `ENGINE=` and `--engine` take them.
    pub fn parse(text: &str) -> anyhow::Result<Engine> {
        match text {
            "sim" | "simulator" => Ok(Engine::Simulator),
            "vllm" => Ok(Engine::Vllm),
            other => anyhow::bail!("unknown engine {other:?}: sim or vllm"),
        }
    }

    /// The model name its servers serve.
    pub fn model(self) -> &'static str {
        match self {
            Engine::Simulator => SIM_MODEL,
            Engine::Vllm => vllm::MODEL_NAME,
        }
    }

    /// The servers `make up` and `make demo` start on this host: three simulated GPUs, or
    /// two vLLM servers (one per core of the 2-core reference machine).
    pub fn default_profiles(self) -> Vec<String> {
        match self {
            Engine::Simulator => vec!["h100".into(), "h100".into(), "a100".into()],
            Engine::Vllm => vec![vllm::HARDWARE.into(); 2],
        }
    }
}

/// The model the simulated servers serve.
pub const SIM_MODEL: &str = "sim-llama-8b";
