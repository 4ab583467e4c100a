// A JavaScript rule whose configure rejects every parameter with a hostile message: a
// forged log line after a newline, a terminal escape, and 200,000 more characters.
export const decisions = {
  configure(params) {
    if (params.length > 0) {
      throw "nope\n2026-11-25T16:20:00.000000Z ERROR ebb::host: FAKE host line \u001b[31mred " + "R".repeat(200000);
    }
  },
  optimalDequeueTaskCount(state) {
    return 1;
  },
  onQueueEmpty(ctx) {
    return { delayMs: ctx.minIntervalMs, stop: false };
  },
};
