//! The threads a rule set starts (background loads, rebuilds after a fault, the folder
//! watcher): each is counted while it runs and joined when the set stops.
//!
//! A compile or an instantiation cannot be interrupted half-way, so stopping waits for
//! the threads with a bound (a Python rule compiles for seconds on an empty cache); a
//! thread still running past it is left to finish on its own, and said so.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::lock;

/// The threads of one rule set.
#[derive(Default)]
pub(super) struct RuleThreads {
    state: Mutex<State>,
    ended: Condvar,
}

#[derive(Default)]
struct State {
    /// Set by [`RuleThreads::stop`]: no thread starts after it.
    stopping: bool,
    /// Threads started and not yet ended.
    running: usize,
    handles: Vec<JoinHandle<()>>,
}

/// Ends a thread's count when its work returns or panics (or when it cannot start).
struct Running(Arc<RuleThreads>);

impl Drop for Running {
    fn drop(&mut self) {
        let mut state = lock(&self.0.state);
        state.running -= 1;
        self.0.ended.notify_all();
    }
}

impl RuleThreads {
    /// Runs `work` on a new thread named `name`, counted until it returns. `Ok(false)`: the
    /// set is stopping and starts no thread; `Err`: the system could not start one.
    pub(super) fn spawn(self: &Arc<Self>, name: &str, work: impl FnOnce() + Send + 'static) -> std::io::Result<bool> {
        let finished = {
            let mut state = lock(&self.state);
            if state.stopping {
                return Ok(false);
            }
            state.running += 1;
            let (finished, running): (Vec<_>, Vec<_>) = std::mem::take(&mut state.handles).into_iter().partition(JoinHandle::is_finished);
            state.handles = running;
            finished
        };
        // Finished threads are joined as new ones start, so the list stays short.
        finished.into_iter().for_each(|handle| drop(handle.join()));
        let running = Running(self.clone());
        // Not under the lock: a thread that cannot start drops `running`, which takes it.
        let handle = std::thread::Builder::new().name(name.into()).spawn(move || {
            let _running = running;
            work();
        })?;
        lock(&self.state).handles.push(handle);
        Ok(true)
    }

    /// Threads started and not yet ended.
    pub(super) fn running(&self) -> usize {
        lock(&self.state).running
    }

    /// Whether [`RuleThreads::stop`] was called.
    pub(super) fn stopping(&self) -> bool {
        lock(&self.state).stopping
    }

    /// Starts no more threads, waits up to `bound` for the running ones to end and joins
    /// them. Returns how many were still running at the bound (left to end on their own).
    pub(super) fn stop(&self, bound: Duration) -> usize {
        let mut state = lock(&self.state);
        state.stopping = true;
        let (mut state, _) = self.ended.wait_timeout_while(state, bound, |state| state.running > 0).unwrap_or_else(PoisonError::into_inner);
        let left = state.running;
        let handles = std::mem::take(&mut state.handles);
        drop(state);
        for handle in handles {
            // With none left running, every thread is past its work: joining is immediate.
            if left == 0 || handle.is_finished() {
                let _ = handle.join();
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopping_waits_for_the_running_threads_then_starts_none() {
        let threads = Arc::new(RuleThreads::default());
        let (release, released) = std::sync::mpsc::channel::<()>();
        assert!(
            threads
                .spawn("test", move || {
                    let _ = released.recv();
                })
                .unwrap()
        );
        assert_eq!(threads.running(), 1);
        // Held: the bound passes with the thread still running.
        assert_eq!(threads.stop(Duration::from_millis(50)), 1);
        assert!(!threads.spawn("test", || {}).unwrap(), "a stopping set starts no thread");
        drop(release);
        assert_eq!(threads.stop(Duration::from_secs(10)), 0);
        assert_eq!(threads.running(), 0);
    }

    #[test]
    fn a_thread_that_panics_is_counted_out() {
        let threads = Arc::new(RuleThreads::default());
        assert!(threads.spawn("test", || panic!("a test panics")).unwrap());
        assert_eq!(threads.stop(Duration::from_secs(10)), 0);
    }
}
