//! The scheduler's decisions, by a fake clock: shares, weights, caps,
//! wake-ups and the line.

use std::collections::{BTreeMap, HashMap};

use super::*;

const SLICE: Duration = Duration::from_millis(1);

fn share(weight: i64, max: Option<f64>) -> CpuShare {
    CpuShare {
        weight: CpuWeight::new(weight).unwrap(),
        max: max.map(|cores| CpuMax::from_cores(cores).unwrap()),
    }
}

/// Runs every tenant's tasks (each always wants more CPU) on `slots`
/// for `slices` rounds of one slice each, with a fake clock; returns
/// the CPU each tenant got.
fn busy(
    slots: usize,
    tenants: &[(&str, usize, CpuShare)],
    slices: usize,
) -> BTreeMap<String, Duration> {
    let mut fair = Fair::new(slots);
    let mut now = Instant::now();
    let mut running: Vec<(Arc<str>, u32)> = Vec::new();
    let mut next_id = 0u32;
    let names: HashMap<u32, (Arc<str>, CpuShare)> = tenants
        .iter()
        .flat_map(|(name, tasks, share)| {
            let name: Arc<str> = Arc::from(*name);
            (0..*tasks).map(move |_| (name.clone(), *share))
        })
        .map(|t| {
            next_id += 1;
            (next_id, t)
        })
        .collect();
    let mut ids: Vec<&u32> = names.keys().collect();
    ids.sort();
    for id in ids {
        let (name, share) = &names[id];
        let d = fair.request(name, *share, *id, now);
        running.extend(d.granted.into_iter().map(|w| (names[&w].0.clone(), w)));
    }
    let mut got: BTreeMap<String, Duration> = BTreeMap::new();
    for _ in 0..slices {
        now += SLICE;
        // Every running task ends its slice and yields to run on.
        for (name, id) in std::mem::take(&mut running) {
            *got.entry(name.to_string()).or_default() += SLICE;
            let d = fair.release(&name, SLICE, Some(id), now);
            running.extend(d.granted.into_iter().map(|w| (names[&w].0.clone(), w)));
        }
        // Windows that opened.
        let d = fair.dispatch(now);
        running.extend(d.granted.into_iter().map(|w| (names[&w].0.clone(), w)));
        assert_eq!(fair.waiting, in_line(&fair), "the count of tasks in line");
    }
    got
}

/// The tasks in its tenants' lines, counted.
fn in_line<W: PartialEq>(fair: &Fair<W>) -> usize {
    fair.tenants.values().map(|a| a.waiting.len()).sum()
}

fn share_of(got: &BTreeMap<String, Duration>, tenant: &str) -> f64 {
    let total: Duration = got.values().sum();
    got.get(tenant).copied().unwrap_or_default().as_secs_f64() / total.as_secs_f64()
}

#[test]
fn a_tenant_with_one_task_gets_its_share_beside_one_with_a_hundred() {
    // One slot: half each, however many tasks the other has.
    let got = busy(
        1,
        &[
            ("light", 1, share(100, None)),
            ("busy", 100, share(100, None)),
        ],
        2_000,
    );
    assert!((share_of(&got, "light") - 0.5).abs() < 0.01, "{got:?}");
    // Two slots: light can use one core at most, and gets it.
    let got = busy(
        2,
        &[
            ("light", 1, share(100, None)),
            ("busy", 100, share(100, None)),
        ],
        2_000,
    );
    assert!((share_of(&got, "light") - 0.5).abs() < 0.01, "{got:?}");
}

#[test]
fn shares_follow_weights_when_all_are_busy() {
    let got = busy(
        2,
        &[
            ("a", 8, share(100, None)),
            ("b", 8, share(200, None)),
            ("c", 8, share(100, None)),
        ],
        4_000,
    );
    for (tenant, expected) in [("a", 0.25), ("b", 0.5), ("c", 0.25)] {
        let share = share_of(&got, tenant);
        assert!(
            (share - expected).abs() < expected * 0.02,
            "{tenant}: {share} against {expected}: {got:?}"
        );
    }
}

