//! The flow-control queue of one pool, and every pool's queue (the order and the bounds
//! are the module doc of [`crate::flow`]). Plain data: it decides who is next, never
//! whether anyone may go ([`super::decide`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::FlowConfig;
use headroom_protocol::{PredictRequest, PredictResponse};

/// Window over which a pool's finished requests give its drain rate.
const DRAIN_WINDOW: Duration = Duration::from_secs(5);

/// Where a waiting request's answer goes: the transport's way back to its caller (a
/// channel in the service, a slot in a simulation). The queue only holds it.
pub trait Reply: Send + std::fmt::Debug {
    /// Hands the answer to the caller, if it is still there.
    fn send(self: Box<Self>, answer: PredictResponse);
    /// The caller has left: nobody would read an answer.
    fn is_closed(&self) -> bool;
}

/// One request waiting.
#[derive(Debug)]
pub struct Waiter {
    pub id: u64,
    pub request: PredictRequest,
    pub band: i32,
    pub tenant: String,
    pub arrived: Instant,
    pub deadline: Instant,
    pub reply: Option<Box<dyn Reply>>,
}

/// Why a request could not join the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Full,
}

/// One pool's waiting requests and what fair queuing remembers of its tenants.
///
/// The waiters are kept twice: in one list (what expiry, `/metrics` and the gateway's word
/// of a client gone scan) and, by band and tenant, in lanes ordered by deadline (what a
/// round's order reads). A round judges at most a few dozen waiters; ordering the whole
/// queue for them compared every waiter's tenant, every round: 4% of the simulated bench's
/// CPU.
#[derive(Debug)]
pub struct Queue {
    /// Every waiter; a removal moves the last one into its place.
    waiters: Vec<Waiter>,
    /// Where each waiter is in `waiters`, by id.
    at: HashMap<u64, usize>,
    /// Each band's tenants with requests waiting, highest band first.
    lanes: BTreeMap<Reverse<i32>, HashMap<String, Lane>>,
    /// When requests of this pool finished recently (reports): the rate the fleet drains at.
    finished: VecDeque<Instant>,
    max_queued: usize,
    max_per_band: usize,
}

/// One tenant's waiters in one band.
#[derive(Debug, Default)]
struct Lane {
    /// Its releases: the tenant with the fewest goes next in its band. Forgotten when its
    /// last waiter leaves; levelled when it comes back ([`Queue::push`]).
    served: u64,
    /// (deadline, id) of its waiters, earliest first.
    waiting: BTreeSet<(Instant, u64)>,
}

impl Queue {
    pub fn new(config: &FlowConfig) -> Queue {
        Queue {
            waiters: Vec::new(),
            at: HashMap::new(),
            lanes: BTreeMap::new(),
            finished: VecDeque::new(),
            max_queued: config.max_queued,
            max_per_band: config.max_queued_per_band,
        }
    }

    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Waiting requests per band, highest band first.
    pub fn depth_by_band(&self) -> Vec<(i32, usize)> {
        self.lanes.iter().map(|(band, tenants)| (band.0, tenants.values().map(|l| l.waiting.len()).sum())).collect()
    }

    /// The waiter `id`, while it waits.
    pub fn get(&self, id: u64) -> Option<&Waiter> {
        self.at.get(&id).and_then(|&i| self.waiters.get(i))
    }

    /// Adds a waiter, unless its band or the queue is full.
    pub fn push(&mut self, waiter: Waiter) -> Result<(), Refused> {
        let in_band = self.lanes.get(&Reverse(waiter.band)).map_or(0, |t| t.values().map(|l| l.waiting.len()).sum());
        if self.waiters.len() >= self.max_queued || in_band >= self.max_per_band || self.at.contains_key(&waiter.id) {
            return Err(Refused::Full);
        }
        let tenants = self.lanes.entry(Reverse(waiter.band)).or_default();
        let entry = (waiter.deadline, waiter.id);
        match tenants.get_mut(waiter.tenant.as_str()) {
            Some(lane) => {
                lane.waiting.insert(entry);
            }
            None => {
                // A tenant joining its band starts level with the least served tenant waiting
                // there: an idle tenant banks no turns, a new one is not behind.
                let floor = tenants.values().map(|l| l.served).min().unwrap_or(0);
                tenants.insert(waiter.tenant.clone(), Lane { served: floor, waiting: BTreeSet::from([entry]) });
            }
        }
        self.at.insert(waiter.id, self.waiters.len());
        self.waiters.push(waiter);
        Ok(())
    }

