//! The scheduler's decisions, apart from threads and clocks: which waiting
//! task runs next. Every call carries the time it happens at and the CPU
//! time a slice used, so the tests drive it with a fake clock.
//!
//! Tenants first, then their tasks: of the tenants with a task waiting,
//! the one that has used least CPU for its weight (its virtual runtime)
//! goes next, and its oldest waiting task runs. A tenant that wakes up
//! starts at the virtual runtime of the tenant chosen last, so the time it
//! slept is not owed to it; a busy one falls at most [`MAX_LAG`] behind
//! it, so CPU it left unused is not owed either. A tenant with a cap that
//! has used its cap's worth of the current window waits for the next
//! window.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::share::{CpuMax, CpuShare, CpuWeight};

/// The window a cap holds over (as cgroups' default `cpu.max` period).
pub const CAP_WINDOW: Duration = Duration::from_millis(100);

/// What one grant, release or timer changed.
#[derive(Debug)]
pub(crate) struct Dispatch<W> {
    /// Waiters that now hold a slot (rarely more than one: inline, not
    /// allocated).
    pub granted: SmallVec<[W; 2]>,
    /// When a capped tenant's next window opens, if one is waiting for it.
    pub retry_at: Option<Instant>,
    /// Tenants whose cap held a task back, and for how long.
    pub throttled: Vec<(Arc<str>, Duration)>,
}

impl<W> Default for Dispatch<W> {
    fn default() -> Self {
        Dispatch {
            granted: SmallVec::new(),
            retry_at: None,
            throttled: Vec::new(),
        }
    }
}

struct Account<W> {
    share: CpuShare,
    /// CPU used, in nanoseconds, times the default weight over its own.
    vruntime: u128,
    waiting: VecDeque<W>,
    running: usize,
    /// Start of the cap's current window, and CPU used in it.
    window: (Instant, Duration),
    /// Since when its cap has held a waiting task back.
    throttled_since: Option<Instant>,
}

impl<W> Account<W> {
    /// Until when its cap holds it back, if it does now.
    fn capped_until(&mut self, now: Instant) -> Option<Instant> {
        let max = self.share.max?;
        self.roll(now);
        let (start, used) = self.window;
        (used >= budget(max)).then_some(start + CAP_WINDOW)
    }

    /// Moves the cap's window up to `now`. What a window used beyond its
    /// budget (slices end past it) is owed by the next: over time a tenant
    /// never gets more than its cap.
    fn roll(&mut self, now: Instant) {
        let Some(max) = self.share.max else {
            return;
        };
        let (start, used) = self.window;
        let passed = now.saturating_duration_since(start).as_nanos() / CAP_WINDOW.as_nanos();
        if passed == 0 {
            return;
        }
        let passed = u32::try_from(passed).unwrap_or(u32::MAX);
        let owed = used.saturating_sub(budget(max).saturating_mul(passed));
        self.window = (start + CAP_WINDOW.saturating_mul(passed), owed);
    }

    fn charge(&mut self, used: Duration, now: Instant) {
        let weighted = used.as_nanos() * u128::from(CpuWeight::DEFAULT.get())
            / u128::from(self.share.weight.get());
        self.vruntime += weighted;
        if self.share.max.is_some() {
            self.roll(now);
            self.window.1 += used;
        }
    }

    /// Busy, but perhaps under its share: no more than a bounded credit
    /// for the CPU it left unused ([`MAX_LAG`] behind `floor`).
    fn keep_up(&mut self, floor: u128) {
        self.vruntime = self.vruntime.max(floor.saturating_sub(MAX_LAG));
    }

    /// Whether forgetting it changes nothing: nothing waiting or running,
    /// owed nothing (it would start at the floor anyway), owing its cap
    /// nothing.
    fn forgettable(&self, floor: u128) -> bool {
        self.waiting.is_empty()
            && self.running == 0
            && self.vruntime <= floor
            && self.window.1.is_zero()
    }
}

