//! The experiment's figure, an SVG drawn with plotters (no Python, no
//! fonts needed): one line per configuration, and the seeds' published
//! figures beside them as reference lines or points.

use std::path::Path;

use plotters::prelude::*;

#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A published figure drawn for orientation.
#[derive(Debug, Clone)]
pub enum Reference {
    /// Across the whole chart, at `y`.
    Line { name: &'static str, y: f64 },
    /// One point.
    Point { name: &'static str, x: f64, y: f64 },
}

#[derive(Debug, Clone)]
pub struct Figure {
    pub title: String,
    pub x_label: &'static str,
    pub y_label: &'static str,
    pub x_log: bool,
    /// A log y axis, for values over several decades (E9: 1 B to 256 KiB
    /// messages span Mb/s to tens of Gb/s).
    pub y_log: bool,
    pub series: Vec<Series>,
    pub references: Vec<Reference>,
}

impl Figure {
    /// The x and y ranges that hold every point and reference, with room.
    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let xs = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
        let ys = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        let (ref_x, ref_y): (Vec<f64>, Vec<f64>) = self
            .references
            .iter()
            .map(|r| match *r {
                Reference::Line { y, .. } => (f64::NAN, y),
                Reference::Point { x, y, .. } => (x, y),
            })
            .unzip();
        let xs: Vec<f64> = xs.chain(ref_x).filter(|v| v.is_finite()).collect();
        let ys: Vec<f64> = ys.chain(ref_y).filter(|v| v.is_finite()).collect();
        let (x0, x1) = bounds(&xs, 1.0);
        // Headroom above the data for the legend: half again on a linear
        // axis, as much on a log one.
        if self.y_log {
            let positive: Vec<f64> = ys.into_iter().filter(|&y| y > 0.0).collect();
            let (y0, y1) = bounds(&positive, 1.0);
            ((x0, x1), (y0 / 2.0, y1 * (y1 / y0).max(10.0).powf(0.35)))
        } else {
            let (_, y1) = bounds(&ys, 1.0);
            ((x0, x1), (0.0, y1 * 1.5))
        }
    }

    pub fn write_svg(&self, path: &Path) -> Result<(), String> {
        let fail = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let ((x0, x1), (y0, y1)) = self.ranges();
        let mut builder = ChartBuilder::on(&root);
        builder.caption(&self.title, ("sans-serif", 22)).margin(16).x_label_area_size(44).y_label_area_size(64);
        // Four kinds of chart, one drawing: x and y each linear or log.
        let (x_lo, x_hi) = match self.x_log {
            true => (x0.max(1e-9) / 1.3, x1 * 1.3),
            false => (x0 - (x1 - x0).max(1.0) * 0.05, x1 + (x1 - x0).max(1.0) * 0.05),
        };
        let (x, y) = (x_lo..x_hi, y0..y1);
        match (self.x_log, self.y_log) {
            (false, false) => {
                self.draw_into(&mut builder.build_cartesian_2d(x, y).map_err(|e| fail(&e))?, (x_lo, x_hi))
            }
            (true, false) => {
                self.draw_into(&mut builder.build_cartesian_2d(x.log_scale(), y).map_err(|e| fail(&e))?, (x_lo, x_hi))
            }
            (false, true) => {
                self.draw_into(&mut builder.build_cartesian_2d(x, y.log_scale()).map_err(|e| fail(&e))?, (x_lo, x_hi))
            }
            (true, true) => self.draw_into(
                &mut builder.build_cartesian_2d(x.log_scale(), y.log_scale()).map_err(|e| fail(&e))?,
                (x_lo, x_hi),
            ),
        }
        .map_err(|e| fail(&e))?;
        root.present().map_err(|e| fail(&e))
    }

    /// The mesh, the series, the references and the legend, on any kind
    /// of axes.
    fn draw_into<'a, X, Y, DB>(
        &self,
        chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
        (x0, x1): (f64, f64),
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
    where
        DB: DrawingBackend + 'a,
        X: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + plotters::coord::ranged1d::ValueFormatter<f64>,
    {
        chart
            .configure_mesh()
            .x_desc(self.x_label)
            .y_desc(self.y_label)
            .max_light_lines(1)
            .x_labels(8)
            .x_label_formatter(&|v| tick(*v))
            .y_label_formatter(&|v| tick(*v))
            .draw()?;
        for (i, s) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))?
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        for (i, r) in self.references.iter().enumerate() {
            let color = Palette99::pick(self.series.len() + i).to_rgba();
            match *r {
                Reference::Line { name, y } => {
                    let dashed = ShapeStyle { color, filled: false, stroke_width: 1 };
                    chart
                        .draw_series(DashedLineSeries::new(vec![(x0, y), (x1, y)], 6, 4, dashed))?
                        .label(name)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
                }
                Reference::Point { name, x, y } => {
                    chart
                        .draw_series(std::iter::once(TriangleMarker::new((x, y), 6, color.filled())))?
                        .label(name)
                        .legend(move |(x, y)| TriangleMarker::new((x + 9, y), 5, color.filled()));
                }
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
    }
}

/// An axis label: whole numbers from 10 up, two significant digits below.
fn tick(v: f64) -> String {
    if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The smallest and largest of `values` (or `fallback` for none).
fn bounds(values: &[f64], fallback: f64) -> (f64, f64) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if lo.is_finite() { (lo, hi.max(lo + f64::EPSILON)) } else { (fallback, fallback * 2.0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg_that_parses_with_every_series_named() {
        for y_log in [false, true] {
            draw_and_parse(y_log);
        }
    }

    fn draw_and_parse(y_log: bool) {
        let figure = Figure {
            title: "E2 throughput".into(),
            x_label: "packet size (B)",
            y_label: "Gb/s",
            x_log: true,
            y_log,
            series: vec![
                Series { name: "qps=1,eng=1".into(), points: vec![(64.0, 0.4), (1024.0, 3.1)] },
                Series { name: "qps=8,eng=2".into(), points: vec![(64.0, 0.7), (1024.0, 5.2)] },
            ],
            references: vec![
                Reference::Point { name: "hardware RoCE, 64 B", x: 64.0, y: 1.39 },
                Reference::Line { name: "Soft-RoCE", y: 0.10 },
            ],
        };
        let path = std::env::temp_dir().join(format!("softrnic-figure-{}.svg", std::process::id()));
        figure.write_svg(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = roxmltree::Document::parse(&text).expect("well-formed SVG");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        for name in ["qps=1,eng=1", "qps=8,eng=2", "hardware RoCE, 64 B", "Soft-RoCE", "E2 throughput"] {
            assert!(texts.iter().any(|t| t.contains(name)), "{name} missing from the figure");
        }
        std::fs::remove_file(&path).unwrap();
    }
}