#[test]
fn a_cap_holds_over_each_window_and_leaves_the_rest_to_others() {
    // A capped tenant alone on two cores gets its cap, not the cores.
    let got = busy(2, &[("capped", 8, share(100, Some(0.5)))], 1_000);
    let used = got["capped"].as_secs_f64();
    // 1,000 slices of 1 ms on 2 cores is 1 s of wall clock: 0.5 s at most
    // (plus one slice per core of overshoot per window).
    assert!((0.45..=0.52).contains(&used), "{got:?}");
    // Beside an uncapped tenant: the rest goes to it.
    let got = busy(
        2,
        &[
            ("capped", 8, share(100, Some(0.5))),
            ("free", 8, share(100, None)),
        ],
        1_000,
    );
    assert!(got["capped"].as_secs_f64() <= 0.52, "{got:?}");
    assert!(got["free"].as_secs_f64() >= 1.45, "{got:?}");
}

#[test]
fn a_tenant_that_slept_is_not_owed_the_time_it_slept() {
    let mut fair = Fair::new(1);
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    let mut now = Instant::now();
    // `a` runs alone for a second.
    assert_eq!(fair.request(&a, share(100, None), 1, now).granted[..], [1]);
    for _ in 0..1000 {
        now += SLICE;
        assert_eq!(fair.release(&a, SLICE, Some(1), now).granted[..], [1]);
    }
    // `b` wakes: they alternate from here; `b` does not get a second
    // of the core to itself.
    let d = fair.request(&b, share(100, None), 2, now);
    assert!(d.granted.is_empty());
    let mut order = Vec::new();
    let mut holder = 1;
    for _ in 0..6 {
        now += SLICE;
        let name = if holder == 1 { &a } else { &b };
        holder = fair.release(name, SLICE, Some(holder), now).granted[0];
        order.push(holder);
    }
    assert_eq!(order, vec![2, 1, 2, 1, 2, 1], "{order:?}");
}

#[test]
fn a_tenant_under_its_share_for_long_cannot_then_shut_the_others_out() {
    // Two cores. `steady` (weight 100) and `trickle` (weight 300) run
    // one task each for 10 s: a core each, so `trickle` uses a third of
    // its weighted share and falls behind.
    let mut fair = Fair::new(2);
    let (steady, trickle): (Arc<str>, Arc<str>) = (Arc::from("steady"), Arc::from("trickle"));
    let tenant = |id: u32| if id == 1 { &steady } else { &trickle };
    let shares = |id: u32| share(if id == 1 { 100 } else { 300 }, None);
    let mut now = Instant::now();
    let mut running: Vec<u32> = Vec::new();
    for id in [1, 2] {
        running.extend(fair.request(tenant(id), shares(id), id, now).granted);
    }
    let run = |fair: &mut Fair<u32>, running: &mut Vec<u32>, now: &mut Instant, slices: usize| {
        let mut steady_got = Duration::ZERO;
        for _ in 0..slices {
            *now += SLICE;
            for id in std::mem::take(running) {
                if id == 1 {
                    steady_got += SLICE;
                }
                running.extend(fair.release(tenant(id), SLICE, Some(id), *now).granted);
            }
        }
        steady_got
    };
    run(&mut fair, &mut running, &mut now, 10_000);
    // Then `trickle` floods: 20 more tasks.
    for id in 3..23 {
        running.extend(fair.request(&trickle, shares(id), id, now).granted);
    }
    // Over the next second, `steady` gets its weighted share (a quarter
    // of two cores: half a core, all its one task can use of it), less
    // the bounded credit `trickle` kept. Without the bound it got
    // nothing for the next 15 s.
    let got = run(&mut fair, &mut running, &mut now, 1_000);
    assert!(
        got >= Duration::from_millis(450),
        "steady got {got:?} of the second after the flood"
    );
}

