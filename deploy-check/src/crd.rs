//! Custom resources checked against the OpenAPI schemas of their CRDs, strictly: a field
//! the schema does not declare is an error (as `kubectl apply --validate=strict` does),
//! unless the schema says `x-kubernetes-preserve-unknown-fields`.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

/// Compiled schemas by `(apiVersion, kind)`.
pub struct Schemas {
    by_kind: HashMap<(String, String), jsonschema::Validator>,
}

/// Turns a CRD's structural schema into a strict JSON Schema (draft 4 semantics).
pub fn strict(schema: &Value) -> Value {
    match schema {
        Value::Object(o) => {
            let mut out = Map::new();
            for (k, v) in o {
                let v = match k.as_str() {
                    // Maps of schemas: keep the keys, make each value strict.
                    "properties" | "patternProperties" | "definitions" => match v {
                        Value::Object(props) => {
                            Value::Object(props.iter().map(|(name, s)| (name.clone(), strict(s))).collect())
                        }
                        other => other.clone(),
                    },
                    // Kubernetes extensions and formats (int32, date-time, ...) are not checked here.
                    k if k.starts_with("x-kubernetes-") || k == "format" || k == "nullable" => continue,
                    // Go (RE2) inline flags such as `(?i)`, which JSON Schema's ECMA-262 patterns
                    // lack (the Prometheus Operator's CRDs use them): such a pattern is not checked.
                    "pattern" if v.as_str().is_some_and(|p| p.contains("(?")) => continue,
                    _ => strict(v),
                };
                out.insert(k.clone(), v);
            }
            let preserve = o.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if o.contains_key("properties") && !o.contains_key("additionalProperties") && !preserve {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            if o.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                out.remove("type");
            }
            if o.get("nullable") == Some(&Value::Bool(true)) {
                if let Some(Value::String(t)) = out.get("type").cloned() {
                    out.insert("type".into(), json!([t, "null"]));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(strict).collect()),
        other => other.clone(),
    }
}

impl Schemas {
    /// Reads every CustomResourceDefinition in a (multi-document) YAML text.
    pub fn load(crds_yaml: &str) -> anyhow::Result<Schemas> {
        let mut by_kind = HashMap::new();
        for doc in crate::yaml::documents(crds_yaml)? {
            if doc["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let spec = &doc["spec"];
            let (group, kind) = (spec["group"].as_str().unwrap_or(""), spec["names"]["kind"].as_str().unwrap_or(""));
            for version in spec["versions"].as_array().into_iter().flatten() {
                let (Some(name), Some(schema)) = (version["name"].as_str(), version["schema"].get("openAPIV3Schema"))
                else {
                    continue;
                };
                let mut schema = strict(schema);
                // A manifest carries the envelope the CRD schema leaves out.
                if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
                    props.insert("apiVersion".into(), json!({"type": "string"}));
                    props.insert("kind".into(), json!({"type": "string"}));
                    props.insert("metadata".into(), json!({"type": "object"}));
                }
                let validator = jsonschema::options()
                    .with_draft(jsonschema::Draft::Draft4)
                    .should_validate_formats(false)
                    .build(&schema)
                    .map_err(|e| anyhow::anyhow!("schema of {kind} {group}/{name}: {e}"))?;
                by_kind.insert((format!("{group}/{name}"), kind.to_string()), validator);
            }
        }
        anyhow::ensure!(!by_kind.is_empty(), "no CustomResourceDefinition schemas found");
        Ok(Schemas { by_kind })
    }

    /// `None` when no CRD defines this apiVersion and kind; else the errors, each `path: message`.
    pub fn check(&self, api_version: &str, kind: &str, doc: &Value) -> Option<Vec<String>> {
        let validator = self.by_kind.get(&(api_version.to_string(), kind.to_string()))?;
        Some(
            validator
                .iter_errors(doc)
                .map(|e| {
                    let path = e.instance_path().to_string();
                    format!("{}: {e}", if path.is_empty() { "/" } else { path.as_str() })
                })
                .collect(),
        )
    }

    /// The kinds known, as `apiVersion kind`.
    pub fn kinds(&self) -> Vec<String> {
        let mut v: Vec<String> = self.by_kind.keys().map(|(a, k)| format!("{a} {k}")).collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_closes_objects_unless_told_to_preserve() {
        let s = strict(&json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string", "format": "int32"}}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"c": {}}},
            "port": {"x-kubernetes-int-or-string": true, "type": "integer"}
        }}));
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert!(s["properties"]["a"]["properties"]["b"].get("format").is_none());
        assert!(s["properties"]["free"].get("additionalProperties").is_none());
        assert!(s["properties"]["port"].get("type").is_none());
    }
}
