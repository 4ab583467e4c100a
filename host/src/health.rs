//! Whether the host can do its work. A component that cannot (a store that cannot be
//! reopened) records its problem here; `/healthz` answers 503 with every problem.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Shared health: no problem recorded means healthy. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Health {
    problems: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Health {
    /// Records that `component` cannot work, and why (the latest reason replaces an earlier
    /// one). Returns true if this is news (the component was fine), so callers log it once.
    pub fn set_problem(&self, component: &str, reason: impl Into<String>) -> bool {
        self.problems.lock().unwrap().insert(component.to_string(), reason.into()).is_none()
    }

    /// Records that `component` works again. Returns true if it had a problem.
    pub fn clear_problem(&self, component: &str) -> bool {
        self.problems.lock().unwrap().remove(component).is_some()
    }

    /// Every problem, by component; empty when healthy.
    pub fn problems(&self) -> BTreeMap<String, String> {
        self.problems.lock().unwrap().clone()
    }

    /// True when no component has a problem.
    pub fn is_healthy(&self) -> bool {
        self.problems.lock().unwrap().is_empty()
    }
}

/// Longest reason kept for a problem, in bytes: storage error texts come from outside (a
/// proxy's page, a hostile server) and are shown in `/readyz`, `/status` and logs.
pub(crate) const MAX_REASON_BYTES: usize = 512;

/// `reason` cut to at most [`MAX_REASON_BYTES`] (on a character boundary), marked when cut.
pub(crate) fn truncate_reason(reason: &str) -> String {
    if reason.len() <= MAX_REASON_BYTES {
        return reason.to_string();
    }
    let mut end = MAX_REASON_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &reason[..end], reason.len() - end)
}

/// Text from outside (a rule's error message, its output) made safe to log and show: control
/// characters escaped (a newline or a terminal escape cannot forge a log line or repaint a
/// terminal), then cut to [`MAX_REASON_BYTES`].
pub(crate) fn untrusted_text(text: &str) -> String {
    truncate_reason(&escaped_text(text))
}

/// `text` with its control characters escaped, and the invisible ones that reorder or break
/// what a reader sees (bidirectional overrides and isolates, line and paragraph separators),
/// uncut: for callers with a bound of their own.
pub(crate) fn escaped_text(text: &str) -> String {
    let hidden = |c: char| c.is_control() || matches!(c, '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    text.chars().flat_map(|c| if hidden(c) { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect()
}

/// What a queue needs before it can work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadinessPart {
    /// Its storage answers.
    Storage,
    /// Its storage accepts the host's credential. A refusal after start-up (an expired SAS,
    /// a rotated key) also fails `/healthz`: only a restart reads a renewed secret.
    Credential,
    /// Its rule is loaded (or it runs the built-in rule by choice).
    Rule,
}

/// Whether each queue can do its work now (`/readyz`), apart from whether the process is
/// sound ([`Health`], `/healthz`). A queue is ready when none of its parts has a problem.
/// Cheap to clone.
#[derive(Clone, Default)]
pub struct Readiness {
    queues: Arc<Mutex<BTreeMap<String, BTreeMap<ReadinessPart, String>>>>,
    checks: Arc<Mutex<Vec<ReadinessCheck>>>,
}

/// A part whose state is read when readiness is asked, not recorded as it changes: the
/// problem it reports now, if any.
type ReadinessCheck = (String, ReadinessPart, Arc<dyn Fn() -> Option<String> + Send + Sync>);

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness").field("queues", &self.snapshot()).finish()
    }
}

/// One queue's readiness, as `/readyz` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QueueReadiness {
    /// True when no part has a problem.
    pub ready: bool,
    /// Each part's problem (truncated to `MAX_REASON_BYTES`).
    pub problems: BTreeMap<ReadinessPart, String>,
}

impl Readiness {
    /// Adds `queue`, ready until a problem is recorded (re-adding keeps its problems).
    pub fn add_queue(&self, queue: &str) {
        self.queues.lock().unwrap().entry(queue.to_string()).or_default();
    }

