// Spare-capacity rule, in JavaScript: the paper's depth table plus a share of spare tasks,
// for volatile loads where a burst should not wait for the next scaling decision; twice
// the share while messages wait longer than `max_wait_ms` (the age of the oldest message of
// the last get, `oldestMessageAgeMs` from contract 0.2.0: null when the last get found
// nothing). Idle back-off is the built-in rule's.
//
// Parameters: `spare_percent` (whole percent added to the paper's count, default 25),
// `max_wait_ms` (milliseconds, default 1000).
// componentize-qjs passes WIT u64 values (depths, milliseconds, random) as Numbers, and
// values of 2^63 and above arrive negative (read as i64): `unsigned` undoes that.

let sparePercent = 25;
let maxWaitMs = 1000;

function unsigned(u64) {
  return u64 < 0 ? u64 + 2 ** 64 : u64;
}

function paperTasks(depth) {
  return depth < 100 ? 10 : depth < 1000 ? 50 : 100;
}

export const decisions = {
  configure(params) {
    for (const [key, value] of params) {
      const parsed = Number(value);
      if (key === "spare_percent") {
        if (!Number.isInteger(parsed) || parsed < 0 || parsed > 1000) {
          throw `parameter "spare_percent": cannot read ${JSON.stringify(value)} as a whole percent (0..1000)`;
        }
        sparePercent = parsed;
      } else if (key === "max_wait_ms") {
        if (!Number.isInteger(parsed) || parsed < 0) {
          throw `parameter "max_wait_ms": cannot read ${JSON.stringify(value)} as whole milliseconds`;
        }
        maxWaitMs = parsed;
      } else {
        throw `unknown parameter ${key} (this rule takes: spare_percent, max_wait_ms)`;
      }
    }
  },

  optimalDequeueTaskCount(state) {
    const base = paperTasks(unsigned(state.approximateDepth));
    const age = state.oldestMessageAgeMs;
    const waiting = age !== null && age !== undefined && unsigned(age) > maxWaitMs;
    const spare = waiting ? 2 * sparePercent : sparePercent;
    return Math.ceil((base * (100 + spare)) / 100);
  },

  // The built-in rule's back-off: 1.75x per empty look from minIntervalMs, +-20 %.
  onQueueEmpty(ctx) {
    const min = unsigned(ctx.minIntervalMs);
    const max = unsigned(ctx.maxIntervalMs);
    let grown = min;
    for (let i = 1; i < Math.min(ctx.idleCount, 200); i++) {
      grown *= 1.75;
    }
    grown *= 0.8 + (unsigned(ctx.random) / 2 ** 64) * (1.2 - 0.8);
    const delayMs = grown >= max ? Math.max(max, min) : Math.max(Math.round(grown), min);
    const stop = ctx.pushEnabled || (delayMs >= max && ctx.activeTasks > 1);
    return { delayMs, stop };
  },
};