#[test]
fn a_waiter_that_leaves_gives_its_place_or_its_slot_back() {
    let mut fair = Fair::new(1);
    let t: Arc<str> = Arc::from("t");
    let now = Instant::now();
    assert_eq!(fair.request(&t, share(100, None), 1, now).granted[..], [1]);
    assert!(
        fair.request(&t, share(100, None), 2, now)
            .granted
            .is_empty()
    );
    assert!(
        fair.request(&t, share(100, None), 3, now)
            .granted
            .is_empty()
    );
    assert_eq!((fair.waiting, in_line(&fair)), (2, 2));
    // 2 leaves the queue; 1's slot then goes to 3.
    assert!(fair.cancel(&t, &2, now).is_some());
    assert_eq!((fair.waiting, in_line(&fair)), (1, 1));
    assert_eq!(fair.release("t", SLICE, None, now).granted[..], [3]);
    assert_eq!((fair.waiting, in_line(&fair)), (0, 0));
    // 3 was granted: cancelling finds nothing waiting, the caller
    // releases, and the slot is free for the next.
    assert!(fair.cancel(&t, &3, now).is_none());
    assert!(
        fair.release("t", Duration::ZERO, None, now)
            .granted
            .is_empty()
    );
    assert_eq!(fair.request(&t, share(100, None), 4, now).granted[..], [4]);
    assert_eq!((fair.waiting, in_line(&fair)), (0, 0));
}

#[test]
fn a_throttled_tenant_is_told_when_its_window_opens_and_counted() {
    let mut fair = Fair::new(2);
    let t: Arc<str> = Arc::from("t");
    let start = Instant::now();
    // A cap of 0.1 core: 10 ms per 100 ms window.
    let capped = share(100, Some(0.1));
    assert_eq!(fair.request(&t, capped, 1, start).granted[..], [1]);
    let now = start + Duration::from_millis(10);
    let d = fair.release("t", Duration::from_millis(10), Some(1), now);
    assert!(d.granted.is_empty());
    assert_eq!(d.retry_at, Some(start + CAP_WINDOW));
    let d = fair.dispatch(start + CAP_WINDOW);
    assert_eq!(d.granted[..], [1]);
    assert_eq!(
        d.throttled,
        vec![(t.clone(), CAP_WINDOW - Duration::from_millis(10))]
    );
}

/// Tenant `t`, capped at 0.1 core (10 ms per 100 ms window), runs task 1
/// from `start` through its whole window's budget, and it ends: its cap,
/// and when it ended.
fn spend_window(fair: &mut Fair<u32>, t: &Arc<str>, start: Instant) -> (CpuShare, Instant) {
    let capped = share(100, Some(0.1));
    assert_eq!(fair.request(t, capped, 1, start).granted[..], [1]);
    let ended = start + Duration::from_millis(10);
    assert!(
        fair.release(t, Duration::from_millis(10), None, ended)
            .granted
            .is_empty()
    );
    (capped, ended)
}

#[test]
fn a_tenant_past_its_cap_waits_though_a_slot_is_free_and_no_one_is_in_line() {
    let mut fair = Fair::new(2);
    let (t, u): (Arc<str>, Arc<str>) = (Arc::from("t"), Arc::from("u"));
    let start = Instant::now();
    let (capped, now) = spend_window(&mut fair, &t, start);
    // Its next task waits for the next window.
    let d = fair.request(&t, capped, 2, now);
    assert!(d.granted.is_empty(), "granted past its cap: {d:?}");
    assert_eq!(d.retry_at, Some(start + CAP_WINDOW));
    // Another tenant's task runs at once meanwhile.
    assert_eq!(fair.request(&u, share(100, None), 3, now).granted[..], [3]);
    assert_eq!(fair.dispatch(start + CAP_WINDOW).granted[..], [2]);
    assert_eq!((fair.waiting, in_line(&fair)), (0, 0));
}

#[test]
fn a_throttled_tenants_time_is_counted_when_its_last_waiting_task_leaves_the_line() {
    let mut fair = Fair::new(2);
    let t: Arc<str> = Arc::from("t");
    let start = Instant::now();
    // Tasks 2 and 3 wait for the next window, throttled.
    let (capped, used) = spend_window(&mut fair, &t, start);
    assert!(fair.request(&t, capped, 2, used).granted.is_empty());
    assert!(fair.request(&t, capped, 3, used).granted.is_empty());
    // 2 is cancelled: 3 still waits, throttled on.
    let at = used + Duration::from_millis(30);
    let left = fair.cancel(&t, &2, at).unwrap();
    assert!(left.throttled.is_empty(), "{left:?}");
    // 3 is cancelled before the window opens: the 60 ms its cap held the
    // tenant back are counted.
    let at = used + Duration::from_millis(60);
    let left = fair.cancel(&t, &3, at).unwrap();
    assert_eq!(left.throttled, vec![(t.clone(), Duration::from_millis(60))]);
    assert_eq!((fair.waiting, in_line(&fair)), (0, 0));
    // Counted once: a task in line again from 70 ms is throttled from
    // then, not from when the others first were.
    let again = used + Duration::from_millis(70);
    assert!(fair.request(&t, capped, 4, again).granted.is_empty());
    let opened = fair.dispatch(start + CAP_WINDOW);
    assert_eq!(opened.granted[..], [4]);
    assert_eq!(
        opened.throttled,
        vec![(t.clone(), Duration::from_millis(20))]
    );
}

