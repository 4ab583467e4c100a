"""A Python rule that fails as authors' rules do, picked by the parameter `mode`:

- `value-error`: `configure` raises ValueError (not `Err`), which traps;
- `float-count`: `optimal_dequeue_task_count` returns 10.5, a float for a u32 (TypeError);
- `huge-power`: `optimal_dequeue_task_count` raises 2 to the depth, with no loop: a big
  integer that a depth of 2^64 - 1 makes too costly to compute;
- none: a sound rule (one task, the minimum interval).
"""

from wit_world import exports
from wit_world.exports.decisions import IdleContext, IdleDecision, QueueState

settings = {"mode": ""}


class Decisions(exports.Decisions):
    def configure(self, params):
        for key, value in params:
            if key == "mode" and value == "value-error":
                int("ten")  # ValueError: invalid literal for int()
            settings[key] = value

    def optimal_dequeue_task_count(self, state: QueueState) -> int:
        if settings["mode"] == "float-count":
            return 10.5
        if settings["mode"] == "huge-power":
            return min(2**state.approximate_depth, state.max_tasks)
        return 1

    def on_queue_empty(self, ctx: IdleContext) -> IdleDecision:
        return IdleDecision(delay_ms=ctx.min_interval_ms, stop=False)
