"""Per-error retry policy, in Python (contract 0.4.0, world `failure-aware-rule`).

What happens to a message whose handler failed depends on how it failed:
- an HTTP status in `poison_statuses` (default 400 and 422): it will never succeed, so it
  is poisoned at the first failure, with the status as the reason;
- a timeout or a refused connection: retried after `slow_retry_ms` (default 10000) doubled
  per delivery, so a struggling app gets air;
- anything else: retried after `base_retry_ms` (default 1000) doubled per delivery;
- from `max_dequeue_count` on: the host's default (poison).
Delays are jittered by +-10 % with the host's random value. The scaling decisions are the
built-in rule's.
"""

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.decisions import HandlerState, IdleContext, IdleDecision, QueueState
from wit_world.exports.failures import (
    ErrorClass,
    FailureContext,
    FailureDecision,
    FailureDecision_Default,
    FailureDecision_Poison,
    FailureDecision_Retry,
)

# componentize-py may create a fresh export object per call: keep configuration at module level.
settings = {"base_retry_ms": 1000, "slow_retry_ms": 10000, "poison_statuses": {400, 422}}


def uniform(random: int, low: float, high: float) -> float:
    return low + (random / 2.0**64) * (high - low)


# The longest retry delay the host allows (7 days): a larger one could not be applied, and
# would overflow the float arithmetic of the backoff.
MAX_DELAY_MS = 604_800_000


def parse_ms(key: str, value: str) -> int:
    # ASCII digits only: str.isdigit() takes other scripts' digits and superscripts.
    if not (value.isascii() and value.isdigit()):
        raise Err(f'parameter "{key}": {value!r} is not a whole number of milliseconds')
    if int(value) > MAX_DELAY_MS:
        raise Err(f'parameter "{key}": {value} is more than {MAX_DELAY_MS} (7 days), the longest retry delay the host allows')
    return int(value)


class Decisions(exports.Decisions):
    def configure(self, params):
        for key, value in params:
            if key in ("base_retry_ms", "slow_retry_ms"):
                settings[key] = parse_ms(key, value)
            elif key == "poison_statuses":
                statuses = set()
                for part in value.split(","):
                    part = part.strip()
                    if not part:
                        continue
                    if not part.isdigit() or not 100 <= int(part) <= 599:
                        raise Err(f'parameter "poison_statuses": {part!r} is not an HTTP status')
                    statuses.add(int(part))
                settings["poison_statuses"] = statuses
            else:
                raise Err(f"unknown parameter {key} (this rule takes: base_retry_ms, slow_retry_ms, poison_statuses)")

    def optimal_dequeue_task_count(self, state: QueueState) -> int:
        # The built-in rule: one task per batch of backlog.
        return min(-(-state.approximate_depth // (state.batch_size or 32)), 2**32 - 1)

    def on_queue_empty(self, ctx: IdleContext) -> IdleDecision:
        grown = float(ctx.min_interval_ms)
        for _ in range(1, min(ctx.idle_count, 200)):
            grown *= 1.75
        delay_ms = min(max(round(grown), ctx.min_interval_ms), max(ctx.max_interval_ms, ctx.min_interval_ms))
        return IdleDecision(delay_ms=delay_ms, stop=ctx.push_enabled)

    def max_concurrent_calls(self, state: HandlerState):
        return None


class Failures(exports.Failures):
    def on_handler_failure(self, ctx: FailureContext) -> FailureDecision:
        if ctx.http_status is not None and ctx.http_status in settings["poison_statuses"]:
            return FailureDecision_Poison(f"python-retry: HTTP {ctx.http_status} is not retried")
        if ctx.dequeue_count >= ctx.max_dequeue_count:
            return FailureDecision_Default()
        slow = ctx.error_class in (ErrorClass.TIMEOUT, ErrorClass.CONNECT)
        base = settings["slow_retry_ms"] if slow else settings["base_retry_ms"]
        delay = float(base)
        for _ in range(1, min(ctx.dequeue_count, 200)):
            delay *= 2.0
        delay *= uniform(ctx.random, 0.9, 1.1)
        return FailureDecision_Retry(min(round(delay), max(ctx.max_retry_delay_ms, base)))
