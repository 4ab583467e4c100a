//! serde's defaults of the file form: the values of [`crate::defaults`], named where the
//! file form's fields name them (`#[serde(default = "serde_defaults::…")]`).

use std::path::PathBuf;
use std::time::Duration;

use crate::defaults as d;

pub fn data_dir() -> PathBuf {
    d::DATA_DIR.into()
}
pub fn rules_dir() -> PathBuf {
    d::RULES_DIR.into()
}
pub fn max_message_bytes() -> usize {
    d::MAX_MESSAGE_BYTES
}
pub fn drain_timeout() -> Duration {
    d::DRAIN_TIMEOUT
}
pub fn channel_prefix() -> String {
    d::CHANNEL_PREFIX.to_string()
}
pub fn price_per_10k_transactions() -> f64 {
    d::PRICE_PER_10K_TRANSACTIONS
}
pub fn listen() -> String {
    d::API_LISTEN.into()
}
pub fn header_read_timeout() -> Duration {
    d::HEADER_READ_TIMEOUT
}
pub fn idle_timeout() -> Duration {
    d::IDLE_TIMEOUT
}
pub fn body_read_timeout() -> Duration {
    d::BODY_READ_TIMEOUT
}
pub fn max_connections() -> usize {
    d::MAX_CONNECTIONS
}
pub fn max_instances() -> u32 {
    d::MAX_INSTANCES
}
pub fn scaler_poll_interval() -> Duration {
    d::SCALER_POLL_INTERVAL
}
pub fn call_deadline() -> Duration {
    d::CALL_DEADLINE
}
pub fn call_fuel() -> u64 {
    d::CALL_FUEL
}
pub fn memory_mib() -> usize {
    d::MEMORY_MIB
}
pub fn quarantine_after() -> u32 {
    d::QUARANTINE_AFTER
}
pub fn cache_mib() -> u64 {
    d::CACHE_MIB
}
pub fn batch_size() -> u32 {
    d::BATCH_SIZE
}
pub fn min_tasks() -> u32 {
    d::MIN_TASKS
}
pub fn max_tasks() -> u32 {
    d::MAX_TASKS
}
pub fn max_concurrent_calls() -> u32 {
    d::MAX_CONCURRENT_CALLS
}
pub fn min_polling_interval() -> Duration {
    d::MIN_POLLING_INTERVAL
}
pub fn max_polling_interval() -> Duration {
    d::MAX_POLLING_INTERVAL
}
pub fn visibility_timeout() -> Duration {
    d::VISIBILITY_TIMEOUT
}
pub fn max_retry_delay() -> Duration {
    d::MAX_RETRY_DELAY
}
pub fn lease_duration() -> Duration {
    d::LEASE_DURATION
}
pub fn max_dequeue_count() -> u32 {
    d::MAX_DEQUEUE_COUNT
}
pub fn push() -> bool {
    d::PUSH
}
pub fn scale_interval() -> Duration {
    d::SCALE_INTERVAL
}
pub fn max_pickup_delay() -> Duration {
    d::MAX_PICKUP_DELAY
}
pub fn record() -> bool {
    d::RECORD
}
pub fn record_max_bytes() -> u64 {
    d::RECORD_MAX_BYTES
}
pub fn partitions() -> u32 {
    d::PARTITIONS
}
pub fn max_claim_check_bytes() -> u64 {
    crate::payload::DEFAULT_MAX_CLAIM_CHECK_BYTES
}
pub fn claim_check_retention() -> Duration {
    crate::payload::claims::DEFAULT_RETENTION
}
pub fn claim_sweep_interval() -> Duration {
    crate::payload::claims::DEFAULT_SWEEP_INTERVAL
}
pub fn pack_linger() -> Duration {
    d::PACK_LINGER
}
pub fn handler_timeout() -> Duration {
    d::HANDLER_TIMEOUT
}
