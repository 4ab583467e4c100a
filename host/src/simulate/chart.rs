//! `--chart out.svg`: backlog, dequeue tasks, pickup latency and cumulative consumer calls
//! over time, every rule side by side (one colour per rule, named once in a legend above
//! the panels, so no legend covers the data), with the floor's calls (dashed) beside them.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Sample, SimReport};

const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

const WIDTH: u32 = 1100;
const LEGEND_HEIGHT: u32 = 36;
const PANEL_HEIGHT: u32 = 290;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Writes the chart as SVG to `path`.
pub(crate) fn write_svg(report: &SimReport, path: &Path) -> Result<()> {
    let svg = render_svg(report)?;
    std::fs::write(path, svg).map_err(|e| anyhow!("--chart: cannot write {}: {e}", path.display()))
}

fn drawing<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e:?}")
}

/// The unit of the time axis: the run's own scale, so a two-minute run reads in seconds
/// and a day in hours.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TimeUnit {
    pub seconds: f64,
    pub name: &'static str,
}

impl TimeUnit {
    pub(crate) fn for_duration(secs: f64) -> TimeUnit {
        match secs {
            s if s <= 180.0 => TimeUnit { seconds: 1.0, name: "seconds" },
            s if s <= 3.0 * 3600.0 => TimeUnit { seconds: 60.0, name: "minutes" },
            _ => TimeUnit { seconds: 3600.0, name: "hours" },
        }
    }

    fn of(&self, sample: &Sample) -> f64 {
        sample.t_secs / self.seconds
    }
}

/// The top of a count axis, and how many labels it takes, so that every label is a whole
/// number and no two read the same (a panel topping out at one task reads 0, 1, 2).
pub(crate) fn count_axis(max: f64) -> (f64, usize) {
    let top = (max * 1.05).ceil().max(max + 1.0).max(2.0);
    (top, (top as usize + 1).min(11))
}

/// A label for a count axis: whole numbers only.
fn whole(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-9 { format!("{v:.0}") } else { String::new() }
}

/// The chart as SVG text.
pub(crate) fn render_svg(report: &SimReport) -> Result<String> {
    let mut svg = String::new();
    {
        let height = 40 + LEGEND_HEIGHT + 4 * PANEL_HEIGHT;
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let title = format!("ebb simulate: {} ({} messages)", report.scenario, report.messages);
        let root = root.titled(&title, ("sans-serif", 22)).map_err(drawing)?;
        let (legend, panels) = root.split_vertically(LEGEND_HEIGHT);
        draw_legend(&legend, report)?;
        let panels = panels.split_evenly((4, 1));
        let unit = TimeUnit::for_duration(report.duration_secs);
        counts_panel(&panels[0], report, unit, "backlog: the most messages in the queue in each interval", "messages", |s| s.backlog as f64)?;
        counts_panel(&panels[1], report, unit, "dequeue tasks: the most running at once in each interval", "tasks", |s| f64::from(s.peak_tasks))?;
        latency_panel(&panels[2], report, unit)?;
        calls_panel(&panels[3], report, unit)?;
        root.present().map_err(drawing)?;
    }
    Ok(svg)
}

/// One entry per rule (its colour and name), then the floor's dashed line.
fn draw_legend(area: &Area, report: &SimReport) -> Result<()> {
    let mut x = 80;
    let y = 18;
    let font = ("sans-serif", 15).into_font();
    let mut entry = |label: String, style: ShapeStyle, dashed: bool| -> Result<()> {
        if dashed {
            for dash in 0..3 {
                let from = x + dash * 8;
                area.draw(&PathElement::new(vec![(from, y), (from + 5, y)], style)).map_err(drawing)?;
            }
        } else {
            area.draw(&PathElement::new(vec![(x, y), (x + 22, y)], style)).map_err(drawing)?;
        }
        area.draw(&Text::new(label.clone(), (x + 28, y - 8), font.clone())).map_err(drawing)?;
        x += 40 + 8 * label.chars().count() as i32;
        Ok(())
    };
    for (index, rule) in report.rules.iter().enumerate() {
        entry(rule.rule.clone(), COLOURS[index % COLOURS.len()].stroke_width(3), false)?;
    }
    let budget = humantime::format_duration(report.floor.wait_budget);
    entry(format!("floor (W = {budget})"), BLACK.stroke_width(2), true)
}

