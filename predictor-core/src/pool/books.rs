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
//!
//! Summing at each moment still read every request in flight, most of them decoding and
//! long past prefill, and the moment moves with every arrival: a tenth of the simulated
//! bench's CPU. So what does not depend on the moment (counts, tokens, SLOs) is kept per
//! endpoint as requests come and go, and the prompts that may still be prefilling are kept
//! by when their prefill is predicted to end: a sum reads only those whose end is not long
//! past ([`in_prefill`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use headroom_protocol::RequestFeatures;

use super::records::Kept;
use crate::callers::Caller;

/// A request dispatched to an endpoint and not yet reported.
#[derive(Debug, Clone)]
pub(super) struct InFlight {
    pub(super) endpoint: usize,
    pub(super) input_tokens: u32,
    pub(super) uncached_tokens: u64,
    pub(super) expected_output: u32,
    /// The sequences the engine runs for it (`n`, `best_of`, a list's prompts): each counts
    /// as a request in flight, with its own output tokens.
    pub(super) sequences: u32,
    /// Its TPOT SLO where it may tighten later requests' targets (`states_for`): only a
    /// request placed by its goals (`prediction_based`), and only a goal that leaves the
    /// endpoint room for others, at least [`CLAIM_FLOOR`] times its fastest decode step
    /// ([`super::ClassCost::fastest_tpot_ms`]). A goal under that can be kept only with a batch of a
    /// few: honoured, it would hand the endpoint to one client (two streams asking the
    /// simulated H100's fastest step sent 181 of 198 other tenants' streams to the A100), and
    /// a client asking 1 ms a token would make every later request there look negative. A
    /// goal the endpoint keeps only while lightly loaded does tighten: that is what
    /// protecting it is for. (Judged on the prediction under load
    /// instead, a p90 objective put two thirds of long-short's interactive streams past
    /// their 40 ms near the cliff; they protected nothing, and batch and sheddable work
    /// piled onto them: interactive attainment 84% instead of 96% at 42.5 req/s.)
    pub(super) tpot_slo_ms: Option<f64>,
    /// Its priority: its SLO tightens the targets of requests in its band and below only.
    pub(super) priority: i32,
    /// Its tenant ([`tenant_key`]): at its own priority its SLO tightens only its tenant's
    /// targets ([`Booked::slos_for`]).
    pub(super) tenant: u64,
    /// Predicted end of prefill (dispatch + predicted TTFT).
    pub(super) prefill_done_by: Option<Instant>,
    /// Its first token passed the gateway: past prefill, observed.
    pub(super) past_prefill: bool,
    pub(super) dispatched_at: Instant,
    /// When it is forgotten if no report came (`Expiry::lifetime`).
    pub(super) expires_at: Instant,
    /// Reserved by flow control when it released the request (`Pool::reserve`), not yet
    /// confirmed by the gateway's dispatch batch: forgotten after [`super::RESERVATION_TTL`].
    pub(super) reserved: bool,
    /// What the predictor saw of it where it went, from its record; `None`: dispatched
    /// without a record here (the gateway fell back, or another replica predicted it).
    pub(super) kept: Option<Box<Kept>>,
    /// Who dispatched it (`None`: a reservation): a caller holds a bounded share of the books.
    pub(super) caller: Option<Caller>,
}

impl InFlight {
    /// `r` sent to endpoint `endpoint` at `now`, `prefix` of its prompt cached there, with
    /// its predicted TTFT there, tracked for `lifetime` without a report; the endpoint's
    /// fastest decode step `fastest_tpot_ms` (none known: every SLO protects);
    /// `reserved`: by flow control, not yet dispatched.
    pub(super) fn new(
        endpoint: usize,
        r: &RequestFeatures,
        prefix: f64,
        (ttft_ms, fastest_tpot_ms): (Option<f64>, Option<f64>),
        (now, lifetime): (Instant, Duration),
        reserved: bool,
        kept: Option<Box<Kept>>,
    ) -> Self {
        let protects =
            |slo: &f64| r.prediction_based && fastest_tpot_ms.is_none_or(|fastest| *slo >= fastest * CLAIM_FLOOR);
        InFlight {
            endpoint,
            input_tokens: r.input_tokens,
            uncached_tokens: (f64::from(r.input_tokens) * (1.0 - prefix)).round() as u64,
            expected_output: r.max_tokens.unwrap_or(DEFAULT_EXPECTED_OUTPUT),
            sequences: r.sequence_count(),
            tpot_slo_ms: r.streamed_tpot_slo_ms().filter(protects),
            priority: r.priority,
            tenant: tenant_key(&r.tenant),
            // Checked: a prediction too large for an Instant means "not known", never a panic.
            prefill_done_by: ttft_ms
                .and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok())
                .and_then(|d| now.checked_add(d)),
            past_prefill: false,
            dispatched_at: now,
            expires_at: now.checked_add(lifetime).unwrap_or(now),
            reserved,
            kept,
            caller: None,
        }
    }
}