    /// Removes the waiter `id` (released, expired, or its caller gone).
    pub fn remove(&mut self, id: u64) -> Option<Waiter> {
        let i = self.at.remove(&id)?;
        let w = self.waiters.swap_remove(i);
        if let Some(moved) = self.waiters.get(i) {
            self.at.insert(moved.id, i);
        }
        if let Some(tenants) = self.lanes.get_mut(&Reverse(w.band)) {
            if let Some(lane) = tenants.get_mut(w.tenant.as_str()) {
                lane.waiting.remove(&(w.deadline, w.id));
                if lane.waiting.is_empty() {
                    // Nobody of this tenant waits in the band: its count only matters again
                    // when it rejoins, and then it is levelled. Forgetting it bounds the map.
                    tenants.remove(w.tenant.as_str());
                }
            }
            if tenants.is_empty() {
                self.lanes.remove(&Reverse(w.band));
            }
        }
        Some(w)
    }

    /// Removes `id` as released: its tenant's turn is used.
    pub fn release(&mut self, id: u64) -> Option<Waiter> {
        let w = self.remove(id)?;
        // Its lane keeps the turn; a lane it emptied is forgotten (a tenant that rejoins is levelled).
        if let Some(lane) = self.lanes.get_mut(&Reverse(w.band)).and_then(|t| t.get_mut(w.tenant.as_str())) {
            lane.served += 1;
        }
        Some(w)
    }

    /// Removes and returns the waiters whose deadline is past.
    pub fn take_expired(&mut self, now: Instant) -> Vec<Waiter> {
        let ids: Vec<u64> = self.waiters.iter().filter(|w| w.deadline <= now).map(|w| w.id).collect();
        ids.into_iter().filter_map(|id| self.remove(id)).collect()
    }

    /// The first `limit` waiter ids in the order they are served: bands high to low; within
    /// a band, tenants by fewest releases (each pick counting as one), ties and each
    /// tenant's own requests by deadline (then by id).
    pub fn order(&self, limit: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(limit.min(self.waiters.len()));
        for tenants in self.lanes.values() {
            // Each tenant's next waiter, keyed by what picks it: the heap's top goes next,
            // and its tenant's following waiter takes its place a turn later.
            let mut lanes: Vec<_> = tenants.values().map(|l| (l.served, l.waiting.iter())).collect();
            let mut heads = BinaryHeap::new();
            for (k, (served, lane)) in lanes.iter_mut().enumerate() {
                if let Some(&(deadline, id)) = lane.next() {
                    heads.push(Reverse((*served, deadline, id, k)));
                }
            }
            while let Some(Reverse((served, _, id, k))) = heads.pop() {
                if out.len() == limit {
                    return out;
                }
                out.push(id);
                if let Some(&(deadline, id)) = lanes[k].1.next() {
                    heads.push(Reverse((served + 1, deadline, id, k)));
                }
            }
        }
        out
    }

    /// A request of this pool finished: the fleet drained one.
    pub fn finished(&mut self, now: Instant) {
        self.finished.push_back(now);
        self.trim(now);
    }

    fn trim(&mut self, now: Instant) {
        while self.finished.front().is_some_and(|t| now.saturating_duration_since(*t) > DRAIN_WINDOW) {
            self.finished.pop_front();
        }
    }

    /// Requests finished per second, over the last [`DRAIN_WINDOW`].
    pub fn drain_rate(&mut self, now: Instant) -> f64 {
        self.trim(now);
        self.finished.len() as f64 / DRAIN_WINDOW.as_secs_f64()
    }

    /// Seconds until `ahead` waiting requests have drained at the current rate
    /// (infinite when nothing drains).
    pub fn predicted_wait_s(&mut self, ahead: usize, now: Instant) -> f64 {
        if ahead == 0 {
            return 0.0;
        }
        let rate = self.drain_rate(now);
        if rate > 0.0 {
            ahead as f64 / rate
        } else {
            f64::INFINITY
        }
    }

    /// Waiting requests in `band` or above: those served before a new one of `band`.
    pub fn ahead_of(&self, band: i32) -> usize {
        self.depth_by_band().into_iter().take_while(|b| b.0 >= band).map(|b| b.1).sum()
    }

