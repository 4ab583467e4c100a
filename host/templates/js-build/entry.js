// Written by `ebb rule build`: the component's entry module. It gives the rule a `console`
// (imported first, so the rule's own top level can use it), and checks what each decision
// returns: the bindings would truncate 10.5 tasks to 10, or wrap -1, without a word; here
// such a value is an error naming the export and the value (the host records a fault).
import { show } from "./console.js";
import * as rule from "../rule.js";

const EXPORTS = ["configure", "optimalDequeueTaskCount", "onQueueEmpty"];
const MAX_U32 = 2 ** 32 - 1;

const user = rule.decisions;
if (typeof user !== "object" || user === null) {
  throw new Error("rule.js must export `decisions`, an object with the functions configure, optimalDequeueTaskCount and onQueueEmpty");
}
const missing = EXPORTS.filter((name) => typeof user[name] !== "function");
if (missing.length > 0) {
  throw new Error(`rule.js: \`decisions\` has no function ${missing.join(", ")} (export names are camelCase: ${EXPORTS.join(", ")})`);
}

// A value as written in JavaScript: 10.5, NaN, "7", undefined.
function literal(value) {
  return typeof value === "number" || value === undefined ? String(value) : typeof value === "string" ? JSON.stringify(value) : show(value);
}

function fail(message) {
  console.error(message);
  throw new Error(message);
}

function wholeNumber(exportName, what, value, max, maxText) {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > max) {
    fail(`${exportName} returned ${what}${literal(value)}: it must be a whole number from 0 to ${maxText} (round it: Math.ceil, Math.floor or Math.round)`);
  }
}

export const decisions = {
  configure(params) {
    try {
      user.configure(params);
    } catch (error) {
      // The contract's error is a string: keep the message of an Error too.
      throw error instanceof Error ? error.message : show(error);
    }
  },

  optimalDequeueTaskCount(state) {
    const tasks = user.optimalDequeueTaskCount(state);
    wholeNumber("optimalDequeueTaskCount", "", tasks, MAX_U32, "4294967295");
    return tasks;
  },

  onQueueEmpty(ctx) {
    const decision = user.onQueueEmpty(ctx);
    if (typeof decision !== "object" || decision === null) {
      fail(`onQueueEmpty returned ${literal(decision)}: it must be an object { delayMs, stop }`);
    }
    // 2^64 - 1 is not a Number: the largest below 2^64 is.
    wholeNumber("onQueueEmpty", "delayMs ", decision.delayMs, 2 ** 64 - 2048, "2^64 - 1");
    if (typeof decision.stop !== "boolean") {
      fail(`onQueueEmpty returned stop ${literal(decision.stop)}: it must be true or false`);
    }
    return { delayMs: decision.delayMs, stop: decision.stop };
  },
};
