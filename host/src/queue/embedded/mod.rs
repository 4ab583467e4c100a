//! A durable queue in a local data directory, on redb: nothing to install.
//!
//! Semantics follow Azure Storage Queues: a get leases messages for a visibility timeout
//! and issues a new pop receipt each time; a message whose lease ends becomes visible again
//! with its dequeue count kept; only the latest receipt can delete or update it.
//!
//! Layout (record format 3): each message is a 36-byte header in `headers (queue, seq)`
//! (visibility, insertion time, receipt, dequeue count, body checksum, body length) and a
//! body written once, at the put: `bodies (queue, seq)` holds a short body whole, and a body
//! longer than a page is cut into page-sized parts in `body_pages (queue, seq, part)` with
//! its rest in `bodies`, so each part fills one 4 KiB redb page exactly (stored whole, a
//! 16 KiB body would take a 32 KiB page). A get, a lease renewal, a retry delay or a release
//! rewrites only the header and the message's entry in the index `visible (queue,
//! visible_at_ms, seq)`, through which a get reads the oldest visible messages directly
//! (roughly FIFO) without walking leased or deleted ones; a delete removes header, body and
//! entry. From put to delete (a get, a renewal), a 16 KiB message costs about 18 KiB of
//! writes when several consumers share commits, 22–24 KiB with one (each commit also writes
//! redb's own pages: about 70 KiB a commit in `ebb bench http`, shared by the changes it
//! carries); [`EmbeddedStore::open_counting`] counts them. Formats 1
//! and 2 (header and body in one `messages` record, rewritten whole at every lease, 99 KiB
//! for the same message) are migrated when the store opens; a newer format is refused.
//!
//! Every change is committed durably (fsync) before it is acknowledged; one writer thread
//! commits all changes that arrive while the previous commit runs together (group commit),
//! so concurrent puts and the deletes of a batch share an fsync.
//!
//! Failures: each body carries a CRC-32 checksum, checked once, by the get that reads the
//! body; a body that fails it (or whose length is not its header's) is delivered with a
//! [`Message::defect`](super::Message::defect) (the listener poisons it, never hands it to
//! the handler). A commit that fails (an I/O error leaves redb refusing every later call)
//! makes the writer reopen the database; if it cannot, the store reports the problem in
//! [`Health`] once, answers every call with a transient "unavailable" error, and keeps
//! trying to reopen. A new store is created only where no file is; an existing file that is
//! not a valid store (empty, truncated, another kind of file, or with pages damaged inside:
//! redb's integrity check runs at every start) is refused and never written. A data directory
//! another process holds is waited for, up to [`EmbeddedOptions::wait_for_owner`].
//!
//! Files: `store` opens a data directory and passes changes to the writer; `queue` is one
//! queue's [`QueueClient`](super::QueueClient); `opening` checks, creates and prepares the
//! file and migrates older formats; `writer` commits groups of changes (`ops`: what a change and its reply are); `changes` applies
//! each change to the `tables` (`leasing`: gets, visibility updates, receipts); `record` is
//! a message's header, `bodies` how a body is stored; `claims` keeps claim-check bodies
//! (large bodies offloaded from envelopes, `ebb::payload::claims`); `counting` counts what
//! the store writes to its file.

mod bodies;
mod changes;
mod claims;
mod counting;
mod leasing;
mod opening;
pub(crate) use opening::check_store;
mod ops;
mod queue;
mod record;
mod store;
mod tables;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use super::clock::{Clock, SystemClock};
use crate::health::Health;

pub use counting::{CountingBackend, StoreWrites};
pub use queue::EmbeddedQueue;
pub(crate) use queue::{ClaimRead, MAX_CLAIM_BODY_BYTES};
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
    /// How long an open waits while another process holds the data directory before it
    /// gives up (none by default; a host waits `OWNER_WAIT`).
    pub wait_for_owner: Duration,
}

/// How long a host, or an `ebb send` with no host running, waits for a data directory
/// another process holds: an `ebb send` with no host running holds it for a moment.
pub(crate) const OWNER_WAIT: Duration = Duration::from_secs(5);

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            clock: Arc::new(SystemClock),
            health: Health::default(),
            wait_for_owner: Duration::ZERO,
        }
    }
}
