"""Native tests of app.py: `python3 -m unittest` in this folder (after `ebb rule build`, which
writes the bindings app.py imports)."""

import pathlib
import sys
import unittest

# The bindings `ebb rule build` writes (stubs, for tests and editors; the component has its own).
sys.path.insert(0, str(pathlib.Path(__file__).parent / "bindings"))

from componentize_py_types import Err
from wit_world.exports.decisions import DepthSource, IdleContext, QueueState

import app


def configured(**params: str) -> app.Decisions:
    rule = app.Decisions()
    rule.configure(list(params.items()))
    return rule


def state(**fields) -> QueueState:
    defaults = dict(queue="q", approximate_depth=0, in_flight=0, active_tasks=1, min_tasks=0, max_tasks=100,
                    throughput_per_sec=0.0, mean_handler_latency_ms=0.0, recent_failures=0, push_enabled=False,
                    timestamp_ms=0, random=0, last_get_messages=0, batch_size=32, arrivals_per_sec=0.0,
                    oldest_message_age_ms=None, depth_source=DepthSource.MEASURED)
    return QueueState(**{**defaults, **fields})


def idle(**fields) -> IdleContext:
    defaults = dict(queue="q", idle_count=1, active_tasks=1, min_interval_ms=800, max_interval_ms=60000,
                    push_enabled=False, timestamp_ms=0, random=2**62)
    return IdleContext(**{**defaults, **fields})


class ConfigureTest(unittest.TestCase):
    def test_per_task_must_be_a_whole_number_from_1(self):
        for bad in ["zero", "0", "-1", "1.5", "", "1e3", "0x10", "5_000"]:
            with self.subTest(per_task=bad), self.assertRaises(Err) as caught:
                configured(per_task=bad)
            self.assertIn("per_task", caught.exception.value)

    def test_an_unknown_parameter_is_rejected(self):
        with self.assertRaises(Err) as caught:
            configured(per_tasks="8")
        self.assertIn("per_tasks", caught.exception.value)


class TaskCountTest(unittest.TestCase):
    def test_one_task_per_per_task_messages_rounded_up(self):
        rule = configured(per_task="32")
        counts = [rule.optimal_dequeue_task_count(state(approximate_depth=d)) for d in [0, 1, 32, 33, 320, 321]]
        self.assertEqual(counts, [0, 1, 1, 2, 10, 11])
        self.assertEqual(configured(per_task="1").optimal_dequeue_task_count(state(approximate_depth=2**64 - 1)), 2**32 - 1)

    def test_per_task_defaults_to_32(self):
        self.assertEqual(configured().optimal_dequeue_task_count(state(approximate_depth=64)), 2)


class QueueEmptyTest(unittest.TestCase):
    def test_backs_off_from_the_minimum_and_stops_with_push(self):
        rule = configured()
        first = rule.on_queue_empty(idle(idle_count=1))
        self.assertEqual((first.delay_ms, first.stop), (800, False))
        self.assertEqual(rule.on_queue_empty(idle(idle_count=3)).delay_ms, 2205)  # 800 x 1.75^2 x 0.9
        self.assertTrue(rule.on_queue_empty(idle(push_enabled=True)).stop)


if __name__ == "__main__":
    unittest.main()
