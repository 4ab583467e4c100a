//! `ebb status`: the running host's `/status`, read into [`HostStatus`] and shown as a table
//! with a line per note (a paused queue, a rule that cannot load, is quarantined or refused),
//! the bus and the host's cost; or, with `--json`, the answer as the host sent it.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::client::{TokenArgs, api_base, client, load};
use crate::rules::{RuleState, RuleStatus};
use crate::status::{BusStatus, CostStatus, HostStatus, QueueStatus};

/// The table's columns: title and alignment.
const COLUMNS: [(&str, Align); 13] = [
    ("queue", Align::Left),
    ("depth", Align::Right),
    ("tasks a/t/pk", Align::Right),
    ("in-flight", Align::Right),
    ("calls/limit", Align::Right),
    ("processed", Align::Right),
    ("failed", Align::Right),
    ("poisoned", Align::Right),
    ("storage tx", Align::Right),
    ("empty gets", Align::Right),
    ("tx/h all/idle", Align::Right),
    ("$/month", Align::Right),
    ("rule", Align::Left),
];

pub async fn status(config_path: &Path, token: &TokenArgs, json: bool) -> Result<()> {
    let (config, token) = load(config_path, token)?;
    let url = format!("{}/status", api_base(&config));
    let body = fetch(&url, token.as_deref()).await?;
    if json {
        // As sent: fields this ebb does not know (a newer host's) are shown too.
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    let status: HostStatus = serde_json::from_value(body).with_context(|| format!("{url} answered a status this ebb cannot read"))?;
    print!("{}", report(&status));
    Ok(())
}

/// `/status` at `url`, as JSON: an error unless the host answered 2xx with an ebb status.
async fn fetch(url: &str, token: Option<&str>) -> Result<Value> {
    let response = client(token)?.get(url).send().await.with_context(|| format!("no host answers at {url}"))?;
    let status = response.status();
    let bytes = response.bytes().await?;
    // A refusal as a sentence: the host's reason and what to do, not its JSON.
    if !status.is_success() {
        bail!("{}", super::client::refusal(status, &super::client::reason_of(&String::from_utf8_lossy(&bytes))));
    }
    let body: Value = serde_json::from_slice(&bytes).context("the host answered with invalid JSON")?;
    // Something else may listen at the configured address: say so, not an empty table.
    if !body["queues"].is_array() {
        bail!("{url} answered JSON that is not an ebb status (no `queues` list): is `[api] listen` the address of this host?");
    }
    Ok(body)
}

/// What `ebb status` prints: the table, the notes, the bus and the host's cost.
fn report(status: &HostStatus) -> String {
    let rows: Vec<Vec<String>> = status.queues.iter().map(queue_row).collect();
    let mut out = table(&COLUMNS, &rows);
    for queue in &status.queues {
        for note in queue_notes(queue) {
            out.push_str(&format!("{note}\n"));
        }
    }
    if let Some(bus) = &status.bus {
        out.push_str(&bus_line(bus));
    }
    if let Some(total) = &status.cost {
        out.push_str(&total_lines(total));
    }
    out
}

/// A queue's row of the table.
fn queue_row(q: &QueueStatus) -> Vec<String> {
    let (total, empty_gets) = match q.transactions {
        Some(t) => (t.total().to_string(), t.gets_empty.to_string()),
        None => ("-".into(), "-".into()),
    };
    let source = q.last_task_count.as_ref().map_or("-".into(), |d| wire_name(&d.decision.source));
    vec![
        q.queue.clone(),
        q.approximate_depth.to_string(),
        format!("{}/{}/{}", q.active_tasks, q.target_tasks, q.peak_tasks),
        q.in_flight.to_string(),
        format!("{}/{}", q.handler_calls, q.concurrency_limit),
        q.processed.to_string(),
        q.failed.to_string(),
        q.poisoned.to_string(),
        total,
        empty_gets,
        q.cost.as_ref().map_or("-".into(), |c| format!("{}/{}", rate(c.transactions_per_hour), rate(c.idle_transactions_per_hour))),
        q.cost.as_ref().map_or("-".into(), |c| dollars(c.usd_per_month)),
        format!("{}, last decision: {source}", rule_cell(q.rule.as_ref())),
    ]
}

/// The lines under the table about a queue: its rule's notes, and its pause.
fn queue_notes(q: &QueueStatus) -> Vec<String> {
    let mut notes = q.rule.as_ref().map(|rule| rule_notes(&q.queue, rule)).unwrap_or_default();
    if let Some(pause) = q.paused {
        let until = pause.until_ms.map_or_else(
            || "until resumed".to_string(),
            |ms| format!("until {}", humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms))),
        );
        notes.push(format!("{}: paused {until} (no get; ebb queue resume {})", q.queue, q.queue));
    }
    notes
}

