//! What both discovery sources (EndpointSlices, `discovery`; an InferencePool's pods,
//! `inference_pool`) do with their watch: fold its events into the addresses the source
//! lists now ([`Listing`]), and make those the source's share of its pool ([`publish`]).

use std::collections::HashMap;

use kube::runtime::watcher::Event;

use crate::state::AppState;

/// The addresses of a watched set of objects (EndpointSlices, pods) by object name, as the
/// watcher's events leave them. A relist replaces them all at its end only, so a relist
/// under way never empties the pool.
#[derive(Default)]
pub(crate) struct Listing {
    objects: HashMap<String, Vec<String>>,
    relist: Option<HashMap<String, Vec<String>>>,
}

impl Listing {
    /// Files one event, `addresses` reading an object's; true when the listing is whole
    /// (no relist under way) and so is what the source contributes now.
    pub(crate) fn apply<K: kube::Resource>(&mut self, event: Event<K>, addresses: impl Fn(&K) -> Vec<String>) -> bool {
        let key = |o: &K| o.meta().name.clone().unwrap_or_default();
        match event {
            Event::Init => self.relist = Some(HashMap::new()),
            Event::InitApply(o) => {
                self.relist.get_or_insert_with(HashMap::new).insert(key(&o), addresses(&o));
            }
            Event::InitDone => self.objects = self.relist.take().unwrap_or_default(),
            Event::Apply(o) => {
                self.objects.insert(key(&o), addresses(&o));
            }
            Event::Delete(o) => {
                self.objects.remove(&key(&o));
            }
        }
        self.relist.is_none()
    }

    /// Every object's addresses, sorted and deduplicated.
    pub(crate) fn addresses(&self) -> Vec<String> {
        union(&self.objects)
    }
}

/// Makes `addresses` source `index`'s share of `pool` (at hardware class `hardware`),
/// logging a change; `described` names the source in the log.
pub(crate) fn publish(
    state: &AppState,
    pool: &str,
    index: usize,
    hardware: u32,
    addresses: Vec<String>,
    described: &str,
) {
    let endpoints: Vec<(String, u32)> = addresses.into_iter().map(|a| (a, hardware)).collect();
    let count = endpoints.len();
    let change = state.core.pools.with(pool, |p| p.set_discovered(index, endpoints));
    if let Some(c) = change.filter(|c| c.added + c.removed > 0) {
        tracing::info!(pool = %pool, source = %described, endpoints = count, added = c.added, removed = c.removed,
            dropped_in_flight = c.dropped_in_flight, "pool endpoints changed");
    }
}

/// The union of every object's addresses, sorted (a stable order for the pool).
fn union(objects: &HashMap<String, Vec<String>>) -> Vec<String> {
    let mut all: Vec<String> = objects.values().flatten().cloned().collect();
    all.sort();
    all.dedup();
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_is_sorted_and_deduplicated() {
        let slices: HashMap<String, Vec<String>> =
            [("a".to_string(), vec!["b:1".to_string(), "a:1".to_string()]), ("b".to_string(), vec!["a:1".to_string()])]
                .into_iter()
                .collect();
        assert_eq!(union(&slices), ["a:1", "b:1"]);
    }
}
