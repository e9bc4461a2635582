//! The feature row's layout: how many columns, which is which, and their names. Its own
//! module because both the row's builder (`features`) and the prior, which reads the
//! row's state columns and whose prediction fills its last two, depend on it.

/// Number of features.
pub const COUNT: usize = 14;

/// Column of the endpoint's hardware class.
pub const HARDWARE_CLASS: usize = 9;
/// Column of the endpoint's recent prefill rate (uncached prompt tokens per second).
pub const PREFILL_TOKENS_PER_S: usize = 11;
/// Column of the prior's log TTFT.
pub const PRIOR_LOG_TTFT: usize = 12;
/// Column of the prior's log TPOT.
pub const PRIOR_LOG_TPOT: usize = 13;

/// Feature names, in column order (also written into exported ONNX models).
pub const NAMES: [&str; COUNT] = [
    "kv_usage",
    "input_tokens",
    "waiting",
    "running",
    "prefix_match",
    "prefill_backlog_tokens",
    "effective_input_tokens",
    "in_flight",
    "tokens_in_flight",
    "hardware_class",
    "recent_tpot_ms",
    "prefill_tokens_per_s",
    "prior_log_ttft",
    "prior_log_tpot",
];

/// One row of features.
pub type Row = [f32; COUNT];
