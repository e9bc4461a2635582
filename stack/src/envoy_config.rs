//! The Envoy bootstrap the stack runs: `envoy/envoy.yaml.tmpl` filled with the stack's
//! addresses, the predictor clusters, and the filter in front of the model servers (the
//! Wasm filter, headroom-epp's ext_proc filter in its place, or none).

use std::net::SocketAddr;
use std::path::Path;

use serde_json::Value;

/// Where the parts Envoy talks to listen, and where Envoy itself does.
#[derive(Debug, Clone, Copy)]
pub struct Addresses<'a> {
    pub admin: SocketAddr,
    pub gateway: SocketAddr,
    /// Every predictor replica (at least one).
    pub predictors: &'a [SocketAddr],
    pub servers: &'a [SocketAddr],
    /// headroom-epp, when Envoy routes through it.
    pub epp: Option<SocketAddr>,
}

/// Envoy cluster name of predictor replica `i` (of `n`).
pub fn predictor_cluster(i: usize, n: usize) -> String {
    if n <= 1 {
        "headroom_predictor".to_string()
    } else {
        format!("headroom_predictor_{i}")
    }
}

/// One cluster per predictor replica. Like the Istio manifests' predictor clusters, they lift
/// Envoy's default circuit breakers (1024 per cluster): every inference request makes one
/// callout, and under flow control a waiting request holds its callout open until released.
/// The predictor clusters speak HTTP/2 (h2c) when the filter streams its predict calls
/// (`predict_stream`, on by default): the stream is gRPC (`headroom_protocol::stream`), and
/// the other calls share the connection. Without it they stay HTTP/1.1, which a predictor
/// that predates the stream (or the e2e suite's fake) speaks.
const PREDICTOR_HTTP2: &str = "    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions\n        explicit_http_config: {http2_protocol_options: {}}\n";

/// The predictor clusters: one per replica when `sharded` (the filter's `predictor_shards`),
/// else one, `headroom_predictor`, with every replica an endpoint of it.
fn predictor_clusters(predictors: &[SocketAddr], http2: bool, sharded: bool) -> String {
    if !sharded {
        return static_cluster(&predictor_cluster(0, 1), predictors, http2);
    }
    let n = predictors.len();
    predictors
        .iter()
        .enumerate()
        .map(|(i, p)| static_cluster(&predictor_cluster(i, n), std::slice::from_ref(p), http2))
        .collect()
}

/// A STATIC cluster of `endpoints` without Envoy's default circuit breakers, speaking
/// HTTP/2 (h2c) when `http2`.
fn static_cluster(name: &str, endpoints: &[SocketAddr], http2: bool) -> String {
    let protocol = if http2 { PREDICTOR_HTTP2 } else { "" };
    let endpoints: String = endpoints.iter().map(|p| lb_endpoint(p) + "\n").collect();
    format!(
        "  - name: {name}\n    type: STATIC\n    connect_timeout: 0.25s\n    circuit_breakers: {{thresholds: [{{max_connections: 1000000, max_pending_requests: 1000000, max_requests: 1000000}}]}}\n{protocol}    load_assignment:\n      cluster_name: {name}\n      endpoints:\n      - lb_endpoints:\n{endpoints}"
    )
}

/// One `lb_endpoints` entry of a cluster's load assignment, indented as the templates nest it.
fn lb_endpoint(a: &SocketAddr) -> String {
    format!("        - endpoint: {{address: {{socket_address: {{address: {}, port_value: {}}}}}}}", a.ip(), a.port())
}

/// A set_metadata filter giving every request the subset hint `allowed` (GIE's
/// `envoy.lb.subset_hint`), then the indentation of the next filter.
fn subset_hint_filter(allowed: &[SocketAddr]) -> String {
    let list = allowed.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(", ");
    format!(
        "- name: envoy.filters.http.set_metadata\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config\n              metadata:\n              - metadata_namespace: envoy.lb.subset_hint\n                value: {{x-gateway-destination-endpoint-subset: [{list}]}}\n          "
    )
}

/// The Envoy cluster of headroom-epp (gRPC: HTTP/2).
pub const EPP_CLUSTER: &str = "headroom_epp";

