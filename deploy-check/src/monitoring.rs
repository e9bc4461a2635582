//! The monitoring that ships (`istio/monitoring/`) reads series headroom serves: every
//! PromQL query of the Grafana dashboard and of the alert rules must parse, name only
//! metrics the predictor, the filter or the picker export (or Prometheus's own `up`), and
//! use only label names those metrics carry. A renamed metric or label fails `make test`
//! here instead of leaving a blank panel or an alert that can never fire.

use std::collections::{BTreeMap, BTreeSet};

use promql_parser::parser::{self, Expr};
use serde_json::Value;

/// Label names of a series (`None`: the metric is served but none of its series is in the
/// specimen, so its labels are not checked).
type Labels = Option<BTreeSet<String>>;

/// Every series name headroom serves, with its label names.
pub struct Catalog {
    series: BTreeMap<String, Labels>,
}

impl Catalog {
    /// From the predictor's registry ([`headroom_predictor_core::metrics::Metrics::specimen`])
    /// and the filter's stat table (as Envoy and the picker name them: `headroom_<name>`).
    pub fn served() -> Catalog {
        let mut series: BTreeMap<String, Labels> = BTreeMap::new();
        let text = headroom_predictor_core::metrics::Metrics::specimen().render();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
                let names: Vec<String> = match kind {
                    "counter" => vec![format!("{name}_total")],
                    "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{name}{s}")).collect(),
                    _ => vec![name.to_string()],
                };
                for n in names {
                    series.entry(n).or_insert(None);
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let (name, labels) = sample_labels(line);
                if let Some(known) = series.get_mut(&name) {
                    known.get_or_insert_with(BTreeSet::new).extend(labels);
                }
            }
        }
        let filter = headroom_filter_core::stats::STATS
            .iter()
            .map(|(n, k)| (*n, *k == headroom_filter_core::stats::Kind::Histogram))
            .chain(headroom_filter_core::stats::FLOW_OUTCOMES.iter().map(|n| (*n, false)))
            .chain([(headroom_filter_core::stats::PREDICT_STREAM_CLOSED, false)]);
        for (stat, histogram) in filter {
            let name = format!("headroom_{}", stat.replace('.', "_"));
            if histogram {
                for suffix in ["_sum", "_count"] {
                    series.insert(format!("{name}{suffix}"), Some(BTreeSet::new()));
                }
                series.insert(format!("{name}_bucket"), Some(["le".to_string()].into()));
            } else {
                series.insert(name, Some(BTreeSet::new()));
            }
        }
        for picker in
            [headroom_filter_core::stats::PICKER_OPEN_STREAMS, headroom_filter_core::stats::PICKER_WORKER_RESTARTS]
        {
            series.insert(picker.into(), Some(BTreeSet::new()));
        }
        // Prometheus's own, for each scraped target.
        series.insert("up".into(), Some(["job".to_string(), "instance".to_string()].into()));
        Catalog { series }
    }

    /// Problems of one PromQL query (`where_` names it in each message).
    pub fn check_query(&self, where_: &str, query: &str) -> Vec<String> {
        let expr = match parser::parse(&grafana_variables_replaced(query)) {
            Ok(e) => e,
            Err(e) => return vec![format!("{where_}: PromQL does not parse: {e}")],
        };
        let mut out = Vec::new();
        let mut selectors = Vec::new();
        selectors_of(&expr, &mut selectors, &BTreeSet::new());
        for (name, labels, grouping) in selectors {
            let Some(name) = name else {
                out.push(format!("{where_}: a selector without a metric name"));
                continue;
            };
            let Some(known) = self.series.get(&name) else {
                out.push(format!("{where_}: {name} is not a metric headroom serves"));
                continue;
            };
            let Some(known) = known else { continue };
            for label in labels.iter().chain(grouping.iter()) {
                if !known.contains(label) {
                    let have: Vec<&str> = known.iter().map(String::as_str).collect();
                    out.push(format!("{where_}: {name} has no label {label:?} (it has {have:?})"));
                }
            }
        }
        out
    }

    /// Problems of a Grafana dashboard's JSON: its shape (what Grafana needs to load it:
    /// title, uid, schemaVersion, panels with a type, a title, a place on the 24-column grid
    /// and unique ids; a `${datasource}` variable when panels use it) and every query.
    pub fn check_dashboard(&self, source: &str, text: &str) -> Vec<String> {
        let dashboard: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => return vec![format!("{source}: not JSON: {e}")],
        };
        let mut out = Vec::new();
        for field in ["title", "uid"] {
            if dashboard[field].as_str().is_none_or(str::is_empty) {
                out.push(format!("{source}: {field} must be a non-empty string"));
            }
        }
        if !dashboard["schemaVersion"].is_u64() {
            out.push(format!("{source}: schemaVersion must be a number"));
        }
        let variables: BTreeMap<&str, &Value> = dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v["name"].as_str()?, v)))
            .collect();
        for (name, variable) in &variables {
            if variable["type"] == "query" {
                let query = variable["query"]["query"].as_str().or(variable["query"].as_str()).unwrap_or_default();
                out.extend(self.check_label_values(&format!("{source}: variable {name}"), query));
            }
        }
        let Some(top) = dashboard["panels"].as_array().filter(|p| !p.is_empty()) else {
            out.push(format!("{source}: panels must be a non-empty list"));
            return out;
        };
        let panels: Vec<&Value> =
            top.iter().flat_map(|p| std::iter::once(p).chain(p["panels"].as_array().into_iter().flatten())).collect();
        let mut ids = BTreeSet::new();
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or_default();
            let at = format!("{source}: panel {title:?}");
            if title.is_empty() || panel["type"].as_str().is_none_or(str::is_empty) {
                out.push(format!("{at}: needs a type and a title"));
            }
            match panel["id"].as_u64() {
                Some(id) if ids.insert(id) => {}
                Some(id) => out.push(format!("{at}: id {id} is used twice")),
                None => out.push(format!("{at}: needs a numeric id")),
            }
            let grid = &panel["gridPos"];
            let cell = |k: &str| grid[k].as_u64();
            match (cell("x"), cell("y"), cell("w"), cell("h")) {
                (Some(x), Some(_), Some(w), Some(h)) if w > 0 && h > 0 && x + w <= 24 => {}
                _ => out.push(format!("{at}: gridPos needs x, y, w > 0, h > 0 with x + w <= 24")),
            }
            for target in panel["targets"].as_array().into_iter().flatten() {
                let Some(expr) = target["expr"].as_str() else {
                    out.push(format!("{at}: a target without expr"));
                    continue;
                };
                out.extend(self.check_query(&format!("{at} {}", target["refId"].as_str().unwrap_or("?")), expr));
            }
            for datasource in [&panel["datasource"]]
                .into_iter()
                .chain(panel["targets"].as_array().into_iter().flatten().map(|t| &t["datasource"]))
            {
                if let Some(uid) = datasource["uid"].as_str().and_then(|u| u.strip_prefix("${")?.strip_suffix('}')) {
                    if !variables.contains_key(uid) {
                        out.push(format!("{at}: datasource ${{{uid}}} is not a dashboard variable"));
                    }
                }
            }
        }
        out
    }

    /// Grafana's `label_values(metric, label)` template query.
    fn check_label_values(&self, at: &str, query: &str) -> Vec<String> {
        let Some(inner) = query.trim().strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')) else {
            return vec![format!("{at}: only label_values(metric, label) queries are checked, got {query:?}")];
        };
        let Some((selector, label)) = inner.rsplit_once(',') else {
            return vec![format!("{at}: label_values needs a metric and a label")];
        };
        let label = label.trim();
        let query = format!("sum by ({label}) ({})", selector.trim());
        self.check_query(at, &query)
    }

    /// Problems of a PrometheusRule: every rule's `expr`, and each alert's `labels.severity`.
    pub fn check_rules(&self, rule: &Value) -> Vec<String> {
        let mut out = Vec::new();
        for group in rule["spec"]["groups"].as_array().into_iter().flatten() {
            let group_name = group["name"].as_str().unwrap_or("?");
            for (i, r) in group["rules"].as_array().into_iter().flatten().enumerate() {
                let name = r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?");
                let at = format!("spec.groups[{group_name}].rules[{i}] {name}");
                match &r["expr"] {
                    Value::String(expr) => out.extend(self.check_query(&at, expr)),
                    _ => out.push(format!("{at}: expr must be a PromQL string")),
                }
                if r["alert"].is_string() && !r["labels"]["severity"].is_string() {
                    out.push(format!("{at}: an alert needs labels.severity"));
                }
            }
        }
        out
    }
}

