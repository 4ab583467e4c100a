//! A queue's listener settings, validated (see `config` for the file form).

use std::time::Duration;

/// How one queue is listened to. Units are in the field names or types.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// Messages per get, 1..=32.
    pub batch_size: u32,
    /// Fewest dequeue tasks (at least one polls unless `push_enabled`).
    pub min_tasks: u32,
    /// Most dequeue tasks.
    pub max_tasks: u32,
    /// Most handler calls at once (the ceiling of a rule's concurrency decision), 1..=10,000.
    pub max_concurrent_calls: u32,
    /// Shortest sleep after an empty get.
    pub min_polling_interval: Duration,
    /// Longest sleep after an empty get.
    pub max_polling_interval: Duration,
    /// How long a get leases its messages; renewed at half while a handler runs.
    pub lease_duration: Duration,
    /// Retry delay after the first failure; doubles with each further dequeue.
    pub visibility_timeout: Duration,
    /// Cap on the retry delay.
    pub max_retry_delay: Duration,
    /// Failures after which a message moves to `<queue>-poison`.
    pub max_dequeue_count: u32,
    /// Whether push notifications wake this queue (then idle tasks may all stop).
    pub push_enabled: bool,
    /// With `push_enabled`: while no task runs, one get at start-up and then one per this
    /// interval, so messages queued before the start, or whose notification was lost, wait
    /// at most this long.
    pub safety_poll: Duration,
    /// Least time between two task-count decisions.
    pub scale_interval: Duration,
    /// Longest a notified message waits for the get that picks it up while no task is
    /// busy: notifications within this time share one get.
    pub max_pickup_delay: Duration,
    /// Seed for the random values passed to rules (None: random). Simulations set it.
    pub random_seed: Option<u64>,
    /// Whether a dequeue task waits for its batch's handler calls before its next get, as a
    /// poller that hands each batch to one invocation does (the simulator's baselines:
    /// Lambda's event source mapping, Azure Functions' trigger). Off (ebb): after a full get
    /// a task gets again as soon as handler slots are free.
    pub wait_for_batch: bool,
    /// What the poison queue receives: a JSON envelope with the reason (the embedded
    /// store's default), or the original body only (Azure: what Azure Functions does, so
    /// tools that requeue poisoned messages work; the reason stays in the log, the status
    /// and the metrics).
    pub poison_envelope: bool,
}

impl Default for QueueSettings {
    fn default() -> Self {
        use crate::defaults as d;
        QueueSettings {
            batch_size: d::BATCH_SIZE,
            min_tasks: d::MIN_TASKS,
            max_tasks: d::MAX_TASKS,
            max_concurrent_calls: d::MAX_CONCURRENT_CALLS,
            min_polling_interval: d::MIN_POLLING_INTERVAL,
            max_polling_interval: d::MAX_POLLING_INTERVAL,
            lease_duration: d::LEASE_DURATION,
            visibility_timeout: d::VISIBILITY_TIMEOUT,
            max_retry_delay: d::MAX_RETRY_DELAY,
            max_dequeue_count: d::MAX_DEQUEUE_COUNT,
            push_enabled: d::PUSH,
            safety_poll: d::SAFETY_POLL,
            scale_interval: d::SCALE_INTERVAL,
            max_pickup_delay: d::MAX_PICKUP_DELAY,
            random_seed: None,
            wait_for_batch: false,
            poison_envelope: true,
        }
    }
}

impl QueueSettings {
    /// The delay before retry after the `dequeue_count`-th failure: `visibility_timeout ×
    /// 2^(dequeue_count − 1)`, capped at `max_retry_delay`.
    pub(crate) fn retry_delay(&self, dequeue_count: u32) -> Duration {
        let doublings = dequeue_count.saturating_sub(1).min(30);
        self.visibility_timeout.saturating_mul(1 << doublings).min(self.max_retry_delay)
    }
}
