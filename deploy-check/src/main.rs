//! `headroom-deploy-check [--root istio]`: validate the manifests offline (see the crate docs).

use clap::Parser;
use headroom_deploy_check::{check_tree, read_schema, Checker};
use headroom_stack::locate;

#[derive(Parser)]
#[command(version, about = "Validate headroom's Istio/Kubernetes manifests offline")]
struct Args {
    /// Manifest tree (default: the repository's istio/).
    #[arg(long)]
    root: Option<std::path::PathBuf>,
    /// CRD schemas, a YAML file, gzipped or not (default: every `*.yaml` and `*.yaml.gz` in <root>/schemas).
    #[arg(long)]
    crds: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = args.root.unwrap_or_else(|| locate::root().join("istio"));
    let checker = match &args.crds {
        Some(file) => Checker::new(&read_schema(file)?)?,
        None => Checker::from_dir(&root.join("schemas"))?,
    };
    let scratch = std::env::temp_dir().join(format!("headroom-deploy-check-{}", std::process::id()));
    let report = check_tree(&checker, &root, &locate::envoy()?, &locate::wasm()?, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    for p in &report.problems {
        println!("{p}");
    }
    for d in &report.not_rendered {
        println!("not rendered (kubectl not installed): {}", d.display());
    }
    println!(
        "{} files ({} documents), {} kustomizations rendered, {} Envoy configs validated: {} problems",
        report.files,
        report.documents,
        report.kustomizations.len(),
        report.envoy_configs,
        report.problems.len()
    );
    anyhow::ensure!(report.problems.is_empty(), "manifests are invalid");
    Ok(())
}
