//! The deadline ticker: advances the engine's epoch (the deadline's clock) every tick while a
//! rule runs, and sleeps while none does. Ticking all the time cost an idle host about 2 % of
//! a core (a thousand wake-ups a second) for rules that run a few microseconds a second.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use anyhow::{Context as _, Result};
use wasmtime::Engine;

use super::lock;

/// How often the ticker advances the engine's epoch while a rule runs: the deadline's resolution.
pub(super) const EPOCH_TICK: Duration = Duration::from_millis(1);

#[derive(Default)]
struct Shared {
    /// Rule calls (and instantiations) running now.
    running: AtomicUsize,
    stop: AtomicBool,
    thread: OnceLock<Thread>,
    /// Epochs advanced, and whether the thread is parked (for tests).
    ticks: AtomicU64,
    parked: AtomicBool,
}

impl Shared {
    fn wake(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

/// The engine's ticker thread.
pub(super) struct EpochTicker {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl EpochTicker {
    pub(super) fn start(engine: Engine) -> Result<EpochTicker> {
        let shared = Arc::new(Shared::default());
        let ticking = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ebb-rule-epoch".into())
            .spawn(move || {
                while !ticking.stop.load(Ordering::Acquire) {
                    if ticking.running.load(Ordering::Acquire) == 0 {
                        // A call that starts after this load unparks us: `park` then returns at once.
                        ticking.parked.store(true, Ordering::Release);
                        std::thread::park();
                        ticking.parked.store(false, Ordering::Release);
                        continue;
                    }
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                    ticking.ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
            .context("failed to start the rule deadline ticker")?;
        shared.thread.set(thread.thread().clone()).expect("set once, here");
        Ok(EpochTicker { shared, thread: Mutex::new(Some(thread)) })
    }

    /// What instances keep to start the ticker when they run.
    pub(super) fn handle(&self) -> TickerHandle {
        TickerHandle(self.shared.clone())
    }

    #[cfg(test)]
    fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::Relaxed)
    }

    /// Waits (a while at most) for the thread to park.
    #[cfg(test)]
    fn until_parked(&self) {
        let started = std::time::Instant::now();
        while !self.shared.parked.load(Ordering::Acquire) {
            assert!(started.elapsed() < Duration::from_secs(30), "the ticker never parked");
            std::thread::sleep(EPOCH_TICK);
        }
    }
}

impl Drop for EpochTicker {
    /// Stops the thread and joins it (it notices within one tick).
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// Starts the ticker for a rule's call.
#[derive(Clone)]
pub(super) struct TickerHandle(Arc<Shared>);

impl TickerHandle {
    /// Keeps the epoch advancing until the returned guard drops: hold it around every entry
    /// into a rule's code, or its deadline never comes.
    #[must_use = "the ticker stops when the guard drops"]
    pub(super) fn running(&self) -> Running {
        if self.0.running.fetch_add(1, Ordering::AcqRel) == 0 {
            self.0.wake();
        }
        Running(self.0.clone())
    }
}

/// A rule running: the ticker ticks while one exists.
#[must_use = "the ticker stops when the guard drops"]
pub(super) struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch_advances(engine: &Engine, within: Duration) -> bool {
        // The epoch is not readable; a store whose deadline is one tick away sees it pass.
        let mut store = wasmtime::Store::new(engine, ());
        store.set_epoch_deadline(1);
        let started = std::time::Instant::now();
        // (module (func (export "spin") (loop (br 0))))
        let spin_module = [
            0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x60, 0x00, 0x00, 0x03, 0x02, 0x01, 0x00, 0x07, 0x08, 0x01, 0x04, b's', b'p',
            b'i', b'n', 0x00, 0x00, 0x0a, 0x09, 0x01, 0x07, 0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b,
        ];
        let module = wasmtime::Module::new(engine, spin_module).unwrap();
        let instance = wasmtime::Instance::new(&mut store, &module, &[]).unwrap();
        let spin = instance.get_typed_func::<(), ()>(&mut store, "spin").unwrap();
        let (sender, receiver) = std::sync::mpsc::channel::<()>();
        let engine = engine.clone();
        let watchdog = std::thread::spawn(move || {
            // Without ticks the spin never ends: end it from here after `within`.
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = receiver.recv_timeout(within) {
                engine.increment_epoch();
            }
        });
        let _ = spin.call(&mut store, ());
        let ended_by_ticker = started.elapsed() < within;
        drop(sender);
        watchdog.join().unwrap();
        ended_by_ticker
    }

    #[test]
    fn ticks_only_while_a_rule_runs() {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config).unwrap();
        let ticker = EpochTicker::start(engine.clone()).unwrap();
        ticker.until_parked();
        let idle = ticker.ticks();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(ticker.ticks(), idle, "the ticker ticked with no rule running");
        let running = ticker.handle().running();
        assert!(epoch_advances(&engine, Duration::from_secs(30)), "the ticker did not tick while a rule ran");
        assert!(ticker.ticks() > idle);
        drop(running);
        ticker.until_parked();
        let after = ticker.ticks();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(ticker.ticks(), after, "the ticker kept ticking after the rule returned");
    }
}
