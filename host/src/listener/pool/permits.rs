//! Handler slots: how many handler calls of a queue run at once on this host. The bound is
//! the queue's `max_concurrent_calls`, or less when the rule decides so (see
//! `concurrency`). A dequeue task takes slots before its get and asks for no more messages
//! than it holds, so a message never waits leased for a slot; each message gives its slot
//! back when its handler call ends, however it ends (a panic, a timeout, a drop at shutdown).
//!
//! A task waits until half the limit is free (at most a batch) before it gets, as Azure
//! Functions fetches a new batch when half of one is left (`newBatchThreshold`): gets stay
//! large (each is a billed call) while the app stays busy.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::sync::Notify;

/// The handler-call permits of one queue (its handler slots): at most `limit` calls at once.
pub(in crate::listener) struct CallPermits {
    state: Mutex<PermitCounts>,
    /// Raised when slots are given back or the limit grows.
    freed: Notify,
    /// Tasks waiting for slots now.
    waiting: AtomicU32,
}

#[derive(Debug, Clone, Copy)]
struct PermitCounts {
    limit: u32,
    in_use: u32,
    /// Most slots in use at once since the last [`CallPermits::take_peak`].
    peak: u32,
    /// The fewest free slots a waiting task asked for (0: nobody waits). Giving a slot back
    /// wakes the waiters only once this many are free: waking every waiting task at every
    /// finished call cost more CPU than the calls' own bookkeeping at 32 tasks.
    need: u32,
}

/// Permits taken by one task for its next get; those not handed to a message are given back
/// when the grant is dropped.
pub(in crate::listener) struct PermitGrant<'a> {
    slots: &'a CallPermits,
    count: u32,
}

/// One message's permit to call its handler (its handler slot), given back when dropped.
pub(in crate::listener) struct CallPermit<'a> {
    slots: &'a CallPermits,
}

impl CallPermits {
    pub(in crate::listener) fn new(limit: u32) -> CallPermits {
        let limit = limit.max(1);
        CallPermits { state: Mutex::new(PermitCounts { limit, in_use: 0, peak: 0, need: 0 }), freed: Notify::new(), waiting: AtomicU32::new(0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PermitCounts> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until enough slots are free for a worthwhile get (half the limit, at most
    /// `batch`, at least one), then takes as many as are free, up to `batch`.
    pub(in crate::listener) async fn acquire(&self, batch: u32) -> PermitGrant<'_> {
        let batch = batch.max(1);
        let mut waiting = None;
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.lock();
                let free = state.limit.saturating_sub(state.in_use);
                let enough = state.limit.div_ceil(2).clamp(1, batch);
                if free >= enough {
                    let count = free.min(batch);
                    state.in_use += count;
                    state.peak = state.peak.max(state.in_use);
                    return PermitGrant { slots: self, count };
                }
                state.need = if state.need == 0 { enough } else { state.need.min(enough) };
            }
            waiting.get_or_insert_with(|| WaitingMark::new(&self.waiting));
            notified.await;
        }
    }

    fn give_back(&self, count: u32) {
        if count == 0 {
            return;
        }
        let wake = {
            let mut state = self.lock();
            state.in_use -= count;
            let wake = state.need != 0 && state.limit.saturating_sub(state.in_use) >= state.need;
            if wake {
                state.need = 0;
            }
            wake
        };
        if wake {
            self.freed.notify_waiters();
        }
    }

    /// Sets the limit (at least 1). Calls over a lower limit finish; no new one starts
    /// until the calls in use are under it.
    pub(in crate::listener) fn set_limit(&self, limit: u32) {
        let limit = limit.max(1);
        let wake = {
            let mut state = self.lock();
            // A waiter's need was half the old limit: any change makes it stale (half of a
            // lower limit may be all a waiter can ever get), so waiters look again.
            let wake = limit != state.limit && state.need != 0;
            state.limit = limit;
            if wake {
                state.need = 0;
            }
            wake
        };
        if wake {
            self.freed.notify_waiters();
        }
    }

    /// The grant of `count` slots taken earlier ([`PermitGrant::into_count`]).
    pub(in crate::listener) fn adopt(&self, count: u32) -> PermitGrant<'_> {
        PermitGrant { slots: self, count }
    }

    pub(in crate::listener) fn limit(&self) -> u32 {
        self.lock().limit
    }

    pub(in crate::listener) fn in_use(&self) -> u32 {
        self.lock().in_use
    }

    /// Tasks waiting for slots now.
    pub(in crate::listener) fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The most slots in use at once since the last call (the slots in use now, at least).
    pub(in crate::listener) fn take_peak(&self) -> u32 {
        let mut state = self.lock();
        let peak = state.peak.max(state.in_use);
        state.peak = state.in_use;
        peak
    }
}

impl<'a> PermitGrant<'a> {
    /// Permits held.
    pub(in crate::listener) fn count(&self) -> u32 {
        self.count
    }

