//! The Grafana dashboard, `deploy/grafana/ebb.json`, queries only metrics a running host's
//! `/metrics` exports: every metric name of every PromQL `expr` (and of the queue variable's
//! `label_values`) is looked up in what `ebb run` serves, so a metric renamed on either side
//! fails here, naming it. It imports as exported dashboards do (a Prometheus data source
//! input every panel uses, unique panel ids), sums a partitioned queue by `logical_queue`, and
//! says which panels stay empty without a rule file.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use ebb_tests::guests;
use serde_json::Value;
use tokio::time::Instant;

use crate::tokens::Host;

const DASHBOARD: &str = include_str!("../../deploy/grafana/ebb.json");

/// PromQL words that are not metric names: aggregations (written before their `by (…)` as
/// often as before their parentheses), binary operators and modifiers.
const KEYWORDS: [&str; 25] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "start",
    "end",
    "step",
];
/// Words whose parenthesised list is of label names, not metrics.
const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The end (exclusive) of the quoted string that starts at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// The end (exclusive) of the bracketed part that starts at `start` (`{…}`, `[…]`, `(…)`),
/// strings inside it skipped whole.
fn skip_group(chars: &[char], start: usize, close: char) -> usize {
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i),
            c if c == close => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The metric names a PromQL expression selects: identifiers that are not a function's or an
/// aggregation's name, a keyword, a label (inside `{…}` or a `by (…)` list), a number or
/// duration, a string, or a Grafana variable (`$queue`, `${queue}`, `$__rate_interval`).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '{' {
            i = skip_group(&chars, i, '}');
        } else if c == '[' {
            i = skip_group(&chars, i, ']');
        } else if c == '#' {
            i = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |n| i + n);
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                i = skip_group(&chars, i, '}');
            } else {
                while i < chars.len() && is_name_char(chars[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number (1e3, 0x1f, .5) or a duration (5m, 1h30m).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_') {
                i += 1;
            }
        } else if is_name_start(c) {
            let start = i;
            while i < chars.len() && is_name_char(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let called = chars.get(next) == Some(&'(');
            if LABEL_LISTS.contains(&word.as_str()) {
                if called {
                    i = skip_group(&chars, next, ')');
                }
            } else if !called && !KEYWORDS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every PromQL expression of the dashboard, with where it is: each `expr`, and the metric
/// selector of each `label_values(metric, label)` variable query.
fn expressions(value: &Value, at: &str, found: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                let here = format!("{at}.{key}");
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => found.push((here, expr.clone())),
                    ("query" | "definition", Value::String(query)) if query.trim_start().starts_with("label_values(") => {
                        let inside = query.trim_start().trim_start_matches("label_values(");
                        let selector = inside.rsplit_once(',').map_or(inside, |(selector, _)| selector);
                        found.push((here, selector.to_string()));
                    }
                    _ => expressions(value, &here, found),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                expressions(item, &format!("{at}[{i}]"), found);
            }
        }
        _ => {}
    }
}