/// A panel of counts (backlog, tasks): a line per rule on a whole-number axis.
fn counts_panel(area: &Area, report: &SimReport, unit: TimeUnit, caption: &str, y_unit: &str, value: fn(&Sample) -> f64) -> Result<()> {
    let max = report.rules.iter().flat_map(|r| r.samples.iter().map(value)).fold(0.0f64, f64::max);
    let (top, labels) = count_axis(max);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..x_end(report, unit), 0f64..top)
        .map_err(drawing)?;
    chart.configure_mesh().x_desc(format!("simulated {}", unit.name)).y_desc(y_unit).y_labels(labels).y_label_formatter(&whole).draw().map_err(drawing)?;
    for (index, rule) in report.rules.iter().enumerate() {
        let points = rule.samples.iter().map(|s| (unit.of(s), value(s)));
        chart.draw_series(LineSeries::new(points, COLOURS[index % COLOURS.len()].stroke_width(2))).map_err(drawing)?;
    }
    Ok(())
}

/// Pickup latency per interval on a log axis: p99 solid, p50 thin; an interval with no
/// pickup is a gap, not the last value carried on.
fn latency_panel(area: &Area, report: &SimReport, unit: TimeUnit) -> Result<()> {
    let max = report.rules.iter().flat_map(|r| r.samples.iter().filter_map(|s| s.pickup_p99_ms)).max().unwrap_or(1).max(10) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption("pickup latency, arrival → handler start: p99 (thick), p50 (thin); gaps had no pickups", ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..x_end(report, unit), (1f64..max * 1.5).log_scale())
        .map_err(drawing)?;
    chart.configure_mesh().x_desc(format!("simulated {}", unit.name)).y_desc("ms (log)").y_label_formatter(&|v| format!("{v:.0}")).draw().map_err(drawing)?;
    if report.rules.iter().all(|r| r.samples.iter().all(|s| s.pickup_p99_ms.is_none())) {
        let (w, h) = area.dim_in_pixel();
        area.draw(&Text::new("no pickups", (w as i32 / 2 - 40, h as i32 / 2), ("sans-serif", 18).into_font())).map_err(drawing)?;
        return Ok(());
    }
    for (index, rule) in report.rules.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        for (pick, width) in [(p99 as fn(&Sample) -> Option<u64>, 2), (p50, 1)] {
            for run in runs_of(&rule.samples, pick) {
                let points: Vec<(f64, f64)> = run.iter().map(|s| (unit.of(s), pick(s).unwrap_or(1).max(1) as f64)).collect();
                if let [point] = points.as_slice() {
                    chart.draw_series(std::iter::once(Circle::new(*point, width + 1, colour.filled()))).map_err(drawing)?;
                } else {
                    chart.draw_series(LineSeries::new(points, colour.stroke_width(width))).map_err(drawing)?;
                }
            }
        }
    }
    Ok(())
}

fn p99(s: &Sample) -> Option<u64> {
    s.pickup_p99_ms
}

fn p50(s: &Sample) -> Option<u64> {
    s.pickup_p50_ms
}

/// The runs of consecutive samples that have a value.
fn runs_of(samples: &[Sample], pick: fn(&Sample) -> Option<u64>) -> impl Iterator<Item = &[Sample]> {
    samples.split(move |s| pick(s).is_none()).filter(|run| !run.is_empty())
}

