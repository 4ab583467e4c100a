//! A durable queue in a local data directory, on redb: nothing to install.
//!
//! Semantics follow Azure Storage Queues: a get leases messages for a visibility timeout
//! and issues a new pop receipt each time; a message whose lease ends becomes visible again
//! with its dequeue count kept; only the latest receipt can delete or update it.
//!
//! Layout: `messages (queue, seq) → header + body`, and an index `visible (queue,
//! visible_at_ms, seq)` so a get reads the oldest visible messages directly (roughly FIFO)
//! without walking leased or deleted ones. Every change is committed durably (fsync)
//! before it is acknowledged; one writer thread commits all changes that arrive while the
//! previous commit runs together (group commit), so concurrent puts and the deletes of a
//! batch share an fsync.
//!
//! Failures: each body carries a CRC-32 checksum; a body that fails it is delivered with a
//! [`Message::defect`](super::Message::defect) (the listener poisons it, never hands it to
//! the handler). A commit that fails (an I/O error leaves redb refusing every later call)
//! makes the writer reopen the database; if it cannot, the store reports the problem in
//! [`Health`] once, answers every call with a transient "unavailable" error, and keeps
//! trying to reopen. A new store is created only where no file is; an existing file that is
//! not a valid store (empty, truncated, another kind of file) is refused and never written.
//!
//! Files: `store` opens a data directory and passes changes to the writer; `queue` is one
//! queue's [`QueueClient`](super::QueueClient); `opening` checks, creates and prepares the
//! file; `writer` commits groups of changes; `changes` applies each change to the `tables`
//! (`leasing`: gets, visibility updates, receipts); `record` is a message's stored form.

mod bodies;
mod changes;
mod counting;
mod leasing;
mod opening;
pub use opening::check_store;
mod queue;
mod record;
mod store;
mod tables;
mod writer;

use std::sync::Arc;

use super::clock::{Clock, SystemClock};
use crate::health::Health;

pub use counting::{CountingBackend, StoreWrites};
pub use queue::EmbeddedQueue;
pub use store::EmbeddedStore;

/// The store's file in its data directory.
pub const STORE_FILE: &str = "queues.redb";
/// Azure's message size limit, the default here too.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = crate::defaults::MAX_MESSAGE_BYTES;

/// Options of an embedded store.
#[derive(Clone)]
pub struct EmbeddedOptions {
    /// Largest body accepted, in bytes.
    pub max_message_bytes: usize,
    /// The clock visibility timeouts run on.
    pub clock: Arc<dyn Clock>,
    /// Where the store reports that it cannot work (it cannot be reopened, commits fail).
    pub health: Health,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions { max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES, clock: Arc::new(SystemClock), health: Health::default() }
    }
}
