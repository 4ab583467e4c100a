//! What `ebb bench http` prints: each contender's medians, ebb's ratios to the baselines,
//! and the goals of issue 24, each met or not. A goal not met is a finding, not a failure:
//! the command exits 0 and says `met: false`.

use std::fmt::Write as _;
use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::contenders::{Contender, EbbSettings, ListenerPeaks, Run};
use crate::plan::{Cell, HttpBench};

/// One contender's medians over the rounds.
#[derive(Debug, Clone)]
pub(crate) struct Figures {
    pub(crate) messages: u64,
    pub(crate) msg_per_s: f64,
    pub(crate) cpu_ms_per_1000: f64,
    /// The app's CPU over the same runs (context: a saturated app caps everyone alike).
    pub(crate) app_cpu_ms_per_1000: Option<f64>,
    /// ebb: the part of `cpu_ms_per_1000` spent in the store's writer thread.
    pub(crate) writer_cpu_ms_per_1000: Option<f64>,
    /// ebb: the most tasks and handler calls at once, over every round.
    pub(crate) peaks: Option<ListenerPeaks>,
    pub(crate) store: Option<StoreFigures>,
    /// Each round's msg/s, in order.
    pub(crate) rounds_msg_per_s: Vec<f64>,
}

/// Bytes written to the store's file per message, medians.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreFigures {
    pub(crate) put: f64,
    pub(crate) processing: f64,
    /// Put, lease and delete: a message's whole life in the store.
    pub(crate) total: f64,
    /// Commits during the run per 1,000 messages: how many changes each commit carried.
    pub(crate) commits_per_1000: f64,
    /// Bytes written during the run per commit.
    pub(crate) bytes_per_commit: f64,
}

/// The median; the mean of the middle two for an even count.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

impl Figures {
    fn of(runs: &[Run]) -> Figures {
        let per_message = |value: f64, run: &Run| value / run.messages.max(1) as f64;
        let msg_per_s: Vec<f64> = runs.iter().map(|r| r.messages as f64 / r.elapsed.as_secs_f64().max(1e-9)).collect();
        let app: Option<Vec<f64>> = runs.iter().map(|r| r.server_cpu.map(|cpu| per_message(cpu.as_secs_f64() * 1e6, r))).collect();
        let writer: Option<Vec<f64>> = runs.iter().map(|r| r.writer_cpu.map(|cpu| per_message(cpu.as_secs_f64() * 1e6, r))).collect();
        let stores: Option<Vec<_>> = runs.iter().map(|r| r.store.map(|s| (per_message(s.put as f64, r), per_message(s.processing as f64, r)))).collect();
        let commits: Option<Vec<_>> = runs
            .iter()
            .map(|r| r.store.map(|s| (per_message(s.processing_commits as f64 * 1000.0, r), s.processing as f64 / s.processing_commits.max(1) as f64)))
            .collect();
        Figures {
            messages: runs.first().map_or(0, |r| r.messages),
            msg_per_s: median(msg_per_s.clone()),
            cpu_ms_per_1000: median(runs.iter().map(|r| per_message(r.cpu.as_secs_f64() * 1e6, r)).collect()),
            app_cpu_ms_per_1000: app.filter(|a| !a.is_empty()).map(median),
            writer_cpu_ms_per_1000: writer.filter(|w| !w.is_empty()).map(median),
            peaks: runs.iter().filter_map(|r| r.listener).reduce(|a, b| ListenerPeaks { tasks: a.tasks.max(b.tasks), calls: a.calls.max(b.calls) }),
            store: stores.filter(|s| !s.is_empty()).map(|s| StoreFigures {
                put: median(s.iter().map(|(put, _)| *put).collect()),
                processing: median(s.iter().map(|(_, processing)| *processing).collect()),
                total: median(s.iter().map(|(put, processing)| put + processing).collect()),
                commits_per_1000: median(commits.iter().flatten().map(|(per_1000, _)| *per_1000).collect()),
                bytes_per_commit: median(commits.iter().flatten().map(|(_, bytes)| *bytes).collect()),
            }),
            rounds_msg_per_s: msg_per_s,
        }
    }