    /// The queue's saturation: the time to drain everything waiting, over the mean time
    /// its requests have left before their deadlines. 0 when nothing waits; above 1 the
    /// queued work cannot all be served within its SLOs at the current drain rate.
    /// Capped at [`MAX_SATURATION`].
    pub fn saturation(&mut self, now: Instant) -> f64 {
        if self.waiters.is_empty() {
            return 0.0;
        }
        let left: f64 = self.waiters.iter().map(|w| w.deadline.saturating_duration_since(now).as_secs_f64()).sum();
        let mean_left = (left / self.waiters.len() as f64).max(1e-3);
        (self.predicted_wait_s(self.waiters.len(), now) / mean_left).min(MAX_SATURATION)
    }
}

/// Saturation reported when nothing drains at all.
pub const MAX_SATURATION: f64 = 100.0;

/// One pool's queue as `/metrics` shows it.
pub struct PoolFlow {
    pub pool: String,
    /// (band, requests waiting), highest band first.
    pub bands: Vec<(i32, usize)>,
    pub saturation: f64,
}

/// What [`Flows::wake`] calls: whoever judges the queues (the service's flow task).
type Waker = Box<dyn Fn() + Send + Sync>;

/// Every pool's queue, and the signal that capacity may have freed.
pub struct Flows {
    queues: Mutex<HashMap<String, Queue>>,
    wake: Mutex<Option<Waker>>,
    next_id: std::sync::atomic::AtomicU64,
    config: FlowConfig,
}

impl Flows {
    pub fn new(config: FlowConfig) -> Flows {
        Flows {
            queues: Mutex::new(HashMap::new()),
            wake: Mutex::new(None),
            next_id: std::sync::atomic::AtomicU64::new(1),
            config,
        }
    }

    /// Runs `f` on `pool`'s queue (created on first use).
    pub fn with<R>(&self, pool: &str, f: impl FnOnce(&mut Queue) -> R) -> R {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        // Looked up before it is made: a flow round asks for its pool's queue several times
        // per waiter, and a key made each time was an allocation each.
        if let Some(queue) = queues.get_mut(pool) {
            return f(queue);
        }
        f(queues.entry(pool.to_string()).or_insert_with(|| Queue::new(&self.config)))
    }

