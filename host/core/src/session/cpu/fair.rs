//! The scheduler's decisions, apart from threads and clocks: which waiting
//! task runs next. Every call carries the time it happens at ([`Clock`]:
//! the tests' fake one, or the machine's, read only if the decision needs
//! it) and the CPU time a slice used, so the tests drive it with a fake
//! clock.
//!
//! Tenants first, then their tasks: of the tenants with a task waiting,
//! the one that has used least CPU for its weight (its virtual runtime)
//! goes next, and its oldest waiting task runs. A tenant that wakes up
//! starts at the virtual runtime of the tenant chosen last, so the time it
//! slept is not owed to it; a busy one falls at most [`MAX_LAG`] behind
//! it, so CPU it left unused is not owed either. A tenant with a cap that
//! has used its cap's worth of the current window waits for the next
//! window. A tenant that wakes when its turn comes before every other
//! tenant's that holds a slot or waits for one (and is not held back by its
//! cap) may run beyond the slots at once ([`Fair::take`]); one release
//! that grants no one pays each such slot back.

use std::cell::OnceCell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::share::{CpuMax, CpuShare, CpuWeight};

/// The window a cap holds over (as cgroups' default `cpu.max` period).
pub const CAP_WINDOW: Duration = Duration::from_millis(100);

/// When a decision happens: a fake clock's `Instant` in the tests; the
/// machine's clock, read only if the decision needs the time ([`Lazy`]),
/// in the host. A slot taken at once, or given back with no one in line,
/// by an uncapped tenant that has an account needs none: two clock reads
/// fewer for a task that ends in its first slice. A new account (its
/// window starts then), a capped tenant, a capped one among those a task
/// beyond the slots is compared with, and a release that grants the slot
/// do.
pub(crate) trait Clock: Copy {
    fn now(self) -> Instant;
}

impl Clock for Instant {
    fn now(self) -> Instant {
        self
    }
}

/// The machine's clock, read once, when a decision first needs it.
#[derive(Default)]
pub(crate) struct Lazy(OnceCell<Instant>);

impl Clock for &Lazy {
    fn now(self) -> Instant {
        *self.0.get_or_init(Instant::now)
    }
}

/// What one request, release, cancel or timer changed.
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

impl<W> Dispatch<W> {
    /// Nothing changed: no one granted, throttled or to retry.
    pub fn is_empty(&self) -> bool {
        self.granted.is_empty() && self.retry_at.is_none() && self.throttled.is_empty()
    }
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
    #[inline]
    fn capped_until(&mut self, now: impl Clock) -> Option<Instant> {
        let max = self.share.max?;
        self.roll(now);
        let (start, used) = self.window;
        (used >= budget(max)).then_some(start + CAP_WINDOW)
    }

    /// Moves the cap's window up to `now`. What a window used beyond its
    /// budget (slices end past it) is owed by the next: over time a tenant
    /// never gets more than its cap.
    #[inline]
    fn roll(&mut self, now: impl Clock) {
        // (Uncapped, most tenants: nothing to move, checked without a call.)
        if let Some(max) = self.share.max {
            self.roll_capped(max, now.now());
        }
    }

    /// [`Account::roll`] of a capped tenant.
    fn roll_capped(&mut self, max: CpuMax, now: Instant) {
        let (start, used) = self.window;
        let passed = now.saturating_duration_since(start).as_nanos() / CAP_WINDOW.as_nanos();
        if passed == 0 {
            return;
        }
        let passed = u32::try_from(passed).unwrap_or(u32::MAX);
        let owed = used.saturating_sub(budget(max).saturating_mul(passed));
        self.window = (start + CAP_WINDOW.saturating_mul(passed), owed);
    }

