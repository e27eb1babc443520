//! Rendering with plotters' bitmap backend: one line per series, p10–p90 error bars.

use crate::series::{Series, extent};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use std::path::Path;
use std::sync::OnceLock;

/// Drawing failures (plotters reports them as boxed errors of its backend).
#[derive(Debug, thiserror::Error)]
pub enum DrawError {
    /// The backend or the encoder failed.
    #[error("drawing: {0}")]
    Backend(String),
}

fn backend<E: std::fmt::Display>(e: E) -> DrawError {
    DrawError::Backend(e.to_string())
}

/// The plot's texts.
pub struct Labels<'a> {
    /// Caption.
    pub title: &'a str,
    /// X axis.
    pub x: &'a str,
    /// Y axis.
    pub y: &'a str,
}

const FONT: &str = "sans-serif";
// Ten colours: the import plot has eight series (four measures in two mixes).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Registers the compiled-in font once; a failure is a broken dependency, not bad input.
fn register() -> Result<(), DrawError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        register_font(FONT, FontStyle::Normal, epaint_default_fonts::HACK_REGULAR).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(DrawError::Backend(
            "the bundled Hack font (epaint_default_fonts) does not parse".to_owned(),
        ))
    }
}

/// An axis label without a trailing `.0` (`{}` of an f64 prints 60 as "60").
fn short(v: f64) -> String {
    format!("{}", (v * 100.0).round() / 100.0)
}

/// Writes `series` as an 900×540 PNG at `out`.
pub fn png(out: &Path, labels: &Labels<'_>, series: &Series) -> Result<(), DrawError> {
    register()?;
    let root = BitMapBackend::new(out, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(backend)?;
    let ((x0, x1), (y0, y1)) = extent(series);
    let mut chart = ChartBuilder::on(&root)
        .margin(16)
        .caption(labels.title, (FONT, 22))
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(backend)?;
    chart
        .configure_mesh()
        .x_desc(labels.x)
        .y_desc(labels.y)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .light_line_style(RGBColor(240, 240, 240))
        .max_light_lines(2)
        .x_label_formatter(&|v| short(*v))
        .y_label_formatter(&|v| short(*v))
        .draw()
        .map_err(backend)?;
    for ((name, points), &colour) in series.iter().zip(PALETTE.iter().cycle()) {
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.x, p.y)),
                colour.stroke_width(2),
            ))
            .map_err(backend)?
            // Series names cannot hold spaces on the input (fields are split on whitespace).
            .label(name.replace('_', " "))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .iter()
                    .map(|p| Circle::new((p.x, p.y), 4, colour.filled())),
            )
            .map_err(backend)?;
        chart
            .draw_series(points.iter().filter_map(|p| {
                p.range
                    .map(|(lo, hi)| ErrorBar::new_vertical(p.x, lo, p.y, hi, colour, 8))
            }))
            .map_err(backend)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(backend)?;
    root.present().map_err(backend)?;
    Ok(())
}