    /// Records that `part` of `queue` cannot work and why (truncated). Returns true if this
    /// is news (the part was fine), so callers log it once.
    pub fn set_problem(&self, queue: &str, part: ReadinessPart, reason: &str) -> bool {
        self.queues.lock().unwrap().entry(queue.to_string()).or_default().insert(part, truncate_reason(reason)).is_none()
    }

    /// Records that `part` of `queue` works. Returns true if it had a problem.
    pub fn clear_problem(&self, queue: &str, part: ReadinessPart) -> bool {
        self.queues.lock().unwrap().get_mut(queue).is_some_and(|problems| problems.remove(&part).is_some())
    }

    /// Asks `check` for `part` of `queue` whenever readiness is asked (a rule that is still
    /// compiling, say): its answer is the part's problem, if any.
    pub fn add_check(&self, queue: &str, part: ReadinessPart, check: impl Fn() -> Option<String> + Send + Sync + 'static) {
        self.add_queue(queue);
        self.checks.lock().unwrap().push((queue.to_string(), part, Arc::new(check)));
    }

    /// Every queue's readiness, by name.
    pub fn snapshot(&self) -> BTreeMap<String, QueueReadiness> {
        let mut queues = self.queues.lock().unwrap().clone();
        let checks = self.checks.lock().unwrap().clone();
        for (queue, part, check) in checks {
            if let Some(problem) = check() {
                queues.entry(queue).or_default().entry(part).or_insert_with(|| truncate_reason(&problem));
            }
        }
        queues.into_iter().map(|(name, problems)| (name, QueueReadiness { ready: problems.is_empty(), problems })).collect()
    }

    /// True when every queue is ready.
    pub fn is_ready(&self) -> bool {
        self.snapshot().values().all(|queue| queue.ready)
    }

    /// The [`ReadinessPart::Credential`] problems, as liveness problems by component
    /// (`queue NAME`): what `/healthz` adds to the host's [`Health`].
    pub fn refused_credentials(&self) -> BTreeMap<String, String> {
        let queues = self.queues.lock().unwrap();
        queues.iter().filter_map(|(queue, problems)| Some((format!("queue {queue}"), problems.get(&ReadinessPart::Credential)?.clone()))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attack pass (session 11): U+202E and U+2028 went through as they were.
    #[test]
    fn characters_that_reorder_or_break_a_line_are_escaped() {
        assert_eq!(untrusted_text("ok\u{202e}txt.exe\u{2028}WARN"), "ok\\u{202e}txt.exe\\u{2028}WARN");
        assert_eq!(untrusted_text("plain é ü"), "plain é ü");
    }

    #[test]
    fn a_hostile_reason_is_cut_on_a_character_boundary() {
        let reason = "é".repeat(10_000);
        let cut = truncate_reason(&reason);
        assert!(cut.len() < MAX_REASON_BYTES + 40, "{} bytes", cut.len());
        assert!(cut.ends_with("bytes cut)"));
        assert_eq!(truncate_reason("short"), "short");
    }

    #[test]
    fn a_queue_is_ready_until_a_part_has_a_problem_and_again_when_it_clears() {
        let readiness = Readiness::default();
        readiness.add_queue("orders");
        assert!(readiness.is_ready());
        assert!(readiness.set_problem("orders", ReadinessPart::Storage, "connection refused"));
        assert!(!readiness.set_problem("orders", ReadinessPart::Storage, "still refused"));
        assert!(!readiness.is_ready());
        assert_eq!(readiness.snapshot()["orders"].problems[&ReadinessPart::Storage], "still refused");
        assert!(readiness.clear_problem("orders", ReadinessPart::Storage));
        assert!(readiness.is_ready());
    }

    #[test]
    fn a_check_is_asked_each_time_readiness_is() {
        let readiness = Readiness::default();
        let compiling = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let state = compiling.clone();
        readiness.add_check("orders", ReadinessPart::Rule, move || state.load(std::sync::atomic::Ordering::Relaxed).then(|| "compiling".to_string()));
        assert_eq!(readiness.snapshot()["orders"].problems[&ReadinessPart::Rule], "compiling");
        compiling.store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(readiness.is_ready());
    }
}
