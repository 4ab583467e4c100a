// Proportional scaling, in C: one dequeue task per `per_task` queued messages (rounded up),
// so the task count tracks the backlog smoothly instead of in the paper's steps; the
// paper's idle back-off; and no say in handler concurrency (the queue keeps its
// `max_concurrent_calls`). It makes the same decisions, and rejects the same parameters
// with the same messages, as the Rust example `proportional/`.
//
// | parameter | meaning                           | default |
// |-----------|-----------------------------------|---------|
// | per_task  | queued messages per dequeue task  | 200     |
//
// Contract ebb:rules@0.3.0. `scaling_rule.h` and `scaling_rule.c` are generated from
// wit/ebb-rules-0.3.0 by wit-bindgen (see docs/guides/writing-rules.md, "C"). The host keeps one instance
// per rule and calls `configure` once on it before any decision, so the parameter can live
// in a global.

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scaling_rule.h"

typedef exports_ebb_rules_decisions_queue_state_t queue_state_t;
typedef exports_ebb_rules_decisions_idle_context_t idle_context_t;
typedef exports_ebb_rules_decisions_idle_decision_t idle_decision_t;
typedef exports_ebb_rules_decisions_handler_state_t handler_state_t;

static uint64_t per_task = 200;

// ---- parameters -------------------------------------------------------------------------

// A growable message, for errors whose length depends on the operator's input.
typedef struct {
    char *text;
    size_t len, cap;
} message_t;

static void append(message_t *m, const char *bytes, size_t n) {
    if (m->len + n + 1 > m->cap) {
        size_t cap = m->cap ? m->cap : 64;
        while (m->len + n + 1 > cap) cap *= 2;
        char *grown = realloc(m->text, cap);
        if (!grown) abort();  // out of the instance's memory: a fault, the host's rule decides
        m->text = grown;
        m->cap = cap;
    }
    memcpy(m->text + m->len, bytes, n);
    m->len += n;
    m->text[m->len] = '\0';
}

static void append_str(message_t *m, const char *s) { append(m, s, strlen(s)); }

// The value quoted and escaped as Rust's `{:?}` prints a string, so that the operator sees
// the same message whichever language the rule is in (and an unprintable byte as a code).
static void append_quoted(message_t *m, const uint8_t *bytes, size_t n) {
    append_str(m, "\"");
    for (size_t i = 0; i < n; i++) {
        char escaped[16];
        uint8_t c = bytes[i];
        switch (c) {
            case '"': append_str(m, "\\\""); break;
            case '\\': append_str(m, "\\\\"); break;
            case '\n': append_str(m, "\\n"); break;
            case '\r': append_str(m, "\\r"); break;
            case '\t': append_str(m, "\\t"); break;
            case '\0': append_str(m, "\\0"); break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    snprintf(escaped, sizeof escaped, "\\u{%x}", c);
                    append_str(m, escaped);
                } else {
                    append(m, (const char *)&c, 1);
                }
        }
    }
    append_str(m, "\"");
}

static bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// A whole number from 0 to 2^64 - 1, surrounding spaces allowed (Rust's `u64` parse of the
// trimmed text: an optional `+`, digits only, no overflow).
static bool parse_u64(const uint8_t *text, size_t n, uint64_t *out) {
    size_t start = 0, end = n;
    while (start < end && is_space(text[start])) start++;
    while (end > start && is_space(text[end - 1])) end--;
    if (start < end && text[start] == '+') start++;
    if (start == end) return false;
    uint64_t value = 0;
    for (size_t i = start; i < end; i++) {
        if (text[i] < '0' || text[i] > '9') return false;
        uint64_t digit = text[i] - '0';
        if (value > (UINT64_MAX - digit) / 10) return false;
        value = value * 10 + digit;
    }
    *out = value;
    return true;
}

static bool key_is(const scaling_rule_string_t *key, const char *name) {
    return key->len == strlen(name) && memcmp(key->ptr, name, key->len) == 0;
}

static int compare_keys(const void *a, const void *b) {
    const scaling_rule_string_t *x = *(scaling_rule_string_t *const *)a, *y = *(scaling_rule_string_t *const *)b;
    size_t common = x->len < y->len ? x->len : y->len;
    int order = memcmp(x->ptr, y->ptr, common);
    if (order != 0) return order;
    return (x->len > y->len) - (x->len < y->len);
}

static bool reject(message_t *m, scaling_rule_string_t *err) {
    err->ptr = (uint8_t *)m->text;
    err->len = m->len;
    return false;
}

