//! The limits every rule runs under, and how a call's time is charged to the rule.
//!
//! A rule is charged for its own work. Fuel bounds the wasm it runs; the deadline bounds the
//! CPU time of the thread running it (its wasm and the host functions it calls, measured
//! with `CLOCK_THREAD_CPUTIME_ID`), not the wall-clock time: on a host short of CPU the
//! scheduler can hold a thread off for tens of milliseconds in the middle of a trivial call,
//! and charging that wait to the rule quarantined sound rules exactly when the host was
//! busiest (a 35-minute soak on 2 busy cores saw the paper's rule "run past" 10 ms twice).
//! The wall clock is only a backstop, [`backstop`] of the deadline, for a rule that waits
//! (a sleep, a blocking call) rather than works: it is generous, so a starved host does not
//! reach it, and a rule still waiting there faults.

use std::time::{Duration, Instant};

/// Limits applied to every rule. Decisions get the per-call limits; instantiation plus
/// `configure` get the (larger) setup limits.
#[derive(Debug, Clone)]
pub struct RuleLimits {
    /// CPU time one decision call may use (its wasm and the host functions it calls); the
    /// wall-clock backstop is [`RuleLimits::call_backstop`].
    pub call_deadline: Duration,
    /// Fuel (roughly, wasm instructions) of one decision call.
    pub call_fuel: u64,
    /// CPU time instantiating a rule and calling `configure` may use; the wall-clock
    /// backstop is [`RuleLimits::setup_backstop`].
    pub setup_deadline: Duration,
    /// Fuel of instantiating a rule and calling `configure`.
    pub setup_fuel: u64,
    /// Most linear memory one rule instance may hold, in bytes.
    pub memory_bytes: usize,
    /// Most wasm stack a call may use, in bytes (engine-wide).
    pub stack_bytes: usize,
    /// Largest rule file accepted, in bytes.
    pub max_file_bytes: u64,
    /// Consecutive faulty calls of one export (or failed rebuilds of the instance) after
    /// which a rule is quarantined until its file's content changes; 0: never (every call is
    /// tried, the built-in rule deciding each that faults).
    pub quarantine_after: u32,
    /// Most bytes the on-disk compiled-rule cache may hold. Rules in use are never evicted,
    /// even when they alone exceed it; unused ones go oldest first.
    pub cache_max_bytes: u64,
}

impl RuleLimits {
    /// Whether `faults` consecutive faults quarantine a rule.
    pub fn quarantines_at(&self, faults: u32) -> bool {
        self.quarantine_after > 0 && faults >= self.quarantine_after
    }

    /// Wall-clock time a decision call may take, waiting included: [`backstop`] of the call
    /// deadline (1 s by default).
    pub fn call_backstop(&self) -> Duration {
        backstop(self.call_deadline)
    }

    /// Wall-clock time instantiation and `configure` may take: [`backstop`] of the setup
    /// deadline (20 s by default).
    pub fn setup_backstop(&self) -> Duration {
        backstop(self.setup_deadline)
    }
}

impl Default for RuleLimits {
    fn default() -> Self {
        RuleLimits {
            call_deadline: crate::defaults::CALL_DEADLINE,
            call_fuel: crate::defaults::CALL_FUEL,
            setup_deadline: Duration::from_secs(2),
            setup_fuel: 2_000_000_000,
            memory_bytes: crate::defaults::MEMORY_MIB << 20,
            stack_bytes: 512 << 10,
            max_file_bytes: 64 << 20,
            quarantine_after: crate::defaults::QUARANTINE_AFTER,
            cache_max_bytes: crate::defaults::CACHE_MIB << 20,
        }
    }
}

/// The wall-clock backstop is at least this many times the CPU deadline...
pub(crate) const BACKSTOP_FACTOR: u32 = 10;
/// ...and never shorter than this: a scheduler's delays run to tens of milliseconds on a busy
/// host, and a thread held off for a second means the host is past scaling well anyway.
pub(crate) const MIN_BACKSTOP: Duration = Duration::from_secs(1);

/// The wall-clock backstop of a CPU-time `deadline`: `BACKSTOP_FACTOR` times it, at least
/// `MIN_BACKSTOP`.
pub fn backstop(deadline: Duration) -> Duration {
    deadline.saturating_mul(BACKSTOP_FACTOR).max(MIN_BACKSTOP)
}

/// Why the host stopped a rule that was still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overrun {
    /// It used its deadline of CPU time (`cpu`, a little past it: checks come once a tick).
    Cpu { cpu: Duration },
    /// It was still running `wall` after it began, past the backstop, having used only
    /// `cpu` of CPU time: it was waiting, not working.
    Backstop { wall: Duration, cpu: Duration },
}

/// What a check in the middle of a call decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Let it run; check again after this much wall-clock time at the latest.
    Continue(Duration),
    /// Stop it, for this reason.
    Stop(Overrun),
}