/// The tightest TPOT goal a running request may hold its endpoint's later requests to, as a
/// multiple of the endpoint's fastest decode step (one sequence alone): twice leaves a batch
/// of many (the simulated H100 decodes 32 sequences of 1,000 tokens in under twice its
/// single step), and no workload's tightest class (40 ms on 7) comes near it.
const CLAIM_FLOOR: f64 = 2.0;

/// The key a tenant's claims are filed under: the anonymous tenant (no name) is 0. An
/// unkeyed hash, so a request's key and the keys filed in the books agree; two names that
/// collide merely share claims, which a client that may name any tenant could do anyway.
pub(super) fn tenant_key(tenant: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    if tenant.is_empty() {
        return 0;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    tenant.hash(&mut h);
    h.finish() | 1
}

/// Running TPOT goals that may tighten another request's target, by priority band, tenant
/// and goal: `requests` of them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Claim {
    pub band: i32,
    pub tenant: u64,
    pub slo_ms: f64,
    pub requests: u32,
}

/// Output tokens assumed for a request that gave no `max_tokens`.
const DEFAULT_EXPECTED_OUTPUT: u32 = 256;

/// What the requests in flight add to one endpoint's state at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Booked {
    pub in_flight: u32,
    pub tokens_in_flight: u64,
    /// Uncached prompt tokens of the requests still in prefill.
    pub uncached_tokens_in_flight: u64,
    /// Of those, what the engine has likely not prefilled yet (`None`: no prefill cost known).
    pub prefill_backlog_tokens: Option<u64>,
    /// The requests whose SLO may tighten another's target (`InFlight::tpot_slo_ms`).
    pub slos: Vec<Claim>,
}

impl Booked {
    /// The tightest TPOT SLO running here that holds a request of `priority` and `tenant`
    /// ([`tenant_key`]), and how many of those are tighter than `own`: the goals of every
    /// higher band, and of its own band its own tenant's.
    ///
    /// Why not its band's every tenant: tenants at one priority are peers, and a goal that
    /// held its peers would let one tenant's tight (if keepable) goals on every endpoint
    /// reserve the pool's batches from all the others, which the operator, who alone sets
    /// priorities above 0 (`trusted_priority_header`), never granted it. Within a tenant, and
    /// over lower bands, a goal protects its stream as before. Requests that name no tenant
    /// are one tenant, so a pool without tenants judges as if every goal held its band.
    pub fn slos_for(&self, priority: i32, tenant: u64, own: Option<f64>) -> (Option<f64>, u32) {
        let mut tightest: Option<f64> = None;
        let mut tighter = 0u32;
        let holds = |c: &&Claim| c.band > priority || (c.band == priority && c.tenant == tenant);
        for c in self.slos.iter().filter(holds) {
            tightest = Some(tightest.map_or(c.slo_ms, |t| t.min(c.slo_ms)));
            if own.is_some_and(|own| c.slo_ms < own) {
                tighter = tighter.saturating_add(c.requests);
            }
        }
        (tightest, tighter)
    }
}

/// How long after its predicted TTFT a request's prompt still counts as prefill work
/// when the gateway reports first tokens: long enough for a late first token, short
/// enough that a lost event does not count a prompt for long.
pub(super) const FIRST_TOKEN_GRACE: Duration = Duration::from_secs(2);

/// Whether a prompt still counts as prefill work at `now`: until its first token is
/// observed (`past_prefill`, with first-token `events`; a grace period after its predicted
/// end of prefill, `done_by`, covers a lost one), else until that end.
fn in_prefill(now: Instant, events: bool, done_by: Option<Instant>, past_prefill: bool) -> bool {
    match (events, done_by) {
        (true, _) if past_prefill => false,
        (true, Some(t)) => now < t.checked_add(FIRST_TOKEN_GRACE).unwrap_or(t),
        (false, Some(t)) => now < t,
        (_, None) => !past_prefill,
    }
}

/// The sums of one moment, kept while the books do not change.
#[derive(Debug)]
struct Sums {
    at: Instant,
    events: bool,
    version: u64,
    booked: Vec<Booked>,
}