/// How far behind the floor a busy tenant's virtual runtime may fall (in
/// nanoseconds of CPU at the default weight): a tenant whose few tasks
/// used less than its share is not owed the difference, as one that slept
/// is not. Without a bound it was: one task a second under its share for an
/// hour, then a flood of tasks, and every other tenant waited an hour.
/// 20 slices: after a flood, the others wait at most about that long.
const MAX_LAG: u128 = 20_000_000;

/// CPU a cap allows per window.
fn budget(max: CpuMax) -> Duration {
    CAP_WINDOW * max.millicores() / 1000
}

/// The host's cores, shared between tenants by weight.
pub(crate) struct Fair<W> {
    /// Tasks that may run at once: the cores given to guests.
    slots: usize,
    running: usize,
    /// Tasks in line, of all tenants: with none, a request given a free
    /// slot and a release need no look for whom to grant it.
    waiting: usize,
    /// By name: a few short comparisons find one, cheaper than hashing
    /// its name each slice.
    tenants: BTreeMap<Arc<str>, Account<W>>,
    /// The virtual runtime of the tenant chosen last.
    floor: u128,
}

impl<W: PartialEq> Fair<W> {
    pub fn new(slots: usize) -> Self {
        Fair {
            slots: slots.max(1),
            running: 0,
            waiting: 0,
            tenants: BTreeMap::new(),
            floor: 0,
        }
    }

    /// `waiter` of `tenant` wants a slot.
    pub fn request(
        &mut self,
        tenant: &Arc<str>,
        share: CpuShare,
        waiter: W,
        now: Instant,
    ) -> Dispatch<W> {
        let floor = self.floor;
        let account = self
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| Account {
                share,
                vruntime: floor,
                waiting: VecDeque::new(),
                running: 0,
                window: (now, Duration::ZERO),
                throttled_since: None,
            });
        // A reloaded policy applies from the next slice.
        account.share = share;
        if account.waiting.is_empty() && account.running == 0 {
            // Waking up: no credit for the time it slept.
            account.vruntime = account.vruntime.max(floor);
        } else {
            account.keep_up(floor);
        }
        // A task is in line once at most: `cancel` takes out the first.
        debug_assert!(!account.waiting.contains(&waiter), "in line twice");
        if self.waiting == 0 && self.running < self.slots && account.capped_until(now).is_none() {
            // No one else waits and a slot is free: what `dispatch` would
            // decide, without the line.
            account.running += 1;
            self.running += 1;
            self.floor = self.floor.max(account.vruntime);
            let mut out = Dispatch::default();
            out.granted.push(waiter);
            return out;
        }
        account.waiting.push_back(waiter);
        self.waiting += 1;
        self.dispatch(now)
    }

    /// A slot of `tenant`'s is free again after a slice that used `used`.
    /// A task that yielded to run on is `again`: in line behind its
    /// tenant's other waiting tasks before the slot is given to anyone, so
    /// that a tenant's one busy task competes for it as a waiting one would.
    pub fn release(
        &mut self,
        tenant: &str,
        used: Duration,
        again: Option<W>,
        now: Instant,
    ) -> Dispatch<W> {
        let mut idle = false;
        if let Some(account) = self.tenants.get_mut(tenant) {
            account.running = account.running.saturating_sub(1);
            account.charge(used, now);
            account.keep_up(self.floor);
            debug_assert!(
                again.as_ref().is_none_or(|w| !account.waiting.contains(w)),
                "in line twice"
            );
            if let Some(again) = again {
                account.waiting.push_back(again);
                self.waiting += 1;
            }
            idle = account.forgettable(self.floor);
        }
        self.running = self.running.saturating_sub(1);
        if self.waiting == 0 {
            // No one in line to grant the slot to (and the floor stays).
            if idle {
                self.tenants.remove(tenant);
            }
            return Dispatch::default();
        }
        let dispatch = self.dispatch(now);
        self.forget_if_idle(tenant);
        dispatch
    }

    /// Takes `waiter` out of the queue; false if it was not waiting (it was
    /// granted a slot, which the caller must then release).
    pub fn cancel(&mut self, tenant: &str, waiter: &W) -> bool {
        let Some(account) = self.tenants.get_mut(tenant) else {
            return false;
        };
        let Some(at) = account.waiting.iter().position(|w| w == waiter) else {
            return false;
        };
        account.waiting.remove(at);
        self.waiting -= 1;
        if account.waiting.is_empty() {
            // Nothing of it waits for its window any more.
            account.throttled_since = None;
        }
        self.forget_if_idle(tenant);
        true
    }

    /// Drops an idle tenant's account when keeping it changes nothing, so
    /// that the scan for the next tenant covers the active ones.
    fn forget_if_idle(&mut self, tenant: &str) {
        if self
            .tenants
            .get(tenant)
            .is_some_and(|a| a.forgettable(self.floor))
        {
            self.tenants.remove(tenant);
        }
    }

    /// Grants free slots to the tenants most owed CPU.
    pub fn dispatch(&mut self, now: Instant) -> Dispatch<W> {
        let mut out = Dispatch::default();
        while self.running < self.slots {
            let mut next: Option<(u128, &Arc<str>)> = None;
            for (name, account) in self.tenants.iter_mut() {
                if account.waiting.is_empty() {
                    continue;
                }
                if let Some(until) = account.capped_until(now) {
                    account.throttled_since.get_or_insert(now);
                    out.retry_at = Some(out.retry_at.map_or(until, |at| at.min(until)));
                    continue;
                }
                if let Some(since) = account.throttled_since.take() {
                    out.throttled
                        .push((name.clone(), now.saturating_duration_since(since)));
                }
                // Ties go by name: the same inputs, the same order.
                if next.is_none_or(|(v, n)| (account.vruntime, name) < (v, n)) {
                    next = Some((account.vruntime, name));
                }
            }
            let Some((vruntime, name)) = next else {
                break;
            };
            let name = name.clone();
            let Some(account) = self.tenants.get_mut(&name) else {
                break;
            };
            let Some(waiter) = account.waiting.pop_front() else {
                break;
            };
            self.waiting -= 1;
            account.running += 1;
            self.running += 1;
            self.floor = self.floor.max(vruntime);
            out.granted.push(waiter);
        }
        out
    }
}

