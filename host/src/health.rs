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