/// The rule has used `cpu` of CPU time and `wall` of wall-clock time.
pub(crate) fn verdict(cpu: Duration, wall: Duration, deadline: Duration, backstop: Duration) -> Verdict {
    if cpu >= deadline {
        return Verdict::Stop(Overrun::Cpu { cpu });
    }
    if wall >= backstop {
        return Verdict::Stop(Overrun::Backstop { wall, cpu });
    }
    // A thread's CPU clock runs no faster than the wall clock, so the deadline cannot be used
    // up sooner than this.
    Verdict::Continue((deadline - cpu).min(backstop - wall))
}

/// The time one call (or one setup) has used, against what it may use.
#[derive(Debug, Clone)]
pub(crate) struct Stopwatch {
    deadline: Duration,
    backstop: Duration,
    started: Instant,
    /// The thread's CPU clock when the call began; `None` when the system has none, and then
    /// every wall-clock instant is charged (the deadline is a wall-clock one).
    started_cpu: Option<Duration>,
    /// Why the rule was stopped, once it was.
    pub(crate) stopped: Option<Overrun>,
    /// Whether the call ran past its deadline in wall-clock time without using it in CPU
    /// time, and was let go on: what charging the wall clock would have made a fault.
    pub(crate) waited: bool,
}

impl Stopwatch {
    /// Starts timing a call on this thread (the thread that runs the call).
    pub(crate) fn start(deadline: Duration, backstop: Duration) -> Self {
        Stopwatch { deadline, backstop, started: Instant::now(), started_cpu: thread_cpu_time(), stopped: None, waited: false }
    }

    /// Checks the time used so far; must run on the thread running the call.
    pub(crate) fn check(&mut self) -> Verdict {
        let wall = self.started.elapsed();
        let cpu = match (self.started_cpu, thread_cpu_time()) {
            (Some(start), Some(now)) => now.saturating_sub(start),
            _ => wall,
        };
        let verdict = verdict(cpu, wall, self.deadline, self.backstop);
        match verdict {
            Verdict::Stop(overrun) => self.stopped = Some(overrun),
            Verdict::Continue(_) => self.waited |= wall >= self.deadline,
        }
        verdict
    }
}

/// The CPU time the calling thread has used (user and system), or `None` where the system
/// does not tell.
pub(crate) fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given, which lives on this stack.
    let read = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    (read == 0).then(|| Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_call_held_off_by_the_scheduler_is_let_run_until_the_backstop() {
        // 40 ms of wall-clock time, 1 ms of it on a CPU: the thread waited for one.
        assert_eq!(verdict(MS, 40 * MS, 10 * MS, 1000 * MS), Verdict::Continue(9 * MS));
        assert_eq!(verdict(MS, 995 * MS, 10 * MS, 1000 * MS), Verdict::Continue(5 * MS), "the backstop comes first");
        assert_eq!(verdict(MS, 1000 * MS, 10 * MS, 1000 * MS), Verdict::Stop(Overrun::Backstop { wall: 1000 * MS, cpu: MS }));
    }

    #[test]
    fn a_call_that_works_past_its_deadline_is_stopped_whatever_the_wall_clock_says() {
        assert_eq!(verdict(10 * MS, 10 * MS, 10 * MS, 1000 * MS), Verdict::Stop(Overrun::Cpu { cpu: 10 * MS }));
        assert_eq!(verdict(11 * MS, 500 * MS, 10 * MS, 1000 * MS), Verdict::Stop(Overrun::Cpu { cpu: 11 * MS }));
        assert_eq!(verdict(9 * MS, 9 * MS, 10 * MS, 1000 * MS), Verdict::Continue(MS));
    }

    #[test]
    fn the_backstop_is_ten_times_the_deadline_and_at_least_a_second() {
        assert_eq!(backstop(10 * MS), Duration::from_secs(1));
        assert_eq!(backstop(MS), Duration::from_secs(1));
        assert_eq!(backstop(Duration::from_secs(1)), Duration::from_secs(10));
        assert_eq!(backstop(Duration::MAX), Duration::MAX);
        let limits = RuleLimits::default();
        assert_eq!((limits.call_backstop(), limits.setup_backstop()), (Duration::from_secs(1), Duration::from_secs(20)));
    }

    #[test]
    fn the_threads_cpu_clock_counts_work_not_sleep() {
        let start = thread_cpu_time().expect("Linux has a per-thread CPU clock");
        std::thread::sleep(50 * MS);
        let slept = thread_cpu_time().unwrap() - start;
        assert!(slept < 20 * MS, "sleeping 50 ms used {slept:?} of CPU time");
        let started = Instant::now();
        while started.elapsed() < 30 * MS {
            std::hint::black_box(0);
        }
        let worked = thread_cpu_time().unwrap() - start - slept;
        assert!(worked > MS, "30 ms of spinning used only {worked:?} of CPU time");
    }
}
