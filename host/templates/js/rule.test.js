// Native tests of rule.js: `node --test` (or `npm test`) in this folder.
import assert from "node:assert/strict";
import { test } from "node:test";

import { decisions } from "./rule.js";

function configured(params = {}) {
  decisions.configure(Object.entries(params));
  return decisions;
}

const tasks = (depth) => decisions.optimalDequeueTaskCount({ approximateDepth: depth });
const idle = (fields) => ({ idleCount: 1, activeTasks: 1, minIntervalMs: 800, maxIntervalMs: 60000, pushEnabled: false, random: 2 ** 62, ...fields });

test("per_task must be a whole number from 1", () => {
  for (const bad of ["zero", "0", "-1", "1.5", "", "1e3", "0x10", "5_000"]) {
    assert.throws(() => configured({ per_task: bad }), (error) => typeof error === "string" && error.includes("per_task"), `per_task ${JSON.stringify(bad)}`);
  }
  assert.throws(() => configured({ per_tasks: "8" }), /per_tasks/);
});

test("one task per per_task messages, rounded up", () => {
  configured({ per_task: "32" });
  assert.deepEqual([0, 1, 32, 33, 320, 321].map(tasks), [0, 1, 1, 2, 10, 11]);
  configured();
  assert.equal(tasks(64), 2, "per_task defaults to 32");
  configured({ per_task: "1" });
  assert.equal(tasks(-1), 2 ** 32 - 1, "a depth of 2^64 - 1 arrives as -1, and saturates");
});

test("an empty queue backs off from the minimum and stops with push", () => {
  configured();
  assert.deepEqual(decisions.onQueueEmpty(idle({ idleCount: 1 })), { delayMs: 800, stop: false });
  assert.equal(decisions.onQueueEmpty(idle({ idleCount: 3 })).delayMs, 2205, "800 x 1.75^2 x 0.9");
  assert.equal(decisions.onQueueEmpty(idle({ pushEnabled: true })).stop, true);
});
