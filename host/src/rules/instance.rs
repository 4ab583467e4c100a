//! A live rule instance: instantiation and `configure` under the setup limits, decision
//! calls under the per-call fuel and deadline.

use anyhow::{Context as _, Result, bail};
use wasmtime::component::ResourceTable;
use wasmtime::{Store, UpdateDeadline};

use super::bindings::{v0_1, v0_2, v0_3, v0_4};
use super::engine::{CompiledRule, RuleEngine, RulePre, deadline_ticks, ticks_until};
use super::fault::{Phase, describe_fault, with_output};
use super::hint::with_hint;
use super::limits::{RuleLimits, Stopwatch, Verdict};
use super::sandbox::{MemoryLimiter, RuleHost, capability_free_wasi};
use super::stderr::CapturedOutput;
use super::ticker::{Running, TickerHandle};

impl RuleEngine {
    /// A fresh instance of `rule`, configured with `params`, under the setup limits.
    pub fn instantiate(&self, rule: &CompiledRule, params: &[(String, String)]) -> Result<RuleInstance> {
        let ticker = self.ticker.handle();
        let _running = ticker.running();
        let output = CapturedOutput::default();
        let host = RuleHost {
            wasi: capability_free_wasi(&output),
            table: ResourceTable::new(),
            limiter: MemoryLimiter { cap: self.limits.memory_bytes, held: 0 },
            output: output.clone(),
            stopwatch: Stopwatch::start(self.limits.setup_deadline, self.limits.setup_backstop()),
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|host| &mut host.limiter);
        // The epoch deadline passing means only that the call's wall-clock time reached its
        // CPU deadline (or the next check): the call is stopped only if its thread's CPU time
        // did too, or the wall-clock backstop passed (see `limits`).
        store.epoch_deadline_callback(|mut store| {
            Ok(match store.data_mut().stopwatch.check() {
                Verdict::Continue(wait) => UpdateDeadline::Continue(ticks_until(wait)),
                Verdict::Stop(_) => UpdateDeadline::Interrupt,
            })
        });
        store.set_fuel(self.limits.setup_fuel).map_err(anyhow::Error::from)?;
        store.set_epoch_deadline(deadline_ticks(self.limits.setup_deadline));
        let fault = |e, store: &Store<RuleHost>, export| {
            with_hint(with_output(describe_fault(e, Phase::Setup, &self.limits, store.data().stopwatch.stopped), &output), export)
        };
        let bindings = match &rule.pre {
            RulePre::V0_1(pre) => pre.instantiate(&mut store).map(Bindings::V0_1),
            RulePre::V0_2(pre) => pre.instantiate(&mut store).map(Bindings::V0_2),
            RulePre::V0_3(pre) => pre.instantiate(&mut store).map(Bindings::V0_3),
            RulePre::V0_4 { pre, decisions, failures } => pre.instantiate(&mut store).and_then(|instance| {
                let decisions = decisions.load(&mut store, &instance)?;
                let failures = failures.as_ref().map(|f| f.load(&mut store, &instance)).transpose()?;
                Ok(Bindings::V0_4 { decisions, failures })
            }),
        };
        let bindings = match bindings {
            Ok(bindings) => bindings,
            Err(error) => return Err(fault(error, &store, None)).context("instantiation failed"),
        };
        let configured = match &bindings {
            Bindings::V0_1(b) => b.ebb_rules_decisions().call_configure(&mut store, params),
            Bindings::V0_2(b) => b.ebb_rules_decisions().call_configure(&mut store, params),
            Bindings::V0_3(b) => b.ebb_rules_decisions().call_configure(&mut store, params),
            Bindings::V0_4 { decisions, .. } => decisions.call_configure(&mut store, params),
        };
        let configured = match configured {
            Ok(configured) => configured,
            Err(error) => return Err(fault(error, &store, Some("configure"))).context("configure failed"),
        };
        if let Err(message) = configured {
            bail!("the rule rejected its parameters: {}", crate::health::untrusted_text(&message));
        }
        Ok(RuleInstance {
            store,
            bindings,
            call_fuel: self.limits.call_fuel,
            call_ticks: deadline_ticks(self.limits.call_deadline),
            limits: self.limits.clone(),
            ticker,
        })
    }
}

/// An instance's exports, in the bindings of its contract version.
pub(super) enum Bindings {
    V0_1(v0_1::ScalingRule),
    V0_2(v0_2::ScalingRule),
    V0_3(v0_3::ScalingRule),
    V0_4 { decisions: v0_4::wit::Guest, failures: Option<v0_4::failures_wit::Guest> },
}

/// A live, configured rule instance. Not shared: callers hold it behind a lock.
pub struct RuleInstance {
    pub(super) store: Store<RuleHost>,
    pub(super) bindings: Bindings,
    pub(super) call_fuel: u64,
    pub(super) call_ticks: u64,
    pub(super) limits: RuleLimits,
    ticker: TickerHandle,
}

impl RuleInstance {
    /// Gives the next call its fuel and deadline, timed from now on this thread; the deadline
    /// runs while the guard is held.
    fn arm(&mut self) -> Result<Running> {
        self.store.set_fuel(self.call_fuel).map_err(anyhow::Error::from)?;
        self.store.data_mut().stopwatch = Stopwatch::start(self.limits.call_deadline, self.limits.call_backstop());
        self.store.set_epoch_deadline(self.call_ticks);
        Ok(self.ticker.running())
    }

