//! The books' sums, read through the pool.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use super::books::FIRST_TOKEN_GRACE;
use super::*;

fn dispatch(id: &str, endpoint: &str, tokens: u32, tpot_slo: f64) -> Dispatch {
    let mut request =
        RequestFeatures { input_tokens: tokens, streaming: true, prediction_based: true, ..Default::default() };
    request.slo.tpot_ms = Some(tpot_slo);
    Dispatch { pool: "p".into(), request_id: id.into(), endpoint: endpoint.into(), request }
}

/// The sums of one moment are kept while the books stand still, and every change of
/// the books at that same moment is seen by the next question: a dispatch, a first
/// token, a report, a reservation and its cancelling.
#[test]
fn a_moment_is_summed_once_and_every_change_at_that_moment_is_seen() {
    let mut p = Pool::new("p", &["a:1".into(), "b:1".into()], 64);
    let now = Instant::now();
    let state = |p: &mut Pool| {
        let s = p.states_for(&RequestFeatures::default(), now);
        (s[0].in_flight, s[0].uncached_tokens_in_flight, s[0].tightest_tpot_slo_ms)
    };
    assert_eq!(state(&mut p), (0, 0, None));
    p.dispatch(&dispatch("r1", "a:1", 400, 50.0), now);
    assert_eq!(state(&mut p), (1, 400, Some(50.0)));
    assert_eq!(state(&mut p), (1, 400, Some(50.0)), "asked again: the same");
    p.dispatch(&dispatch("r2", "a:1", 100, 20.0), now);
    assert_eq!(state(&mut p), (2, 500, Some(20.0)));
    assert!(p.first_token("r1", "a:1", now));
    assert_eq!(state(&mut p), (2, 100, Some(20.0)), "r1 past prefill");
    p.reserve("r3", "a:1", &RequestFeatures { input_tokens: 7, ..Default::default() }, 10.0, now);
    assert_eq!(state(&mut p).0, 3);
    p.cancel_reservation("r3");
    assert_eq!(state(&mut p).0, 2);
    assert!(matches!(p.finish("r2", now), Finished::Tracked(..)));
    assert_eq!(state(&mut p), (1, 0, Some(50.0)));
    // The asker's band and own SLO are read per question, not summed.
    let mut asking = RequestFeatures { streaming: true, priority: 1, ..Default::default() };
    asking.slo.tpot_ms = Some(100.0);
    let s = p.states_for(&asking, now);
    assert_eq!((s[0].tightest_tpot_slo_ms, s[0].tighter_tpot_in_flight), (None, 0), "a higher band is not held");
    asking.priority = 0;
    let s = p.states_for(&asking, now);
    assert_eq!((s[0].tightest_tpot_slo_ms, s[0].tighter_tpot_in_flight), (Some(50.0), 1));
}

/// A running goal holds the later requests of its own tenant at its priority and every
/// tenant's below it, never another tenant's at its priority: a tenant's tight goals on
/// every endpoint leave its peers' targets as if it asked nothing.
#[test]
fn a_running_goal_holds_its_own_tenant_and_lower_bands_but_not_its_peers() {
    let mut p = Pool::new("p", &["a:1".into(), "b:1".into()], 64);
    let now = Instant::now();
    for (id, endpoint) in [("g1", "a:1"), ("g2", "b:1")] {
        let mut d = dispatch(id, endpoint, 100, 20.0);
        d.request.tenant = "greedy".into();
        p.dispatch(&d, now);
    }
    let held = |p: &mut Pool, tenant: &str, priority: i32| {
        let mut asking = RequestFeatures { streaming: true, priority, tenant: tenant.into(), ..Default::default() };
        asking.slo.tpot_ms = Some(100.0);
        p.states_for(&asking, now)
            .iter()
            .map(|s| (s.tightest_tpot_slo_ms, s.tighter_tpot_in_flight))
            .collect::<Vec<_>>()
    };
    assert_eq!(held(&mut p, "greedy", 0), vec![(Some(20.0), 1); 2], "its own tenant is held");
    assert_eq!(held(&mut p, "greedy", -1), vec![(Some(20.0), 1); 2], "a lower band is held");
    assert_eq!(held(&mut p, "other", -1), vec![(Some(20.0), 1); 2], "any tenant's lower band is held");
    assert_eq!(held(&mut p, "other", 0), vec![(None, 0); 2], "a peer is not");
    assert_eq!(held(&mut p, "", 0), vec![(None, 0); 2], "nor an anonymous request at its band");
    // A goal of its band another tenant holds still binds that tenant's own requests.
    let mut d = dispatch("o1", "a:1", 100, 50.0);
    d.request.tenant = "other".into();
    p.dispatch(&d, now);
    assert_eq!(held(&mut p, "other", 0), vec![(Some(50.0), 1), (None, 0)]);
}

/// An endpoint's (requests, tokens, uncached tokens in prefill, SLOs as [`merged`]).
type Sums = (u32, u64, u64, Vec<(i32, u64, u64, u32)>);