    /// The slots held, kept taken, as a count (for a task of their own, which makes them a
    /// grant again with [`CallPermits::adopt`]).
    pub(in crate::listener) fn into_count(self) -> u32 {
        let count = self.count;
        std::mem::forget(self);
        count
    }

    /// Hands one slot to a message.
    pub(in crate::listener) fn take_one(&mut self) -> Option<CallPermit<'a>> {
        (self.count > 0).then(|| {
            self.count -= 1;
            CallPermit { slots: self.slots }
        })
    }
}

impl Drop for PermitGrant<'_> {
    fn drop(&mut self) {
        self.slots.give_back(self.count);
    }
}

impl Drop for CallPermit<'_> {
    fn drop(&mut self) {
        self.slots.give_back(1);
    }
}

/// Counts a task among the waiting while it waits, however the wait ends (a cancel included).
struct WaitingMark<'a>(&'a AtomicU32);

impl<'a> WaitingMark<'a> {
    fn new(waiting: &'a AtomicU32) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        WaitingMark(waiting)
    }
}

impl Drop for WaitingMark<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_task_takes_at_most_a_batch_and_waits_until_half_the_limit_is_free() {
        let slots = CallPermits::new(8);
        let mut first = slots.acquire(32).await;
        assert_eq!(first.count(), 8, "all eight are free: a get of eight");
        let held: Vec<_> = (0..5).map(|_| first.take_one().unwrap()).collect();
        drop(first);
        assert_eq!(slots.in_use(), 5, "the three not handed to a message went back");
        // Three free: less than half of eight, so the next task waits.
        let waiting = tokio::time::timeout(Duration::from_secs(1), slots.acquire(32)).await;
        assert!(waiting.is_err(), "three free slots are not worth a get");
        assert_eq!(slots.waiting(), 0, "a cancelled wait is not counted as waiting");
        let mut held = held.into_iter();
        drop(held.next());
        let grant = slots.acquire(32).await;
        assert_eq!(grant.count(), 4, "four free: half the limit");
        drop(grant);
        let small = slots.acquire(2).await;
        assert_eq!(small.count(), 2, "a task never takes more than its batch");
    }

    #[tokio::test(start_paused = true)]
    async fn every_slot_comes_back_whatever_ends_the_call() {
        let slots = std::sync::Arc::new(CallPermits::new(2));
        let panicking = {
            let slots = slots.clone();
            tokio::spawn(async move {
                let mut grant = slots.acquire(1).await;
                let _slot = grant.take_one().unwrap();
                panic!("the handler panicked");
            })
        };
        assert!(panicking.await.is_err());
        let hanging = {
            let slots = slots.clone();
            tokio::spawn(async move {
                let mut grant = slots.acquire(2).await;
                let _slot = grant.take_one().unwrap();
                drop(grant);
                std::future::pending::<()>().await;
            })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(slots.in_use(), 1, "the hanging call holds one; the grant's other went back");
        hanging.abort();
        let _ = hanging.await;
        assert_eq!(slots.in_use(), 0, "a call dropped at shutdown gives its slot back");
        assert_eq!(slots.take_peak(), 2, "the peak saw both at once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lower_limit_lets_running_calls_finish_and_a_higher_one_wakes_waiters() {
        let slots = std::sync::Arc::new(CallPermits::new(4));
        let mut grant = slots.acquire(4).await;
        let held: Vec<_> = (0..4).map(|_| grant.take_one().unwrap()).collect();
        drop(grant);
        slots.set_limit(2);
        assert_eq!(slots.in_use(), 4, "calls over the new limit run on");
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire(32).await.count() })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(slots.waiting(), 1);
        drop(held);
        assert_eq!(waiter.await.unwrap(), 2, "under the lowered limit, two at once");
        slots.set_limit(0);
        assert_eq!(slots.limit(), 1, "at least one call can always run");
    }

    /// A task waits for half the limit; when the limit drops under what it waited for, it
    /// must look again rather than wait for slots that can never be free.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_looks_again_when_the_limit_drops_under_its_need() {
        let slots = std::sync::Arc::new(CallPermits::new(32));
        let mut grant = slots.acquire(32).await;
        let mut held: Vec<_> = (0..32).map(|_| grant.take_one().unwrap()).collect();
        drop(grant);
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire(32).await.count() })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(slots.waiting(), 1, "32 in use: the task waits for 16 free");
        held.truncate(24);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(slots.waiting(), 1, "8 free is not half of 32");
        slots.set_limit(2);
        held.truncate(0);
        let got = tokio::time::timeout(Duration::from_secs(1), waiter).await;
        assert_eq!(got.expect("the waiter was never woken").unwrap(), 2, "the lowered limit's half is free");
        slots.set_limit(0);
        assert_eq!(slots.limit(), 1, "at least one call can always run");
    }
}
