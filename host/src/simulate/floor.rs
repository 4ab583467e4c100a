//! The latency-aware floor: the fewest consumer calls that handle every arrival within a
//! wait budget W. One delete per message (on SQS one `DeleteMessageBatch` per 10), plus the
//! fewest gets of at most 32 messages (SQS: 10) such that no message waits longer
//! than W after its arrival before a get fetches it. No listener can bill less and keep
//! every pickup within W.
//!
//! Greedy is optimal: the first get waits as long as it may (the earliest un-fetched
//! arrival + W) and takes up to a batch of what has arrived by then, earliest first; repeat.
//! Any schedule can be turned into the greedy one without adding a get (moving a get later,
//! up to the earliest deadline among what it fetches, only lets it take more).

use std::time::Duration;

use anyhow::{Result, bail};

use super::Arrival;

/// The shortest wait budget `--wait-budget` takes.
pub(crate) const MIN_WAIT_BUDGET: Duration = Duration::from_millis(1);
/// The longest wait budget `--wait-budget` takes.
pub(crate) const MAX_WAIT_BUDGET: Duration = Duration::from_secs(3600);
/// The default wait budget.
pub(crate) const DEFAULT_WAIT_BUDGET: Duration = Duration::from_secs(1);

/// The floor of a run's arrivals.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Floor {
    /// The wait budget W.
    pub wait_budget: Duration,
    /// Gets of the greedy schedule.
    pub gets: u64,
    /// Delete requests: one per message, or one per batch of up to `delete_batch`.
    pub deletes: u64,
    /// Messages one delete request carries at most (1; SQS: 10).
    pub delete_batch: u32,
    /// The greedy schedule: when each get happens and how many messages it fetches, in time
    /// order (for the chart).
    pub schedule: Vec<(Duration, u32)>,
}

impl Floor {
    /// Consumer calls at the floor: gets + deletes.
    pub fn calls(&self) -> u64 {
        self.gets + self.deletes
    }

    /// Consumer calls the floor has made by `at` (a get and its deletes count at the get;
    /// batched deletes as the batches of what was fetched so far).
    pub fn calls_by(&self, at: Duration) -> u64 {
        let made = self.schedule.partition_point(|(t, _)| *t <= at);
        let fetched: u64 = self.schedule[..made].iter().map(|(_, n)| u64::from(*n)).sum();
        made as u64 + fetched.div_ceil(u64::from(self.delete_batch.max(1)))
    }
}

/// Checks a wait budget given on the command line.
pub(crate) fn check_wait_budget(wait_budget: Duration) -> Result<()> {
    if !(MIN_WAIT_BUDGET..=MAX_WAIT_BUDGET).contains(&wait_budget) {
        bail!("--wait-budget: must be 1ms to 1h, got {}", humantime::format_duration(wait_budget));
    }
    Ok(())
}

