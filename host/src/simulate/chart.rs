//! `--chart out.svg`: backlog, tasks and cumulative consumer calls over time, every rule side
//! by side (one line per rule in each panel), with the floor's calls (dashed) beside them.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use super::{Sample, SimReport};

/// A panel: its caption and the value it plots.
type Panel = (&'static str, fn(&Sample) -> f64);

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

/// Writes the chart as SVG to `path`.
pub(crate) fn write_svg(report: &SimReport, path: &Path) -> Result<()> {
    let svg = render_svg(report)?;
    std::fs::write(path, svg).map_err(|e| anyhow!("--chart: cannot write {}: {e}", path.display()))
}

/// The chart as SVG text.
pub(crate) fn render_svg(report: &SimReport) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 960)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("drawing the chart: {e}"))?;
        let title = format!("ebb simulate: {} ({} messages)", report.scenario, report.messages);
        let root = root.titled(&title, ("sans-serif", 22)).map_err(|e| anyhow!("drawing the chart: {e}"))?;
        let panels = root.split_evenly((3, 1));
        let hours = (report.duration_secs / 3600.0).max(1e-3);
        let series: [Panel; 3] = [
            ("backlog (messages, the most in each interval)", |s| s.backlog as f64),
            ("dequeue tasks", |s| f64::from(s.tasks)),
            ("consumer calls (cumulative: billed transactions but puts)", |s| s.consumer_calls as f64),
        ];
        // The floor at the sample times, in the consumer-calls panel.
        let floor: Vec<(f64, f64)> = report
            .rules
            .first()
            .map(|r| r.samples.iter().map(|s| (s.t_secs / 3600.0, report.floor.calls_by(std::time::Duration::from_secs_f64(s.t_secs)) as f64)).collect())
            .unwrap_or_default();
        let last = series.len() - 1;
        for (index, (panel, (label, value))) in panels.iter().zip(series).enumerate() {
            let floor = if index == last { floor.as_slice() } else { &[] };
            let top = report.rules.iter().flat_map(|r| r.samples.iter().map(value)).chain(floor.iter().map(|p| p.1)).fold(0.0f64, f64::max).max(1.0) * 1.05;
            let mut chart = ChartBuilder::on(panel)
                .caption(label, ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(70)
                .build_cartesian_2d(0f64..hours, 0f64..top)
                .map_err(|e| anyhow!("drawing the chart: {e}"))?;
            chart.configure_mesh().x_desc("simulated hours").y_label_formatter(&|v| format!("{v:.0}")).draw().map_err(|e| anyhow!("drawing the chart: {e}"))?;
            for (index, rule) in report.rules.iter().enumerate() {
                let colour = COLOURS[index % COLOURS.len()];
                let points = rule.samples.iter().map(|s| (s.t_secs / 3600.0, value(s)));
                chart
                    .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                    .map_err(|e| anyhow!("drawing the chart: {e}"))?
                    .label(rule.rule.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
            }
            if !floor.is_empty() {
                let budget = humantime::format_duration(report.floor.wait_budget);
                chart
                    .draw_series(DashedLineSeries::new(floor.iter().copied(), 6, 4, BLACK.stroke_width(2)))
                    .map_err(|e| anyhow!("drawing the chart: {e}"))?
                    .label(format!("floor (W = {budget})"))
                    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| anyhow!("drawing the chart: {e}"))?;
        }
        root.present().map_err(|e| anyhow!("drawing the chart: {e}"))?;
    }
    Ok(svg)
}