    fn charge(&mut self, used: Duration, now: impl Clock) {
        // A slice's nanoseconds times the default weight fit in 64 bits
        // (centuries of CPU): no 128-bit division each slice.
        let nanos = u64::try_from(used.as_nanos()).unwrap_or(u64::MAX);
        let weighted = nanos.saturating_mul(u64::from(CpuWeight::DEFAULT.get()))
            / u64::from(self.share.weight.get());
        self.vruntime += u128::from(weighted);
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

    /// Whether forgetting it at `now` changes nothing: nothing waiting or
    /// running, owed nothing (it would start at the floor anyway), owing
    /// its cap nothing (its window moved up to `now` first).
    fn forgettable(&mut self, floor: u128, now: impl Clock) -> bool {
        self.roll(now);
        self.waiting.is_empty()
            && self.running == 0
            && self.vruntime <= floor
            // (Uncapped now, it owes no cap: what a cap it had left in its
            // window would keep it remembered for ever.)
            && (self.share.max.is_none() || self.window.1.is_zero())
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

/// A tenant's place in the order tenants are granted slots in: least
/// virtual runtime first; of equals, the one with fewer tasks running (the
/// CPU of running slices is not charged yet, so it has used less); then by
/// name (the same inputs, the same order).
type Turn<'a> = (u128, usize, &'a Arc<str>);

/// Where a task that asks for a slot may run when none is free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Beyond {
    /// Nowhere: it waits in line.
    No,
    /// Beyond the slots, at once, if its tenant would be granted the next
    /// one ([`Fair::take`]): the caller runs it where no slot holder can
    /// keep it waiting.
    IfNext,
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

    /// Tasks that hold a slot (or one beyond them).
    #[cfg(test)]
    pub fn running(&self) -> usize {
        self.running
    }

    /// `waiter` of `tenant` wants a slot: [`Fair::take`], else in line.
    #[cfg(test)]
    pub fn request(
        &mut self,
        tenant: &Arc<str>,
        share: CpuShare,
        waiter: W,
        now: Instant,
    ) -> Dispatch<W> {
        if self.take(tenant, share, now, Beyond::No) {
            let mut out = Dispatch::default();
            out.granted.push(waiter);
            return out;
        }
        self.enqueue(tenant, share, waiter, now)
    }

    /// A task of `tenant` wants a slot: `true` if it holds one now, as
    /// [`Fair::dispatch`] would decide with no one else in line, a slot
    /// free and its cap not holding it back; otherwise the caller puts it
    /// in line ([`Fair::enqueue`]). Without a place in line, the task that
    /// needs no wait — most of them — costs no waiter to grant and wake.
    ///
    /// With the slots all taken, a task that may run [`Beyond::IfNext`]
    /// holds one beyond them when its tenant wakes — nothing of it running
    /// or in line — and would be granted the next slot anyway: its cap does
    /// not hold it back, and no tenant in line or holding a slot, its cap
    /// not holding it back either, is ahead of it. Each slot held beyond
    /// them is paid back by one release that grants none (wake-up
    /// preemption: a tenant that wakes does not wait for a slot held by
    /// one whose turn comes after its own). A tenant with a task running
    /// or in line never runs beyond the slots: at most one task per tenant
    /// does, and only when the tenant is owed the CPU. How many tenants do
    /// at once is the caller's bound (the host's threads' places).
    pub fn take(
        &mut self,
        tenant: &Arc<str>,
        share: CpuShare,
        now: impl Clock,
        beyond: Beyond,
    ) -> bool {
        let (waiting, running, slots) = (self.waiting, self.running, self.slots);
        let account = self.account(tenant, share, now);
        let (vruntime, busy) = (account.vruntime, account.running);
        // Held back by its cap: no slot, free or beyond.
        if account.capped_until(now).is_some() {
            return false;
        }
        if waiting == 0 && running < slots {
            account.running += 1;
        } else {
            if beyond == Beyond::No
                || busy > 0
                || !account.waiting.is_empty()
                || self.ahead_of((vruntime, busy, tenant), now)
            {
                return false;
            }
            // (Found again: the scan for who is ahead borrowed them all.
            // Nothing between the lookups forgets it; if something did,
            // refusing keeps the counts right.)
            let Some(account) = self.tenants.get_mut(tenant) else {
                return false;
            };
            account.running += 1;
        }
        self.running += 1;
        self.floor = self.floor.max(vruntime);
        true
    }

    /// Whether a tenant the next slot to free could go to, its cap not
    /// holding it back, goes before one at `turn` in [`Fair::dispatch`]'s
    /// order: one in line, or one holding a slot (a holder that yields is
    /// back in line before its slot is given away).
    fn ahead_of(&mut self, turn: Turn<'_>, now: impl Clock) -> bool {
        self.tenants.iter_mut().any(|(name, account)| {
            (account.running > 0 || !account.waiting.is_empty())
                && (account.vruntime, account.running, name) < turn
                && account.capped_until(now).is_none()
        })
    }

    /// `waiter` of `tenant` in line, once [`Fair::take`] refused it.
    pub fn enqueue(
        &mut self,
        tenant: &Arc<str>,
        share: CpuShare,
        waiter: W,
        now: Instant,
    ) -> Dispatch<W> {
        // As `take` left it (the same policy, already woken up).
        let account = self.account(tenant, share, now);
        // A task is in line once at most: `cancel` takes out the first.
        debug_assert!(!account.waiting.contains(&waiter), "in line twice");
        account.waiting.push_back(waiter);
        self.waiting += 1;
        self.dispatch(now)
    }

    /// `tenant`'s account, made if it has none, with `share` its policy
    /// from now on; one that wakes up gets no credit for the time it slept.
    fn account(&mut self, tenant: &Arc<str>, share: CpuShare, now: impl Clock) -> &mut Account<W> {
        let floor = self.floor;
        let account = self
            .tenants
            .entry(tenant.clone())
            .or_insert_with(|| Account {
                share,
                vruntime: floor,
                waiting: VecDeque::new(),
                running: 0,
                window: (now.now(), Duration::ZERO),
                throttled_since: None,
            });
        // Its policy, as its tasks carry it.
        account.share = share;
        if account.waiting.is_empty() && account.running == 0 {
            // Waking up: no credit for the time it slept.
            account.vruntime = account.vruntime.max(floor);
        } else {
            account.keep_up(floor);
        }
        account
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
        now: impl Clock,
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
            idle = account.forgettable(self.floor, now);
        }
        self.running = self.running.saturating_sub(1);
        if self.waiting == 0 {
            // No one in line to grant the slot to (and the floor stays).
            if idle {
                self.tenants.remove(tenant);
            }
            return Dispatch::default();
        }
        let dispatch = self.dispatch(now.now());
        self.forget_if_idle(tenant, now);
        dispatch
    }

