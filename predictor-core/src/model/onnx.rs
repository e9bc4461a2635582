//! Writing trained ensembles as a standard ONNX model.
//!
//! The graph: `features` float[N, 14] -> `ai.onnx.ml.TreeEnsembleRegressor`
//! (two targets: the log residuals of TTFT and TPOT), plus
//! `ai.onnx.ml.LinearRegressor` picking out the prior's log columns
//! (`features::PRIOR_LOG_*`), `Add`, `Exp` -> `latency_ms` float[N, 2] (column 0
//! TTFT, column 1 TPOT, milliseconds). Any model with that signature can be
//! loaded instead of the trained ones (`model_path`).
//!
//! Only the few ONNX messages needed are declared here, with the field numbers
//! of `onnx-ml.proto` (ONNX 1.23).

use prost::Message;

use super::features;
use super::gbdt::{Ensemble, Node};

/// Name of the model's input.
pub const INPUT: &str = "features";
/// Name of the model's output.
pub const OUTPUT: &str = "latency_ms";

#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    #[prost(int64, optional, tag = "1")]
    pub ir_version: Option<i64>,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    #[prost(string, optional, tag = "2")]
    pub producer_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub producer_version: Option<String>,
    #[prost(int64, optional, tag = "5")]
    pub model_version: Option<i64>,
    #[prost(string, optional, tag = "6")]
    pub doc_string: Option<String>,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct OperatorSetIdProto {
    #[prost(string, optional, tag = "1")]
    pub domain: Option<String>,
    #[prost(int64, optional, tag = "2")]
    pub version: Option<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct StringStringEntryProto {
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub op_type: Option<String>,
    #[prost(string, optional, tag = "7")]
    pub domain: Option<String>,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto.AttributeType` values used here.
const ATTR_INT: i32 = 2;
const ATTR_STRING: i32 = 3;
const ATTR_FLOATS: i32 = 6;
const ATTR_INTS: i32 = 7;
const ATTR_STRINGS: i32 = 8;
/// `TensorProto.DataType.FLOAT`.
const FLOAT: i32 = 1;

#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(int32, optional, tag = "20")]
    pub r#type: Option<i32>,
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    #[prost(bytes = "vec", optional, tag = "4")]
    pub s: Option<Vec<u8>>,
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueInfoProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeProto {
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorTypeProto {
    #[prost(int32, optional, tag = "1")]
    pub elem_type: Option<i32>,
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Dimension {
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(ATTR_INT), i: Some(v), ..Default::default() }
}
fn attr_string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(ATTR_STRING),
        s: Some(v.as_bytes().to_vec()),
        ..Default::default()
    }
}
fn attr_floats(name: &str, v: Vec<f32>) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(ATTR_FLOATS), floats: v, ..Default::default() }
}
fn attr_ints(name: &str, v: Vec<i64>) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(ATTR_INTS), ints: v, ..Default::default() }
}
fn attr_strings(name: &str, v: Vec<&str>) -> AttributeProto {
    let strings = v.into_iter().map(|s| s.as_bytes().to_vec()).collect();
    AttributeProto { name: Some(name.into()), r#type: Some(ATTR_STRINGS), strings, ..Default::default() }
}

fn tensor(name: &str, dims: [Option<i64>; 2]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match d {
            Some(v) => Dimension { dim_value: Some(*v), dim_param: None },
            None => Dimension { dim_value: None, dim_param: Some("N".into()) },
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto { elem_type: Some(FLOAT), shape: Some(TensorShapeProto { dim }) }),
        }),
    }
}

/// The ONNX bytes of a model predicting TTFT (target 0) and TPOT (target 1).
/// `metadata` goes into the model's metadata properties.
pub fn export(ttft: &Ensemble, tpot: &Ensemble, version: i64, metadata: &[(&str, String)]) -> Vec<u8> {
    let mut nodes = TreeAttrs::default();
    for (target, ensemble) in [ttft, tpot].into_iter().enumerate() {
        for tree in &ensemble.trees {
            nodes.push_tree(tree, target as i64);
        }
    }
    let ensemble = NodeProto {
        input: vec![INPUT.into()],
        output: vec!["log_residual".into()],
        name: Some("latency_trees".into()),
        op_type: Some("TreeEnsembleRegressor".into()),
        domain: Some("ai.onnx.ml".into()),
        attribute: nodes.into_attributes([ttft.base as f32, tpot.base as f32]),
    };
    // The offset columns (the prior's log latency) picked out by a linear map with one
    // coefficient of 1 per target: standard ops only, no initializers.
    let mut coefficients = vec![0f32; 2 * features::COUNT];
    for (target, ensemble) in [ttft, tpot].into_iter().enumerate() {
        if let Some(f) = ensemble.offset_feature.filter(|&f| f < features::COUNT) {
            coefficients[target * features::COUNT + f] = 1.0;
        }
    }
    let offsets = NodeProto {
        input: vec![INPUT.into()],
        output: vec!["log_offset".into()],
        name: Some("prior_columns".into()),
        op_type: Some("LinearRegressor".into()),
        domain: Some("ai.onnx.ml".into()),
        attribute: vec![
            attr_floats("coefficients", coefficients),
            attr_floats("intercepts", vec![0.0, 0.0]),
            attr_int("targets", 2),
        ],
    };
    let add = NodeProto {
        input: vec!["log_residual".into(), "log_offset".into()],
        output: vec!["log_latency".into()],
        name: Some("residual_plus_prior".into()),
        op_type: Some("Add".into()),
        domain: Some(String::new()),
        attribute: vec![],
    };
    let exp = NodeProto {
        input: vec!["log_latency".into()],
        output: vec![OUTPUT.into()],
        name: Some("to_ms".into()),
        op_type: Some("Exp".into()),
        domain: Some(String::new()),
        attribute: vec![],
    };
    let mut props: Vec<StringStringEntryProto> = metadata
        .iter()
        .map(|(k, v)| StringStringEntryProto { key: Some((*k).into()), value: Some(v.clone()) })
        .collect();
    props.push(StringStringEntryProto { key: Some("features".into()), value: Some(features::NAMES.join(",")) });
    props.push(StringStringEntryProto { key: Some("outputs".into()), value: Some("ttft_ms,tpot_ms".into()) });
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![
            OperatorSetIdProto { domain: Some(String::new()), version: Some(17) },
            OperatorSetIdProto { domain: Some("ai.onnx.ml".into()), version: Some(3) },
        ],
        producer_name: Some("headroom-predictor".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        model_version: Some(version),
        doc_string: Some(format!(
            "headroom latency model: features[N,{}] -> latency_ms[N,2] (ttft, tpot) = exp(trees + prior columns)",
            features::COUNT
        )),
        graph: Some(GraphProto {
            node: vec![ensemble, offsets, add, exp],
            name: Some("headroom_latency".into()),
            input: vec![tensor(INPUT, [None, Some(features::COUNT as i64)])],
            output: vec![tensor(OUTPUT, [None, Some(2)])],
        }),
        metadata_props: props,
    };
    model.encode_to_vec()
}

/// The flattened node and target lists of a `TreeEnsembleRegressor`.
#[derive(Default)]
struct TreeAttrs {
    next_tree: i64,
    tree_ids: Vec<i64>,
    node_ids: Vec<i64>,
    feature_ids: Vec<i64>,
    modes: Vec<&'static str>,
    values: Vec<f32>,
    true_ids: Vec<i64>,
    false_ids: Vec<i64>,
    target_tree_ids: Vec<i64>,
    target_node_ids: Vec<i64>,
    target_ids: Vec<i64>,
    target_weights: Vec<f32>,
}

impl TreeAttrs {
    fn push_tree(&mut self, tree: &[Node], target: i64) {
        let id = self.next_tree;
        self.next_tree += 1;
        for (i, node) in tree.iter().enumerate() {
            self.tree_ids.push(id);
            self.node_ids.push(i as i64);
            match node {
                Node::Split { feature, threshold, left, right } => {
                    self.feature_ids.push(*feature as i64);
                    self.modes.push("BRANCH_LEQ");
                    self.values.push(*threshold);
                    self.true_ids.push(*left as i64);
                    self.false_ids.push(*right as i64);
                }
                Node::Leaf { value } => {
                    self.feature_ids.push(0);
                    self.modes.push("LEAF");
                    self.values.push(0.0);
                    self.true_ids.push(0);
                    self.false_ids.push(0);
                    self.target_tree_ids.push(id);
                    self.target_node_ids.push(i as i64);
                    self.target_ids.push(target);
                    self.target_weights.push(*value as f32);
                }
            }
        }
    }

    fn into_attributes(self, base: [f32; 2]) -> Vec<AttributeProto> {
        vec![
            attr_int("n_targets", 2),
            attr_string("aggregate_function", "SUM"),
            attr_string("post_transform", "NONE"),
            attr_floats("base_values", base.to_vec()),
            attr_ints("nodes_treeids", self.tree_ids),
            attr_ints("nodes_nodeids", self.node_ids),
            attr_ints("nodes_featureids", self.feature_ids),
            attr_strings("nodes_modes", self.modes),
            attr_floats("nodes_values", self.values),
            attr_ints("nodes_truenodeids", self.true_ids),
            attr_ints("nodes_falsenodeids", self.false_ids),
            attr_ints("target_treeids", self.target_tree_ids),
            attr_ints("target_nodeids", self.target_node_ids),
            attr_ints("target_ids", self.target_ids),
            attr_floats("target_weights", self.target_weights),
        ]
    }
}