    fn json(&self, body_bytes: u32) -> Value {
        let mut figures = json!({
            "messages": self.messages,
            "msg_per_s": round(self.msg_per_s, 1),
            "cpu_ms_per_1000": round(self.cpu_ms_per_1000, 2),
            "rounds_msg_per_s": self.rounds_msg_per_s.iter().map(|v| round(*v, 1)).collect::<Vec<_>>(),
        });
        if let Some(app) = self.app_cpu_ms_per_1000 {
            figures["app_cpu_ms_per_1000"] = json!(round(app, 2));
        }
        if let Some(peaks) = self.peaks {
            figures["peak_tasks"] = json!(peaks.tasks);
            figures["peak_handler_calls"] = json!(peaks.calls);
        }
        if let Some(writer) = self.writer_cpu_ms_per_1000 {
            figures["store_writer_cpu_ms_per_1000"] = json!(round(writer, 2));
        }
        if let Some(store) = self.store {
            figures["store_bytes_written_per_message"] = json!({
                "put": round(store.put, 1),
                "processing": round(store.processing, 1),
                "total": round(store.total, 1),
                "total_over_body": round(store.total / f64::from(body_bytes), 3),
            });
            figures["store_commits_per_1000"] = json!(round(store.commits_per_1000, 1));
            figures["store_bytes_per_commit"] = json!(round(store.bytes_per_commit, 0));
        }
        figures
    }
}

fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

/// A goal of issue 24 for one ebb variant in one cell.
#[derive(Debug, Clone)]
pub(crate) struct Goal {
    pub(crate) name: &'static str,
    pub(crate) what: &'static str,
    pub(crate) value: f64,
    pub(crate) bound: f64,
    /// The value must be at most the bound (else at least).
    pub(crate) at_most: bool,
}

impl Goal {
    pub(crate) fn met(&self) -> bool {
        if self.at_most { self.value <= self.bound } else { self.value >= self.bound }
    }

    fn json(&self) -> Value {
        let mut goal = json!({ "goal": self.name, "value": round(self.value, 3), "met": self.met() });
        goal[if self.at_most { "at_most" } else { "at_least" }] = json!(self.bound);
        goal
    }
}

/// The goals that apply to a cell: CPU and throughput against the baselines everywhere, the
/// throughput floor against reqwest at the two sizes the issue names, bytes written at 16 KiB.
/// A goal against a baseline that did not run (`--contenders`) is left out.
pub(crate) fn goals(body_bytes: u32, ebb: &Figures, reqwest: Option<&Figures>, redb: Option<&Figures>) -> Vec<Goal> {
    let mut goals = Vec::new();
    if let Some(reqwest) = reqwest {
        goals.push(Goal {
            name: "cpu_per_message_vs_reqwest_loop",
            what: "CPU per message ÷ reqwest loop's",
            value: ebb.cpu_ms_per_1000 / reqwest.cpu_ms_per_1000,
            bound: 1.5,
            at_most: true,
        });
        let floor = match body_bytes {
            256 => Some(0.75),
            16384 => Some(0.65),
            _ => None,
        };
        if let Some(bound) = floor {
            goals.push(Goal {
                name: "throughput_vs_reqwest_loop",
                what: "msg/s ÷ reqwest loop's",
                value: ebb.msg_per_s / reqwest.msg_per_s,
                bound,
                at_most: false,
            });
        }
    }
    if let Some(redb) = redb {
        goals.push(Goal { name: "throughput_vs_redb_loop", what: "msg/s ÷ redb loop's", value: ebb.msg_per_s / redb.msg_per_s, bound: 1.2, at_most: false });
    }
    if let (16384, Some(store)) = (body_bytes, ebb.store) {
        goals.push(Goal {
            name: "store_bytes_per_message_vs_body",
            what: "store bytes written per message ÷ body",
            value: store.total / f64::from(body_bytes),
            bound: 1.25,
            at_most: true,
        });
    }
    goals
}