    /// Capacity may have freed (a report, a first token, a scrape): judge the waiters now.
    pub fn wake(&self) {
        if let Some(wake) = self.wake.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            wake();
        }
    }

    /// Makes [`Flows::wake`] call `wake` (replacing what it called before). Until then a
    /// wake-up reaches nobody, and the waiters are judged at the next round.
    pub fn on_wake(&self, wake: impl Fn() + Send + Sync + 'static) {
        *self.wake.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(wake));
    }

    /// A new waiter's id (unique in this process).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// A request of `pool` finished: counts towards its drain rate, and wakes the waiters.
    pub fn finished(&self, pool: &str, now: Instant) {
        if let Some(q) = self.queues.lock().unwrap_or_else(|p| p.into_inner()).get_mut(pool) {
            q.finished(now);
        }
        self.wake();
    }

    /// Each pool's waiting requests by band and its saturation, for `/metrics`.
    pub fn snapshot(&self, now: Instant) -> Vec<PoolFlow> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues
            .iter_mut()
            .map(|(pool, q)| PoolFlow { pool: pool.clone(), bands: q.depth_by_band(), saturation: q.saturation(now) })
            .collect()
    }

    /// The gateway says the client of `request_id` left while it waited: out of the queue.
    /// Returns whether it was still there.
    pub fn abandon(&self, pool: &str, request_id: &str) -> bool {
        // Only a queue that exists: word of a request in a pool nobody queued in creates none.
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let Some(q) = queues.get_mut(pool) else { return false };
        let Some(id) = q.waiters.iter().find(|w| w.request.request_id == request_id).map(|w| w.id) else {
            return false;
        };
        q.remove(id).is_some()
    }

    /// How many pools have a queue (tests: word of unknown pools creates none).
    pub fn queue_count(&self) -> usize {
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Pools with requests waiting.
    pub fn busy_pools(&self) -> Vec<String> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.iter().filter(|(_, q)| !q.is_empty()).map(|(p, _)| p.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_protocol::{RequestFeatures, Slo};

    fn waiter(id: u64, band: i32, tenant: &str, deadline_ms: u64, t0: Instant) -> Waiter {
        Waiter {
            id,
            band,
            tenant: tenant.into(),
            arrived: t0,
            deadline: t0 + Duration::from_millis(deadline_ms),
            request: PredictRequest {
                pool: "p".into(),
                request_id: format!("r{id}"),
                request: RequestFeatures { slo: Slo { ttft_ms: Some(500.0), tpot_ms: None }, ..Default::default() },
                flow: None,
            },
            reply: None,
        }
    }

    fn queue(max: usize, per_band: usize) -> Queue {
        Queue::new(&FlowConfig { max_queued: max, max_queued_per_band: per_band, ..FlowConfig::default() })
    }

    #[test]
    fn bands_go_high_to_low_and_each_band_by_deadline() {
        let t0 = Instant::now();
        let mut q = queue(10, 10);
        for w in
            [waiter(1, 0, "", 900, t0), waiter(2, 1, "", 950, t0), waiter(3, 0, "", 100, t0), waiter(4, -1, "", 1, t0)]
        {
            q.push(w).unwrap();
        }
        assert_eq!(q.order(usize::MAX), vec![2, 3, 1, 4]);
    }

    #[test]
    fn within_a_band_a_tenants_burst_cannot_starve_another() {
        let t0 = Instant::now();
        let mut q = queue(100, 100);
        // Tenant a bursts 10 requests with early deadlines; b sends 2 with later ones.
        for i in 0..10 {
            q.push(waiter(i, 0, "a", 10 + i, t0)).unwrap();
        }
        q.push(waiter(100, 0, "b", 500, t0)).unwrap();
        q.push(waiter(101, 0, "b", 600, t0)).unwrap();
        let order = q.order(usize::MAX);
        let pos = |id| order.iter().position(|&x| x == id).unwrap();
        assert!(pos(100) <= 1 && pos(101) <= 3, "b takes turns with a: {order:?}");
        // Releases are what count: after a is served 3 times, b goes first.
        for id in [0, 1, 2] {
            q.release(id);
        }
        assert_eq!(q.order(usize::MAX)[0], 100);
    }

    #[test]
    fn a_tenant_rejoining_banks_no_turns() {
        let t0 = Instant::now();
        let mut q = queue(100, 100);
        q.push(waiter(1, 0, "a", 10, t0)).unwrap();
        for id in 2..6 {
            q.push(waiter(id, 0, "b", 20, t0)).unwrap();
        }
        for id in 2..5 {
            q.release(id); // b served 3 times while a waits
        }
        q.release(1);
        // a comes back: levelled with b (3), not at 1, so it does not get three turns in a row.
        for id in 10..13 {
            q.push(waiter(id, 0, "a", 1, t0)).unwrap();
        }
        let order = q.order(usize::MAX);
        assert_eq!(order.len(), 4);
        assert!(order.iter().position(|&x| x == 5).unwrap() <= 1, "{order:?}");
    }

    #[test]
    fn the_queue_is_bounded_per_band_and_in_total_and_expiry_removes() {
        let t0 = Instant::now();
        let mut q = queue(3, 2);
        q.push(waiter(1, 0, "", 10, t0)).unwrap();
        q.push(waiter(2, 0, "", 1000, t0)).unwrap();
        assert_eq!(q.push(waiter(3, 0, "", 10, t0)), Err(Refused::Full), "band full");
        q.push(waiter(4, 1, "", 10, t0)).unwrap();
        assert_eq!(q.push(waiter(5, 2, "", 10, t0)), Err(Refused::Full), "queue full");
        let expired: Vec<u64> = q.take_expired(t0 + Duration::from_millis(50)).iter().map(|w| w.id).collect();
        assert_eq!(expired.len(), 2);
        assert!(expired.contains(&1) && expired.contains(&4));
        assert_eq!(q.depth_by_band(), vec![(0, 1)]);
    }

    /// The order as the flow-control doc states it, from the waiters alone: bands high to
    /// low, tenants by fewest releases (each pick counting), each tenant's by deadline.
    fn order_by_the_rule(waiters: &[(u64, i32, String, Instant)], served: &HashMap<(i32, String), u64>) -> Vec<u64> {
        let mut bands: Vec<i32> = waiters.iter().map(|w| w.1).collect();
        bands.sort_unstable_by(|a, b| b.cmp(a));
        bands.dedup();
        let mut out = Vec::new();
        for band in bands {
            let mut left: Vec<&(u64, i32, String, Instant)> = waiters.iter().filter(|w| w.1 == band).collect();
            let mut turns: HashMap<&str, u64> = HashMap::new();
            while !left.is_empty() {
                let key = |w: &&(u64, i32, String, Instant)| {
                    let n = turns.get(w.2.as_str()).copied().unwrap_or_else(|| served[&(band, w.2.clone())]);
                    (n, w.3, w.0)
                };
                let (i, _) = left.iter().enumerate().min_by_key(|(_, w)| key(w)).unwrap();
                let w = left.swap_remove(i);
                let n = key(&w).0;
                turns.insert(w.2.as_str(), n + 1);
                out.push(w.0);
            }
        }
        out
    }

    #[test]
    fn the_order_read_from_the_lanes_is_the_rules_order_through_any_history() {
        // Pushes, releases, removals and expiries in a pseudo-random mix, each step checked
        // against the rule computed from scratch (with the turns the tenants were given).
        let t0 = Instant::now();
        let mut q = queue(10_000, 10_000);
        let mut rng = headroom_protocol::rng::Rng::new(0x2545_f491_4f6c_dd1du64);
        let mut next = |n| rng.below(n);
        let mut served: HashMap<(i32, String), u64> = HashMap::new();
        let mut live: Vec<(u64, i32, String, Instant)> = Vec::new();
        for id in 0..2_000u64 {
            match next(10) {
                0..=4 => {
                    let (band, tenant) = (next(3) as i32 - 1, format!("t{}", next(4)));
                    let deadline_ms = next(50);
                    if !live.iter().any(|w| w.1 == band && w.2 == tenant) {
                        let floor = live.iter().filter(|w| w.1 == band).map(|w| served[&(band, w.2.clone())]).min();
                        served.insert((band, tenant.clone()), floor.unwrap_or(0));
                    }
                    q.push(waiter(id, band, &tenant, deadline_ms, t0)).unwrap();
                    assert_eq!(q.get(id).map(|w| w.id), Some(id));
                    live.push((id, band, tenant, t0 + Duration::from_millis(deadline_ms)));
                }
                5..=6 if !live.is_empty() => {
                    let w = live.swap_remove(next(live.len() as u64) as usize);
                    *served.entry((w.1, w.2.clone())).or_default() += 1;
                    assert_eq!(q.release(w.0).map(|r| r.id), Some(w.0));
                }
                7 if !live.is_empty() => {
                    let w = live.swap_remove(next(live.len() as u64) as usize);
                    assert_eq!(q.remove(w.0).map(|r| r.id), Some(w.0));
                }
                8 => {
                    let now = t0 + Duration::from_millis(next(30));
                    let mut gone: Vec<u64> = q.take_expired(now).iter().map(|w| w.id).collect();
                    let mut expected: Vec<u64> = live.iter().filter(|w| w.3 <= now).map(|w| w.0).collect();
                    live.retain(|w| w.3 > now);
                    gone.sort_unstable();
                    expected.sort_unstable();
                    assert_eq!(gone, expected);
                }
                _ => {}
            }
            served.retain(|(band, tenant), _| live.iter().any(|w| w.1 == *band && w.2 == *tenant));
            let rule = order_by_the_rule(&live, &served);
            assert_eq!(q.order(usize::MAX), rule, "after step {id}");
            assert_eq!(q.order(5), rule[..rule.len().min(5)], "the first five");
            assert_eq!(q.len(), live.len());
            assert_eq!(q.ahead_of(0), live.iter().filter(|w| w.1 >= 0).count());
        }
    }

    #[test]
    fn saturation_compares_the_drain_time_with_the_deadlines() {
        let t0 = Instant::now();
        let mut q = queue(100, 100);
        assert_eq!(q.saturation(t0), 0.0);
        for id in 0..4 {
            q.push(waiter(id, 0, "", 2000, t0)).unwrap();
        }
        assert_eq!(q.saturation(t0), MAX_SATURATION, "nothing drains");
        // 10 finished in the last 5 s: 2/s; 4 waiting drain in 2 s, with 2 s left: 1.0.
        for _ in 0..10 {
            q.finished(t0);
        }
        assert!((q.saturation(t0) - 1.0).abs() < 1e-6, "{}", q.saturation(t0));
        assert!((q.predicted_wait_s(q.ahead_of(-1), t0) - 2.0).abs() < 1e-9);
    }
}