#[cfg(test)]
mod tests {
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
        let run =
            |fair: &mut Fair<u32>, running: &mut Vec<u32>, now: &mut Instant, slices: usize| {
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
        assert!(fair.cancel("t", &2));
        assert_eq!((fair.waiting, in_line(&fair)), (1, 1));
        assert_eq!(fair.release("t", SLICE, None, now).granted[..], [3]);
        assert_eq!((fair.waiting, in_line(&fair)), (0, 0));
        // 3 was granted: cancelling finds nothing waiting, the caller
        // releases, and the slot is free for the next.
        assert!(!fair.cancel("t", &3));
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

    #[test]
    fn a_tenant_past_its_cap_waits_though_a_slot_is_free_and_no_one_is_in_line() {
        let mut fair = Fair::new(2);
        let (t, u): (Arc<str>, Arc<str>) = (Arc::from("t"), Arc::from("u"));
        let start = Instant::now();
        // A cap of 0.1 core: 10 ms per 100 ms window, all used by one
        // task that then ends.
        let capped = share(100, Some(0.1));
        assert_eq!(fair.request(&t, capped, 1, start).granted[..], [1]);
        let now = start + Duration::from_millis(10);
        assert!(
            fair.release("t", Duration::from_millis(10), None, now)
                .granted
                .is_empty()
        );
        // Its next task waits for the next window.
        let d = fair.request(&t, capped, 2, now);
        assert!(d.granted.is_empty(), "granted past its cap: {d:?}");
        assert_eq!(d.retry_at, Some(start + CAP_WINDOW));
        // Another tenant's task runs at once meanwhile.
        assert_eq!(fair.request(&u, share(100, None), 3, now).granted[..], [3]);
        assert_eq!(fair.dispatch(start + CAP_WINDOW).granted[..], [2]);
        assert_eq!((fair.waiting, in_line(&fair)), (0, 0));
    }
}
