// A JavaScript rule whose exports are snake_case, as in the WIT text: componentize-qjs
// looks for camelCase names, so every decision fails ("function ... not found").
export const decisions = {
  configure(params) {},
  optimal_dequeue_task_count(state) {
    return 1;
  },
  on_queue_empty(ctx) {
    return { delayMs: ctx.minIntervalMs, stop: false };
  },
};
