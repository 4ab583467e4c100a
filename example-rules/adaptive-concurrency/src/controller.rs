//! The concurrency controller: a pure function of each window's [`HandlerState`] and what the
//! controller remembers from the windows before.
//!
//! **Latency.** A window is judged by its slowest call (`latency_max_ms`): a p99 goal is
//! about the slow calls, and a mean hides the few calls started past the knee. On the real
//! listener a call's latency is fixed when it starts, so a window's calls may have started
//! windows ago, under another limit: the controller remembers each window's peak of calls at
//! once to know how many ran when its slowest call started.
//!
//! **Baseline.** The lowest latency of a window seen so far: the app's latency without load.
//! It decays slowly (rises 0.2 % a window, doubling in about a minute without a lower window)
//! so that one lucky window does not rule for ever; and when a cut for latency did not lower
//! latency once the calls started before it have ended, the app itself got slower, and that
//! latency becomes the baseline.
//!
//! **Growth.** Only when the limit was reached (the window's peak of calls at once reached
//! the limit; tasks waiting for a slot say nothing, the listener's tasks wait for half the
//! limit), and only once the calls started under the limit have had time to end (windows
//! since it changed × the window ≥ the latency). A fresh controller starting from `initial`
//! doubles the limit (slow start) until latency first climbs; after that, it adds one call,
//! or 1/32 of the limit if more, each time (congestion avoidance).
//!
//! **Cuts.** Latency past `tolerance` × the baseline means calls queue in the app: the limit
//! becomes the calls at once when the slowest call started × the square root of baseline ÷
//! latency (when latency grows with the square of the calls past the knee, that lands on the
//! knee), at most `backoff` × those; a late window still showing calls started before a cut
//! gives the same answer, so it does not cut again. A push-back (HTTP 429 or 503) or failures
//! over `failure_percent` cut it to `backoff` × the limit. A cut limit is held for `settle`
//! windows, doubled (up to 16 ×) each time a cut lands where the one before did, so the
//! controller spends its time at the knee rather than climbing past it again and again.
//!
//! **Probing down.** A controller that starts from a limit past the knee measures a loaded
//! latency as its baseline and would never see the app's real one. So until it has seen the
//! latency at a lower limit, it halves the limit for one window: if latency fell by more than
//! the tolerance, it was past the knee, and it stays there and halves again; if not, the limit
//! was at or under the knee, and it goes back and grows in slow start.

use ebb_rules_sdk::HandlerState;

/// The rule's parameters (see the crate docs for their meaning).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Calls at once for a fresh controller while the host's limit is still its ceiling.
    pub initial: u32,
    /// Ratio of latency to the baseline past which the limit is cut (over 1).
    pub tolerance: f64,
    /// The share of the limit kept by the least cut (over 0, under 1).
    pub backoff: f64,
    /// Windows a cut limit is held before it grows again.
    pub settle: u32,
    /// Percent of a window's ended calls that may fail before the limit is cut.
    pub failure_percent: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { initial: 1, tolerance: 1.2, backoff: 0.9, settle: 8, failure_percent: 10.0 }
    }
}

impl Settings {
    /// These settings, or an error naming the first parameter out of its range.
    pub fn validated(self) -> Result<Settings, String> {
        if self.initial == 0 {
            return Err("parameter \"initial\": must be 1 or more (calls at once)".into());
        }
        // Written so that NaN fails each check.
        if !(self.tolerance > 1.0 && self.tolerance.is_finite()) {
            return Err(format!("parameter \"tolerance\": {} must be a ratio over 1 (e.g. 1.2: latency may rise 20 % over the baseline)", self.tolerance));
        }
        if !(self.backoff > 0.0 && self.backoff < 1.0) {
            return Err(format!("parameter \"backoff\": {} must be over 0 and under 1 (the share of the limit a cut keeps)", self.backoff));
        }
        if self.settle > MAX_SETTLE {
            return Err(format!("parameter \"settle\": {} must be at most {MAX_SETTLE} windows", self.settle));
        }
        if !(0.0..=100.0).contains(&self.failure_percent) {
            return Err(format!("parameter \"failure_percent\": {} must be from 0 to 100", self.failure_percent));
        }
        Ok(self)
    }
}