/// The medians of every cell, and ebb's ratios and goals.
pub(crate) struct Report<'a> {
    bench: &'a HttpBench,
    server: SocketAddr,
    server_pid: u32,
    cells: Vec<CellReport>,
}

struct CellReport {
    body_bytes: u32,
    concurrency: u32,
    figures: Vec<(Contender, Figures)>,
}

impl CellReport {
    fn of(&self, contender: Contender) -> Option<&Figures> {
        self.figures.iter().find(|(c, _)| *c == contender).map(|(_, f)| f)
    }

    fn ebb_variants(&self) -> impl Iterator<Item = (Contender, &Figures)> {
        self.figures.iter().filter(|(c, _)| matches!(c, Contender::Ebb(_))).map(|(c, f)| (*c, f))
    }

    /// The goals of `contender`'s `ebb` figures: issue 24's against the baselines, and issue
    /// 39's for spans exported, against the same settings without them.
    fn goals(&self, contender: Contender, ebb: &Figures) -> Vec<Goal> {
        let mut goals = goals(self.body_bytes, ebb, self.of(Contender::ReqwestLoop), self.of(Contender::RedbLoop));
        if let (Contender::Ebb(EbbSettings::Traced), Some(untraced)) = (contender, self.of(Contender::Ebb(EbbSettings::ConcurrentCalls))) {
            goals.push(Goal {
                name: "throughput_traced_vs_untraced",
                what: "msg/s ÷ ebb's without spans",
                value: ebb.msg_per_s / untraced.msg_per_s,
                bound: 0.95,
                at_most: false,
            });
        }
        goals
    }
}

impl<'a> Report<'a> {
    pub(crate) fn new(bench: &'a HttpBench, cells: &[Cell], server: SocketAddr, server_pid: u32) -> Report<'a> {
        let cells = cells
            .iter()
            .map(|cell| CellReport {
                body_bytes: cell.body_bytes,
                concurrency: cell.concurrency,
                figures: cell.runs.iter().map(|(c, runs)| (*c, Figures::of(runs))).collect(),
            })
            .collect();
        Report { bench, server, server_pid, cells }
    }

    fn all_goals(&self) -> impl Iterator<Item = Goal> + '_ {
        self.cells.iter().flat_map(|cell| cell.ebb_variants().flat_map(|(contender, ebb)| cell.goals(contender, ebb)))
    }

    pub(crate) fn json(&self) -> Value {
        let cells: Vec<Value> = self
            .cells
            .iter()
            .map(|cell| {
                let contenders: serde_json::Map<String, Value> = cell.figures.iter().map(|(c, f)| (c.key().to_string(), f.json(cell.body_bytes))).collect();
                let reqwest = cell.of(Contender::ReqwestLoop);
                let redb = cell.of(Contender::RedbLoop);
                let verdicts: serde_json::Map<String, Value> = cell
                    .ebb_variants()
                    .map(|(contender, ebb)| {
                        let mut ratios = json!({});
                        if let Some(reqwest) = reqwest {
                            ratios["throughput_vs_reqwest_loop"] = json!(round(ebb.msg_per_s / reqwest.msg_per_s, 3));
                            ratios["cpu_per_message_vs_reqwest_loop"] = json!(round(ebb.cpu_ms_per_1000 / reqwest.cpu_ms_per_1000, 3));
                        }
                        if let Some(redb) = redb {
                            ratios["throughput_vs_redb_loop"] = json!(round(ebb.msg_per_s / redb.msg_per_s, 3));
                        }
                        if let Some(store) = ebb.store {
                            ratios["store_bytes_per_message_vs_body"] = json!(round(store.total / f64::from(cell.body_bytes), 3));
                            ratios["store_bytes_processing_per_message_vs_body"] = json!(round(store.processing / f64::from(cell.body_bytes), 3));
                        }
                        let goals: Vec<Value> = cell.goals(contender, ebb).iter().map(Goal::json).collect();
                        (contender.key().to_string(), json!({ "ratios": ratios, "goals": goals }))
                    })
                    .collect();
                json!({
                    "body_bytes": cell.body_bytes,
                    "concurrency": cell.concurrency,
                    "contenders": contenders,
                    "verdicts": verdicts,
                })
            })
            .collect();
        let goals: Vec<Goal> = self.all_goals().collect();
        let met = goals.iter().filter(|g| g.met()).count();
        json!({
            "bench": "http",
            "rounds": self.bench.rounds,
            "messages": self.bench.messages,
            "redb_messages": self.bench.redb_messages.min(self.bench.messages),
            "server": { "address": self.server.to_string(), "pid": self.server_pid },
            "cells": cells,
            "goals_met": met,
            "goals": goals.len(),
            // No goal at all (a baseline left out) is not "all met".
            "all_goals_met": !goals.is_empty() && met == goals.len(),
        })
    }