impl Booked {
    /// Counts `f` in what does not depend on the moment (requests, tokens, SLOs).
    fn add(&mut self, f: &InFlight) {
        self.in_flight = self.in_flight.saturating_add(f.sequences);
        self.tokens_in_flight = self.tokens_in_flight.saturating_add(tokens(f));
        if let Some(slo) = f.tpot_slo_ms {
            match self.slos.iter_mut().find(|c| c.band == f.priority && c.tenant == f.tenant && c.slo_ms == slo) {
                Some(c) => c.requests = c.requests.saturating_add(1),
                None => self.slos.push(Claim { band: f.priority, tenant: f.tenant, slo_ms: slo, requests: 1 }),
            }
        }
    }

    /// Undoes [`Booked::add`] of `f`.
    fn take(&mut self, f: &InFlight) {
        self.in_flight = self.in_flight.saturating_sub(f.sequences);
        self.tokens_in_flight = self.tokens_in_flight.saturating_sub(tokens(f));
        if let Some(slo) = f.tpot_slo_ms {
            let filed = |c: &Claim| c.band == f.priority && c.tenant == f.tenant && c.slo_ms == slo;
            if let Some(k) = self.slos.iter().position(filed) {
                self.slos[k].requests -= 1;
                if self.slos[k].requests == 0 {
                    self.slos.swap_remove(k);
                }
            }
        }
    }
}

fn tokens(f: &InFlight) -> u64 {
    u64::from(f.input_tokens) + u64::from(f.expected_output) * u64::from(f.sequences)
}

/// A prompt that may still be prefilling: what a sum reads of it.
#[derive(Debug, Clone, Copy)]
struct Prompt {
    endpoint: usize,
    dispatched_at: Instant,
    uncached_tokens: u64,
}

impl Prompt {
    fn of(f: &InFlight) -> Prompt {
        Prompt { endpoint: f.endpoint, dispatched_at: f.dispatched_at, uncached_tokens: f.uncached_tokens }
    }
}

/// The requests in flight by id; every change counted.
#[derive(Debug, Default)]
pub(super) struct Books {
    /// Each request with the number it is filed under in the indexes below: the books'
    /// version its insert made.
    map: HashMap<String, (u64, InFlight)>,
    version: u64,
    sums: Option<Sums>,
    /// Per endpoint, what its requests add at any moment ([`Booked::add`]; the prompts in
    /// prefill are left to each moment).
    standing: Vec<Booked>,
    /// Requests with a predicted end of prefill, by it: without first-token events a prompt
    /// counts until then.
    dated: BTreeMap<(Instant, u64), Prompt>,
    /// Of those, the ones whose first token was not seen: with events a prompt counts
    /// until it is, or until [`FIRST_TOKEN_GRACE`] past that end.
    unseen: BTreeMap<(Instant, u64), Prompt>,
    /// Requests without a predicted end of prefill whose first token was not seen.
    undated: BTreeMap<u64, Prompt>,
    /// Requests each caller dispatched.
    by_caller: HashMap<Caller, usize>,
}

