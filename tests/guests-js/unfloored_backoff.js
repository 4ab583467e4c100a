// The paper's jittered back-off without a floor: 1.75x per empty look from minIntervalMs,
// times 0.8 .. 1.2, capped at maxIntervalMs but not raised to minIntervalMs, so the first
// empty look can ask for 80 ms under a 100 ms minimum. The host clamps it: `ebb rule check`
// warns, and fails only with --strict.

function unsigned(u64) {
  return u64 < 0 ? u64 + 2 ** 64 : u64;
}

export const decisions = {
  configure(params) {},
  optimalDequeueTaskCount(state) {
    return 1;
  },
  onQueueEmpty(ctx) {
    const min = unsigned(ctx.minIntervalMs);
    const max = unsigned(ctx.maxIntervalMs);
    let grown = min;
    for (let i = 1; i < Math.min(ctx.idleCount, 200); i++) {
      grown *= 1.75;
    }
    grown *= 0.8 + (unsigned(ctx.random) / 2 ** 64) * (1.2 - 0.8);
    return { delayMs: Math.min(Math.round(grown), max), stop: ctx.pushEnabled };
  },
};
