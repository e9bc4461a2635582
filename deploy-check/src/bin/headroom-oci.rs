//! `headroom-oci [--wasm F] [--out DIR] [--tag T]`: the filter as an OCI image layout
//! (and `<DIR>.tar`), ready to push; prints the digests (what `make oci` runs).

use clap::Parser;
use headroom_deploy_check::oci;
use headroom_stack::locate;

#[derive(Parser)]
#[command(version, about = "Package the headroom filter as an OCI image (no container daemon needed)")]
struct Args {
    /// The filter module (default: the `make wasm` output).
    #[arg(long)]
    wasm: Option<std::path::PathBuf>,
    /// Layout directory to write (replaced).
    #[arg(long, default_value = "target/oci/headroom-filter")]
    out: std::path::PathBuf,
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    tag: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let wasm_path = match args.wasm {
        Some(p) => p,
        None => locate::wasm()?,
    };
    let wasm = std::fs::read(&wasm_path).map_err(|e| anyhow::anyhow!("{}: {e}", wasm_path.display()))?;
    let image = oci::write_layout(&wasm, &args.out, &args.tag)?;
    let archive = args.out.with_extension("tar");
    oci::write_archive(&args.out, &archive)?;
    println!("OCI image layout: {} (tag {})", args.out.display(), args.tag);
    println!("OCI archive:      {}", archive.display());
    println!("manifest digest:  {}", image.manifest_digest);
    println!("layer digest:     {}", image.layer_digest);
    println!("plugin.wasm:      {} (EnvoyFilter remote `sha256`, without the prefix)", image.wasm_digest);
    println!("push: skopeo copy oci:{}:{} docker://<registry>/<repo>:{}", args.out.display(), args.tag, args.tag);
    Ok(())
}
