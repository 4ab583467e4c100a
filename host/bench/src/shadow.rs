//! `ebb bench shadow`: what a shadow rule adds to a live decision (issue 22), for a rule in
//! Rust: the same live rule decides with no shadow and with one, interleaved batch by batch
//! in one run, each decision timed; the added cost is the difference of the percentiles.
//! The rule is a component given with `--rule` (live and shadow each get an instance of it,
//! through the rule set the listener uses), or by default the same arithmetic compiled into
//! the host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use ebb_rules_sdk::{IdleContext, IdleDecision, QueueState};
use serde::Serialize;

use ebb::names::DecisionSite;
use ebb::rules::{Decider, DecisionSource, NativeRule, QueueRuleConfig, RuleEngine, RuleLimits, RuleSet, SHADOW_CHANNEL_CAPACITY, Shadowed};

/// Decisions per batch: well within the shadow's channel, so that every decision is handed
/// over (a full channel's drop would be cheaper, and flatter the figure).
const BATCH: usize = SHADOW_CHANNEL_CAPACITY / 4;

/// The goal: at most this much added per decision, at the median.
pub(crate) const GOAL_P50_NS: f64 = 1_000.0;

/// The rule decided with: ⌈depth ÷ 10⌉ tasks, the paper's kind of arithmetic.
struct PerTen;

impl NativeRule for PerTen {
    fn name(&self) -> &str {
        "per-ten"
    }
    fn optimal_dequeue_task_count(&self, state: &QueueState) -> u32 {
        u32::try_from(state.approximate_depth.div_ceil(10)).unwrap_or(u32::MAX)
    }
    fn on_queue_empty(&self, ctx: &IdleContext) -> IdleDecision {
        IdleDecision { delay_ms: ctx.min_interval_ms, stop: false }
    }
}

/// Per-decision figures of one contender, in nanoseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Percentiles {
    pub(crate) p50_ns: f64,
    pub(crate) p99_ns: f64,
}

/// What `ebb bench shadow` reports.
#[derive(Debug, Serialize)]
pub(crate) struct ShadowReport {
    /// The rule file decided with, or "native" (compiled into the host).
    pub(crate) rule: String,
    pub(crate) decisions: usize,
    pub(crate) no_shadow: Percentiles,
    pub(crate) with_shadow: Percentiles,
    pub(crate) added_p50_ns: f64,
    pub(crate) added_p99_ns: f64,
    pub(crate) goal_p50_ns: f64,
    pub(crate) goal_met: bool,
    /// Decisions the shadow compared (all of them: none dropped, none lost).
    pub(crate) shadow_compared: u64,
}

fn percentiles(mut samples: Vec<u64>) -> Percentiles {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize] as f64;
    Percentiles { p50_ns: at(0.50), p99_ns: at(0.99) }
}

/// The live and the shadow decider, and the rule set they come from (kept while they decide).
struct Contenders {
    live: Arc<dyn Decider>,
    shadow: Arc<dyn Decider>,
    _set: Option<RuleSet>,
}

/// The live and the shadow decider: instances of the component at `rule`, through a rule set
/// as the listener holds them, or the native rule.
fn contenders(rule: Option<&Path>) -> Result<Contenders> {
    let Some(rule) = rule else {
        return Ok(Contenders { live: Arc::new(PerTen), shadow: Arc::new(PerTen), _set: None });
    };
    let rule = rule.canonicalize().with_context(|| format!("failed to read rule {}", rule.display()))?;
    let live_slot = DecisionSite::new("bench")?;
    let shadow_slot = live_slot.shadow();
    let engine = RuleEngine::new(RuleLimits::default(), None)?;
    let set = RuleSet::new(engine, [live_slot.clone(), shadow_slot.clone()].map(|slot| QueueRuleConfig { slot, rule: Some(rule.clone()), params: vec![] }));
    if let Some(error) = set.load_all().into_iter().next() {
        return Err(error.context(format!("failed to load rule {}", rule.display())));
    }
    let live = set.queue(&live_slot).context("the bench queue has no rule slot")?;
    let shadow = set.queue(&shadow_slot).context("the bench queue has no shadow slot")?;
    let probe = QueueState { queue: "bench".into(), approximate_depth: 5, max_tasks: 1_000, ..Default::default() };
    if live.decide_task_count(&probe).source != DecisionSource::Rule {
        bail!("rule {} does not decide (the built-in rule answered instead)", rule.display());
    }
    Ok(Contenders { live: Arc::new(live), shadow: Arc::new(shadow), _set: Some(set) })
}

