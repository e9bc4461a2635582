//! Workloads: when each request is sent and what it asks for.

use headroom_protocol::tokens::BYTES_PER_TOKEN;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// A class of traffic with its own SLOs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SloClass {
    pub name: String,
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub priority: i32,
}

/// One request of a workload.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RequestSpec {
    /// Seconds after the start of the run.
    pub at_s: f64,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub stream: bool,
    pub class: SloClass,
}

impl RequestSpec {
    /// A prompt of exactly `prompt_tokens` tokens (by the shared approximation),
    /// unique to request `index` from its first block.
    pub fn prompt(&self, index: usize) -> String {
        let mut text = format!("request {index:08} ");
        let target = self.prompt_tokens as usize * BYTES_PER_TOKEN;
        while text.len() < target {
            text.push_str("lorem ipsum dolor sit amet ");
        }
        text.truncate(target.max(1));
        text
    }
}

/// The demo's mix: interactive (tight TTFT and TPOT), batch (loose), and a
/// sheddable background class. Poisson arrivals at `rate` per second.
pub fn mixed(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    let classes = [
        (0.5, SloClass { name: "interactive".into(), ttft_ms: Some(400.0), tpot_ms: Some(40.0), priority: 0 }),
        (0.35, SloClass { name: "batch".into(), ttft_ms: Some(4000.0), tpot_ms: Some(150.0), priority: 0 }),
        (0.15, SloClass { name: "sheddable".into(), ttft_ms: Some(1000.0), tpot_ms: Some(80.0), priority: -1 }),
    ];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += -rng.gen_range(f64::EPSILON..1.0).ln() / rate;
        if t >= duration_s {
            return out;
        }
        let pick: f64 = rng.gen_range(0.0..1.0);
        let mut acc = 0.0;
        let mut class = classes[0].1.clone();
        for (share, c) in &classes {
            acc += share;
            if pick < acc {
                class = c.clone();
                break;
            }
        }
        let (prompt_tokens, max_tokens) = match rng.gen_range(0..3) {
            0 => (rng.gen_range(50..400), rng.gen_range(150..400)), // short prompt, long answer
            1 => (rng.gen_range(1500..4000), rng.gen_range(10..60)), // long prompt, short answer
            _ => (rng.gen_range(300..1500), rng.gen_range(50..200)),
        };
        out.push(RequestSpec { at_s: t, prompt_tokens, max_tokens, stream: rng.gen_bool(0.85), class });
    }
}

/// A prefill-heavy shift: long prompts (2k-6k tokens), short answers, all
/// interactive. Used to check that the predictor's models recover.
pub fn long_prompts(seed: u64, rate: f64, duration_s: f64) -> Vec<RequestSpec> {
    let class = SloClass { name: "long-prompt".into(), ttft_ms: Some(1500.0), tpot_ms: Some(60.0), priority: 0 };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += -rng.gen_range(f64::EPSILON..1.0).ln() / rate;
        if t >= duration_s {
            return out;
        }
        let (prompt_tokens, max_tokens) = (rng.gen_range(2000..6000), rng.gen_range(20..100));
        out.push(RequestSpec { at_s: t, prompt_tokens, max_tokens, stream: true, class: class.clone() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::tokens::estimate_tokens;

    #[test]
    fn seeded_and_rate_shaped() {
        let a = mixed(7, 10.0, 60.0);
        assert_eq!(a, mixed(7, 10.0, 60.0));
        assert!((a.len() as f64 - 600.0).abs() < 100.0, "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].at_s <= w[1].at_s));
        for name in ["interactive", "batch", "sheddable"] {
            assert!(a.iter().any(|r| r.class.name == name));
        }
    }

    #[test]
    fn prompt_has_the_stated_token_count() {
        let r = RequestSpec {
            at_s: 0.0,
            prompt_tokens: 321,
            max_tokens: 1,
            stream: true,
            class: mixed(1, 1.0, 5.0)[0].class.clone(),
        };
        assert_eq!(estimate_tokens(&r.prompt(3)), 321);
        assert_ne!(r.prompt(3)[..64], r.prompt(4)[..64]);
    }
}
