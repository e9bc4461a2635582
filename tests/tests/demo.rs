//! `make demo`, shortened: both routers run on the same requests, the side-by-side table
//! and the chart come out, and nothing is left running.

use std::process::Command;

use headroom_stack::locate;

#[test]
fn the_demo_compares_least_request_and_headroom_on_the_same_requests() {
    let base = std::env::temp_dir().join(format!("headroom-demo-{}", std::process::id()));
    let chart = base.join("demo.svg");
    let run = Command::new(locate::bin_dir().unwrap().join("headroom-stack"))
        .args(["--run-dir", base.join("run").to_str().unwrap(), "demo", "--duration", "4", "--rate", "8"])
        .args(["--servers", "h100,a100", "--chart", chart.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).to_string();
    assert!(run.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("== envoy least request") && stdout.contains("== headroom"), "{stdout}");
    let side = stdout.split("== side by side").nth(1).unwrap_or_else(|| panic!("no side-by-side table: {stdout}"));
    assert!(side.contains("A = envoy least request, B = headroom") && side.contains("B - A"), "{side}");
    for class in ["interactive", "batch", "all"] {
        assert!(side.lines().any(|l| l.starts_with(class)), "{class} missing: {side}");
    }
    let svg = std::fs::read_to_string(&chart).unwrap();
    let groups = side.lines().filter(|l| l.contains('%')).count();
    assert_eq!(svg.matches(r#"class="bar""#).count(), 2 * groups, "one bar per router and class");
    let _ = std::fs::remove_dir_all(&base);
}
