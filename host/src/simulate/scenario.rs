//! What arrives when: the named scenarios, arrival traces from CSV files, and the
//! handler-time distribution. Every input is bounded.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

/// Longest simulated run: 31 days.
pub const MAX_DURATION: Duration = Duration::from_secs(31 * 24 * 3600);
/// Largest trace file: 64 MiB.
pub(crate) const MAX_TRACE_BYTES: u64 = 64 << 20;
/// Most lines in a trace file.
pub(crate) const MAX_TRACE_LINES: usize = 1_000_000;
/// Most messages on one trace line.
pub const MAX_COUNT_PER_LINE: u32 = 100_000;
/// Most messages in one run (each keeps its pickup latency).
pub const MAX_MESSAGES: u64 = 5_000_000;
/// Longest handler time.
pub const MAX_HANDLER_TIME: Duration = Duration::from_secs(600);
/// The knee scenario's backlog: more than any concurrency drains in its two minutes.
pub(crate) const KNEE_BACKLOG: u32 = 60_000;
/// Most concurrent calls `--handler-knee` takes.
pub const MAX_HANDLER_KNEE: u32 = 10_000;
/// How long a trace runs after its last arrival, unless `--duration` says otherwise.
pub(crate) const TRACE_TAIL: Duration = Duration::from_secs(600);

/// `count` messages put at `at` from the start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// From the start of the run.
    pub at: Duration,
    /// Messages put at that moment (at least 1).
    pub count: u32,
}

/// A run's input: arrivals, sorted by time, and how long the run lasts.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The scenario's name, or the trace's file name.
    pub name: String,
    /// Sorted by time, all before `duration`.
    pub arrivals: Vec<Arrival>,
    /// How long the run lasts (simulated).
    pub duration: Duration,
}

impl Workload {
    /// Messages in the run.
    pub fn messages(&self) -> u64 {
        self.arrivals.iter().map(|a| u64::from(a.count)).sum()
    }
}

/// A named scenario or a trace file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scenario {
    /// The whitepaper's billing case: a day busy about 2 of 24 hours (09:00–10:00 and
    /// 14:00–15:00: a burst of 500 every 10 minutes over a Poisson trickle of 1 message/s),
    /// idle the other 22 hours.
    PaperBilling,
    /// One burst of 5,000 messages a minute in, then quiet (1 hour).
    Burst,
    /// A Poisson trickle of one message per 10 s on average (1 hour).
    Trickle,
    /// Nothing arrives (24 hours): the pure idle cost.
    Idle,
    /// A bursty day (24 hours, about 95,000 messages): sporadic singles at night (one per
    /// 5 minutes on average), a morning ramp from 07:00 to 11:00 (up to 2 msg/s), a
    /// lunchtime peak at 4 msg/s (11:30–13:30), a calmer afternoon (0.5 msg/s to 17:00,
    /// 0.1 msg/s to 20:00), and two dumps of 20,000 messages at once (03:00 and 15:00).
    BurstyDay,
    /// A backlog of 60,000 messages at the start (2 minutes): throughput and handler
    /// latency at a given concurrency, for an app that slows down past a concurrency knee
    /// (`--handler-knee`).
    Knee,
    /// Arrival times from a CSV file: seconds from the start, optional count.
    Trace(PathBuf),
}

/// The scenario names `--scenario` takes.
pub(crate) const SCENARIOS: &[&str] = &["paper-billing", "burst", "trickle", "idle", "bursty-day", "knee"];

impl Scenario {
    /// A scenario by name.
    pub fn named(name: &str) -> Result<Scenario> {
        Ok(match name {
            "paper-billing" => Scenario::PaperBilling,
            "burst" => Scenario::Burst,
            "trickle" => Scenario::Trickle,
            "idle" => Scenario::Idle,
            "bursty-day" => Scenario::BurstyDay,
            "knee" => Scenario::Knee,
            other => bail!("--scenario: unknown scenario {other:?}; one of {}, or --trace FILE", SCENARIOS.join(", ")),
        })
    }