    pub(crate) fn table(&self) -> String {
        let mut out = String::new();
        let b = self.bench;
        let _ = writeln!(
            out,
            "ebb bench http: {} messages per run{}, median of {} round{}; the app is pid {} at {}",
            thousands(b.messages as f64),
            if b.contenders.contains(&Contender::RedbLoop) {
                format!(" (redb loop: {})", thousands(b.redb_messages.min(b.messages) as f64))
            } else {
                String::new()
            },
            b.rounds,
            if b.rounds == 1 { "" } else { "s" },
            self.server_pid,
            self.server
        );
        for &size in &b.sizes {
            let _ = writeln!(out, "\nbody {size} B");
            let _ = writeln!(
                out,
                "{:>5}  {:<32} {:>8} {:>9} {:>8} {:>8} {:>11}  store bytes written per message",
                "T", "contender", "msg/s", "CPU ms", "(writer)", "app CPU", "peak tasks"
            );
            let _ =
                writeln!(out, "{:>5}  {:<32} {:>8} {:>9} {:>8} {:>8} {:>11}  put + run = all (÷ body), commits", "", "", "", "per 1k", "", "per 1k", "/ calls");
            for cell in self.cells.iter().filter(|c| c.body_bytes == size) {
                for (contender, f) in &cell.figures {
                    let optional = |value: Option<f64>| value.map_or(String::new(), |v| format!("{v:.1}"));
                    let store = f.store.map_or(String::new(), |s| {
                        format!(
                            "{} + {} = {} ({:.2}×), {:.0} commits per 1k",
                            thousands(s.put),
                            thousands(s.processing),
                            thousands(s.total),
                            s.total / f64::from(size),
                            s.commits_per_1000
                        )
                    });
                    let _ = writeln!(
                        out,
                        "{:>5}  {:<32} {:>8} {:>9.1} {:>8} {:>8} {:>11}  {store}",
                        cell.concurrency,
                        contender.label(),
                        thousands(f.msg_per_s),
                        f.cpu_ms_per_1000,
                        optional(f.writer_cpu_ms_per_1000),
                        optional(f.app_cpu_ms_per_1000),
                        f.peaks.map_or(String::new(), |p| format!("{} / {}", p.tasks, p.calls)),
                    );
                }
            }
        }
        let _ = writeln!(out, "\ngoals of issues 24 and 39 (ebb against the baselines of the same cell; spans exported against ebb without)");
        for cell in &self.cells {
            for (contender, ebb) in cell.ebb_variants() {
                let variant = match contender {
                    Contender::Ebb(EbbSettings::ConcurrentCalls) => "max_concurrent_calls = T",
                    Contender::Ebb(EbbSettings::Traced) => "max_concurrent_calls = T, spans exported",
                    _ => "min_tasks = max_tasks = T",
                };
                let _ = writeln!(out, "  {} B, T = {}, ebb with {variant}:", cell.body_bytes, cell.concurrency);
                for goal in cell.goals(contender, ebb) {
                    let _ = writeln!(
                        out,
                        "    {:<40} {:>8.2}  {} {:<5} {}",
                        goal.what,
                        goal.value,
                        if goal.at_most { "≤" } else { "≥" },
                        goal.bound,
                        if goal.met() { "met" } else { "NOT MET" }
                    );
                }
            }
        }
        let goals: Vec<Goal> = self.all_goals().collect();
        let _ = writeln!(out, "\n{} of {} goals met", goals.iter().filter(|g| g.met()).count(), goals.len());
        out
    }
}