#[test]
fn an_idle_tenant_is_forgotten_once_the_floor_passes_it_or_its_window_rolls_over() {
    // Tenants that ran once and went idle must not stay in every
    // scan for the next task: a host of many tenants would scan them all
    // at each slice.
    let mut fair = Fair::new(1);
    let (t, u, v): (Arc<str>, Arc<str>, Arc<str>) =
        (Arc::from("t"), Arc::from("u"), Arc::from("v"));
    let start = Instant::now();
    // `t`, capped, and `v` each run one slice and go idle: both are ahead
    // of the floor, and `t` has used its window.
    let (_, mut now) = spend_window(&mut fair, &t, start);
    assert_eq!(fair.request(&v, share(100, None), 2, now).granted[..], [2]);
    now += Duration::from_millis(10);
    assert!(
        fair.release("v", Duration::from_millis(10), None, now)
            .granted
            .is_empty()
    );
    assert_eq!(fair.tenants.len(), 2, "kept while ahead of the floor");
    // `u` runs two tasks, taking turns on the one slot, past them both.
    now = start + 2 * CAP_WINDOW;
    assert_eq!(fair.request(&u, share(100, None), 3, now).granted[..], [3]);
    assert!(
        fair.request(&u, share(100, None), 4, now)
            .granted
            .is_empty()
    );
    let mut running = 3;
    for _ in 0..30 {
        now += SLICE;
        let d = fair.release("u", SLICE, Some(running), now);
        running = d.granted[0];
    }
    assert!(fair.floor > 10_000_000);
    assert_eq!(
        fair.tenants.keys().map(|k| &**k).collect::<Vec<_>>(),
        ["u"],
        "only the tenant that is busy is left to scan"
    );
}

#[test]
fn cpu_a_tenant_used_outside_a_slot_counts_in_its_share() {
    let mut fair = Fair::new(1);
    let now = Instant::now();
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    assert_eq!(fair.request(&a, share(100, None), 1, now).granted[..], [1]);
    assert!(
        fair.request(&b, share(100, None), 2, now)
            .granted
            .is_empty()
    );
    assert_eq!(fair.release(&a, SLICE, Some(1), now).granted[..], [2]);
    // A task of a's torn down outside its slot, as long as five slices.
    fair.charge(&a, 5 * SLICE, now);
    // Even again after b's slice, a would go next by name; charged, b
    // goes on.
    assert_eq!(fair.release(&b, SLICE, Some(2), now).granted[..], [2]);
}

#[test]
fn a_tenant_whose_turn_comes_next_runs_beyond_the_slots_and_the_next_release_pays_it_back() {
    let mut fair = Fair::new(2);
    let (busy, light): (Arc<str>, Arc<str>) = (Arc::from("busy"), Arc::from("light"));
    let even = share(100, None);
    let mut now = Instant::now();
    // `busy` holds both slots, and has a third task in line.
    assert_eq!(fair.request(&busy, even, 1, now).granted[..], [1]);
    assert_eq!(fair.request(&busy, even, 2, now).granted[..], [2]);
    assert!(fair.request(&busy, even, 3, now).granted.is_empty());
    // `light` wakes: as much CPU charged as `busy` (none, and `busy`'s
    // running slices are not charged yet), and nothing running, so its
    // turn comes first. Where only a slot will do, it waits...
    assert!(!fair.take(&light, even, now, Beyond::No));
    // ...where it may run beyond them, it runs now.
    assert!(fair.take(&light, even, now, Beyond::IfNext));
    assert_eq!(fair.running, 3);
    // The next release pays the slot back: `busy`'s task yields to run
    // on, and goes in line behind its waiting one, granted nothing.
    now += SLICE;
    assert!(fair.release(&busy, SLICE, Some(1), now).granted.is_empty());
    // `light`'s slice ends: the slot goes to `busy`'s oldest in line.
    assert_eq!(fair.release(&light, SLICE, None, now).granted[..], [3]);
    assert_eq!((fair.running, fair.waiting), (2, 1));
}

