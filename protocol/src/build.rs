//! What each binary says of its own build: `--version` (clap's, from the same workspace
//! version) and the `headroom_build_info` series on every `/metrics`, so a dashboard or an
//! alert can tell which release each predictor and picker runs during a rollout.

/// The release every crate of the workspace shares.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The series' name: an info series, always 1, its labels the build.
pub const BUILD_INFO: &str = "headroom_build_info";

/// Its help text.
pub const BUILD_INFO_HELP: &str = "The running build: component and version (always 1)";

/// Its labels for `component` (`predictor`, `picker`).
pub fn build_labels(component: &'static str) -> [(&'static str, &'static str); 2] {
    [("component", component), ("version", VERSION)]
}