/// `12345.6` → `12,346`.
fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return value.to_string();
    }
    let digits = format!("{:.0}", value.abs());
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    if value < -0.5 { format!("-{grouped}") } else { grouped }
}

#[cfg(test)]
mod tests {
    use super::{Figures, StoreFigures, goals, median, thousands};

    fn figures(msg_per_s: f64, cpu_ms_per_1000: f64, store_total: Option<f64>) -> Figures {
        Figures {
            messages: 1000,
            msg_per_s,
            cpu_ms_per_1000,
            app_cpu_ms_per_1000: None,
            writer_cpu_ms_per_1000: None,
            peaks: None,
            store: store_total.map(|total| StoreFigures { put: total, processing: 0.0, total, commits_per_1000: 0.0, bytes_per_commit: 0.0 }),
            rounds_msg_per_s: vec![msg_per_s],
        }
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }

    #[test]
    fn goals_follow_the_issue_bounds_and_apply_only_where_the_issue_sets_them() {
        let reqwest = figures(1000.0, 10.0, None);
        let redb = figures(100.0, 20.0, Some(600.0));
        // 256 B: CPU, throughput vs reqwest (0.75), vs redb; no bytes goal.
        let at_256 = goals(256, &figures(750.0, 15.0, Some(400.0)), Some(&reqwest), Some(&redb));
        let named: Vec<(&str, bool)> = at_256.iter().map(|g| (g.name, g.met())).collect();
        assert_eq!(named, [("cpu_per_message_vs_reqwest_loop", true), ("throughput_vs_reqwest_loop", true), ("throughput_vs_redb_loop", true)]);
        // 16 KiB: the floor is 0.65, and bytes written are judged against 1.25 × body.
        let at_16k = goals(16384, &figures(640.0, 15.1, Some(16384.0 * 1.3)), Some(&reqwest), Some(&redb));
        let named: Vec<(&str, bool)> = at_16k.iter().map(|g| (g.name, g.met())).collect();
        assert_eq!(
            named,
            [
                ("cpu_per_message_vs_reqwest_loop", false),
                ("throughput_vs_reqwest_loop", false),
                ("throughput_vs_redb_loop", true),
                ("store_bytes_per_message_vs_body", false)
            ]
        );
        // Another size: no throughput floor against reqwest.
        assert!(goals(1024, &figures(1.0, 1.0, None), Some(&reqwest), Some(&redb)).iter().all(|g| g.name != "throughput_vs_reqwest_loop"));
        // Without the baselines (`--contenders ebb`): only the bytes goal, which needs none.
        let alone: Vec<&str> = goals(16384, &figures(1.0, 1.0, Some(1.0)), None, None).iter().map(|g| g.name).collect();
        assert_eq!(alone, ["store_bytes_per_message_vs_body"]);
    }

    #[test]
    fn spans_exported_have_issue_39s_goal_against_ebb_without_them() {
        use crate::contenders::{Contender, EbbSettings};
        let cell = super::CellReport {
            body_bytes: 256,
            concurrency: 32,
            figures: vec![
                (Contender::Ebb(EbbSettings::ConcurrentCalls), figures(1000.0, 10.0, None)),
                (Contender::Ebb(EbbSettings::Traced), figures(940.0, 11.0, None)),
            ],
        };
        let traced = cell.goals(Contender::Ebb(EbbSettings::Traced), cell.of(Contender::Ebb(EbbSettings::Traced)).unwrap());
        let goal = traced.iter().find(|g| g.name == "throughput_traced_vs_untraced").expect("the traced goal");
        assert!((goal.value - 0.94).abs() < 1e-9 && !goal.met() && goal.bound == 0.95);
        let untraced = cell.goals(Contender::Ebb(EbbSettings::ConcurrentCalls), cell.of(Contender::Ebb(EbbSettings::ConcurrentCalls)).unwrap());
        assert!(untraced.iter().all(|g| g.name != "throughput_traced_vs_untraced"), "only spans exported have it");
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(thousands(12.0), "12");
    }
}
