// A sound JavaScript rule, built WITHOUT `--sync` (tests/build.rs builds `*.nosync.js` so):
// the component then needs the component model's async feature, which the host lacks.
export const decisions = {
  configure(params) {},
  optimalDequeueTaskCount(state) {
    return 1;
  },
  onQueueEmpty(ctx) {
    return { delayMs: ctx.minIntervalMs, stop: false };
  },
};