fn bus_line(bus: &BusStatus) -> String {
    let state = if bus.connected { "subscribed" } else { "DOWN (queues poll)" };
    format!(
        "bus {}: {state}; received {}, published {}, publish failures {}, outages {}, ignored {}\n",
        bus.engine, bus.received, bus.published, bus.publish_failures, bus.outages, bus.ignored
    )
}

/// The host's cost: the rates and the month, and what unanswered attempts may add.
fn total_lines(total: &CostStatus) -> String {
    let mut out = format!(
        "total: {} transactions/h ({} idle), ${} a month at this rate (${} of it idle), at ${} per 10,000 transactions\n",
        rate(total.transactions_per_hour),
        rate(total.idle_transactions_per_hour),
        dollars(total.usd_per_month),
        dollars(total.idle_usd_per_month),
        total.price_per_10k_transactions,
    );
    // Attempts that got no answer are not in the figures above; the service may have
    // billed them.
    if total.unanswered_transactions_per_hour > 0.0 {
        out.push_str(&format!(
            "and up to {} attempts/h that got no answer (${} a month more at most), which the service may have billed\n",
            rate(total.unanswered_transactions_per_hour),
            dollars(total.unanswered_usd_per_month),
        ));
    }
    out
}

/// A value's name in the JSON of `/status` (a [`RuleState`]'s `built-in`, a source's `rule`).
fn wire_name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| "-".into())
}

/// The first 12 hex digits of a sha256, as the status line shows it.
fn short_sha(sha: Option<&str>) -> String {
    sha.unwrap_or("-").chars().take(12).collect()
}

/// The file name of a path as `/status` gives it.
fn file_name(path: Option<&str>) -> String {
    path.map_or("-".into(), |p| Path::new(p).file_name().map_or(p.to_string(), |n| n.to_string_lossy().into_owned()))
}

/// A queue's rule in a few words, for the table: which file, its sha256 and contract, and its
/// faults; or why no file decides. (An older host sends no `state`: it reads as built-in, and
/// is told from `file`.)
fn rule_cell(rule: Option<&RuleStatus>) -> String {
    let Some(rule) = rule else { return "built-in".into() };
    let file = rule.file.as_deref();
    match rule.state {
        RuleState::Error => format!("ERROR: {} not loaded (built-in decides)", file_name(rule.configured_file.as_deref())),
        RuleState::Compiling => format!("{} compiling (built-in decides)", file_name(rule.configured_file.as_deref())),
        RuleState::Loaded | RuleState::Quarantined | RuleState::BuiltIn if file.is_some() => {
            let mut text = format!("{} ({}", file.unwrap_or("-"), short_sha(rule.sha256.as_deref()));
            if let Some(contract) = rule.contract {
                text.push_str(&format!(", contract {contract}"));
            }
            text.push_str(&format!(", {} fault{})", rule.faults, super::client::plural(rule.faults)));
            if rule.state == RuleState::Quarantined {
                text.push_str(" QUARANTINED (built-in decides)");
            }
            text
        }
        _ => "built-in".into(),
    }
}

/// What a person must know about a queue's rule beyond its cell, a line each: a load error,
/// a quarantine, a refused newer file.
fn rule_notes(queue: &str, rule: &RuleStatus) -> Vec<String> {
    let mut notes = Vec::new();
    let configured = rule.configured_file.as_deref().unwrap_or("-");
    if rule.state == RuleState::Error {
        let error = rule.error.as_deref().unwrap_or("-");
        notes.push(format!("{queue}: error: rule {configured} cannot load: {error}; the built-in rule decides until the file is fixed"));
    }
    if let Some(quarantine) = &rule.quarantine {
        let run = match quarantine.export {
            Some(export) => format!("{} faulted {} times in a row", export.name(), quarantine.faults),
            None => format!("its instance could not be rebuilt {} times in a row", quarantine.faults),
        };
        notes.push(format!(
            "{queue}: quarantined since {}: {run} (last: {}); the built-in rule decides until {configured} changes",
            humantime::format_rfc3339(quarantine.since),
            quarantine.reason
        ));
    }
    if let Some(refused) = &rule.refused {
        let sha = refused.sha256.as_deref().map_or(String::new(), |sha| format!(" (sha256 {})", short_sha(Some(sha))));
        notes.push(format!(
            "{queue}: refused: {}{sha}: {}; {} ({}) goes on deciding",
            refused.file,
            refused.reason,
            rule.file.as_deref().unwrap_or("-"),
            short_sha(rule.sha256.as_deref())
        ));
    }
    notes
}

/// A rate per hour, rounded to a whole transaction.
fn rate(value: f64) -> String {
    format!("{value:.0}")
}