/// The floor of `arrivals` (sorted by time) for `wait_budget` on a backend: gets of at most
/// `batch` (Azure 32, SQS 10), deletes of at most `delete_batch` a request (deletes of messages fetched apart may share a request: SQS's batch takes any
/// receipts of the queue).
pub(crate) fn floor_of(arrivals: &[Arrival], wait_budget: Duration, batch: u32, delete_batch: u32) -> Floor {
    let batch = batch.max(1);
    let delete_batch = delete_batch.max(1);
    let mut schedule = Vec::new();
    // The earliest un-fetched arrival and how many of its messages are still there.
    let mut first = 0;
    let mut left = arrivals.first().map_or(0, |a| a.count);
    while first < arrivals.len() {
        let at = arrivals[first].at.saturating_add(wait_budget);
        // Whole batches of the earliest arrival alone (a dump of 20,000 is 625 gets).
        if left >= batch {
            for _ in 0..left / batch {
                schedule.push((at, batch));
            }
            left %= batch;
            if left == 0 {
                first += 1;
                left = arrivals.get(first).map_or(0, |a| a.count);
                continue;
            }
        }
        // One get at the deadline of the earliest: up to a batch of what arrived by then.
        let mut taken = 0;
        while taken < batch && first < arrivals.len() && arrivals[first].at <= at {
            let take = left.min(batch - taken);
            taken += take;
            left -= take;
            if left == 0 {
                first += 1;
                left = arrivals.get(first).map_or(0, |a| a.count);
            }
        }
        schedule.push((at, taken));
    }
    let messages: u64 = arrivals.iter().map(|a| u64::from(a.count)).sum();
    Floor { wait_budget, gets: schedule.len() as u64, deletes: messages.div_ceil(u64::from(delete_batch)), delete_batch, schedule }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Azure's floor: gets of 32, a delete per message.
    fn floor(arrivals: &[Arrival], wait_budget: Duration) -> Floor {
        floor_of(arrivals, wait_budget, crate::queue::MAX_BATCH, 1)
    }

    fn arrivals(times_ms: &[u64]) -> Vec<Arrival> {
        let mut arrivals: Vec<Arrival> = times_ms.iter().map(|&ms| Arrival { at: Duration::from_millis(ms), count: 1 }).collect();
        arrivals.sort_by_key(|a| a.at);
        arrivals
    }

    /// The fewest gets by brute force: every partition of the messages into groups of at
    /// most `batch` where one get time serves the whole group (the latest arrival of the
    /// group is at most the earliest + W).
    fn brute_force(times_ms: &[u64], wait_ms: u64, batch: usize) -> u64 {
        fn search(times: &[u64], wait: u64, batch: usize, next: usize, groups: &mut Vec<(u64, u64, usize)>, best: &mut usize) {
            if groups.len() >= *best {
                return;
            }
            if next == times.len() {
                *best = groups.len();
                return;
            }
            let t = times[next];
            for i in 0..groups.len() {
                let (low, high, size) = groups[i];
                let (low2, high2) = (low.min(t), high.max(t));
                if size < batch && high2 <= low2 + wait {
                    groups[i] = (low2, high2, size + 1);
                    search(times, wait, batch, next + 1, groups, best);
                    groups[i] = (low, high, size);
                }
            }
            groups.push((t, t, 1));
            search(times, wait, batch, next + 1, groups, best);
            groups.pop();
        }
        let mut best = times_ms.len() + 1;
        search(times_ms, wait_ms, batch, 0, &mut Vec::new(), &mut best);
        if times_ms.is_empty() { 0 } else { best as u64 }
    }

    #[test]
    fn greedy_gets_match_brute_force_on_small_cases() {
        let mut rng = fastrand::Rng::with_seed(19);
        for case in 0..3000 {
            let n = rng.usize(0..=8);
            let span = [5, 20, 100][case % 3];
            let times: Vec<u64> = (0..n).map(|_| rng.u64(0..span)).collect();
            let wait = rng.u64(1..=12);
            let batch = rng.usize(1..=4);
            let greedy = floor_of(&arrivals(&times), Duration::from_millis(wait), batch as u32, 1);
            let expected = brute_force(&times, wait, batch);
            assert_eq!(greedy.gets, expected, "times {times:?}, W {wait} ms, batch {batch}: greedy {:?}", greedy.schedule);
            assert_eq!(greedy.deletes, n as u64);
        }
    }

    #[test]
    fn greedy_over_counts_matches_the_same_arrivals_one_by_one() {
        // An arrival with a count is that many arrivals at one time.
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..500 {
            let grouped: Vec<Arrival> = {
                let mut at = 0;
                (0..rng.usize(1..20))
                    .map(|_| {
                        at += rng.u64(0..3000);
                        Arrival { at: Duration::from_millis(at), count: rng.u32(1..100) }
                    })
                    .collect()
            };
            let single: Vec<Arrival> = grouped.iter().flat_map(|a| std::iter::repeat_n(Arrival { count: 1, ..*a }, a.count as usize)).collect();
            let (a, b) = (floor(&grouped, Duration::from_secs(1)), floor(&single, Duration::from_secs(1)));
            assert_eq!(a, Floor { deletes: b.deletes, ..b.clone() }, "{grouped:?}");
        }
    }

    #[test]
    fn every_message_is_fetched_within_the_budget_in_batches_of_at_most_32() {
        let input = vec![
            Arrival { at: Duration::from_secs(1), count: 70 },
            Arrival { at: Duration::from_millis(1500), count: 1 },
            Arrival { at: Duration::from_millis(2100), count: 1 },
            Arrival { at: Duration::from_secs(10), count: 1 },
        ];
        let floor = floor(&input, Duration::from_secs(1));
        // 70 at 1 s: two full gets and one of 6 + the 1.5 s arrival at 2 s; 2.1 s alone at
        // 3.1 s; 10 s alone at 11 s.
        let s = Duration::from_secs;
        assert_eq!(floor.schedule, vec![(s(2), 32), (s(2), 32), (s(2), 7), (Duration::from_millis(3100), 1), (s(11), 1)]);
        assert_eq!((floor.gets, floor.deletes, floor.calls()), (5, 73, 78));
        assert_eq!(floor.calls_by(Duration::from_millis(1999)), 0);
        assert_eq!(floor.calls_by(s(2)), 3 + 71);
        assert_eq!(floor.calls_by(s(60)), 78);
        assert_eq!(floor_of(&[], Duration::from_secs(1), 10, 10).calls(), 0);
    }

    #[test]
    fn on_sqs_the_floor_is_receives_of_ten_and_a_delete_batch_per_ten_messages() {
        let s = Duration::from_secs;
        // 25 at once and 3 a minute later: 3 + 1 receives; 28 messages in 3 delete batches.
        let input = vec![Arrival { at: s(0), count: 25 }, Arrival { at: s(60), count: 3 }];
        let floor = floor_of(&input, s(1), 10, 10);
        assert_eq!(floor.schedule, vec![(s(1), 10), (s(1), 10), (s(1), 5), (s(61), 3)]);
        assert_eq!((floor.gets, floor.deletes, floor.calls()), (4, 3, 7));
        assert_eq!((floor.calls_by(s(1)), floor.calls_by(s(61))), (3 + 3, 7));
        // At load the floor is 0.2 requests per message.
        let load = floor_of(&[Arrival { at: s(0), count: 10_000 }], s(1), 10, 10);
        assert_eq!(load.calls() as f64 / 10_000.0, 0.2);
    }

    #[test]
    fn the_wait_budget_is_bounded() {
        assert!(check_wait_budget(Duration::from_millis(1)).is_ok());
        assert!(check_wait_budget(Duration::from_secs(3600)).is_ok());
        for bad in [Duration::ZERO, Duration::from_micros(999), Duration::from_secs(3601)] {
            let error = check_wait_budget(bad).unwrap_err().to_string();
            assert!(error.starts_with("--wait-budget: must be 1ms to 1h, got"), "{error}");
        }
    }
}