/// Grafana's interval variables as a duration, other `$variables` left inside strings.
fn grafana_variables_replaced(query: &str) -> String {
    ["$__rate_interval", "$__interval", "$__range"].iter().fold(query.to_string(), |q, v| q.replace(v, "5m"))
}

/// A sample line's metric name and label names.
fn sample_labels(line: &str) -> (String, Vec<String>) {
    let head = line.split_whitespace().next().unwrap_or_default();
    let Some((name, rest)) = head.split_once('{') else { return (head.to_string(), Vec::new()) };
    let labels = rest
        .trim_end_matches('}')
        .split("\",")
        .filter_map(|pair| pair.split_once('=').map(|(k, _)| k.trim().to_string()))
        .filter(|k| !k.is_empty())
        .collect();
    (name.to_string(), labels)
}

/// Each vector selector of `expr`: its metric name, the label names it matches on, and the
/// labels its enclosing aggregations group by (`grouping`, carried down as found).
fn selectors_of(expr: &Expr, out: &mut Vec<(Option<String>, Vec<String>, Vec<String>)>, grouping: &BTreeSet<String>) {
    match expr {
        Expr::Aggregate(a) => {
            let mut inner = grouping.clone();
            if let Some(promql_parser::parser::LabelModifier::Include(labels)) = &a.modifier {
                inner.extend(labels.labels.iter().cloned());
            }
            selectors_of(&a.expr, out, &inner);
            if let Some(p) = &a.param {
                selectors_of(p, out, grouping);
            }
        }
        Expr::Unary(u) => selectors_of(&u.expr, out, grouping),
        Expr::Binary(b) => {
            selectors_of(&b.lhs, out, grouping);
            selectors_of(&b.rhs, out, grouping);
        }
        Expr::Paren(p) => selectors_of(&p.expr, out, grouping),
        Expr::Subquery(s) => selectors_of(&s.expr, out, grouping),
        Expr::VectorSelector(vs) => out.push(selector(vs, grouping)),
        Expr::MatrixSelector(ms) => out.push(selector(&ms.vs, grouping)),
        Expr::Call(c) => {
            for arg in &c.args.args {
                selectors_of(arg, out, grouping);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

fn selector(
    vs: &promql_parser::parser::VectorSelector,
    grouping: &BTreeSet<String>,
) -> (Option<String>, Vec<String>, Vec<String>) {
    let labels: Vec<String> = vs.matchers.matchers.iter().map(|m| m.name.clone()).filter(|n| n != "__name__").collect();
    // Grouped-by labels are held to the selector's series as its matchers are (`le` for a
    // histogram's `_bucket`s is one of them).
    (vs.name.clone(), labels, grouping.iter().cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_has_the_predictors_the_filters_and_their_labels() {
        let c = Catalog::served();
        assert!(c.check_query("q", "rate(headroom_shed[5m])").is_empty());
        assert!(c
            .check_query("q", r#"sum by (model_name, type) (inference_objective_request_slo_violation_total)"#)
            .is_empty());
        assert!(c
            .check_query("q", "histogram_quantile(0.9, sum by (le) (rate(headroom_predictor_call_ms_bucket[5m])))")
            .is_empty());
        assert!(c.check_query("q", r#"inference_pool_ready_pods{name=~"$pool"}"#).is_empty());
        assert!(c.check_query("q", "rate(x[$__rate_interval])")[0].contains("x is not a metric"));
    }

    #[test]
    fn unknown_metrics_labels_and_bad_syntax_are_named() {
        let c = Catalog::served();
        let p = c.check_query("panel A", "sum by (model) (rate(inference_objective_request_total[5m]))");
        assert!(p.len() == 1 && p[0].contains("no label \"model\""), "{p:?}");
        let p = c.check_query("panel A", r#"headroom_shed{pool="x"}"#);
        assert!(p[0].contains("headroom_shed has no label \"pool\""), "{p:?}");
        let p = c.check_query("panel A", "headroom_shedd");
        assert!(p[0].contains("headroom_shedd is not a metric"), "{p:?}");
        assert!(c.check_query("panel A", "sum(rate(headroom_shed[5m])")[0].contains("does not parse"));
    }

    #[test]
    fn a_dashboard_needs_its_shape() {
        let c = Catalog::served();
        let bad = r#"{"title": "t", "uid": "u", "schemaVersion": 39, "panels": [
            {"id": 1, "type": "timeseries", "title": "a", "gridPos": {"x": 20, "y": 0, "w": 8, "h": 8},
             "datasource": {"uid": "${ds}"}, "targets": [{"refId": "A", "expr": "headroom_shed"}]},
            {"id": 1, "type": "timeseries", "title": "b", "gridPos": {"x": 0, "y": 0, "w": 8, "h": 8}, "targets": []}]}"#;
        let p = c.check_dashboard("d.json", bad).join("\n");
        assert!(p.contains("x + w <= 24") && p.contains("id 1 is used twice") && p.contains("${ds} is not"), "{p}");
        assert!(c.check_dashboard("d.json", "{").join("").contains("not JSON"));
    }
}