#[test]
fn a_tenant_runs_beyond_the_slots_only_when_its_turn_comes_next() {
    let even = share(100, None);
    let (busy, light): (Arc<str>, Arc<str>) = (Arc::from("busy"), Arc::from("light"));
    let now = Instant::now();
    // Not with a task of its own in line: that one goes first.
    let mut fair = Fair::new(1);
    assert_eq!(fair.request(&busy, even, 1, now).granted[..], [1]);
    assert!(fair.request(&light, even, 2, now).granted.is_empty());
    assert!(!fair.take(&light, even, now, Beyond::IfNext));
    // Not ahead of a tenant in line that goes first: `able` has used as
    // little CPU (none), has nothing running, and its name comes first.
    let able: Arc<str> = Arc::from("able");
    let mut fair = Fair::new(1);
    assert_eq!(fair.request(&busy, even, 1, now).granted[..], [1]);
    assert!(fair.request(&able, even, 2, now).granted.is_empty());
    assert!(!fair.take(&light, even, now, Beyond::IfNext));
    // Nor of one holding a slot that has used less CPU, with no one in
    // line: the slot `busy` yields at its slice's end is its own again.
    // (`light` ran 5 ms, and is remembered, ahead of the floor.)
    let mut fair = Fair::new(1);
    assert_eq!(fair.request(&light, even, 1, now).granted[..], [1]);
    let later = now + Duration::from_millis(5);
    assert!(
        fair.release(&light, Duration::from_millis(5), None, later)
            .granted
            .is_empty()
    );
    assert_eq!(fair.request(&busy, even, 2, later).granted[..], [2]);
    assert!(!fair.take(&light, even, later, Beyond::IfNext));
    // Not while a task of its own runs: only a tenant that wakes.
    let mut fair = Fair::new(1);
    assert_eq!(fair.request(&busy, even, 1, now).granted[..], [1]);
    assert!(fair.take(&light, even, now, Beyond::IfNext));
    assert!(!fair.take(&light, even, now, Beyond::IfNext));
    assert_eq!(fair.running, 2);
    // Not past its cap: it waits for its window, beyond the slots too.
    let mut fair = Fair::new(1);
    let (capped, ended) = spend_window(&mut fair, &light, now);
    assert_eq!(fair.request(&busy, even, 2, ended).granted[..], [2]);
    assert!(!fair.take(&light, capped, ended, Beyond::IfNext));
    assert_eq!(fair.running, 1);
}

#[test]
fn a_tenant_that_wakes_again_and_again_gets_no_more_than_its_share_beyond_the_slots() {
    // Two slots, both `busy`'s (weight 100) all along; `light` (weight
    // 1) sends one task after another, a slice each, and asks to run
    // beyond the slots every time. It runs only when it is owed the CPU:
    // its share by weight, 1 in 101, not a third of what runs.
    let mut fair = Fair::new(2);
    let (busy, light): (Arc<str>, Arc<str>) = (Arc::from("busy"), Arc::from("light"));
    let mut now = Instant::now();
    let mut running: Vec<u32> = Vec::new();
    for id in [1, 2] {
        running.extend(fair.request(&busy, share(100, None), id, now).granted);
    }
    let (mut busy_got, mut light_got) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..10_000 {
        now += SLICE;
        let beyond = fair.take(&light, share(1, None), now, Beyond::IfNext);
        for id in std::mem::take(&mut running) {
            busy_got += SLICE;
            running.extend(fair.release(&busy, SLICE, Some(id), now).granted);
        }
        if beyond {
            light_got += SLICE;
            running.extend(fair.release(&light, SLICE, None, now).granted);
        }
        assert_eq!(fair.running, running.len(), "slots held");
    }
    let light_share = light_got.as_secs_f64() / (busy_got + light_got).as_secs_f64();
    assert!(
        (0.005..0.015).contains(&light_share),
        "light got {light_share:.4} of the CPU at a 1-in-101 weight share"
    );
    assert_eq!(running.len(), 2);
}

