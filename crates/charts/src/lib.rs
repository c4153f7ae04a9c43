//! SVG charts for ringcast's reports: the simulator study's figures (the `figures` example of
//! `ringcast-loopback-sim`) and the namespace lab's benchmark (the `bench_net_report` example
//! of `ringcast`). Both are examples, so this crate is only ever a dev-dependency; it keeps
//! plotters out of the libraries and out of xtask.
//!
//! plotters' SVG backend writes text as SVG `<text>`: no font files or fontconfig needed.

use plotters::coord::Shift;
use plotters::prelude::*;

/// plotters itself, for charts of other shapes (bars) drawn through [`svg`].
pub use plotters;

/// The series colours, in order (matplotlib's first eight).
pub const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
];

/// The drawing area [`svg`] hands its closure.
pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// An SVG document of `size` pixels on a white background, drawn by `draw`.
pub fn svg(
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> Result<(), String>,
) -> Result<String, String> {
    let mut out = String::new();
    {
        let area = SVGBackend::with_string(&mut out, size).into_drawing_area();
        area.fill(&WHITE).map_err(|e| e.to_string())?;
        draw(&area)?;
        area.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// Which axes are log-scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scales {
    /// The x axis.
    pub x_log: bool,
    /// The y axis; a linear y axis starts at 0.
    pub y_log: bool,
}

/// A line chart (900 x 560) of named series of `(x, y)` points, each point marked. The axes
/// span the points (a log axis needs them positive); the legend sits top left on a log y
/// axis and bottom left on a linear one, where the space from 0 up is usually empty. No
/// points at all give empty axes, not an error.
pub fn line_chart(
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    scales: Scales,
    x_fmt: &dyn Fn(&f64) -> String,
) -> Result<String, String> {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in series.iter().flat_map(|s| s.1.iter()) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (1.0, 10.0, 1.0, 10.0);
    } else if x0 == x1 {
        (x0, x1) = if scales.x_log {
            (x0 / 2.0, x0 * 2.0)
        } else {
            (x0 - 1.0, x0 + 1.0)
        };
    }
    let legend = if scales.y_log {
        SeriesLabelPosition::UpperLeft
    } else {
        SeriesLabelPosition::LowerLeft
    };
    let (y_log_range, y_lin_range) = (
        (y0 * 0.8..y1 * 1.25).log_scale(),
        0f64..(y1 * 1.15).max(1.05),
    );
    svg((900, 560), |area| {
        let mut b = ChartBuilder::on(area);
        b.caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        // One body for the four coordinate types the scales give.
        macro_rules! finish {
            ($chart:expr) => {{
                let mut chart = $chart.map_err(|e| e.to_string())?;
                chart
                    .configure_mesh()
                    .x_desc(x_desc)
                    .y_desc(y_desc)
                    .x_label_formatter(x_fmt)
                    .draw()
                    .map_err(|e| e.to_string())?;
                for (i, (name, p)) in series.iter().enumerate() {
                    let color = COLORS[i % COLORS.len()];
                    chart
                        .draw_series(LineSeries::new(p.iter().copied(), color.stroke_width(2)))
                        .map_err(|e| e.to_string())?
                        .label(name.clone())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                        });
                    chart
                        .draw_series(p.iter().map(|&q| Circle::new(q, 3, color.filled())))
                        .map_err(|e| e.to_string())?;
                }
                chart
                    .configure_series_labels()
                    .position(legend)
                    .background_style(WHITE)
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| e.to_string())
            }};
        }
        match (scales.x_log, scales.y_log) {
            (true, true) => finish!(b.build_cartesian_2d((x0..x1).log_scale(), y_log_range)),
            (true, false) => finish!(b.build_cartesian_2d((x0..x1).log_scale(), y_lin_range)),
            (false, true) => finish!(b.build_cartesian_2d(x0..x1, y_log_range)),
            (false, false) => finish!(b.build_cartesian_2d(x0..x1, y_lin_range)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Vec<(String, Vec<(f64, f64)>)> {
        vec![
            ("a".to_owned(), vec![(1024.0, 0.5), (1_048_576.0, 40.0)]),
            ("b".to_owned(), vec![(1024.0, 0.7), (1_048_576.0, 90.0)]),
        ]
    }

    /// The lines (and legend marks) drawn in series colour `i`.
    fn lines_of(svg: &str, i: usize) -> usize {
        let RGBColor(r, g, b) = COLORS[i];
        svg.matches(&format!(
            "stroke=\"#{r:02X}{g:02X}{b:02X}\" stroke-width=\"2\""
        ))
        .count()
    }

    #[test]
    fn every_scale_draws_every_series_with_its_legend() {
        for (x_log, y_log) in [(true, true), (true, false), (false, true), (false, false)] {
            let out = line_chart(
                "latency",
                ("bytes", "ms"),
                &series(),
                Scales { x_log, y_log },
                &|x| format!("{x}"),
            )
            .unwrap();
            assert!(out.starts_with("<svg"), "{x_log} {y_log}");
            for text in ["latency", "bytes", "ms"] {
                assert!(
                    out.contains(&format!("\n{text}\n")),
                    "{x_log} {y_log}: {text}"
                );
            }
            // Each series: its line and its legend mark, in its own colour; no third colour.
            assert_eq!(
                [lines_of(&out, 0), lines_of(&out, 1), lines_of(&out, 2)],
                [2, 2, 0]
            );
        }
    }

    #[test]
    fn no_points_or_one_x_still_draw() {
        let fmt = |x: &f64| format!("{x}");
        let none = line_chart(
            "empty",
            ("x", "y"),
            &[],
            Scales {
                x_log: true,
                y_log: true,
            },
            &fmt,
        );
        assert_eq!(lines_of(&none.unwrap(), 0), 0);
        let one = vec![("only".to_owned(), vec![(4096.0, 2.0)])];
        for x_log in [true, false] {
            let out = line_chart(
                "one",
                ("x", "y"),
                &one,
                Scales {
                    x_log,
                    y_log: x_log,
                },
                &fmt,
            );
            let out = out.unwrap();
            assert!(
                out.contains("\nonly\n") && lines_of(&out, 0) == 2,
                "{x_log}"
            );
        }
    }
}