static bool configure(const scaling_rule_list_tuple2_string_string_t *params, scaling_rule_string_t *err) {
    message_t m = {0};
    // The last `per_task` wins when it is given twice, as in the config's own order.
    const scaling_rule_string_t *given = NULL;
    for (size_t i = 0; i < params->len; i++) {
        if (key_is(&params->ptr[i].f0, "per_task")) given = &params->ptr[i].f1;
    }
    uint64_t value = 200;
    if (given && !parse_u64(given->ptr, given->len, &value)) {
        append_str(&m, "parameter \"per_task\": cannot read ");
        append_quoted(&m, given->ptr, given->len);
        append_str(&m, " as u64");
        return reject(&m, err);
    }
    if (value == 0) {
        append_str(&m, "parameter \"per_task\": must be at least 1");
        return reject(&m, err);
    }
    // Any other key is a typo or a parameter of another rule: name each once, sorted.
    const scaling_rule_string_t **unknown = calloc(params->len ? params->len : 1, sizeof *unknown);
    if (!unknown) abort();
    size_t count = 0;
    for (size_t i = 0; i < params->len; i++) {
        if (!key_is(&params->ptr[i].f0, "per_task")) unknown[count++] = &params->ptr[i].f0;
    }
    if (count > 0) {
        qsort(unknown, count, sizeof *unknown, compare_keys);
        append_str(&m, "unknown parameter ");
        for (size_t i = 0; i < count; i++) {
            if (i > 0 && compare_keys(&unknown[i - 1], &unknown[i]) == 0) continue;
            if (i > 0) append_str(&m, ", ");
            append(&m, (const char *)unknown[i]->ptr, unknown[i]->len);
        }
        append_str(&m, " (this rule takes: per_task)");
        free(unknown);
        return reject(&m, err);
    }
    free(unknown);
    per_task = value;
    return true;
}

// Every export owns what it is given (the bindings allocated it in this instance's memory):
// what is not freed leaks at every call, until the instance's memory runs out and it faults.

bool exports_ebb_rules_decisions_configure(scaling_rule_list_tuple2_string_string_t *params, scaling_rule_string_t *err) {
    bool accepted = configure(params, err);
    scaling_rule_list_tuple2_string_string_free(params);
    return accepted;
}

// ---- decisions ---------------------------------------------------------------------------

uint32_t exports_ebb_rules_decisions_optimal_dequeue_task_count(queue_state_t *state) {
    uint64_t depth = state->approximate_depth;
    uint64_t tasks = depth / per_task + (depth % per_task != 0);
    exports_ebb_rules_decisions_queue_state_free(state);
    return tasks > UINT32_MAX ? UINT32_MAX : (uint32_t)tasks;
}

// The paper's back-off, with ebb's factor: min_interval × 1.75^(idle − 1) × random(0.8 .. 1.2),
// within [min_interval, max_interval]; the power by repeated multiplication (at most 200
// times), exactly as the built-in rule computes it, so both give the same milliseconds.
static uint64_t jittered_geometric(uint32_t attempt, uint64_t min_ms, uint64_t max_ms, uint64_t random) {
    double grown = (double)min_ms;
    uint32_t steps = attempt < 200 ? attempt : 200;
    for (uint32_t i = 1; i < steps; i++) grown *= 1.75;
    double unit = (double)random / 18446744073709551616.0;  // [0, 1)
    grown *= 0.8 + unit * (1.2 - 0.8);
    if (grown >= (double)max_ms) return max_ms > min_ms ? max_ms : min_ms;
    uint64_t rounded = (uint64_t)round(grown);
    return rounded > min_ms ? rounded : min_ms;
}

void exports_ebb_rules_decisions_on_queue_empty(idle_context_t *ctx, idle_decision_t *ret) {
    uint64_t delay = jittered_geometric(ctx->idle_count, ctx->min_interval_ms, ctx->max_interval_ms, ctx->random);
    ret->delay_ms = delay;
    ret->stop = ctx->push_enabled || (delay >= ctx->max_interval_ms && ctx->active_tasks > 1);
    exports_ebb_rules_decisions_idle_context_free(ctx);
}

bool exports_ebb_rules_decisions_max_concurrent_calls(handler_state_t *state, uint32_t *ret) {
    (void)ret;
    exports_ebb_rules_decisions_handler_state_free(state);
    return false;  // none: the queue keeps its configured max_concurrent_calls
}
