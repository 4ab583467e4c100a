"""{{name}}: an ebb scaling rule, in Python. One dequeue task per `per_task` messages of
backlog, ceil(depth / per_task); when the queue is empty, the paper's back-off.

Parameters (the queue's `rule_params`): `per_task`, messages per task, a whole number from 1
(default 32).

`ebb rule build` builds {{name}}.wasm, and writes into bindings/ the modules this one imports
(wit_world, componentize_py_types) for the native test: then `python3 -m unittest`.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.decisions import IdleContext, IdleDecision, QueueState

DEFAULT_PER_TASK = 32
MAX_U32 = 2**32 - 1

# componentize-py may make a fresh `Decisions` per call: keep configuration at module level.
settings = {"per_task": DEFAULT_PER_TASK}


def read_per_task(value: str) -> int:
    # ASCII digits only, as the Rust and JavaScript templates read it (int() would take
    # "5_000" and other scripts' digits).
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        raise Err(f'parameter "per_task": cannot read {value!r} as a whole number of messages')
    per_task = int(text)
    if per_task < 1:
        raise Err(f'parameter "per_task": {value} must be 1 or more (messages per task)')
    return per_task


def uniform(random: int, low: float, high: float) -> float:
    """Maps the host's random value (0 .. 2^64) onto [low, high]."""
    return low + (random / 2.0**64) * (high - low)


class Decisions(exports.Decisions):
    def configure(self, params):
        # Raise `Err(message)` to reject the parameters (any other exception is a trap).
        per_task = DEFAULT_PER_TASK
        for key, value in params:
            if key != "per_task":
                raise Err(f"unknown parameter {key} (this rule takes: per_task)")
            per_task = read_per_task(value)
        settings["per_task"] = per_task

    def optimal_dequeue_task_count(self, state: QueueState) -> int:
        # Return an int (a float is a TypeError), at most 2^32 - 1.
        return min(-(-state.approximate_depth // settings["per_task"]), MAX_U32)

    def on_queue_empty(self, ctx: IdleContext) -> IdleDecision:
        # The paper's back-off: 1.75x per empty look from min_interval_ms, +-20 %.
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
