//! A pool's requests in flight, and what they add to each endpoint's state at a moment.
//!
//! Every prediction asks what the requests in flight add to each endpoint: their count,
//! their tokens, the prompts still being prefilled, the TPOT SLOs running there. Scanning
//! every request in flight for each prediction made the predictor's cost grow with the load
//! it judges: a flow-control round judging 64 waiting requests over 3,600 in flight scanned
//! 230,000 entries, every round. All of it but the SLO comparison is the same for every
//! request asked about at one moment, so it is summed once per moment and change of the
//! books ([`Books::booked`]); what depends on the asker (its band, its own TPOT SLO) reads
//! a handful of (band, SLO) counts. Every change to the books goes through [`Books`], which
//! counts it, so a sum is never read after the books it came from changed.

use std::collections::HashMap;
use std::time::Instant;

use super::InFlight;

/// What the requests in flight add to one endpoint's state at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Booked {
    pub in_flight: u32,
    pub tokens_in_flight: u64,
    /// Uncached prompt tokens of the requests still in prefill.
    pub uncached_tokens_in_flight: u64,
    /// Of those, what the engine has likely not prefilled yet (`None`: no prefill cost known).
    pub prefill_backlog_tokens: Option<u64>,
    /// `(priority, TPOT SLO, requests)` of the requests whose SLO may tighten another's
    /// target (`InFlight::tpot_slo_ms`).
    pub slos: Vec<(i32, f64, u32)>,
}

impl Booked {
    /// The tightest TPOT SLO running here of the band `priority` or above, and how many of
    /// those are tighter than `own`.
    pub fn slos_for(&self, priority: i32, own: Option<f64>) -> (Option<f64>, u32) {
        let mut tightest: Option<f64> = None;
        let mut tighter = 0u32;
        for &(_, slo, n) in self.slos.iter().filter(|(band, ..)| *band >= priority) {
            tightest = Some(tightest.map_or(slo, |t| t.min(slo)));
            if own.is_some_and(|own| slo < own) {
                tighter = tighter.saturating_add(n);
            }
        }
        (tightest, tighter)
    }
}

/// The sums of one moment, kept while the books do not change.
#[derive(Debug)]
struct Sums {
    at: Instant,
    version: u64,
    booked: Vec<Booked>,
}

/// The requests in flight by id; every change counted.
#[derive(Debug, Default)]
pub(super) struct Books {
    map: HashMap<String, InFlight>,
    version: u64,
    sums: Option<Sums>,
}

impl Books {
    pub fn get(&self, id: &str) -> Option<&InFlight> {
        self.map.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut InFlight> {
        self.version += 1;
        self.map.get_mut(id)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.map.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn insert(&mut self, id: String, f: InFlight) {
        self.version += 1;
        self.map.insert(id, f);
    }

    pub fn remove(&mut self, id: &str) -> Option<InFlight> {
        self.version += 1;
        self.map.remove(id)
    }

    pub fn retain(&mut self, keep: impl FnMut(&String, &mut InFlight) -> bool) {
        self.version += 1;
        self.map.retain(keep);
    }

    pub fn values(&self) -> impl Iterator<Item = &InFlight> {
        self.map.values()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &InFlight)> {
        self.map.iter()
    }

    /// What the requests in flight add to each of `endpoints` endpoints at `now`, summed
    /// once per moment and change. `in_prefill` says whether a request's prompt still counts
    /// as prefill work then; `backlog` turns an endpoint's prompts in prefill (dispatch
    /// instant, uncached tokens) into the tokens not prefilled yet.
    pub fn booked(
        &mut self,
        endpoints: usize,
        now: Instant,
        in_prefill: impl Fn(&InFlight) -> bool,
        backlog: impl Fn(usize, &mut [(Instant, u64)]) -> Option<u64>,
    ) -> &[Booked] {
        let fresh =
            self.sums.as_ref().is_some_and(|s| s.at == now && s.version == self.version && s.booked.len() == endpoints);
        if !fresh {
            let mut booked = vec![Booked::default(); endpoints];
            let mut prefilling: Vec<Vec<(Instant, u64)>> = vec![Vec::new(); endpoints];
            for f in self.map.values() {
                let Some(b) = booked.get_mut(f.endpoint) else { continue };
                b.in_flight = b.in_flight.saturating_add(1);
                b.tokens_in_flight =
                    b.tokens_in_flight.saturating_add(u64::from(f.input_tokens) + u64::from(f.expected_output));
                if in_prefill(f) {
                    b.uncached_tokens_in_flight = b.uncached_tokens_in_flight.saturating_add(f.uncached_tokens);
                    prefilling[f.endpoint].push((f.dispatched_at, f.uncached_tokens));
                }
                if let Some(slo) = f.tpot_slo_ms {
                    match b.slos.iter_mut().find(|(band, s, _)| *band == f.priority && *s == slo) {
                        Some((_, _, n)) => *n = n.saturating_add(1),
                        None => b.slos.push((f.priority, slo, 1)),
                    }
                }
            }
            for (i, (b, prompts)) in booked.iter_mut().zip(&mut prefilling).enumerate() {
                b.prefill_backlog_tokens = backlog(i, prompts);
            }
            self.sums = Some(Sums { at: now, version: self.version, booked });
        }
        self.sums.as_ref().map_or(&[], |s| s.booked.as_slice())
    }
}