    /// The run's arrivals and length: `duration` if given (at most `MAX_DURATION`), else
    /// the scenario's own (a trace: its last arrival plus `TRACE_TAIL`). Arrivals at or
    /// after the end are dropped. `seed` drives the random spacing.
    pub fn workload(&self, duration: Option<Duration>, seed: u64) -> Result<Workload> {
        if let Some(d) = duration
            && !(Duration::from_secs(1)..=MAX_DURATION).contains(&d)
        {
            bail!("--duration: must be 1s to {}, got {}", show_duration(MAX_DURATION), show_duration(d));
        }
        let hour = Duration::from_secs(3600);
        let mut rng = fastrand::Rng::with_seed(seed);
        let (name, arrivals, own) = match self {
            Scenario::PaperBilling => {
                let mut arrivals = Vec::new();
                for start_hour in [9u64, 14] {
                    let start = Duration::from_secs(start_hour * 3600);
                    for burst in 0..6u64 {
                        arrivals.push(Arrival { at: start + Duration::from_secs(burst * 600), count: 500 });
                    }
                    poisson(&mut rng, start, start + hour, 1.0, &mut arrivals);
                }
                ("paper-billing".to_string(), arrivals, 24 * hour)
            }
            Scenario::Burst => ("burst".to_string(), vec![Arrival { at: Duration::from_secs(60), count: 5000 }], hour),
            Scenario::Trickle => {
                let mut arrivals = Vec::new();
                poisson(&mut rng, Duration::ZERO, hour, 0.1, &mut arrivals);
                ("trickle".to_string(), arrivals, hour)
            }
            Scenario::Idle => ("idle".to_string(), Vec::new(), 24 * hour),
            Scenario::BurstyDay => ("bursty-day".to_string(), bursty_day(&mut rng), 24 * hour),
            Scenario::Knee => ("knee".to_string(), vec![Arrival { at: Duration::ZERO, count: KNEE_BACKLOG }], Duration::from_secs(120)),
            Scenario::Trace(path) => {
                let arrivals = read_trace(path)?;
                let own = arrivals.last().map_or(TRACE_TAIL, |a| a.at.saturating_add(TRACE_TAIL)).min(MAX_DURATION);
                let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
                (name, arrivals, own)
            }
        };
        let duration = duration.unwrap_or(own);
        let mut arrivals: Vec<Arrival> = arrivals.into_iter().filter(|a| a.at < duration).collect();
        arrivals.sort_by_key(|a| a.at);
        let workload = Workload { name, arrivals, duration };
        if workload.messages() > MAX_MESSAGES {
            bail!("{}: {} messages is more than the {MAX_MESSAGES} a run may hold", workload.name, workload.messages());
        }
        Ok(workload)
    }
}

/// A duration for a message: whole days as days (humantime would say months).
pub(crate) use crate::durations::show as show_duration;

/// A Poisson process of `per_sec` messages a second from `from` to `to`.
fn poisson(rng: &mut fastrand::Rng, from: Duration, to: Duration, per_sec: f64, out: &mut Vec<Arrival>) {
    let mut at = from.as_secs_f64();
    loop {
        // Exponential spacing; 1 − u is in (0, 1], so the log is finite.
        at += -(1.0 - rng.f64()).ln() / per_sec;
        if at >= to.as_secs_f64() {
            return;
        }
        out.push(Arrival { at: Duration::from_secs_f64(at), count: 1 });
    }
}

/// The arrivals of [`Scenario::BurstyDay`].
fn bursty_day(rng: &mut fastrand::Rng) -> Vec<Arrival> {
    let at = |h: f64| Duration::from_secs_f64(h * 3600.0);
    let mut arrivals = Vec::new();
    // (from hour, to hour, rate at the start, rate at the end) in messages a second.
    let night = 1.0 / 300.0;
    for (from, to, start, end) in [
        (0.0, 7.0, night, night),
        (7.0, 11.0, 0.05, 2.0),
        (11.0, 11.5, 2.0, 4.0),
        (11.5, 13.5, 4.0, 4.0),
        (13.5, 17.0, 0.5, 0.5),
        (17.0, 20.0, 0.1, 0.1),
        (20.0, 24.0, night, night),
    ] {
        ramp(rng, at(from), at(to), start, end, &mut arrivals);
    }
    arrivals.extend([3.0, 15.0].map(|h| Arrival { at: at(h), count: 20_000 }));
    arrivals
}