#[test]
fn two_tenants_that_wake_may_each_run_beyond_the_slots_and_each_is_paid_back() {
    let mut fair = Fair::new(2);
    let even = share(100, None);
    let (busy, a, b): (Arc<str>, Arc<str>, Arc<str>) =
        (Arc::from("busy"), Arc::from("a"), Arc::from("b"));
    let now = Instant::now() + SLICE;
    assert_eq!(fair.request(&busy, even, 1, now).granted[..], [1]);
    assert_eq!(fair.request(&busy, even, 2, now).granted[..], [2]);
    // Each wakes with its turn before `busy`'s (and, with one task
    // running, `a`'s is after `b`'s): each runs one task beyond the slots.
    assert!(fair.take(&a, even, now, Beyond::IfNext));
    assert!(fair.take(&b, even, now, Beyond::IfNext));
    assert_eq!(fair.running, 4);
    // Paid back by two releases that grant no one: `busy`'s yield and
    // `a`'s end; `b`'s end then gives `busy`'s task its slot again.
    assert!(fair.release(&busy, SLICE, Some(1), now).granted.is_empty());
    assert!(fair.release(&a, SLICE, None, now).granted.is_empty());
    assert_eq!(fair.release(&b, SLICE, None, now).granted[..], [1]);
    assert_eq!((fair.running, fair.waiting), (2, 0));
}

#[test]
fn the_clock_is_read_only_when_a_decision_needs_the_time() {
    let mut fair: Fair<u32> = Fair::new(1);
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
    let read = |clock: &Lazy| clock.0.get().is_some();
    // (Its account made: a new one's window starts at the time.)
    assert!(fair.take(&a, share(100, None), Instant::now(), Beyond::No));
    assert!(fair.release(&a, SLICE, None, Instant::now()).is_empty());
    // An uncapped tenant takes a free slot and gives it back with no one in
    // line, as most tasks do: nothing in either decision is timed.
    let clock = Lazy::default();
    assert!(fair.take(&a, share(100, None), &clock, Beyond::No));
    assert!(fair.release(&a, SLICE, None, &clock).is_empty());
    assert!(!read(&clock), "read for an uncapped tenant's free slot");
    // A capped tenant's slot and slice count in its window: both timed
    // (its account made first: a slice ahead of the floor keeps it).
    let capped = share(100, Some(0.5));
    assert!(fair.take(&b, capped, Instant::now(), Beyond::No));
    assert!(fair.release(&b, SLICE, None, Instant::now()).is_empty());
    let clock = Lazy::default();
    assert!(fair.take(&b, capped, &clock, Beyond::No));
    assert!(read(&clock), "a cap decided without the time");
    let clock = Lazy::default();
    assert!(fair.release(&b, SLICE, None, &clock).is_empty());
    assert!(read(&clock), "a capped slice charged without the time");
    // A release with someone in line grants the slot: timed (a cap may
    // hold the next one back).
    let now = Instant::now();
    assert!(fair.take(&a, share(100, None), now, Beyond::No));
    assert!(fair.enqueue(&b, capped, 2, now).granted.is_empty());
    let clock = Lazy::default();
    assert_eq!(fair.release(&a, SLICE, None, &clock).granted[..], [2]);
    assert!(read(&clock), "a slot granted without the time");
}

#[test]
fn a_tenant_whose_cap_is_lifted_is_forgotten_though_its_window_was_used() {
    // What a cap's window holds is owed only while the tenant is capped:
    // lifted, it must not keep an idle tenant in every scan for ever.
    let mut fair = Fair::new(1);
    let t: Arc<str> = Arc::from("t");
    let (_, now) = spend_window(&mut fair, &t, Instant::now());
    // Still inside that window, uncapped now: one task that uses nothing.
    let uncapped = share(100, None);
    assert!(fair.take(&t, uncapped, now, Beyond::No));
    assert!(fair.release(&t, Duration::ZERO, None, now).is_empty());
    assert!(fair.tenants.is_empty(), "an idle, uncapped tenant kept");
}
