//! A figure of several charts stacked one above the other, sharing a
//! title: the incast's flow rates over its queue depth, the fat-tree's FCT
//! slowdown at p50, p95 and p99.

use std::path::Path;

use plotters::prelude::*;

use super::figure::Series;

/// One chart of a stacked figure.
pub struct Panel {
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    pub series: Vec<Series>,
}

/// The range a panel's values span, padded; never empty.
fn span(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite() && (!log || *v > 0.0)) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        (lo / 1.3, hi * 1.3)
    } else {
        let pad = ((hi - lo) * 0.05).max(1e-9);
        (lo.min(0.0), hi + pad)
    }
}

pub fn write(path: &Path, title: &str, panels: &[Panel]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    let root = SVGBackend::new(path, (900, 360 * panels.len() as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(|e| fail(&e))?;
    for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        let (x0, x1) = span(panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), panel.x_log);
        let (y0, y1) = span(panel.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), false);
        let mut builder = ChartBuilder::on(area);
        builder.margin(14).x_label_area_size(40).y_label_area_size(70);
        if panel.x_log {
            let mut chart = builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1).map_err(|e| fail(&e))?;
            draw(&mut chart, panel).map_err(|e| fail(&e))?;
        } else {
            let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(|e| fail(&e))?;
            draw(&mut chart, panel).map_err(|e| fail(&e))?;
        }
    }
    root.present().map_err(|e| fail(&e))
}

fn draw<'a, X, DB>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, plotters::coord::types::RangedCoordf64>>,
    panel: &Panel,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    X: plotters::coord::ranged1d::Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
{
    chart.configure_mesh().x_desc(&panel.x_label).y_desc(&panel.y_label).max_light_lines(1).draw()?;
    for (i, s) in panel.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        // Each measured point marked too: a series of one point (a quick
        // run's) draws no line.
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}