/// A Poisson process whose rate goes linearly from `start` to `end` messages a second
/// between `from` and `to` (by thinning a process at the higher rate).
fn ramp(rng: &mut fastrand::Rng, from: Duration, to: Duration, start: f64, end: f64, out: &mut Vec<Arrival>) {
    let mut candidates = Vec::new();
    let top = start.max(end);
    poisson(rng, from, to, top, &mut candidates);
    let span = (to - from).as_secs_f64();
    out.extend(candidates.into_iter().filter(|a| {
        let rate = start + (end - start) * (a.at - from).as_secs_f64() / span;
        rng.f64() * top < rate
    }));
}

/// Reads a trace: one arrival per line, `seconds[,count]` (seconds from the start, a
/// decimal number; count 1 to `MAX_COUNT_PER_LINE`, default 1). Blank lines and lines
/// starting with `#` are skipped; a first line that does not start with a number is a header.
pub fn read_trace(path: &Path) -> Result<Vec<Arrival>> {
    // Looked at before opening: opening a FIFO would wait for a writer.
    let metadata = std::fs::metadata(path).with_context(|| format!("--trace: cannot open {}", path.display()))?;
    if !metadata.is_file() {
        bail!("--trace: {} is not a regular file", path.display());
    }
    let file = std::fs::File::open(path).with_context(|| format!("--trace: cannot open {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_TRACE_BYTES + 1).read_to_end(&mut bytes).with_context(|| format!("--trace: cannot read {}", path.display()))?;
    if bytes.len() as u64 > MAX_TRACE_BYTES {
        bail!("--trace: {} is larger than {} MiB", path.display(), MAX_TRACE_BYTES >> 20);
    }
    let text = String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("--trace: {} is not UTF-8 text", path.display()))?;
    parse_trace(&text).with_context(|| format!("--trace {}", path.display()))
}

/// Parses trace text (see [`read_trace`]).
pub fn parse_trace(text: &str) -> Result<Vec<Arrival>> {
    // A spreadsheet's export may start with a byte-order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut arrivals = Vec::new();
    let mut total = 0u64;
    let mut seen_content = false;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if number > MAX_TRACE_LINES {
            bail!("more than {MAX_TRACE_LINES} lines");
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split(',').map(str::trim);
        let seconds_text = fields.next().unwrap_or_default();
        let is_number_start = seconds_text.starts_with(|c: char| c.is_ascii_digit() || c == '.' || c == '-' || c == '+');
        let first = !std::mem::replace(&mut seen_content, true);
        if first && !is_number_start {
            continue; // a header
        }
        let seconds: f64 = seconds_text.parse().map_err(|_| anyhow::anyhow!("line {number}: {seconds_text:?} is not a number of seconds"))?;
        if !seconds.is_finite() || seconds < 0.0 || seconds > MAX_DURATION.as_secs_f64() {
            bail!("line {number}: seconds must be 0 to {} (31 days), got {seconds_text}", MAX_DURATION.as_secs());
        }
        let count = match fields.next() {
            None | Some("") => 1,
            Some(text) => match text.parse::<u32>() {
                Ok(n) if (1..=MAX_COUNT_PER_LINE).contains(&n) => n,
                _ => bail!("line {number}: the count must be a whole number from 1 to {MAX_COUNT_PER_LINE}, got {text:?}"),
            },
        };
        if let Some(extra) = fields.next() {
            bail!("line {number}: expected seconds[,count], found a third field {extra:?}");
        }
        total += u64::from(count);
        if total > MAX_MESSAGES {
            bail!("line {number}: more than {MAX_MESSAGES} messages in all");
        }
        arrivals.push(Arrival { at: Duration::from_secs_f64(seconds), count });
    }
    arrivals.sort_by_key(|a| a.at);
    Ok(arrivals)
}

/// The latency of an app that slows down past a concurrency knee: `time` for up to `knee`
/// calls at once, `time × (calls ÷ knee)²` beyond it, so its throughput (calls ÷ latency)
/// peaks at `knee` calls and falls as `knee² ÷ calls` past it (a database pool, a lock, a
/// CPU: queueing inside the app).
pub(crate) fn knee_latency(time: Duration, calls: u32, knee: u32) -> Duration {
    if calls <= knee || knee == 0 {
        return time;
    }
    let over = f64::from(calls) / f64::from(knee);
    time.mul_f64(over * over).min(MAX_HANDLER_TIME)
}

/// How long the simulated handler takes per message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HandlerTime {
    /// Always this long.
    Fixed(Duration),
    /// Uniform between the two.
    Uniform(Duration, Duration),
    /// Exponential with this mean (capped at [`MAX_HANDLER_TIME`]).
    Exponential(Duration),
}