/// US dollars, to the cent (to the tenth of a cent under a cent).
fn dollars(value: f64) -> String {
    if value != 0.0 && value.abs() < 0.01 { format!("{value:.4}") } else { format!("{value:.2}") }
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// Columns as wide as their widest cell or title, one space apart; the last is not padded.
fn table(columns: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> =
        columns.iter().enumerate().map(|(i, (title, _))| rows.iter().map(|r| r[i].chars().count()).chain([title.chars().count()]).max().unwrap_or(0)).collect();
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (text, (_, align))) in cells.iter().zip(columns).enumerate() {
            let last = i + 1 == columns.len();
            if i > 0 {
                out.push(' ');
            }
            let pad = " ".repeat(widths[i] - text.chars().count());
            match align {
                Align::Left if last => out.push_str(text),
                Align::Left => out.push_str(&format!("{text}{pad}")),
                Align::Right => out.push_str(&format!("{pad}{text}")),
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(columns.iter().map(|(title, _)| *title).collect());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::client::cell;

    /// A rule's status as a host sends it.
    fn rule(json: Value) -> RuleStatus {
        serde_json::from_value(json).expect("a rule status")
    }

    #[test]
    fn a_rules_cell_and_notes_tell_its_state() {
        let loaded = rule(serde_json::json!({"state": "loaded", "file": "orders.wasm", "sha256": "0123456789abcdef", "contract": "0.2.0", "faults": 1}));
        assert_eq!(rule_cell(Some(&loaded)), "orders.wasm (0123456789ab, contract 0.2.0, 1 fault)");
        assert!(rule_notes("orders", &loaded).is_empty());
        assert_eq!(rule_cell(None), "built-in");
        assert_eq!(rule_cell(Some(&rule(serde_json::json!({"state": "built-in", "file": null})))), "built-in");
        // A host from before `state` still shows its rule.
        assert_eq!(rule_cell(Some(&rule(serde_json::json!({"file": "a.wasm", "sha256": "ff"})))), "a.wasm (ff, 0 faults)");

        let error =
            rule(serde_json::json!({"state": "error", "configured_file": "rules/orders.wasm", "file": null, "error": "the rule rejected its parameters: no"}));
        assert_eq!(rule_cell(Some(&error)), "ERROR: orders.wasm not loaded (built-in decides)");
        assert_eq!(
            rule_notes("orders", &error),
            ["orders: error: rule rules/orders.wasm cannot load: the rule rejected its parameters: no; the built-in rule decides until the file is fixed"]
        );

        let quarantined = rule(serde_json::json!({
            "state": "quarantined", "configured_file": "rules/orders.wasm", "file": "orders.wasm", "sha256": "0123456789abcdef", "faults": 5,
            "quarantine": {"export": "on-queue-empty", "faults": 5, "since": "2026-11-25T15:00:00Z", "reason": "trapped: unreachable"},
            "refused": {"file": "rules/orders.wasm", "sha256": "fedcba9876543210", "reason": "configure failed", "at": "2026-11-25T15:01:00Z"},
        }));
        assert_eq!(rule_cell(Some(&quarantined)), "orders.wasm (0123456789ab, 5 faults) QUARANTINED (built-in decides)");
        assert_eq!(
            rule_notes("orders", &quarantined),
            [
                "orders: quarantined since 2026-11-25T15:00:00Z: on-queue-empty faulted 5 times in a row (last: trapped: unreachable); the built-in rule decides until rules/orders.wasm changes",
                "orders: refused: rules/orders.wasm (sha256 fedcba987654): configure failed; orders.wasm (0123456789ab) goes on deciding",
            ]
        );
    }

    #[test]
    fn table_columns_line_up_with_the_header_and_null_is_a_dash() {
        let columns = [("queue", Align::Left), ("depth", Align::Right), ("rule", Align::Left)];
        let rows = vec![
            vec!["a-very-long-queue-name".to_string(), cell(&Value::Null), "built-in".into()],
            vec!["q".into(), cell(&serde_json::json!(12345678)), "x".into()],
        ];
        let text = table(&columns, &rows);
        assert_eq!(text, "queue                     depth rule\na-very-long-queue-name        - built-in\nq                      12345678 x\n");
    }

    #[test]
    fn the_report_of_a_full_status_has_a_row_per_queue_its_notes_the_bus_and_the_total() -> anyhow::Result<()> {
        let status: HostStatus = serde_json::from_str(include_str!("../status/example.json"))?;
        let report = report(&status);
        let lines: Vec<&str> = report.lines().collect();
        assert!(lines[0].starts_with("queue ") && lines[1].starts_with("orders "), "{report}");
        assert!(lines[1].ends_with("QUARANTINED (built-in decides), last decision: rule"), "{report}");
        assert!(lines.iter().any(|l| l.starts_with("orders: paused until ")), "{report}");
        assert!(lines.iter().any(|l| l.starts_with("bus redis redis://127.0.0.1:6379: subscribed; received 4")), "{report}");
        assert!(lines.iter().any(|l| l.starts_with("total: 1200 transactions/h (720 idle), $0.86 a month")), "{report}");
        Ok(())
    }
}