    fn fault(&self, error: wasmtime::Error, export: &str) -> anyhow::Error {
        let host = self.store.data();
        with_hint(with_output(describe_fault(error, Phase::Call, &self.limits, host.stopwatch.stopped), &host.output), Some(export))
    }

    /// `optimal-dequeue-task-count`, raw (unclamped). Any error means the instance is unusable.
    pub fn optimal_dequeue_task_count(&mut self, state: &ebb_rules_sdk::QueueState) -> Result<u32> {
        let _running = self.arm()?;
        let called = match &self.bindings {
            // A 0.1.0 rule is told 0.1.0's fields only.
            Bindings::V0_1(b) => b.ebb_rules_decisions().call_optimal_dequeue_task_count(&mut self.store, &state.into()),
            Bindings::V0_2(b) => b.ebb_rules_decisions().call_optimal_dequeue_task_count(&mut self.store, &state.into()),
            Bindings::V0_3(b) => b.ebb_rules_decisions().call_optimal_dequeue_task_count(&mut self.store, &state.into()),
            Bindings::V0_4 { decisions, .. } => decisions.call_optimal_dequeue_task_count(&mut self.store, &state.into()),
        };
        called.map_err(|e| self.fault(e, "optimal-dequeue-task-count"))
    }

    /// `on-queue-empty`, raw (unclamped). Any error means the instance is unusable.
    pub fn on_queue_empty(&mut self, ctx: &ebb_rules_sdk::IdleContext) -> Result<ebb_rules_sdk::IdleDecision> {
        let _running = self.arm()?;
        let called = match &self.bindings {
            Bindings::V0_1(b) => b.ebb_rules_decisions().call_on_queue_empty(&mut self.store, &ctx.into()).map(Into::into),
            Bindings::V0_2(b) => b.ebb_rules_decisions().call_on_queue_empty(&mut self.store, &ctx.into()).map(Into::into),
            Bindings::V0_3(b) => b.ebb_rules_decisions().call_on_queue_empty(&mut self.store, &ctx.into()).map(Into::into),
            Bindings::V0_4 { decisions, .. } => decisions.call_on_queue_empty(&mut self.store, &ctx.into()).map(Into::into),
        };
        called.map_err(|e| self.fault(e, "on-queue-empty"))
    }

    /// `max-concurrent-calls`, raw (unclamped): `None` keeps the configured bound. A rule of
    /// a contract before 0.3.0 has no such export and is not called: `Ok(None)`. Any error
    /// means the instance is unusable.
    pub fn max_concurrent_calls(&mut self, state: &ebb_rules_sdk::HandlerState) -> Result<Option<u32>> {
        if !self.decides_concurrency() {
            return Ok(None);
        }
        let _running = self.arm()?;
        let called = match &self.bindings {
            Bindings::V0_3(b) => b.ebb_rules_decisions().call_max_concurrent_calls(&mut self.store, &state.into()),
            Bindings::V0_4 { decisions, .. } => decisions.call_max_concurrent_calls(&mut self.store, &state.into()),
            Bindings::V0_1(_) | Bindings::V0_2(_) => return Ok(None),
        };
        called.map_err(|e| self.fault(e, "max-concurrent-calls"))
    }

    /// Whether the rule decides how many handler calls run at once (contract 0.3.0 and later).
    pub fn decides_concurrency(&self) -> bool {
        matches!(self.bindings, Bindings::V0_3(_) | Bindings::V0_4 { .. })
    }

    /// `on-handler-failure`, raw (unclamped): `None` when the rule does not export
    /// `ebb:rules/failures` (nothing is called). Any error means the instance is unusable.
    pub fn on_handler_failure(&mut self, ctx: &ebb_rules_sdk::FailureContext) -> Result<Option<ebb_rules_sdk::FailureDecision>> {
        let Bindings::V0_4 { failures: Some(_), .. } = &self.bindings else { return Ok(None) };
        let _running = self.arm()?;
        let Bindings::V0_4 { failures: Some(failures), .. } = &self.bindings else { return Ok(None) };
        failures.call_on_handler_failure(&mut self.store, &ctx.into()).map(|d| Some(d.into())).map_err(|e| self.fault(e, "on-handler-failure"))
    }

    /// Whether the rule decides what happens to failed messages (it exports `ebb:rules/failures`).
    pub fn decides_failures(&self) -> bool {
        matches!(self.bindings, Bindings::V0_4 { failures: Some(_), .. })
    }

    /// Whether the last call took longer than its deadline in wall-clock time but not in CPU
    /// time (its thread waited: for a CPU, or in a sleep), and was let finish.
    pub(crate) fn waited(&self) -> bool {
        self.store.data().stopwatch.waited
    }

    /// What the rule wrote to stdout/stderr since the last look.
    pub(crate) fn output(&self) -> &CapturedOutput {
        &self.store.data().output
    }

    /// Bytes of linear memory the instance holds (for reports).
    pub fn memory_bytes(&self) -> usize {
        self.store.data().limiter.held
    }
}
