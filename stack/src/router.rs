//! What routes requests to the model servers: the gateways a stack can run.

/// What routes requests to the model servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Router {
    /// Envoy with the headroom filter (`envoy/envoy.yaml.tmpl`).
    Headroom,
    /// Plain Envoy, round robin (`envoy/baseline.yaml.tmpl`).
    RoundRobin,
    /// Plain Envoy, least request.
    LeastRequest,
    /// Plain Envoy, sticky sessions: a consistent hash (`RING_HASH`) of the client's
    /// `x-session-id`, what operators deploy for chat traffic so a conversation's turns find
    /// its prefix cached (a request without the header goes to a random server).
    StickySession,
    /// The headroom bootstrap with its Wasm filter left out, as Envoy runs it when the
    /// VM failed and `FAIL_OPEN` skips the filter (tests what Envoy enforces alone).
    HeadroomFilterSkipped,
    /// Envoy's ext_proc filter in front of headroom-epp, the endpoint picker, in place of
    /// the Wasm filter (`envoy/ext-proc-filter.yaml.tmpl`): the Gateway API Inference
    /// Extension's way to plug routing in.
    Epp,
}

impl Router {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Router::Headroom => "headroom",
            Router::RoundRobin => "envoy round robin",
            Router::LeastRequest => "envoy least request",
            Router::StickySession => "envoy sticky sessions",
            Router::HeadroomFilterSkipped => "headroom, filter skipped",
            Router::Epp => "headroom epp",
        }
    }
}
