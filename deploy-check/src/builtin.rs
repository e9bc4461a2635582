//! Kubernetes' own kinds, checked against the typed API of `k8s-openapi`: wrong types,
//! missing required fields and wrong apiVersions fail to deserialize, and a field the
//! type does not have is reported (strict, like `kubectl apply --validate=strict`).

use k8s_openapi::api::{apps, core, networking, policy, rbac};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Deserializes `doc` as `T`, collecting every field `T` does not know. Problems read
/// `path: message` with a dotted path (`spec.template.spec.containers[0].image`).
fn typed<T: DeserializeOwned>(doc: &Value) -> (Option<T>, Vec<String>) {
    let mut problems = Vec::new();
    // serde_ignored writes `?` for each Option on the way: not part of the document's path.
    let clean = |path: String| path.split('.').filter(|s| *s != "?").collect::<Vec<_>>().join(".");
    let mut unknown = |path: serde_ignored::Path| problems.push(format!("{}: unknown field", clean(path.to_string())));
    let parsed: Result<T, _> =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(doc.clone(), &mut unknown));
    match parsed {
        Ok(v) => (Some(v), problems),
        Err(e) => {
            let path = e.path().to_string();
            problems.push(format!("{path}: {}", e.inner()));
            (None, problems)
        }
    }
}

/// Every label of `selector` present, with the same value, in `labels`.
fn selects(
    selector: Option<&std::collections::BTreeMap<String, String>>,
    labels: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    let empty = Default::default();
    let labels = labels.unwrap_or(&empty);
    selector.is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// `None` when this is not a built-in kind this checker knows; else the problems found.
pub fn check(api_version: &str, kind: &str, doc: &Value) -> Option<Vec<String>> {
    let problems = match (api_version, kind) {
        ("v1", "ServiceAccount") => typed::<core::v1::ServiceAccount>(doc).1,
        ("v1", "ConfigMap") => typed::<core::v1::ConfigMap>(doc).1,
        ("v1", "Secret") => typed::<core::v1::Secret>(doc).1,
        ("v1", "Namespace") => typed::<core::v1::Namespace>(doc).1,
        ("v1", "Service") => {
            let (svc, mut p) = typed::<core::v1::Service>(doc);
            if let Some(spec) = svc.and_then(|s| s.spec) {
                if spec.selector.as_ref().is_none_or(|s| s.is_empty()) && spec.type_.as_deref() != Some("ExternalName")
                {
                    p.push("spec.selector: a Service without a selector routes nowhere".into());
                }
            }
            p
        }
        ("apps/v1", "Deployment") => {
            let (d, mut p) = typed::<apps::v1::Deployment>(doc);
            if let Some(spec) = d.and_then(|d| d.spec) {
                let labels = spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref());
                if !selects(spec.selector.match_labels.as_ref(), labels) {
                    p.push("spec.selector: matchLabels must select the pod template's labels".into());
                }
            }
            p
        }
        ("policy/v1", "PodDisruptionBudget") => typed::<policy::v1::PodDisruptionBudget>(doc).1,
        ("rbac.authorization.k8s.io/v1", "Role") => typed::<rbac::v1::Role>(doc).1,
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => typed::<rbac::v1::RoleBinding>(doc).1,
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => typed::<rbac::v1::ClusterRole>(doc).1,
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => typed::<rbac::v1::ClusterRoleBinding>(doc).1,
        ("networking.k8s.io/v1", "NetworkPolicy") => typed::<networking::v1::NetworkPolicy>(doc).1,
        _ => return None,
    };
    Some(problems)
}

/// The object metadata of any kind (custom resources too): names, labels, annotations.
pub fn check_metadata(doc: &Value) -> Vec<String> {
    let Some(meta) = doc.get("metadata") else { return vec!["metadata: missing".into()] };
    let (m, p) = typed::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(meta);
    let mut p: Vec<String> = p.into_iter().map(|e| format!("metadata.{e}")).collect();
    if let Some(m) = m {
        match m.name.as_deref() {
            None | Some("") => p.push("metadata.name: missing".into()),
            Some(name) if !is_dns_label_ish(name) => p.push(format!("metadata.name: {name:?} is not a valid name")),
            _ => {}
        }
    }
    p
}

/// Lower-case alphanumerics, `-` and `.`, starting and ending alphanumeric, at most 253.
fn is_dns_label_ish(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= 253
        && name.chars().all(|c| ok(c) || c == '-' || c == '.')
        && name.chars().next().is_some_and(ok)
        && name.chars().last().is_some_and(ok)
}