/// The longest `settle`: 1000 windows, about four minutes.
const MAX_SETTLE: u32 = 1000;
/// How much the baseline rises each window with calls, unless a lower latency comes.
const BASELINE_DRIFT: f64 = 0.002;
/// Latencies below this count as this much: under it, a window's latency is all noise.
const LATENCY_FLOOR_MS: f64 = 0.1;
/// A cut for latency that leaves latency above this share of what it was did not help.
const UNHELPED_CUT: f64 = 0.95;
/// Growth in congestion avoidance: this share of the limit a window, at least one call.
const GROWTH_SHARE: f64 = 1.0 / 32.0;
/// A cut for latency aims this much over the baseline, which is the lowest of noisy windows
/// and so a little under the app's typical latency at the knee.
const LANDING: f64 = 1.05;
/// Windows of calls at once remembered, to find how many ran when a slow call started.
const HISTORY: usize = 64;
/// The most times the hold after a cut doubles when growth keeps being cut back to where
/// it was: `settle` × 2⁴ windows at most.
const MAX_HOLD_DOUBLINGS: u32 = 4;

/// A cut for latency whose effect is still to be seen.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// The limit in force when it was decided.
    applied: u32,
    /// The latency that caused it.
    latency: f64,
    /// Windows with calls since.
    windows: u32,
}

/// What a controller remembers between windows.
#[derive(Debug, Clone)]
pub struct Controller {
    /// The limit, unrounded, so that growth by a fraction of a call adds up.
    limit: f64,
    /// The lowest windowed latency seen (decaying), in milliseconds.
    baseline: Option<f64>,
    /// Doubling the limit each window, until latency first climbs.
    slow_start: bool,
    /// Windows left before a cut limit may grow.
    settling: u32,
    /// Whether the latency at a lower limit is known (started low, or a probe came back
    /// without a lower latency): no more probing down.
    knee_found: bool,
    /// The limit and baseline before the probe now running, if one is.
    probe: Option<(f64, f64)>,
    /// The last cut for latency, until the calls started under the cut limit show.
    cut: Option<Cut>,
    /// The most calls at once of each recent window, the newest last.
    peaks: std::collections::VecDeque<u32>,
    /// Where the last cut for latency landed, and how many cuts in a row landed there.
    landing: Option<(u32, u32)>,
    /// Windows since the limit last changed.
    steady: u32,
}

impl Controller {
    /// A fresh controller: it takes up the limit in force, or starts from `initial` (in slow
    /// start) while the host's limit is still its ceiling, where a queue starts.
    pub fn new(settings: &Settings, state: &HandlerState) -> Controller {
        let ceiling = state.max_limit.max(1);
        let (limit, from_initial) = if state.current_limit >= ceiling && settings.initial < ceiling {
            (settings.initial, true)
        } else {
            (state.current_limit.clamp(1, ceiling), false)
        };
        Controller {
            limit: f64::from(limit),
            baseline: None,
            slow_start: from_initial,
            settling: 0,
            knee_found: from_initial,
            probe: None,
            cut: None,
            peaks: std::collections::VecDeque::with_capacity(HISTORY),
            landing: None,
            steady: 0,
        }
    }

    /// The limit for the next window, from the window that just ended.
    pub fn decide(&mut self, settings: &Settings, state: &HandlerState) -> u32 {
        let before = self.rounded();
        self.steady = self.steady.saturating_add(1);
        let decided = self.decide_limit(settings, state);
        if decided != before {
            self.steady = 0;
        }
        decided
    }

