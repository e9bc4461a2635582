//! headroom-loadgen: open-loop traffic with per-request SLO headers against any
//! OpenAI-compatible gateway, with client-side TTFT/TPOT per request.

pub mod chart;
pub mod profile;
pub mod report;
pub mod runner;
pub mod workload;
