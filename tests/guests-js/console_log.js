// A JavaScript rule that logs with `console.log`: plain componentize-qjs defines no
// `console`, so the decision throws a ReferenceError (a trap).
export const decisions = {
  configure(params) {},
  optimalDequeueTaskCount(state) {
    console.log("deciding");
    return 1;
  },
  onQueueEmpty(ctx) {
    return { delayMs: ctx.minIntervalMs, stop: false };
  },
};
