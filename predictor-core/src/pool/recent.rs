//! A bounded map of recent request ids: the books' finished ids and the predict records.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Request ids seen recently, each with a value, oldest first: bounded in count and
/// forgotten after a time, so a flood of reports for unknown ids cannot grow memory. An id
/// keeps its first value ([`RecentIds::insert`]) or takes the newest ([`RecentIds::replace`]);
/// each entry of the order names the value it was made for, so one removed or replaced
/// since does not take a newer value with it when it comes round. Values can also be weighed
/// ([`RecentIds::weighed`]): past the weight allowed, the oldest go too.
#[derive(Debug)]
pub(super) struct RecentIds<V = ()> {
    order: VecDeque<(String, Instant, u64)>,
    ids: HashMap<String, (V, u64)>,
    cap: usize,
    next: u64,
    weigh: fn(&V) -> usize,
    weight: usize,
    max_weight: usize,
}

impl<V> RecentIds<V> {
    pub(super) fn new(cap: usize) -> Self {
        RecentIds::weighed(cap, usize::MAX, |_| 0)
    }

    /// At most `cap` ids, whose values `weigh` at most `max_weight` together.
    pub(super) fn weighed(cap: usize, max_weight: usize, weigh: fn(&V) -> usize) -> Self {
        RecentIds {
            order: VecDeque::new(),
            ids: HashMap::new(),
            cap: cap.max(1),
            next: 0,
            weigh,
            weight: 0,
            max_weight,
        }
    }

    /// Remembers `value` for `id` unless `id` has one already.
    pub(super) fn insert(&mut self, id: &str, value: V, now: Instant) {
        if !self.ids.contains_key(id) {
            self.replace(id, value, now);
        }
    }

    /// Remembers `value` for `id`, in place of any it had, as of `now`.
    pub(super) fn replace(&mut self, id: &str, value: V, now: Instant) {
        self.next += 1;
        self.weight = self.weight.saturating_add((self.weigh)(&value));
        if let Some((old, _)) = self.ids.insert(id.to_string(), (value, self.next)) {
            self.weight = self.weight.saturating_sub((self.weigh)(&old));
        }
        self.order.push_back((id.to_string(), now, self.next));
        while self.order.len() > self.cap || (self.weight > self.max_weight && !self.order.is_empty()) {
            self.pop_oldest();
        }
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.ids.contains_key(id)
    }

    /// Takes `id`'s value; its place in the order goes when it is the oldest.
    pub(super) fn remove(&mut self, id: &str) -> Option<V> {
        let (v, _) = self.ids.remove(id)?;
        self.weight = self.weight.saturating_sub((self.weigh)(&v));
        Some(v)
    }

    pub(super) fn pop_oldest(&mut self) {
        if let Some((id, _, seq)) = self.order.pop_front() {
            if self.ids.get(&id).is_some_and(|(_, s)| *s == seq) {
                self.remove(&id);
            }
        }
    }

    pub(super) fn expire(&mut self, now: Instant, memory: Duration) {
        while self.order.front().is_some_and(|(_, t, _)| now.saturating_duration_since(*t) >= memory) {
            self.pop_oldest();
        }
    }

    /// What the values held weigh together.
    pub(super) fn weight(&self) -> usize {
        self.weight
    }

    /// Ids remembered.
    pub(super) fn len(&self) -> usize {
        self.ids.len()
    }
}
