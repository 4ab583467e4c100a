//! The table `ebb simulate` prints.

use super::{RuleReport, SimReport};

/// The report as a table, one row per rule, with a heading line.
pub fn table(report: &SimReport) -> String {
    let mut rows: Vec<Vec<String>> = report.rules.iter().map(rule_row).collect();
    rows.push(floor_row(report));
    heading(report) + &aligned(&rows)
}

/// The columns, in order.
const TITLES: [&str; 18] = [
    "rule",
    "billed",
    "consumer",
    "per msg",
    "× floor",
    "idle",
    "useful",
    "$/month",
    "idle $/month",
    "p50 ms",
    "p99 ms",
    "max ms",
    "peak tasks",
    "peak backlog",
    "handled",
    "calls/s",
    "handler p99 ms",
    "wall s",
];

/// What was simulated, and what the figures count.
fn heading(report: &SimReport) -> String {
    let mut out = format!(
        "scenario {} ({} simulated, {} messages), backend {}, handler {}, ${} per 10,000 transactions, $/month for {} listener{}\n",
        report.scenario,
        super::scenario::show_duration(std::time::Duration::from_secs_f64(report.duration_secs)),
        report.messages,
        report.backend.name(),
        report.handler_time,
        report.price_per_10k_transactions,
        report.listeners,
        if report.listeners == 1 { "" } else { "s" },
    );
    if report.duration_secs < 86_400.0 {
        // The paper's framing: 22 idle hours a day, the rest not counted. A shorter run is
        // taken as a whole day's activity, not as a rate.
        out.push_str("($/month counts this run as a whole day's activity, 30 times over: the rest of each day costs nothing)\n");
    }
    out.push_str(&format!(
        "consumer = billed transactions but puts; floor = {} that fetch each message within W of its arrival\n",
        report.backend.floor_words()
    ));
    out
}

/// A ratio with two decimals; `-` when there is none.
fn ratio(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |v| format!("{v:.2}"))
}

/// One rule's cells, in the order of [`TITLES`].
fn rule_row(r: &RuleReport) -> Vec<String> {
    let latency = |f: fn(&super::Latency) -> u64| r.latency.as_ref().map_or("-".to_string(), |l| f(l).to_string());
    vec![
        r.rule.clone(),
        r.billed_transactions.to_string(),
        r.consumer_calls.to_string(),
        ratio(r.calls_per_message),
        ratio(r.ratio_to_floor),
        r.idle_transactions.to_string(),
        r.useful_transactions.to_string(),
        format!("{:.2}", r.usd_per_month),
        format!("{:.2}", r.idle_usd_per_month),
        latency(|l| l.p50_ms),
        latency(|l| l.p99_ms),
        latency(|l| l.max_ms),
        r.peak_tasks.to_string(),
        r.peak_backlog.to_string(),
        format!("{}/{}", r.handled, r.messages),
        format!("{:.1}", r.throughput_per_sec),
        r.handler_p99_ms.map_or("-".to_string(), |ms| ms.to_string()),
        format!("{:.2}", r.wall_secs),
    ]
}

/// The floor: what no rule can beat while fetching every message within W.
fn floor_row(report: &SimReport) -> Vec<String> {
    let budget = humantime::format_duration(std::time::Duration::from_millis(report.wait_budget_ms)).to_string();
    let mut floor = vec!["-".to_string(); TITLES.len()];
    floor[0] = format!("floor (W = {budget})");
    floor[2] = report.floor_calls.to_string();
    floor[3] = ratio((report.messages > 0).then(|| report.floor_calls as f64 / report.messages as f64));
    floor[4] = if report.floor_calls > 0 { "1.00".into() } else { "-".into() };
    floor[11] = format!("≤ {}", report.wait_budget_ms);
    floor
}

/// The titles and the rows in columns: the first left-aligned, the others right-aligned.
fn aligned(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..TITLES.len()).map(|i| rows.iter().map(|r| r[i].chars().count()).chain([TITLES[i].len()]).max().unwrap_or(0)).collect();
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = " ".repeat(widths[i] - cell.chars().count());
            if i == 0 {
                text.push_str(&format!("{cell}{pad}"));
            } else {
                text.push_str(&format!("  {pad}{cell}"));
            }
        }
        text.push('\n');
        text
    };
    let mut out = line(TITLES.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}