    fn decide_limit(&mut self, settings: &Settings, state: &HandlerState) -> u32 {
        let ceiling = f64::from(state.max_limit.max(1));
        self.limit = self.limit.clamp(1.0, ceiling);
        let applied = state.current_limit.max(1);
        if self.peaks.len() == HISTORY {
            self.peaks.pop_front();
        }
        self.peaks.push_back(state.peak_in_flight.max(state.in_flight).max(1));
        // The window ran under another limit than this controller's (its first window, when it
        // starts from `initial`): what it showed is not about this controller's limit.
        if applied != self.rounded() && self.baseline.is_none() && self.knee_found {
            return self.rounded();
        }
        let sample = window_latency(state);
        if state.completed == 0 || !sample.is_finite() || sample < 0.0 {
            return self.rounded();
        }
        let sample = sample.max(LATENCY_FLOOR_MS);
        self.learn_baseline(applied, sample, state.window_ms);
        let baseline = self.baseline.unwrap_or(sample);

        // After a probe whose latency fell, the limit was past the knee: it stays at the probe's
        // half, and looks lower still below.
        if let Some((limit_before, baseline_before)) = self.probe.take()
            && sample * settings.tolerance >= baseline_before
        {
            // Latency did not fall at half the limit: the limit was at or under the knee.
            self.knee_found = true;
            self.limit = limit_before;
            self.slow_start = true;
            return self.rounded();
        }

        let failed = u64::from(state.failed) as f64;
        let too_many_failures = failed * 100.0 > f64::from(state.completed) * settings.failure_percent;
        if state.pushed_back > 0 || too_many_failures {
            self.cut_to(self.limit * settings.backoff, settings.settle);
        } else if sample > settings.tolerance * baseline {
            // The slowest call started with about `calls` at once: the limit lands where that
            // many would have been within `LANDING` of the baseline. A window that still shows
            // calls started before the last cut asks for no more than that cut gave.
            let calls = f64::from(self.calls_when_started(sample, state.window_ms));
            let gradient = (LANDING * baseline / sample).sqrt();
            let target = (calls * gradient.min(settings.backoff)).round().max(1.0);
            if target < self.limit.round() {
                self.cut = Some(Cut { applied, latency: sample, windows: 0 });
                let landed = target as u32;
                let repeats = match self.landing {
                    Some((at, repeats)) if landed <= at + 1 && landed + 1 >= at => (repeats + 1).min(MAX_HOLD_DOUBLINGS),
                    _ => 0,
                };
                self.landing = Some((landed, repeats));
                self.cut_to(target, settings.settle.saturating_mul(1 << repeats));
            }
        } else if self.settling > 0 {
            self.settling -= 1;
        } else if state.peak_in_flight >= applied {
            // The limit was reached; it grows once the calls started under it have had time
            // to end (probing down needs no wait: a lower limit shows at once).
            let seen = f64::from(self.steady) * state.window_ms as f64 >= sample;
            self.grow(ceiling, seen);
            if let Some((at, _)) = self.landing
                && self.limit >= f64::from(at) * 1.25 + 2.0
            {
                // Growth went well past the last cut without latency climbing: the knee moved.
                self.landing = None;
            }
        }
        self.rounded()
    }

    /// The most calls at once in the windows when a call that took `latency_ms` and ended in
    /// this window started.
    fn calls_when_started(&self, latency_ms: f64, window_ms: u64) -> u32 {
        let window = window_ms.max(1) as f64;
        let back = (latency_ms / window).floor().min(HISTORY as f64) as usize;
        self.peaks.iter().rev().skip(back).take(2).copied().max().unwrap_or_else(|| self.rounded())
    }

    fn learn_baseline(&mut self, applied: u32, sample: f64, window_ms: u64) {
        // A cut for latency shows once the calls started before it have ended: if latency did
        // not fall then, the app itself got slower, and that latency is its baseline now.
        let mut unhelped = false;
        if let Some(mut cut) = self.cut.take() {
            cut.windows += 1;
            if f64::from(cut.windows) * window_ms.max(1) as f64 >= sample + window_ms as f64 {
                unhelped = applied < cut.applied && sample >= cut.latency * UNHELPED_CUT;
            } else {
                self.cut = Some(cut);
            }
        }
        self.baseline = match self.baseline {
            Some(baseline) if !unhelped => Some((baseline * (1.0 + BASELINE_DRIFT)).min(sample)),
            // The first window, or the app got slower: a cut did not bring latency down.
            _ => Some(sample),
        };
    }

    fn cut_to(&mut self, limit: f64, hold: u32) {
        self.limit = limit.max(1.0);
        self.slow_start = false;
        self.settling = hold;
    }

    fn grow(&mut self, ceiling: f64, seen: bool) {
        let rounded = self.rounded();
        if !self.knee_found && rounded >= 2 {
            self.probe = Some((self.limit, self.baseline.unwrap_or(f64::INFINITY)));
            self.limit = f64::from(rounded / 2);
        } else if seen && self.slow_start {
            self.limit = (self.limit * 2.0).min(ceiling);
        } else if seen {
            self.limit = (self.limit + (self.limit * GROWTH_SHARE).max(1.0)).min(ceiling);
        }
    }

