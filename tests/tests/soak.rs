//! The 2-minute soak of `make test` (`make soak` runs 30 minutes): steady mixed traffic
//! through the whole stack, memory sampled, failures counted, the predictor's books
//! balanced. With the predictor's bounded stores shrunk (`--small-caps`) so they are full
//! by the end of the warm-up, growth after it means something that is not bounded.

use std::process::Command;

use headroom_bench::soak::SoakSummary;
use headroom_stack::locate;

#[test]
fn two_minutes_of_steady_traffic_leak_nothing_and_lose_nothing() {
    let bin = locate::bin_dir().unwrap().join("headroom-bench");
    let base = std::env::temp_dir().join(format!("headroom-soak-{}", std::process::id()));
    let (run_dir, out) = (base.join("run"), base.join("soak"));
    let run = Command::new(&bin)
        .args(["--run-dir", run_dir.to_str().unwrap(), "soak", "--seconds", "120", "--warmup", "60", "--small-caps"])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    let summary: SoakSummary = serde_json::from_str(&std::fs::read_to_string(out.join("soak.json")).unwrap()).unwrap();
    assert!(run.status.success(), "soak failed: {stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("soak PASSED"), "{stdout}");
    assert!(summary.requests > 3000 && summary.failed == 0 && summary.books.balanced(), "{summary:?}");
    assert!(summary.books.dispatched >= summary.ok as f64 * 0.99, "every routed request was dispatched: {summary:?}");
    let csv = std::fs::read_to_string(out.join("samples.csv")).unwrap();
    assert!(csv.lines().count() >= 12, "a sample every 10 s:\n{csv}");
    assert!(csv.lines().skip(2).all(|l| l.split(',').all(|v| v.parse::<f64>().is_ok_and(|x| x > 0.0))), "{csv}");
    assert!(std::fs::read_to_string(out.join("memory.svg")).unwrap().contains("</svg>"));
    let _ = std::fs::remove_dir_all(&base);
}