/// The ext_proc filter in front of headroom-epp (`envoy/ext-proc-filter.yaml.tmpl`, filled):
/// Envoy waits for the picker at most the predictor's timeout, plus flow control's longest
/// wait when it is on, plus a second; the picker answers within that by itself.
pub(crate) fn ext_proc_filter(
    snippet: &str,
    plugin: &Value,
    failure_mode_allow: bool,
    full_duplex: bool,
    subset: Option<&[SocketAddr]>,
) -> anyhow::Result<String> {
    // Read for its timeouts only: the picker takes its token from its own file, so the
    // variable Envoy's filter would read it from stands in.
    let stand_in = |_: &str| Some("stand-in-token-of-the-picker".to_string());
    let config = headroom_filter_core::FilterConfig::parse_in(serde_json::to_string(plugin)?.as_bytes(), stand_in)
        .map_err(|e| anyhow::anyhow!("the filter configuration: {e}"))?;
    let wait = if config.flow_control { config.flow_max_wait_ms } else { 0 };
    let timeout_ms = config.predictor_timeout_ms + wait + 1000;
    Ok(snippet
        .replace("{{EPP_FAILURE_MODE_ALLOW}}", &failure_mode_allow.to_string())
        .replace("{{EPP_REQUEST_BODY_MODE}}", if full_duplex { "FULL_DUPLEX_STREAMED" } else { "BUFFERED" })
        .replace("{{EPP_REQUEST_TRAILER_MODE}}", if full_duplex { "SEND" } else { "SKIP" })
        .replace("{{EPP_SUBSET_HINT}}", &subset.map(subset_hint_filter).unwrap_or_default())
        .replace("{{EPP_MESSAGE_TIMEOUT}}", &format!("{}.{:03}s", timeout_ms / 1000, timeout_ms % 1000)))
}

/// Marks the Wasm filter's lines in `envoy/envoy.yaml.tmpl` (for [`replace_wasm_filter`]).
const WASM_FILTER_BEGIN: &str = "# headroom-wasm-filter-begin";
const WASM_FILTER_END: &str = "# headroom-wasm-filter-end";

/// The template with `replacement` in place of the lines between the Wasm filter's markers.
pub(crate) fn replace_wasm_filter(template: &str, replacement: &str) -> anyhow::Result<String> {
    let begin = template.find(WASM_FILTER_BEGIN).ok_or_else(|| anyhow::anyhow!("no {WASM_FILTER_BEGIN} marker"))?;
    let end = template.find(WASM_FILTER_END).ok_or_else(|| anyhow::anyhow!("no {WASM_FILTER_END} marker"))?;
    anyhow::ensure!(begin < end, "Wasm filter markers out of order");
    Ok(format!("{}{}{}", &template[..begin], replacement.trim_start(), &template[end + WASM_FILTER_END.len()..]))
}

/// Renders the Envoy bootstrap template. The Wasm filter may pause on headers
/// (`allow_on_headers_stop_iteration`) unless the plugin says `read_body: false`.
pub fn render_envoy(
    template: &str,
    addresses: Addresses<'_>,
    wasm: &Path,
    plugin: &Value,
    lb_policy: &str,
) -> anyhow::Result<String> {
    let Addresses { admin, gateway, predictors, servers, epp } = addresses;
    // Unset, each takes the filter's own default: defined once, in its configuration.
    let defaults = headroom_filter_core::config::FilterConfig::default();
    let read_body = plugin.get("read_body").and_then(Value::as_bool).unwrap_or(defaults.read_body);
    let http2 = plugin.get("predict_stream").and_then(Value::as_bool).unwrap_or(defaults.predict_stream);
    let sharded = plugin.get("predictor_shards").is_some();
    let mut clusters = predictor_clusters(predictors, http2, sharded);
    if let Some(epp) = epp {
        clusters.push_str(&static_cluster(EPP_CLUSTER, std::slice::from_ref(&epp), true));
    }
    let endpoints: Vec<String> = servers.iter().map(lb_endpoint).collect();
    // A JSON string is a valid double-quoted YAML scalar.
    let plugin_text = serde_json::to_string(&serde_json::to_string(plugin)?)?;
    let out = template
        .replace("{{ADMIN_PORT}}", &admin.port().to_string())
        .replace("{{GATEWAY_PORT}}", &gateway.port().to_string())
        .replace("{{PREDICTOR_CLUSTERS}}", clusters.trim_end())
        .replace("{{ALLOW_ON_HEADERS_STOP_ITERATION}}", &read_body.to_string())
        .replace("{{WASM_PATH}}", &wasm.display().to_string())
        .replace("{{PLUGIN_CONFIG}}", &plugin_text)
        .replace("{{MODEL_SERVER_ENDPOINTS}}", &endpoints.join("\n"))
        .replace("{{LB_POLICY}}", lb_policy);
    anyhow::ensure!(!out.contains("{{"), "envoy template has a placeholder the stack does not fill");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictor_clusters_speak_http2_while_the_filter_streams() {
        let replicas: Vec<SocketAddr> = vec!["127.0.0.1:9000".parse().unwrap(), "127.0.0.1:9001".parse().unwrap()];
        let streaming = predictor_clusters(&replicas, true, true);
        assert_eq!(streaming.matches("http2_protocol_options").count(), 2, "{streaming}");
        assert!(streaming.contains("name: headroom_predictor_1"));
        assert!(!predictor_clusters(&replicas, false, true).contains("http2"));
        // A rollout's overlap: one cluster, both replicas its endpoints.
        let one = predictor_clusters(&replicas, false, false);
        assert_eq!(one.matches("- name: headroom_predictor\n").count(), 1, "{one}");
        assert!(one.contains("port_value: 9000") && one.contains("port_value: 9001"), "{one}");
    }
}
