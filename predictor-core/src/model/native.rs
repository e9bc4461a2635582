//! A [`Runtime`] in plain Rust for the models this predictor exports ([`super::onnx`]):
//! it reads the ONNX graph back into the two tree ensembles it was written from and walks
//! them. Tests and simulations run the whole learning loop on it without loading ONNX
//! Runtime; any other graph (a user's `model_path`) is refused with the reason, since
//! only ONNX Runtime runs arbitrary models.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use prost::Message;

use super::features::{self, Row};
use super::gbdt::{Ensemble, Node};
use super::onnx::{AttributeProto, ModelProto, NodeProto};
use super::runtime::{LatencyModel, Runtime};

/// Runs exported tree ensembles (`TreeEnsembleRegressor` + prior columns, `Add`, `Exp`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Native;

impl Runtime for Native {
    fn load(&self, onnx: &[u8]) -> anyhow::Result<Box<dyn LatencyModel>> {
        let model = ModelProto::decode(onnx).map_err(|e| anyhow::anyhow!("not a usable ONNX model: {e}"))?;
        let graph = model.graph.ok_or_else(|| anyhow::anyhow!("the model has no graph"))?;
        let op = |name: &str| graph.node.iter().find(|n| n.op_type.as_deref() == Some(name));
        let ops: Vec<&str> = graph.node.iter().filter_map(|n| n.op_type.as_deref()).collect();
        anyhow::ensure!(
            ops == ["TreeEnsembleRegressor", "LinearRegressor", "Add", "Exp"],
            "the native runtime runs only the predictor's own exported graph, not {ops:?}"
        );
        let (Some(trees), Some(offsets)) = (op("TreeEnsembleRegressor"), op("LinearRegressor")) else {
            anyhow::bail!("the model's graph is incomplete");
        };
        let [ttft, tpot] = ensembles(trees, offsets)?;
        Ok(Box::new(Trees { ttft, tpot, runs: AtomicU64::new(0) }))
    }
}

struct Trees {
    ttft: Ensemble,
    tpot: Ensemble,
    runs: AtomicU64,
}

impl LatencyModel for Trees {
    fn predict(&self, rows: &[Row]) -> anyhow::Result<Vec<(f64, f64)>> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        Ok(rows.iter().map(|r| (self.ttft.predict(r), self.tpot.predict(r))).collect())
    }

    fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }
}

fn attr<'a>(node: &'a NodeProto, name: &str) -> anyhow::Result<&'a AttributeProto> {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
        .ok_or_else(|| anyhow::anyhow!("{} has no `{name}`", node.op_type.as_deref().unwrap_or("a node")))
}

fn index(v: i64, what: &str) -> anyhow::Result<usize> {
    usize::try_from(v).map_err(|_| anyhow::anyhow!("negative {what}: {v}"))
}

/// The (TTFT, TPOT) ensembles the two nodes hold.
fn ensembles(trees: &NodeProto, offsets: &NodeProto) -> anyhow::Result<[Ensemble; 2]> {
    let base = &attr(trees, "base_values")?.floats;
    anyhow::ensure!(base.len() == 2, "base_values has {} values, not 2", base.len());
    let tree_ids = &attr(trees, "nodes_treeids")?.ints;
    let node_ids = &attr(trees, "nodes_nodeids")?.ints;
    let feature_ids = &attr(trees, "nodes_featureids")?.ints;
    let modes = &attr(trees, "nodes_modes")?.strings;
    let values = &attr(trees, "nodes_values")?.floats;
    let true_ids = &attr(trees, "nodes_truenodeids")?.ints;
    let false_ids = &attr(trees, "nodes_falsenodeids")?.ints;
    let n = tree_ids.len();
    anyhow::ensure!(
        [node_ids.len(), feature_ids.len(), modes.len(), values.len(), true_ids.len(), false_ids.len()]
            .iter()
            .all(|&l| l == n),
        "the tree node lists differ in length"
    );
    // Nodes are numbered within their tree from 0, as the exporter writes them.
    let mut by_tree: BTreeMap<i64, Vec<Node>> = BTreeMap::new();
    for i in 0..n {
        let tree = by_tree.entry(tree_ids[i]).or_default();
        anyhow::ensure!(index(node_ids[i], "node id")? == tree.len(), "tree {} is not in node order", tree_ids[i]);
        tree.push(match modes[i].as_slice() {
            b"BRANCH_LEQ" => Node::Split {
                feature: index(feature_ids[i], "feature id")?,
                threshold: values[i],
                left: index(true_ids[i], "node id")?,
                right: index(false_ids[i], "node id")?,
            },
            b"LEAF" => Node::Leaf { value: 0.0 },
            other => anyhow::bail!("node mode {} is not run natively", String::from_utf8_lossy(other)),
        });
    }
    let target_trees = &attr(trees, "target_treeids")?.ints;
    let target_nodes = &attr(trees, "target_nodeids")?.ints;
    let targets = &attr(trees, "target_ids")?.ints;
    let weights = &attr(trees, "target_weights")?.floats;
    anyhow::ensure!(
        [target_nodes.len(), targets.len(), weights.len()].iter().all(|&l| l == target_trees.len()),
        "the target lists differ in length"
    );
    let mut ensembles = [0, 1].map(|t| Ensemble { base: f64::from(base[t]), trees: Vec::new(), offset_feature: None });
    let mut target_of: BTreeMap<i64, usize> = BTreeMap::new();
    for i in 0..target_trees.len() {
        let target = index(targets[i], "target")?;
        anyhow::ensure!(target < 2, "target {target} is neither TTFT nor TPOT");
        anyhow::ensure!(
            *target_of.entry(target_trees[i]).or_insert(target) == target,
            "tree {} feeds both targets",
            target_trees[i]
        );
        let leaf = by_tree
            .get_mut(&target_trees[i])
            .and_then(|t| t.get_mut(index(target_nodes[i], "node id").ok()?))
            .ok_or_else(|| anyhow::anyhow!("a target names a node that does not exist"))?;
        *leaf = Node::Leaf { value: f64::from(weights[i]) };
    }
    for (id, tree) in by_tree {
        let target = target_of.get(&id).copied().unwrap_or(0);
        ensembles[target].trees.push(tree);
    }
    // The prior's log columns: one coefficient of 1 per target picks out its offset.
    let coefficients = &attr(offsets, "coefficients")?.floats;
    anyhow::ensure!(coefficients.len() == 2 * features::COUNT, "the prior columns' coefficients do not fit the rows");
    for (target, ensemble) in ensembles.iter_mut().enumerate() {
        let own = &coefficients[target * features::COUNT..(target + 1) * features::COUNT];
        ensemble.offset_feature = own.iter().position(|&c| c == 1.0);
    }
    Ok(ensembles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::runtime;

    #[test]
    fn runs_exported_models_as_the_trees_do() {
        runtime::conformance(&Native).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_graph_it_did_not_write_is_refused_with_the_reason() {
        let other = ModelProto {
            graph: Some(super::super::onnx::GraphProto {
                node: vec![NodeProto { op_type: Some("MatMul".into()), ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = Native.load(&other.encode_to_vec()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("only the predictor's own exported graph"), "{err}");
    }
}