impl Books {
    pub fn get(&self, id: &str) -> Option<&InFlight> {
        self.map.get(id).map(|(_, f)| f)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.map.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Requests `caller` dispatched that are tracked.
    pub fn held_by(&self, caller: &Caller) -> usize {
        self.by_caller.get(caller).copied().unwrap_or(0)
    }

    pub fn insert(&mut self, id: String, f: InFlight) {
        self.version += 1;
        self.file(self.version, &f);
        if let Some((n, old)) = self.map.insert(id, (self.version, f)) {
            self.unfile(n, &old);
        }
    }

    pub fn remove(&mut self, id: &str) -> Option<InFlight> {
        self.version += 1;
        let (n, f) = self.map.remove(id)?;
        self.unfile(n, &f);
        Some(f)
    }

    /// Keeps the requests `keep` says to.
    pub fn retain(&mut self, keep: impl Fn(&InFlight) -> bool) {
        let gone: Vec<String> = self.map.iter().filter(|(_, (_, f))| !keep(f)).map(|(id, _)| id.clone()).collect();
        for id in gone {
            self.remove(&id);
        }
    }

    /// Moves each request to the endpoint `to` gives for its endpoint, dropping those it
    /// gives none (the pool's endpoints changed).
    pub fn renumber(&mut self, to: impl Fn(usize) -> Option<usize>) {
        self.version += 1;
        let map = std::mem::take(&mut self.map);
        *self = Books { version: self.version, ..Books::default() };
        for (id, (_, mut f)) in map {
            if let Some(i) = to(f.endpoint) {
                f.endpoint = i;
                self.insert(id, f);
            }
        }
    }

    /// The request `id`, dispatched to `endpoint`, is past prefill (its first token was
    /// seen). Returns whether it applied (tracked, at that endpoint).
    pub fn seen_first_token(&mut self, id: &str, endpoint: usize) -> bool {
        let Some((n, f)) = self.map.get_mut(id).filter(|(_, f)| f.endpoint == endpoint) else { return false };
        self.version += 1;
        f.past_prefill = true;
        match f.prefill_done_by {
            Some(t) => self.unseen.remove(&(t, *n)),
            None => self.undated.remove(n),
        };
        true
    }

    pub fn values(&self) -> impl Iterator<Item = &InFlight> {
        self.map.values().map(|(_, f)| f)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &InFlight)> {
        self.map.iter().map(|(id, (_, f))| (id, f))
    }

    fn file(&mut self, n: u64, f: &InFlight) {
        if self.standing.len() <= f.endpoint {
            self.standing.resize(f.endpoint + 1, Booked::default());
        }
        self.standing[f.endpoint].add(f);
        if let Some(c) = &f.caller {
            *self.by_caller.entry(c.clone()).or_insert(0) += 1;
        }
        let prompt = Prompt::of(f);
        match f.prefill_done_by {
            Some(t) => {
                self.dated.insert((t, n), prompt);
                if !f.past_prefill {
                    self.unseen.insert((t, n), prompt);
                }
            }
            None if !f.past_prefill => {
                self.undated.insert(n, prompt);
            }
            None => {}
        }
    }

    fn unfile(&mut self, n: u64, f: &InFlight) {
        if let Some(s) = self.standing.get_mut(f.endpoint) {
            s.take(f);
        }
        if let Some(c) = &f.caller {
            if let Some(n) = self.by_caller.get_mut(c) {
                *n -= 1;
                if *n == 0 {
                    self.by_caller.remove(c);
                }
            }
        }
        match f.prefill_done_by {
            Some(t) => {
                self.dated.remove(&(t, n));
                self.unseen.remove(&(t, n));
            }
            None => {
                self.undated.remove(&n);
            }
        }
    }

    /// What the requests in flight add to each of `endpoints` endpoints at `now`, summed
    /// once per moment and change. `events`: the gateway reports first tokens ([`in_prefill`]);
    /// `backlog` turns an endpoint's prompts in prefill (dispatch instant, uncached tokens)
    /// into the tokens not prefilled yet.
    pub fn booked(
        &mut self,
        endpoints: usize,
        now: Instant,
        events: bool,
        backlog: impl Fn(usize, &mut [(Instant, u64)]) -> Option<u64>,
    ) -> &[Booked] {
        let fresh = self.sums.as_ref().is_some_and(|s| {
            s.at == now && s.events == events && s.version == self.version && s.booked.len() == endpoints
        });
        if !fresh {
            let mut booked: Vec<Booked> =
                (0..endpoints).map(|i| self.standing.get(i).cloned().unwrap_or_default()).collect();
            let mut prefilling: Vec<Vec<(Instant, u64)>> = vec![Vec::new(); endpoints];
            // Only prompts whose predicted end of prefill is ahead (or, with events, within
            // the grace behind) can count; the rule itself decides which do.
            let (from, dated) =
                if events { (now.checked_sub(FIRST_TOKEN_GRACE), &self.unseen) } else { (Some(now), &self.dated) };
            let ahead = match from {
                Some(from) => dated.range((from, 0)..),
                None => dated.range(..),
            };
            // Every candidate is unseen but in `dated` without events, where the rule does not
            // read whether it was seen.
            let candidates = ahead.map(|(&(t, _), p)| (Some(t), p)).chain(self.undated.values().map(|p| (None, p)));
            for (_, p) in candidates.filter(|(t, _)| in_prefill(now, events, *t, false)) {
                let Some(b) = booked.get_mut(p.endpoint) else { continue };
                b.uncached_tokens_in_flight = b.uncached_tokens_in_flight.saturating_add(p.uncached_tokens);
                prefilling[p.endpoint].push((p.dispatched_at, p.uncached_tokens));
            }
            for (i, (b, prompts)) in booked.iter_mut().zip(&mut prefilling).enumerate() {
                b.prefill_backlog_tokens = backlog(i, prompts);
            }
            self.sums = Some(Sums { at: now, events, version: self.version, booked });
        }
        self.sums.as_ref().map_or(&[], |s| s.booked.as_slice())
    }
}
