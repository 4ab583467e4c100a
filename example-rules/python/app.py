"""Drain-time rule, in Python: run enough dequeue tasks to drain the queue in a target time.

Each task's rate is estimated from the queue's recent throughput; the tasks must take the
backlog in the target time and keep up with what keeps arriving (`arrivals_per_sec`, from
contract 0.2.0). Without a throughput figure yet, one task per batch of backlog (the
built-in rule's count). Idle back-off is the built-in rule's.

Parameters: `target_drain_s` (seconds, default 10).
"""

import math

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.decisions import IdleContext, IdleDecision, QueueState

# componentize-py may create a fresh `Decisions` per call: keep configuration at module level.
settings = {"target_drain_s": 10.0}


def built_in_tasks(depth: int, batch_size: int) -> int:
    return -(-depth // (batch_size or 32))


def uniform(random: int, low: float, high: float) -> float:
    return low + (random / 2.0**64) * (high - low)


class Decisions(exports.Decisions):
    def configure(self, params):
        for key, value in params:
            if key != "target_drain_s":
                raise Err(f"unknown parameter {key} (this rule takes: target_drain_s)")
            try:
                seconds = float(value)
            except ValueError:
                raise Err(f'parameter "target_drain_s": cannot read {value!r} as a number')
            if not seconds > 0:
                raise Err(f'parameter "target_drain_s": {value} must be more than 0')
            settings["target_drain_s"] = seconds

    def optimal_dequeue_task_count(self, state: QueueState) -> int:
        per_task = state.throughput_per_sec / max(state.active_tasks, 1)
        if per_task <= 0:
            return min(built_in_tasks(state.approximate_depth, state.batch_size), 2**32 - 1)
        drain_rate = state.approximate_depth / settings["target_drain_s"] + state.arrivals_per_sec
        needed = drain_rate / per_task
        return min(math.ceil(needed), 2**32 - 1)

    def on_queue_empty(self, ctx: IdleContext) -> IdleDecision:
        # The built-in rule's back-off: 1.75x per empty look from min_interval_ms, +-20 %.
        grown = float(ctx.min_interval_ms)
        for _ in range(1, min(ctx.idle_count, 200)):
            grown *= 1.75
        grown *= uniform(ctx.random, 0.8, 1.2)
        if grown >= ctx.max_interval_ms:
            delay_ms = max(ctx.max_interval_ms, ctx.min_interval_ms)
        else:
            delay_ms = max(round(grown), ctx.min_interval_ms)
        stop = ctx.push_enabled or (delay_ms >= ctx.max_interval_ms and ctx.active_tasks > 1)
        return IdleDecision(delay_ms=delay_ms, stop=stop)
