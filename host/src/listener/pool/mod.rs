//! The task pool: the dequeue tasks and how many run (`tasks`, `scaling`), the pickup of
//! notified work (`pickup`), the handler slots and how many calls run at once (`slots`,
//! `concurrency`), and the messages fetched ahead of the free slots.

mod concurrency;
mod permits;
mod pickup;
mod scaling;
mod tasks;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64};

use tokio::sync::Notify;

pub use concurrency::CONCURRENCY_WINDOW;
pub(in crate::listener) use concurrency::FetchedAhead;
pub(in crate::listener) use permits::{CallPermit, PermitGrant};

/// What the dequeue tasks share among themselves (the handler slots with delivery, which
/// hands each message its slot).
pub(in crate::listener) struct Pool {
    /// Wakes resting tasks early (a pickup, the scaler).
    wake: Notify,
    /// Tells a task that claimed the pickup that it is due now (a batch was announced).
    pickup_due: Notify,
    /// Notifications waiting for a get, and the tasks that will make it.
    pickup: Mutex<pickup::Pickup>,
    /// Handler slots: how many handler calls run at once.
    pub(in crate::listener) slots: permits::CallPermits,
    /// Raised when slots are taken, so the idle concurrency decision starts its windows.
    calls_started: Notify,
    /// The recent mean handler latency, in µs (0 before the first call): how far tasks
    /// may fetch ahead of the free slots.
    latency_micros: AtomicU64,
    /// Messages fetched ahead of the free slots and not yet given one, all tasks together
    /// (with the places reserved for gets in flight).
    fetched_ahead: AtomicU32,
}

impl Pool {
    /// A message fetched ahead of the free slots, whose place was reserved by its get:
    /// counted until it has its slot or its processing ends.
    pub(in crate::listener) fn fetched_ahead(&self) -> FetchedAhead<'_> {
        FetchedAhead(&self.fetched_ahead)
    }

    /// A pool whose handler slots allow `max_concurrent_calls` at once.
    pub(in crate::listener) fn new(max_concurrent_calls: u32) -> Pool {
        Pool {
            wake: Notify::new(),
            pickup_due: Notify::new(),
            pickup: Mutex::default(),
            slots: permits::CallPermits::new(max_concurrent_calls),
            calls_started: Notify::new(),
            latency_micros: AtomicU64::new(0),
            fetched_ahead: AtomicU32::new(0),
        }
    }
}