    /// The limit as the host takes it: a whole number of calls, at least 1.
    fn rounded(&self) -> u32 {
        // `as` saturates: a limit past u32::MAX (it cannot be, but) stays u32::MAX.
        (self.limit.round() as u32).max(1)
    }
}

/// The latency a window is judged by: its slowest call's, the one a percentile goal is about
/// (the mean if the host gave no maximum).
fn window_latency(state: &HandlerState) -> f64 {
    if state.latency_max_ms.is_finite() && state.latency_max_ms >= state.latency_mean_ms && state.latency_max_ms > 0.0 {
        state.latency_max_ms
    } else {
        state.latency_mean_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of a saturated queue at `limit`: calls waited for a slot, `completed` ended
    /// with a mean latency of `latency_ms`.
    fn window(limit: u32, completed: u32, latency_ms: f64) -> HandlerState {
        HandlerState {
            queue: "orders".into(),
            current_limit: limit,
            max_limit: 256,
            in_flight: limit,
            peak_in_flight: limit,
            waiting_tasks: 2,
            window_ms: 250,
            completed,
            latency_mean_ms: latency_ms,
            latency_min_ms: latency_ms,
            latency_max_ms: latency_ms,
            ..Default::default()
        }
    }

    /// A controller settled at `limit` with a baseline of 50 ms, out of slow start and done probing.
    fn settled_at(limit: u32, settings: &Settings) -> Controller {
        let mut controller = Controller::new(settings, &window(limit, 0, 0.0));
        assert!(!controller.knee_found, "it took up the limit in force");
        controller.knee_found = true;
        assert!(controller.decide(settings, &window(limit, 100, 50.0)) > limit, "it grows while latency is flat");
        controller.limit = f64::from(limit);
        controller
    }

    #[test]
    fn a_fresh_controller_takes_up_the_limit_in_force_unless_it_is_the_ceiling() {
        let settings = Settings { initial: 3, ..Settings::default() };
        assert_eq!(Controller::new(&settings, &window(20, 0, 0.0)).rounded(), 20, "a rebuild goes on from the limit in force");
        assert_eq!(Controller::new(&settings, &window(256, 0, 0.0)).rounded(), 3, "at the ceiling, where a queue starts, from initial");
        let high = Settings { initial: 1000, ..Settings::default() };
        assert_eq!(Controller::new(&high, &window(256, 0, 0.0)).rounded(), 256, "initial is bounded by the ceiling");
    }

    #[test]
    fn without_completions_the_limit_holds() {
        let settings = Settings::default();
        let mut controller = settled_at(16, &settings);
        for _ in 0..20 {
            assert_eq!(controller.decide(&settings, &window(16, 0, 0.0)), 16);
        }
    }

    #[test]
    fn a_limit_nobody_reaches_does_not_grow() {
        let settings = Settings::default();
        let mut controller = settled_at(16, &settings);
        let idle = HandlerState { peak_in_flight: 5, in_flight: 3, waiting_tasks: 0, ..window(16, 20, 50.0) };
        for _ in 0..20 {
            assert_eq!(controller.decide(&settings, &idle), 16);
        }
    }

    #[test]
    fn a_push_back_cuts_by_backoff_and_the_limit_settles_before_growing() {
        let settings = Settings::default();
        let mut controller = settled_at(20, &settings);
        let pushed = HandlerState { pushed_back: 1, ..window(20, 100, 50.0) };
        assert_eq!(controller.decide(&settings, &pushed), 18);
        for _ in 0..settings.settle {
            assert_eq!(controller.decide(&settings, &window(18, 90, 50.0)), 18, "settling");
        }
        assert_eq!(controller.decide(&settings, &window(18, 90, 50.0)), 19, "then it grows again");
    }

    #[test]
    fn failures_over_the_allowed_share_cut_the_limit_and_fewer_do_not() {
        let settings = Settings::default();
        let mut controller = settled_at(20, &settings);
        let few = HandlerState { failed: 10, ..window(20, 100, 50.0) };
        assert_eq!(controller.decide(&settings, &few), 21, "10 % of the calls failed: allowed");
        let many = HandlerState { failed: 11, ..window(21, 100, 50.0) };
        assert_eq!(controller.decide(&settings, &many), 19, "11 %: cut to 0.9 x 21");
    }

    #[test]
    fn latency_past_the_tolerance_cuts_the_limit_back_to_the_knee() {
        let settings = Settings::default();
        let mut controller = settled_at(64, &settings);
        // 64 calls past a knee of 40: latency 2.56 x the baseline.
        assert_eq!(controller.decide(&settings, &window(64, 125, 128.0)), 41, "64 x sqrt(1.05 / 2.56), the knee and a little");
        let mut controller = settled_at(40, &settings);
        assert_eq!(controller.decide(&settings, &window(40, 100, 59.0)), 41, "1.18 x the baseline is within the tolerance");
        assert_eq!(controller.decide(&settings, &window(41, 100, 62.0)), 37, "1.24 x is not: at least a backoff cut");
    }

    #[test]
    fn the_limit_never_goes_below_one() {
        let settings = Settings { settle: 0, ..Settings::default() };
        let mut controller = settled_at(2, &settings);
        for _ in 0..50 {
            let limit = controller.rounded();
            let decided = controller.decide(&settings, &HandlerState { pushed_back: 3, failed: 5, ..window(limit, 5, 5_000.0) });
            assert!(decided >= 1);
        }
        assert_eq!(controller.rounded(), 1);
    }

    #[test]
    fn an_app_that_got_slower_becomes_the_new_baseline_instead_of_emptying_the_limit() {
        let settings = Settings::default();
        let mut controller = settled_at(16, &settings);
        // The app now takes 100 ms at any load: the first window looks like a queue.
        let cut = controller.decide(&settings, &window(16, 40, 100.0));
        assert!(cut < 16, "{cut}");
        // The next window may still hold calls started before the cut (they took up to
        // 100 ms): the one after holds only calls started under it. The cut did not bring
        // latency down, so 100 ms is the app's latency now.
        for _ in 0..2 {
            let next = controller.decide(&settings, &window(cut, 25, 100.0));
            assert_eq!(next, cut, "no second cut: it settles at {cut}");
        }
        assert!((controller.baseline.unwrap() - 100.0).abs() < 1e-9, "{:?}", controller.baseline);
    }

    #[test]
    fn a_controller_started_past_the_knee_probes_down_until_latency_stops_falling() {
        let settings = Settings { initial: 256, ..Settings::default() };
        let latency = |calls: u32| if calls <= 16 { 50.0 } else { 50.0 * (f64::from(calls) / 16.0).powi(2) };
        let mut controller = Controller::new(&settings, &window(256, 0, 0.0));
        let mut limit = 256;
        let mut limits = vec![];
        for _ in 0..12 {
            limit = controller.decide(&settings, &window(limit, 10, latency(limit)));
            limits.push(limit);
        }
        // Halving while latency falls; back up once it does not, then slow start, whose one
        // doubling past the knee is cut back to it.
        assert_eq!(&limits[..8], &[128, 64, 32, 16, 8, 16, 32, 16], "{limits:?}");
        assert!(limits[8..].iter().all(|l| (16..=20).contains(l)), "{limits:?}");
    }

    #[test]
    fn extreme_states_neither_panic_nor_leave_the_range() {
        let settings = Settings::default();
        let states = [
            HandlerState::default(),
            HandlerState { completed: 1, ..HandlerState::default() },
            HandlerState {
                current_limit: u32::MAX,
                max_limit: u32::MAX,
                in_flight: u32::MAX,
                peak_in_flight: u32::MAX,
                waiting_tasks: u32::MAX,
                window_ms: u64::MAX,
                completed: u32::MAX,
                failed: u32::MAX,
                pushed_back: u32::MAX,
                latency_mean_ms: 1e300,
                latency_min_ms: 1e300,
                latency_max_ms: f64::MAX,
                timestamp_ms: u64::MAX,
                random: u64::MAX,
                ..HandlerState::default()
            },
            HandlerState { max_limit: u32::MAX, current_limit: u32::MAX, completed: u32::MAX, waiting_tasks: 1, ..HandlerState::default() },
            HandlerState { completed: 3, latency_mean_ms: f64::NAN, current_limit: 4, max_limit: 8, ..HandlerState::default() },
            HandlerState { completed: 3, latency_mean_ms: -1.0, current_limit: 4, max_limit: 8, ..HandlerState::default() },
        ];
        for state in &states {
            let mut controller = Controller::new(&settings, state);
            for _ in 0..40 {
                let limit = controller.decide(&settings, state);
                assert!(limit >= 1 && limit <= state.max_limit.max(1), "{limit} for {state:?}");
            }
        }
    }
}