/// Cumulative consumer calls per rule, with the floor's (dashed).
fn calls_panel(area: &Area, report: &SimReport, unit: TimeUnit) -> Result<()> {
    let floor: Vec<(f64, f64)> = report
        .rules
        .first()
        .map(|r| r.samples.iter().map(|s| (unit.of(s), report.floor.calls_by(std::time::Duration::from_secs_f64(s.t_secs)) as f64)).collect())
        .unwrap_or_default();
    let max = report.rules.iter().flat_map(|r| r.samples.iter().map(|s| s.consumer_calls as f64)).chain(floor.iter().map(|p| p.1)).fold(0.0f64, f64::max);
    let (top, labels) = count_axis(max);
    let mut chart = ChartBuilder::on(area)
        .caption("consumer calls, cumulative (billed transactions but puts)", ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..x_end(report, unit), 0f64..top)
        .map_err(drawing)?;
    chart.configure_mesh().x_desc(format!("simulated {}", unit.name)).y_desc("calls").y_labels(labels).y_label_formatter(&whole).draw().map_err(drawing)?;
    for (index, rule) in report.rules.iter().enumerate() {
        let points = rule.samples.iter().map(|s| (unit.of(s), s.consumer_calls as f64));
        chart.draw_series(LineSeries::new(points, COLOURS[index % COLOURS.len()].stroke_width(2))).map_err(drawing)?;
    }
    chart.draw_series(DashedLineSeries::new(floor, 6, 4, BLACK.stroke_width(2))).map_err(drawing)?;
    Ok(())
}

/// The end of the time axis, in its unit.
fn x_end(report: &SimReport, unit: TimeUnit) -> f64 {
    (report.duration_secs / unit.seconds).max(1e-3)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 38 item 7: a day's chart sampled the tasks running at each sample time, so a
    /// burst's peak between two samples (two minutes apart on a day) read as one task.
    #[test]
    fn a_days_chart_holds_the_task_peak_and_the_pickups_of_each_interval() {
        use crate::simulate::scenario::Scenario;
        use crate::simulate::{RuleChoice, SimOptions};
        let workload = Scenario::Burst.workload(Some(std::time::Duration::from_secs(86_400)), 1).unwrap();
        let report = crate::simulate::run(&SimOptions::new(workload, vec![RuleChoice::parse("paper").unwrap()])).unwrap();
        let rule = &report.rules[0];
        let sampled_peak = rule.samples.iter().map(|s| s.peak_tasks).max().unwrap();
        assert!(rule.peak_tasks > 1, "the burst needs more than one task: {}", rule.peak_tasks);
        assert_eq!(sampled_peak, rule.peak_tasks, "the chart's tasks reach the run's peak");
        let with_pickups: Vec<&Sample> = rule.samples.iter().filter(|s| s.pickup_p99_ms.is_some()).collect();
        assert!(!with_pickups.is_empty() && with_pickups.len() < 5, "only the burst's intervals had pickups: {}", with_pickups.len());
        assert!(with_pickups.iter().all(|s| s.pickup_p50_ms <= s.pickup_p99_ms));
        let svg = render_svg(&report).unwrap();
        for text in ["simulated hours", "pickup latency", "tasks", "floor (W = "] {
            assert!(svg.contains(text), "the chart says {text:?}");
        }
    }

    #[test]
    fn the_time_axis_is_in_the_runs_own_unit() {
        assert_eq!(TimeUnit::for_duration(120.0).name, "seconds");
        assert_eq!(TimeUnit::for_duration(3600.0).name, "minutes");
        assert_eq!(TimeUnit::for_duration(86_400.0).name, "hours");
    }

    #[test]
    fn a_count_axis_has_only_whole_distinct_labels_whatever_its_top() {
        for max in [0.0, 1.0, 2.0, 3.0, 7.0, 20.0, 32.0, 1_000.0, 20_000.0] {
            let (top, labels) = count_axis(max);
            assert!(top > max, "the top {top} is above the most, {max}");
            let points = plotters::coord::types::RangedCoordf64::from(0f64..top).key_points(labels);
            let shown: Vec<String> = points.iter().map(whole).filter(|l| !l.is_empty()).collect();
            let mut distinct = shown.clone();
            distinct.dedup();
            assert_eq!(shown, distinct, "labels for a top of {top}: {shown:?}");
            assert!(shown.len() >= 2, "at least two labels for {max}: {shown:?}");
        }
    }
}