    /// CPU `tenant` used outside a slot (a cancelled task's teardown),
    /// counted as a slice's is, while it has an account (one forgotten
    /// would start at the floor anyway).
    pub fn charge(&mut self, tenant: &str, used: Duration, now: Instant) {
        if let Some(account) = self.tenants.get_mut(tenant) {
            account.charge(used, now);
        }
    }

    /// Takes `waiter` out of the queue at `now`; `None` if it was not
    /// waiting (it was granted a slot, which the caller must then
    /// release). The last of a tenant's tasks to leave the line while its
    /// cap holds it back ends its throttled time: counted in what it
    /// returns, not lost.
    pub fn cancel(&mut self, tenant: &Arc<str>, waiter: &W, now: Instant) -> Option<Dispatch<W>> {
        let account = self.tenants.get_mut(tenant)?;
        let at = account.waiting.iter().position(|w| w == waiter)?;
        account.waiting.remove(at);
        self.waiting -= 1;
        // Nothing of it waits for its window any more.
        let throttled = account
            .waiting
            .is_empty()
            .then(|| account.throttled_since.take())
            .flatten();
        let mut out = Dispatch::default();
        if let Some(since) = throttled {
            out.throttled
                .push((tenant.clone(), now.saturating_duration_since(since)));
        }
        self.forget_if_idle(tenant, now);
        Some(out)
    }

    /// Drops an idle tenant's account when keeping it changes nothing, so
    /// that the scan for the next tenant covers the active ones.
    fn forget_if_idle(&mut self, tenant: &str, now: impl Clock) {
        let floor = self.floor;
        if self
            .tenants
            .get_mut(tenant)
            .is_some_and(|a| a.forgettable(floor, now))
        {
            self.tenants.remove(tenant);
        }
    }

    /// Grants free slots to the tenants most owed CPU.
    pub fn dispatch(&mut self, now: Instant) -> Dispatch<W> {
        let mut out = Dispatch::default();
        // An idle tenant is forgotten when it ends its last task, unless it
        // is still ahead of the floor or owes its cap; nothing else
        // looks at it again, so the scan does, once the floor has passed it
        // or its window has rolled over.
        let mut stale = false;
        while self.running < self.slots {
            let mut next: Option<Turn<'_>> = None;
            for (name, account) in self.tenants.iter_mut() {
                if account.waiting.is_empty() {
                    stale = stale || account.forgettable(self.floor, now);
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
                let turn = (account.vruntime, account.running, name);
                if next.is_none_or(|next| turn < next) {
                    next = Some(turn);
                }
            }
            let Some((vruntime, _, name)) = next else {
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
        if stale {
            let floor = self.floor;
            self.tenants
                .retain(|_, account| !account.forgettable(floor, now));
        }
        out
    }
}

#[cfg(test)]
mod tests;