/// The handler time when none is given: exponential with a 20 ms mean. A fixed time ends a
/// get's calls together, so every get finds all its slots free and takes a full batch; a
/// real app's calls end one by one and the next get takes fewer (on issue 35's review trace,
/// 16–22 of 32 where the simulator with a fixed 20 ms took 32: its gets with messages came
/// 14–16 % short of the binary's, and within 5 % with this).
pub(crate) const DEFAULT_HANDLER_TIME: HandlerTime = HandlerTime::Exponential(Duration::from_millis(20));

impl HandlerTime {
    /// `20ms` (fixed), `10ms..200ms` (uniform) or `exp:50ms` (exponential with that mean);
    /// each at most [`MAX_HANDLER_TIME`].
    pub fn parse(text: &str) -> Result<HandlerTime> {
        let duration = |t: &str| -> Result<Duration> {
            let d = humantime::parse_duration(t.trim()).map_err(|e| anyhow::anyhow!("--handler-time: {t:?} is not a duration: {e}"))?;
            if d > MAX_HANDLER_TIME {
                bail!("--handler-time: {} is more than {}", humantime::format_duration(d), humantime::format_duration(MAX_HANDLER_TIME));
            }
            Ok(d)
        };
        if let Some(mean) = text.strip_prefix("exp:") {
            return Ok(HandlerTime::Exponential(duration(mean)?));
        }
        if let Some((low, high)) = text.split_once("..") {
            let (low, high) = (duration(low)?, duration(high)?);
            if low > high {
                bail!("--handler-time: {text:?}: the low end is above the high end");
            }
            return Ok(HandlerTime::Uniform(low, high));
        }
        Ok(HandlerTime::Fixed(duration(text)?))
    }

    /// One handler time.
    pub fn sample(&self, rng: &mut fastrand::Rng) -> Duration {
        match *self {
            HandlerTime::Fixed(d) => d,
            HandlerTime::Uniform(low, high) => low + (high - low).mul_f64(rng.f64()),
            HandlerTime::Exponential(mean) => mean.mul_f64(-(1.0 - rng.f64()).ln()).min(MAX_HANDLER_TIME),
        }
    }
}