/// Times `decisions` task-count decisions of each contender, a batch of each in turn.
pub(crate) fn run(decisions: usize, rule: Option<&Path>) -> Result<ShadowReport> {
    if decisions < BATCH {
        bail!("--decisions: at least {BATCH}");
    }
    let contenders = contenders(rule)?;
    let plain = contenders.live.clone();
    let shadowed = Shadowed::new("bench", plain.clone(), contenders.shadow.clone(), SHADOW_CHANNEL_CAPACITY)?;
    let mut no_shadow = Vec::with_capacity(decisions);
    let mut with_shadow = Vec::with_capacity(decisions);
    let mut state = QueueState { queue: "bench".into(), min_tasks: 0, max_tasks: 1_000, ..Default::default() };
    let time = |decider: &dyn Decider, samples: &mut Vec<u64>, state: &mut QueueState| {
        for depth in 0..BATCH as u64 {
            state.approximate_depth = depth * 7;
            let started = Instant::now();
            std::hint::black_box(decider.decide_task_count(std::hint::black_box(state)));
            samples.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
    };
    while no_shadow.len() < decisions {
        time(&*plain, &mut no_shadow, &mut state);
        time(&shadowed, &mut with_shadow, &mut state);
        // Untimed: the shadow catches up, so the next batch finds room in its channel.
        if !shadowed.flush(Duration::from_secs(10)) {
            bail!("the shadow did not catch up within 10s");
        }
    }
    let status = shadowed.shadow_status();
    let counts = status.decisions["task_count"];
    let (no_shadow, with_shadow) = (percentiles(no_shadow), percentiles(with_shadow));
    let added_p50_ns = with_shadow.p50_ns - no_shadow.p50_ns;
    Ok(ShadowReport {
        rule: rule.map_or_else(|| "native".to_string(), |r| r.display().to_string()),
        decisions: status.decisions.values().map(|c| c.agree + c.disagree + c.fault + c.dropped + c.skipped).sum::<u64>() as usize,
        no_shadow,
        with_shadow,
        added_p50_ns,
        added_p99_ns: with_shadow.p99_ns - no_shadow.p99_ns,
        goal_p50_ns: GOAL_P50_NS,
        goal_met: added_p50_ns <= GOAL_P50_NS,
        shadow_compared: counts.agree + counts.disagree,
    })
}

/// The report as a table.
pub(crate) fn table(report: &ShadowReport) -> String {
    format!(
        "shadow rule cost per task-count decision (rule {}, {} decisions each)\n\
         {:<14} {:>10} {:>10}\n{:<14} {:>10.0} {:>10.0}\n{:<14} {:>10.0} {:>10.0}\n{:<14} {:>10.0} {:>10.0}\n\
         goal: added p50 <= {:.0} ns: {}\n",
        report.rule,
        report.decisions,
        "",
        "p50 ns",
        "p99 ns",
        "no shadow",
        report.no_shadow.p50_ns,
        report.no_shadow.p99_ns,
        "with shadow",
        report.with_shadow.p50_ns,
        report.with_shadow.p99_ns,
        "added",
        report.added_p50_ns,
        report.added_p99_ns,
        report.goal_p50_ns,
        if report.goal_met { "met" } else { "NOT met" }
    )
}
