//! The filter as an OCI image, without a container daemon: an OCI image layout directory
//! (and the same as one tar file) whose single layer holds `plugin.wasm`, the form Istio's
//! WasmPlugin pulls (`oci://...`). Push it with any OCI tool, e.g.
//! `skopeo copy oci:<dir>:<tag> docker://<registry>/<repo>:<tag>` or
//! `oras cp --from-oci-layout <dir>:<tag> <registry>/<repo>:<tag>`.
//!
//! The output is reproducible: fixed timestamps and ownership, so the same `.wasm` always
//! gives the same digests.

use std::io::Write;
use std::path::Path;

use serde_json::json;
use sha2::{Digest, Sha256};

/// Media types of an OCI image (the "compat" Wasm image Istio accepts).
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A gzipped tar holding `plugin.wasm` (mode 0444, uid/gid 0, mtime 0).
fn layer(wasm: &[u8]) -> anyhow::Result<(Vec<u8>, String)> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_path("plugin.wasm")?;
    header.set_size(wasm.len() as u64);
    header.set_mode(0o444);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    tar.append(&header, wasm)?;
    let tar_bytes = tar.into_inner()?;
    let diff_id = digest(&tar_bytes);
    let mut gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar_bytes)?;
    Ok((gz.finish()?, diff_id))
}

/// What was written.
#[derive(Debug)]
pub struct Image {
    pub manifest_digest: String,
    pub layer_digest: String,
    /// `sha256:` of the `.wasm` itself (what an EnvoyFilter `remote` source checks).
    pub wasm_digest: String,
}

fn blob(dir: &Path, bytes: &[u8]) -> anyhow::Result<String> {
    let d = digest(bytes);
    let path = dir.join("blobs/sha256").join(d.trim_start_matches("sha256:"));
    std::fs::write(&path, bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(d)
}

/// Writes an OCI image layout at `dir` (replacing it) holding `wasm` as `plugin.wasm`, tagged `tag`.
pub fn write_layout(wasm: &[u8], dir: &Path, tag: &str) -> anyhow::Result<Image> {
    anyhow::ensure!(wasm.starts_with(b"\0asm"), "not a WebAssembly module (no \\0asm magic)");
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("blobs/sha256"))?;
    let (layer_bytes, diff_id) = layer(wasm)?;
    let layer_digest = blob(dir, &layer_bytes)?;
    let config = json!({
        "architecture": "wasm",
        "os": "wasip1",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    let config_bytes = serde_json::to_vec(&config)?;
    let config_digest = blob(dir, &config_bytes)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": config_digest, "size": config_bytes.len()},
        "layers": [{"mediaType": LAYER, "digest": layer_digest, "size": layer_bytes.len(),
                    "annotations": {"org.opencontainers.image.title": "plugin.wasm"}}],
    });
    let manifest_bytes = serde_json::to_vec(&manifest)?;
    let manifest_digest = blob(dir, &manifest_bytes)?;
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": MANIFEST, "digest": manifest_digest, "size": manifest_bytes.len(),
                       "annotations": {"org.opencontainers.image.ref.name": tag}}],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec_pretty(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(Image { manifest_digest, layer_digest, wasm_digest: digest(wasm) })
}

/// The layout directory as one tar (what `skopeo copy oci-archive:` reads).
pub fn write_archive(layout: &Path, archive: &Path) -> anyhow::Result<()> {
    let mut tar = tar::Builder::new(std::fs::File::create(archive)?);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.append_dir_all(".", layout)?;
    tar.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn read_blob(dir: &Path, d: &str) -> Vec<u8> {
        std::fs::read(dir.join("blobs/sha256").join(d.trim_start_matches("sha256:"))).unwrap()
    }

    #[test]
    fn layout_chains_index_manifest_and_layer_by_digest() {
        let wasm = b"\0asm\x01\0\0\0 pretend module".to_vec();
        let dir = std::env::temp_dir().join(format!("headroom-oci-test-{}", std::process::id()));
        let image = write_layout(&wasm, &dir, "0.1.0").unwrap();

        let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["digest"], image.manifest_digest.as_str());
        assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], "0.1.0");
        let manifest_bytes = read_blob(&dir, &image.manifest_digest);
        assert_eq!(digest(&manifest_bytes), image.manifest_digest, "blob names are their digests");
        let manifest: serde_json::Value = serde_json::from_slice(&manifest_bytes).unwrap();
        assert_eq!(manifest["layers"][0]["digest"], image.layer_digest.as_str());
        let layer_bytes = read_blob(&dir, &image.layer_digest);
        assert_eq!(manifest["layers"][0]["size"], layer_bytes.len());

        // The layer is a gzipped tar with exactly plugin.wasm, byte for byte.
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(&layer_bytes[..]));
        let mut entries: Vec<(String, Vec<u8>)> = Vec::new();
        for e in tar.entries().unwrap() {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            entries.push((e.path().unwrap().display().to_string(), data));
        }
        assert_eq!(entries, vec![("plugin.wasm".to_string(), wasm.clone())]);

        // Reproducible: the same module gives the same digests.
        let again = write_layout(&wasm, &dir, "0.1.0").unwrap();
        assert_eq!(again.manifest_digest, image.manifest_digest);
        assert!(write_layout(b"not wasm", &dir, "x").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