impl std::fmt::Display for HandlerTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |d: Duration| humantime::format_duration(d).to_string();
        match *self {
            HandlerTime::Fixed(d) => write!(f, "{}", show(d)),
            HandlerTime::Uniform(low, high) => write!(f, "{}..{}", show(low), show(high)),
            HandlerTime::Exponential(mean) => write!(f, "exp:{}", show(mean)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_knee_latency_grows_with_the_square_of_the_calls_and_throughput_falls() {
        let base = Duration::from_millis(50);
        assert_eq!(knee_latency(base, 1, 16), base);
        assert_eq!(knee_latency(base, 16, 16), base);
        assert_eq!(knee_latency(base, 32, 16), base * 4);
        let throughput = |calls: u32| f64::from(calls) / knee_latency(base, calls, 16).as_secs_f64();
        assert!(throughput(16) > throughput(20) && throughput(20) > throughput(64) && throughput(64) > throughput(256));
        assert_eq!(knee_latency(base, u32::MAX, 1), MAX_HANDLER_TIME, "bounded");
    }

    #[test]
    fn a_trace_takes_seconds_and_counts_a_header_and_comments() {
        let arrivals = parse_trace("seconds,count\n# a comment\n\n2.5,3\n1\n").unwrap();
        assert_eq!(arrivals, vec![Arrival { at: Duration::from_secs(1), count: 1 }, Arrival { at: Duration::from_millis(2500), count: 3 }]);
        // Windows line ends and a byte-order mark (no header: the first line is an arrival).
        let arrivals = parse_trace("\u{feff}1,2\r\n3\r\n").unwrap();
        assert_eq!(arrivals, vec![Arrival { at: Duration::from_secs(1), count: 2 }, Arrival { at: Duration::from_secs(3), count: 1 }]);
    }

    #[test]
    fn hostile_traces_are_refused_with_the_line() {
        for (text, expected) in [
            ("1\nx\n", "line 2: \"x\" is not a number"),
            ("-1\n", "line 1: seconds must be 0 to"),
            ("1\nNaN\n", "line 2: seconds must be 0 to"),
            ("1\ninf\n", "line 2: seconds must be 0 to"),
            ("99999999999\n", "line 1: seconds must be 0 to"),
            ("1,0\n", "line 1: the count must be a whole number from 1 to 100000"),
            ("1,100001\n", "line 1: the count must be"),
            ("1,-3\n", "line 1: the count must be"),
            ("1,2,3\n", "line 1: expected seconds[,count]"),
            ("1,100000\n".repeat(51).as_str(), "line 51: more than 5000000 messages"),
        ] {
            let error = format!("{:#}", parse_trace(text).unwrap_err());
            assert!(error.contains(expected), "{text:?}: {error}");
        }
        let too_many_lines = "1\n".repeat(MAX_TRACE_LINES + 1);
        assert!(format!("{:#}", parse_trace(&too_many_lines).unwrap_err()).contains("more than 1000000 lines"));
    }

    #[test]
    fn a_trace_file_too_large_or_not_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.csv");
        let file = std::fs::File::create(&big).unwrap();
        file.set_len(MAX_TRACE_BYTES + 1).unwrap();
        assert!(format!("{:#}", read_trace(&big).unwrap_err()).contains("larger than 64 MiB"));
        assert!(format!("{:#}", read_trace(dir.path()).unwrap_err()).contains("not a regular file"));
        // A FIFO is refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(format!("{:#}", read_trace(&fifo).unwrap_err()).contains("not a regular file"));
    }

    #[test]
    fn the_bursty_day_has_quiet_nights_a_lunchtime_peak_and_two_dumps() {
        let day = Scenario::BurstyDay.workload(None, 1).unwrap();
        assert_eq!(day.duration, Duration::from_secs(86_400));
        let between =
            |from: f64, to: f64| day.arrivals.iter().filter(|a| (from * 3600.0..to * 3600.0).contains(&a.at.as_secs_f64()) && a.count == 1).count() as f64;
        assert!((60.0..200.0).contains(&between(0.0, 7.0)), "night: {}", between(0.0, 7.0));
        // 4 msg/s for 2 hours: 28,800.
        assert!((28_000.0..29_600.0).contains(&between(11.5, 13.5)), "peak: {}", between(11.5, 13.5));
        let dumps: Vec<_> = day.arrivals.iter().filter(|a| a.count == 20_000).map(|a| a.at.as_secs() / 3600).collect();
        assert_eq!(dumps, vec![3, 15]);
        assert!((90_000..100_000).contains(&day.messages()), "{}", day.messages());
    }

    #[test]
    fn the_paper_billing_day_is_busy_two_hours_and_idle_twenty_two() {
        let day = Scenario::PaperBilling.workload(None, 1).unwrap();
        assert_eq!(day.duration, Duration::from_secs(86_400));
        let busy = |a: &Arrival| (9 * 3600..10 * 3600).contains(&a.at.as_secs()) || (14 * 3600..15 * 3600).contains(&a.at.as_secs());
        assert!(day.arrivals.iter().all(busy));
        // 12 bursts of 500 and about 7,200 single messages.
        let singles = day.messages() - 6000;
        assert!((6800..7600).contains(&singles), "{singles}");
        assert_eq!(day.arrivals, Scenario::PaperBilling.workload(None, 1).unwrap().arrivals, "a seed gives the same day");
    }

    #[test]
    fn durations_and_handler_times_are_bounded() {
        assert!(Scenario::Idle.workload(Some(Duration::from_secs(32 * 86_400)), 1).is_err());
        assert!(Scenario::Idle.workload(Some(Duration::ZERO), 1).is_err());
        assert!(HandlerTime::parse("11m").is_err());
        assert!(HandlerTime::parse("200ms..10ms").is_err());
        assert!(HandlerTime::parse("fast").is_err());
        assert_eq!(HandlerTime::parse("exp:50ms").unwrap(), HandlerTime::Exponential(Duration::from_millis(50)));
        let mut rng = fastrand::Rng::with_seed(3);
        let uniform = HandlerTime::parse("10ms..20ms").unwrap();
        assert!((0..100).map(|_| uniform.sample(&mut rng)).all(|d| (Duration::from_millis(10)..=Duration::from_millis(20)).contains(&d)));
    }
}