/// What the books say at a moment, summed from scratch over every request in flight by
/// the rule (the definition the kept sums must equal).
fn summed_from_scratch(p: &Pool, now: Instant) -> Vec<Sums> {
    let events = p.first_token_events(now);
    let mut out = vec![(0u32, 0u64, 0u64, Vec::new()); p.endpoints.len()];
    for f in p.in_flight.values() {
        let Some(o) = out.get_mut(f.endpoint) else { continue };
        o.0 += f.sequences;
        o.1 += u64::from(f.input_tokens) + u64::from(f.expected_output) * u64::from(f.sequences);
        let prefilling = match (events, f.prefill_done_by) {
            (true, _) if f.past_prefill => false,
            (true, Some(t)) => now < t + FIRST_TOKEN_GRACE,
            (false, Some(t)) => now < t,
            (_, None) => !f.past_prefill,
        };
        if prefilling {
            o.2 += f.uncached_tokens;
        }
        if let Some(slo) = f.tpot_slo_ms {
            o.3.push((f.priority, f.tenant, slo.to_bits(), 1));
        }
    }
    out.into_iter().map(|(n, t, u, slos)| (n, t, u, merged(slos))).collect()
}

/// (band, tenant, SLO bits, requests) sorted, equal ones merged: the SLOs as a set with counts.
fn merged(mut slos: Vec<(i32, u64, u64, u32)>) -> Vec<(i32, u64, u64, u32)> {
    slos.sort_unstable();
    let mut out: Vec<(i32, u64, u64, u32)> = Vec::new();
    for s in slos {
        match out.last_mut() {
            Some(last) if (last.0, last.1, last.2) == (s.0, s.1, s.2) => last.3 += s.3,
            _ => out.push(s),
        }
    }
    out
}

/// Dispatches, reservations, first tokens, reports, expiry and a change of endpoints in
/// a pseudo-random mix, on a clock that moves on: after each, the sums kept as requests
/// come and go equal the sums from scratch, with and without first-token events.
#[test]
fn the_kept_sums_equal_a_sum_from_scratch_through_any_history() {
    let t0 = Instant::now();
    let mut p = Pool::new("p", &[], 64);
    let listed = |names: &[&str]| names.iter().map(|a| (a.to_string(), 0)).collect::<Vec<_>>();
    p.set_discovered(0, listed(&["a:1", "b:1", "c:1"]));
    let mut rng = headroom_protocol::rng::Rng::new(0x9e37_79b9_7f4a_7c15u64);
    let mut next = |n| rng.below(n);
    let mut now = t0;
    let mut ids: Vec<String> = Vec::new();
    for step in 0..3_000u64 {
        now += Duration::from_millis(next(400));
        let endpoint = ["a:1", "b:1", "c:1"][next(3) as usize];
        match next(12) {
            0..=3 => {
                let id = format!("r{step}");
                let mut d = dispatch(&id, endpoint, 1 + next(900) as u32, [20.0, 50.0, 80.0][next(3) as usize]);
                d.request.priority = next(2) as i32 - 1;
                d.request.tenant = ["", "a", "b"][next(3) as usize].to_string();
                let ttft = [None, Some(50.0), Some(900.0), Some(4_000.0)][next(4) as usize];
                p.predicted_then_dispatched(&d, (ttft, Some(10.0)), now);
                ids.push(id);
            }
            4 => {
                let id = format!("r{step}");
                p.reserve(&id, endpoint, &RequestFeatures { input_tokens: 30, ..Default::default() }, 200.0, now);
                ids.push(id);
            }
            5..=6 if !ids.is_empty() => {
                let id = &ids[next(ids.len() as u64) as usize];
                let at = p.in_flight.get(id).and_then(|f| p.endpoints.get(f.endpoint)).map(|e| e.address.clone());
                p.first_token(id, &at.unwrap_or_default(), now);
            }
            7..=8 if !ids.is_empty() => {
                let id = ids.swap_remove(next(ids.len() as u64) as usize);
                p.finish(&id, now);
            }
            9 => {
                p.expire(now);
            }
            10 if step % 300 == 10 => {
                // Endpoints renumbered, one gone with its requests, one new; then back.
                p.set_discovered(0, listed(&["c:1", "a:1", "d:1"]));
                assert_eq!(p.in_flight.values().filter(|f| f.endpoint >= 3).count(), 0);
                p.set_discovered(0, listed(&["a:1", "b:1", "c:1"]));
            }
            _ => {}
        }
        // Asked at this moment and a little later (a prompt's prefill may end between).
        for at in [now, now + Duration::from_millis(next(3_000))] {
            p.states_for(&RequestFeatures::default(), at);
            let kept: Vec<_> = p
                .in_flight
                .booked(p.endpoints.len(), at, p.first_token_events(at), |_, _| None)
                .iter()
                .map(|b| {
                    let slos = b.slos.iter().map(|c| (c.band, c.tenant, c.slo_ms.to_bits(), c.requests)).collect();
                    (b.in_flight, b.tokens_in_flight, b.uncached_tokens_in_flight, merged(slos))
                })
                .collect();
            assert_eq!(kept, summed_from_scratch(&p, at), "step {step}");
        }
    }
}
