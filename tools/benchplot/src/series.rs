//! The plot's input: one point per line, `SERIES X Y [LOW HIGH]` (LOW/HIGH: p10/p90 of Y), as
//! the benchmark scripts print them. Blank lines and `#` comments are skipped. Series names
//! cannot hold spaces: write `_`, drawn as a space in the legend.

use std::collections::BTreeMap;

/// Input that is not a series of points.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    /// A line without the expected fields.
    #[error("line {line}: expected `SERIES X Y [LOW HIGH]`, got {text:?}")]
    Shape {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
    /// A field that is not a finite number.
    #[error("line {line}: {field} {text:?} is not a finite number")]
    Number {
        /// 1-based line number.
        line: usize,
        /// Which field.
        field: &'static str,
        /// The field's text.
        text: String,
    },
    /// Nothing to draw.
    #[error("no points on the input: give lines `SERIES X Y [LOW HIGH]`")]
    Empty,
}

/// One measured point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// The scaling variable (endpoints, rules, ...).
    pub x: f64,
    /// The median.
    pub y: f64,
    /// p10 and p90, when the script measured more than one run.
    pub range: Option<(f64, f64)>,
}

/// Series by name, in name order (stable colours across runs), points sorted by x.
pub type Series = BTreeMap<String, Vec<Point>>;

fn number(line: usize, field: &'static str, text: &str) -> Result<f64, ParseError> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| ParseError::Number {
            line,
            field,
            text: text.to_owned(),
        })
}

/// Parses the whole input.
pub fn parse(input: &str) -> Result<Series, ParseError> {
    let mut out = Series::new();
    for (i, raw) in input.lines().enumerate() {
        let line = i + 1;
        let text = raw.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = text.split_whitespace().collect();
        let (name, x, y, range) = match f.as_slice() {
            [name, x, y] => (*name, *x, *y, None),
            [name, x, y, low, high] => (
                *name,
                *x,
                *y,
                Some((number(line, "LOW", low)?, number(line, "HIGH", high)?)),
            ),
            _ => {
                return Err(ParseError::Shape {
                    line,
                    text: text.to_owned(),
                });
            }
        };
        out.entry(name.to_owned()).or_default().push(Point {
            x: number(line, "X", x)?,
            y: number(line, "Y", y)?,
            range,
        });
    }
    if out.is_empty() {
        return Err(ParseError::Empty);
    }
    for points in out.values_mut() {
        points.sort_by(|a, b| a.x.total_cmp(&b.x));
    }
    Ok(out)
}

/// The axes' extent over every point and range, with 5% headroom above and y from 0.
#[must_use]
pub fn extent(series: &Series) -> ((f64, f64), (f64, f64)) {
    let mut xmin = f64::INFINITY;
    let mut xmax = f64::NEG_INFINITY;
    let mut ymax = 0f64;
    for p in series.values().flatten() {
        xmin = xmin.min(p.x);
        xmax = xmax.max(p.x);
        ymax = ymax.max(p.range.map_or(p.y, |(_, hi)| hi.max(p.y)));
    }
    if xmax <= xmin {
        // One x value: give the axis some width around it.
        xmin -= 1.0;
        xmax += 1.0;
    }
    if ymax <= 0.0 {
        ymax = 1.0;
    }
    ((xmin, xmax), (0.0, ymax * 1.05))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_points_with_and_without_ranges() {
        let s = parse("# restart\nweft 250 120 100 140\nweft 50 30\n\nnft 50 1.5\n").unwrap();
        assert_eq!(s.len(), 2);
        let w = &s["weft"];
        assert!(w[0].x < w[1].x, "sorted by x");
        assert_eq!(w[1].range, Some((100.0, 140.0)));
        assert_eq!(s["nft"][0].range, None);
    }

    #[test]
    fn rejects_bad_lines_naming_the_line() {
        assert_eq!(
            parse("a 1 2\nb 1\n"),
            Err(ParseError::Shape {
                line: 2,
                text: "b 1".into()
            })
        );
        assert!(matches!(
            parse("a 1 NaN"),
            Err(ParseError::Number {
                line: 1,
                field: "Y",
                ..
            })
        ));
        assert!(matches!(
            parse("a x 2"),
            Err(ParseError::Number { field: "X", .. })
        ));
        assert_eq!(parse("# nothing\n"), Err(ParseError::Empty));
    }

    #[test]
    fn extent_covers_ranges_and_widens_a_single_x() {
        let s = parse("a 5 10 8 20\n").unwrap();
        let ((x0, x1), (y0, y1)) = extent(&s);
        assert!(x0 < 5.0 && x1 > 5.0);
        assert!(y0.abs() < f64::EPSILON);
        assert!(y1 >= 20.0);
    }
}
