// {{name}}: an ebb scaling rule, in JavaScript. One dequeue task per `per_task` messages of
// backlog, ceil(depth / per_task); when the queue is empty, the paper's back-off.
//
// Parameters (the queue's `rule_params`): `per_task`, messages per task, a whole number from
// 1 (default 32).
//
// Test: `node --test`. Build: `ebb rule build` (it gives the rule a `console` whose output
// reaches the host's log, and turns a fractional or out-of-range number returned by a
// decision into an error naming it). Names are camelCase: `optimalDequeueTaskCount`,
// `state.approximateDepth`, `{ delayMs, stop }`.
//
// WIT u64 values (depths, milliseconds, random) arrive as Numbers, and values of 2^63 and
// above arrive negative (read as i64): `unsigned` undoes that.

const DEFAULT_PER_TASK = 32;
const MAX_U32 = 2 ** 32 - 1;

let perTask = DEFAULT_PER_TASK;

function unsigned(u64) {
  return u64 < 0 ? u64 + 2 ** 64 : u64;
}

// Maps the host's random value (0 .. 2^64) onto [low, high].
function uniform(random, low, high) {
  return low + (unsigned(random) / 2 ** 64) * (high - low);
}

export const decisions = {
  // Throw a string to reject the parameters: the host shows it and keeps the rule it had.
  configure(params) {
    let next = DEFAULT_PER_TASK;
    for (const [key, value] of params) {
      if (key !== "per_task") {
        throw `unknown parameter ${key} (this rule takes: per_task)`;
      }
      // Digits only, as the Rust and Python templates read it (Number() would take 1e3 and 0x10).
      const parsed = /^[0-9]+$/.test(value.trim()) ? Number(value.trim()) : NaN;
      if (!Number.isSafeInteger(parsed) || parsed < 1) {
        throw `parameter "per_task": cannot read ${JSON.stringify(value)} as a whole number of messages from 1`;
      }
      next = parsed;
    }
    perTask = next;
  },

  // Return a whole number from 0 to 2^32 - 1.
  optimalDequeueTaskCount(state) {
    return Math.min(Math.ceil(unsigned(state.approximateDepth) / perTask), MAX_U32);
  },

  // The paper's back-off: 1.75x per empty look from minIntervalMs, +-20 %.
  onQueueEmpty(ctx) {
    const min = unsigned(ctx.minIntervalMs);
    const max = unsigned(ctx.maxIntervalMs);
    let grown = min;
    for (let i = 1; i < Math.min(ctx.idleCount, 200); i++) {
      grown *= 1.75;
    }
    grown *= uniform(ctx.random, 0.8, 1.2);
    const delayMs = grown >= max ? Math.max(max, min) : Math.max(Math.round(grown), min);
    const stop = ctx.pushEnabled || (delayMs >= max && ctx.activeTasks > 1);
    return { delayMs, stop };
  },
};
