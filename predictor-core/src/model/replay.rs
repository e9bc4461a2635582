//! Recorded observations read back for the offline tools (`prior-check`,
//! `train-check`): `headroom-bench run` keeps them under `observations/` (one
//! `/v1/observations` entry per line), `headroom-stack accuracy --observations F`
//! writes each wrapped as `{"phase": ..., "observation": {...}}`.

use std::io::BufRead;

use anyhow::Context;
use headroom_protocol::Observation;

/// One recorded observation and the accuracy run's phase it came in (else the name of
/// the file it came from: the benchmark writes one file per router and rate).
pub struct Recorded {
    pub phase: String,
    pub observation: Observation,
}

/// Every observation in `files`, in file order; lines that are not one are skipped.
pub fn read(files: &[String]) -> anyhow::Result<Vec<Recorded>> {
    let mut out = Vec::new();
    for file in files {
        let reader = std::io::BufReader::new(std::fs::File::open(file).with_context(|| file.clone())?);
        for line in reader.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&line?) else { continue };
            let phase = match value.get("phase").and_then(|p| p.as_str()) {
                Some(p) => p.to_string(),
                None => stem(file),
            };
            let value = if value.get("observation").is_some() { value["observation"].clone() } else { value };
            if let Ok(observation) = serde_json::from_value::<Observation>(value) {
                out.push(Recorded { phase, observation });
            }
        }
    }
    Ok(out)
}

/// Sets the prior's hardware factor of one class from `--scale CLASS=FACTOR` (the
/// factors by class id as the observations carry it: the pool's hardware names in order,
/// from 1), the classes before it at 1.0 unless set.
pub fn hardware_scale(arg: &str, scale: &mut Vec<f64>) -> anyhow::Result<()> {
    let (class, factor) = arg.split_once('=').context("--scale needs CLASS=FACTOR")?;
    let class: usize = class.parse().with_context(|| format!("--scale {arg}: CLASS is a class id"))?;
    let factor: f64 = factor.parse().with_context(|| format!("--scale {arg}: FACTOR is a number"))?;
    anyhow::ensure!(factor.is_finite() && factor > 0.0, "--scale {arg}: FACTOR must be > 0");
    anyhow::ensure!(class < 1024, "--scale {arg}: no pool has that many hardware classes");
    if scale.len() <= class {
        scale.resize(class + 1, 1.0);
    }
    scale[class] = factor;
    Ok(())
}

/// A file's name without its folders and its last extension.
fn stem(file: &str) -> String {
    let path = std::path::Path::new(file);
    path.file_stem().map_or_else(|| file.to_string(), |s| s.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use headroom_protocol::{EndpointState, Report, RequestFeatures, RouteSource};

    use super::*;

    fn observation(id: &str) -> Observation {
        Observation {
            report: Report {
                pool: "p".into(),
                request_id: id.into(),
                endpoint: "127.0.0.1:1".into(),
                source: RouteSource::PredictedPositive,
                ttft_ms: Some(25.0),
                tpot_ms: Some(6.0),
                e2e_ms: 700.0,
                output_tokens: Some(100),
                cached_tokens: None,
                status: 200,
                failed_at: None,
            },
            request: RequestFeatures { input_tokens: 100, streaming: true, ..Default::default() },
            state_at_dispatch: Some(EndpointState::default()),
            predicted_ttft_ms: Some(20.0),
            predicted_tpot_ms: Some(5.0),
        }
    }

    #[test]
    fn both_recordings_read_back_in_order_with_their_phase() {
        let dir = std::env::temp_dir().join(format!("headroom-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (accuracy, bench) = (dir.join("accuracy.jsonl"), dir.join("mixed-headroom-predicted-140.jsonl"));
        let wrapped = |phase: &str, id: &str| serde_json::json!({"phase": phase, "observation": observation(id)});
        let lines = [wrapped("mixed", "a"), wrapped("shifted", "b")].map(|v| v.to_string());
        std::fs::write(&accuracy, format!("{}\nnot json\n{{\"phase\":\"mixed\"}}\n{}\n", lines[0], lines[1])).unwrap();
        std::fs::write(&bench, serde_json::to_string(&observation("c")).unwrap() + "\n").unwrap();

        let files = [&accuracy, &bench].map(|p| p.display().to_string());
        let back = read(&files).unwrap();
        let got: Vec<(&str, &str)> =
            back.iter().map(|r| (r.phase.as_str(), r.observation.report.request_id.as_str())).collect();
        // Lines that are not an observation are skipped; a file without phases is its own.
        assert_eq!(got, [("mixed", "a"), ("shifted", "b"), ("mixed-headroom-predicted-140", "c")]);
        assert_eq!(back[2].observation, observation("c"));
        assert!(read(&["/nonexistent/x.jsonl".to_string()]).is_err(), "a missing file is an error, not nothing");
        let mut scale = Vec::new();
        hardware_scale("2=2.7", &mut scale).unwrap();
        assert_eq!(scale, [1.0, 1.0, 2.7]);
        for bad in ["", "2", "x=1", "1=0", "1=nan", "99999=1"] {
            assert!(hardware_scale(bad, &mut scale).is_err(), "{bad:?} is refused");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