/// The names a query may use for what `/metrics` (OpenMetrics text) exports: every sample's
/// name, and each family with the suffixes its type gives its samples (`_total` for a
/// counter; `_bucket`, `_sum`, `_count` for a histogram; `_sum`, `_count` for a summary), so a
/// histogram with no sample yet still counts and a suffix never fits a family of another type.
fn exported_names(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(family), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total", "_created"],
                "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count", "_created", "_gcount", "_gsum"],
                "summary" => &["", "_sum", "_count", "_created"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|suffix| format!("{family}{suffix}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// The metric names of `dashboard` that `/metrics` does not export, each with where it is used.
fn unexported(dashboard: &Value, metrics: &str) -> BTreeMap<String, String> {
    let exported = exported_names(metrics);
    let mut found = Vec::new();
    expressions(dashboard, "", &mut found);
    let mut missing = BTreeMap::new();
    for (at, expr) in found {
        for name in metric_names(&expr) {
            if !exported.contains(&name) {
                missing.entry(name).or_insert(at.clone());
            }
        }
    }
    missing
}

/// The dashboard, parsed.
fn dashboard() -> Result<Value> {
    serde_json::from_str(DASHBOARD).context("deploy/grafana/ebb.json is not JSON")
}

/// `/metrics` of a host whose queue `orders` has `queue` settings and `rule` as its rule
/// file, once the rule has loaded (if any) and one message was sent.
async fn scrape(queue: &str, rule: Option<&str>) -> Result<String> {
    let host = Host::start_with("token = \"t0ken\"", queue, rule, &[]).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while rule.is_some() {
        let status: Value = serde_json::from_str(&host.call("GET", "/status", Some("t0ken")).await?.body)?;
        if status["queues"][0]["rule"]["file"] == "orders.wasm" {
            break;
        }
        ensure!(Instant::now() < deadline, "the rule did not load: {status}\n{}", host.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(host.call("POST", "/queues/orders/messages", Some("t0ken")).await?.status == 201);
    let answer = host.call("GET", "/metrics", Some("t0ken")).await?;
    ensure!(answer.status == 200, "{answer:?}");
    Ok(answer.body)
}

/// Every panel of the dashboard, those inside a collapsed row included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let top = dashboard["panels"].as_array().map_or(&[][..], Vec::as_slice);
    top.iter().flat_map(|panel| std::iter::once(panel).chain(panel["panels"].as_array().into_iter().flatten())).collect()
}

/// The metric names `panel`'s queries select.
fn panel_metrics(panel: &Value) -> BTreeSet<String> {
    let mut found = Vec::new();
    expressions(panel, "", &mut found);
    found.iter().flat_map(|(_, expr)| metric_names(expr)).collect()
}

/// The metrics of `dashboard` some selector filters by `logical_queue`, each with where.
fn filtered_by_logical_queue(dashboard: &Value) -> BTreeMap<String, String> {
    let mut found = Vec::new();
    expressions(dashboard, "", &mut found);
    let mut names = BTreeMap::new();
    for (at, expr) in found {
        for (open, _) in expr.match_indices('{') {
            let name: String = expr[..open].chars().rev().take_while(|&c| is_name_char(c)).collect::<Vec<_>>().into_iter().rev().collect();
            let inside = expr[open..].split('}').next().unwrap_or_default();
            if !name.is_empty() && inside.contains("logical_queue") {
                names.entry(name).or_insert(at.clone());
            }
        }
    }
    names
}

#[test]
fn promql_names_are_told_from_functions_labels_keywords_and_variables() {
    let expr = "sum by (queue, kind) (rate(ebb_a_total{queue=~\"$queue\", kind!=\"x{y}\"}[$__rate_interval])) * 3600 \
                / on (instance) group_left(job) clamp_min(ebb_b, 0.001) > bool 1e3 \
                or max(ebb_c offset 5m) without (le) - histogram_quantile(0.9, sum(rate(ebb_d_bucket[5m])) by (le)) \
                + ${metric_var} + count(ebb_e:recorded) # ebb_in_a_comment";
    let names: Vec<String> = metric_names(expr).into_iter().collect();
    assert_eq!(names, ["ebb_a_total", "ebb_b", "ebb_c", "ebb_d_bucket", "ebb_e:recorded"]);
    assert_eq!(
        metric_names("time() - ebb_rule_loaded_timestamp_seconds{queue=~\"$queue\"}").into_iter().collect::<Vec<_>>(),
        ["ebb_rule_loaded_timestamp_seconds"]
    );
}

#[test]
fn a_suffix_fits_only_a_family_of_its_type() {
    let metrics = "# TYPE ebb_calls counter\n# TYPE ebb_wait histogram\n# TYPE ebb_depth gauge\nebb_depth{queue=\"a\"} 3\n# EOF\n";
    let exported = exported_names(metrics);
    for name in ["ebb_calls_total", "ebb_wait_bucket", "ebb_wait_sum", "ebb_wait_count", "ebb_depth"] {
        assert!(exported.contains(name), "{name}");
    }
    for name in ["ebb_calls", "ebb_calls_bucket", "ebb_depth_total", "ebb_depth_count", "ebb_wait", "EOF"] {
        assert!(!exported.contains(name), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_grafana_dashboard_queries_is_exported_by_metrics() -> Result<()> {
    let dashboard = dashboard()?;
    // A rule file, so the rule's metrics (its load time among them) are exported.
    let metrics = scrape("rule = \"orders.wasm\"", Some(guests::PAPER_DEFAULT)).await?;

    let mut found = Vec::new();
    expressions(&dashboard, "", &mut found);
    let used: BTreeSet<String> = found.iter().flat_map(|(_, expr)| metric_names(expr)).collect();
    ensure!(found.len() >= 20 && used.len() >= 20, "only {} expressions and {} metric names found: {used:?}", found.len(), used.len());
    let missing = unexported(&dashboard, &metrics);
    ensure!(missing.is_empty(), "the dashboard queries metrics /metrics does not export (name: first use):\n{missing:#?}");

    // The check fails for any one metric renamed, on either side.
    for name in &used {
        let renamed: Value = serde_json::from_str(&DASHBOARD.replace(name.as_str(), &format!("{name}_renamed")))?;
        ensure!(unexported(&renamed, &metrics).contains_key(&format!("{name}_renamed")), "renaming {name} in the dashboard went unnoticed");
        let family = name.strip_suffix("_total").unwrap_or(name);
        let metrics_renamed = metrics.replace(&format!("{family} "), &format!("{family}_renamed ")).replace(&format!("{name}{{"), &format!("{name}_renamed{{"));
        ensure!(unexported(&dashboard, &metrics_renamed).contains_key(name), "renaming {name} in /metrics went unnoticed");
    }
    Ok(())
}

/// Issue 38, item 8: the dashboard named no data source input, so Grafana's import did not ask
/// for one (panels pointed at a `${datasource}` variable with nothing chosen). As Grafana's
/// "Export for sharing externally" writes it: a Prometheus `__inputs` entry, and every panel,
/// query and query variable pointing at it.
#[test]
fn the_grafana_dashboard_asks_for_its_prometheus_data_source_on_import() -> Result<()> {
    let dashboard = dashboard()?;
    let inputs = dashboard["__inputs"].as_array().context("no __inputs")?;
    let input = inputs.iter().find(|i| i["type"] == "datasource" && i["pluginId"] == "prometheus").context("no Prometheus data source input")?;
    let name = input["name"].as_str().context("the input has no name")?;
    let uid = format!("${{{name}}}");
    let mut users = Vec::new();
    for panel in panels(&dashboard).into_iter().filter(|p| p["type"] != "row") {
        users.push((format!("panel {}", panel["title"]), &panel["datasource"]));
        let targets = panel["targets"].as_array().context("a panel without targets")?;
        users.extend(targets.iter().map(|t| (format!("a target of panel {}", panel["title"]), &t["datasource"])));
    }
    let variables = dashboard["templating"]["list"].as_array().context("no variables")?;
    users.extend(variables.iter().filter(|v| v["type"] == "query").map(|v| (format!("variable {}", v["name"]), &v["datasource"])));
    ensure!(users.len() >= 40, "only {} data source users found", users.len());
    for (what, datasource) in users {
        ensure!(datasource["type"] == "prometheus" && datasource["uid"] == uid.as_str(), "{what} uses {datasource}, not the input {uid}");
    }
    ensure!(!DASHBOARD.contains("${datasource}"), "a query still names the ${{datasource}} variable");
    Ok(())
}

/// Issue 38, item 8: no panel had an `id`, which Grafana needs to link, embed and edit a panel.
#[test]
fn every_grafana_panel_has_a_unique_id() -> Result<()> {
    let dashboard = dashboard()?;
    let mut seen = BTreeMap::new();
    for panel in panels(&dashboard) {
        let id = panel["id"].as_u64().with_context(|| format!("panel {} has no id", panel["title"]))?;
        if let Some(other) = seen.insert(id, panel["title"].clone()) {
            anyhow::bail!("panels {other} and {} share the id {id}", panel["title"]);
        }
    }
    ensure!(seen.len() >= 20, "only {} panels", seen.len());
    Ok(())
}

/// Issue 38, item 8: a partitioned queue showed as one line per partition with no way to sum
/// them. The dashboard picks ebb queues by `logical_queue` and sums each over its partitions;
/// only the Partitions row splits a queue by its storage queue. Against a host whose queue has
/// two partitions, every metric filtered by `logical_queue` has series carrying it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_sums_a_partitioned_queue_by_logical_queue() -> Result<()> {
    let dashboard = dashboard()?;
    let variables = dashboard["templating"]["list"].as_array().context("no variables")?;
    ensure!(
        variables.iter().any(|v| v["name"] == "logical_queue" && v["definition"].as_str().is_some_and(|d| d.ends_with(", logical_queue)"))),
        "no logical_queue variable: {variables:?}"
    );
    let mut summed = 0;
    let mut in_partitions_row = false;
    for panel in dashboard["panels"].as_array().context("no panels")? {
        if panel["type"] == "row" {
            in_partitions_row = panel["title"] == "Partitions";
            continue;
        }
        let mut found = Vec::new();
        expressions(panel, "", &mut found);
        for (_, expr) in found {
            let by_queue = expr.contains("by (queue)") || expr.contains("by (queue,");
            ensure!(in_partitions_row || !by_queue, "panel {} splits by partition outside the Partitions row: {expr}", panel["title"]);
            summed += usize::from(expr.contains("by (logical_queue"));
        }
    }
    ensure!(summed >= 15, "only {summed} expressions group by logical_queue");

    let filtered = filtered_by_logical_queue(&dashboard);
    ensure!(filtered.len() >= 15, "only {} metrics filtered by logical_queue: {filtered:?}", filtered.len());
    let metrics = scrape("partitions = 2", None).await?;
    for (name, at) in filtered {
        let carries = |partition: &str| {
            let series = format!("{name}{{queue=\"{partition}\",logical_queue=\"orders\"");
            metrics.lines().any(|line| line.starts_with(&series))
        };
        let absent = !metrics.lines().any(|line| line.starts_with(&format!("{name}{{")));
        ensure!(
            absent || (carries("orders-0") && carries("orders-1")),
            "{name} (at {at}) has no series labelled logical_queue=\"orders\" per partition:\n{metrics}"
        );
    }
    Ok(())
}

/// Issue 38, item 8: the rule-swap panels stayed empty on a queue without a rule file and did
/// not say why. A panel that queries a metric a host without a rule file does not export
/// says "Needs a rule file" in its description, and only such a panel says it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_panels_empty_without_a_rule_file_say_they_need_one() -> Result<()> {
    let dashboard = dashboard()?;
    let exported = exported_names(&scrape("", None).await?);
    let mut needing = 0;
    for panel in panels(&dashboard) {
        let absent: Vec<String> = panel_metrics(panel).into_iter().filter(|name| !exported.contains(name)).collect();
        let description = panel["description"].as_str().unwrap_or_default();
        let says = description.contains("Needs a rule file");
        let needs = !absent.is_empty();
        ensure!(says == needs, "panel {} queries {absent:?} absent without a rule file, and its description says: {description:?}", panel["title"]);
        needing += usize::from(says);
    }
    ensure!(needing >= 2, "only {needing} panels need a rule file");
    Ok(())
}
