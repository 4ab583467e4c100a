// Written by `ebb rule build`: a `console` for the rule (QuickJS has none), writing lines to
// the rule's stdout (log, info, debug) and stderr (warn, error), which the host logs.
import stdout from "wasi:cli/stdout@0.2.12";
import stderr from "wasi:cli/stderr@0.2.12";

// WASI writes at most 4096 bytes per call.
const CHUNK = 4096;

function utf8(text) {
  let binary;
  try {
    binary = unescape(encodeURIComponent(text));
  } catch {
    binary = unescape(encodeURIComponent(text.replace(/[\uD800-\uDFFF]/g, "\uFFFD")));
  }
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) {
    bytes[i] = binary.charCodeAt(i);
  }
  return bytes;
}

export function show(value) {
  if (typeof value === "string") {
    return value;
  }
  if (value instanceof Error) {
    return `${value.name}: ${value.message}`;
  }
  try {
    const json = JSON.stringify(value);
    return json === undefined ? String(value) : json;
  } catch {
    return String(value);
  }
}

function writer(stream) {
  return (...values) => {
    const bytes = utf8(values.map(show).join(" ") + "\n");
    const out = stream();
    for (let at = 0; at < bytes.length; at += CHUNK) {
      out.blockingWriteAndFlush(bytes.subarray(at, at + CHUNK));
    }
  };
}

const out = writer(() => stdout.getStdout());
const err = writer(() => stderr.getStderr());
globalThis.console = { log: out, info: out, debug: out, warn: err, error: err };
