//! weft-benchplot: draws one scaling series plot (PNG) for docs/BENCHMARKS.md.
//!
//! `weft-benchplot OUT.png --title T --x-label X --y-label Y < points` where each input line is
//! `SERIES X Y [LOW HIGH]` (see `series`). Used by scripts/bench/all.

mod draw;
mod series;

use clap::Parser;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    about = "Draw a benchmark scaling series as a PNG (points on stdin: SERIES X Y [LOW HIGH])"
)]
struct Args {
    /// The PNG to write.
    out: PathBuf,
    /// Caption above the plot.
    #[arg(long)]
    title: String,
    /// X axis description.
    #[arg(long)]
    x_label: String,
    /// Y axis description.
    #[arg(long)]
    y_label: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("weft-benchplot: reading the points from stdin: {e}");
        return ExitCode::FAILURE;
    }
    let result = series::parse(&input)
        .map_err(|e| e.to_string())
        .and_then(|s| {
            draw::png(
                &args.out,
                &draw::Labels {
                    title: &args.title,
                    x: &args.x_label,
                    y: &args.y_label,
                },
                &s,
            )
            .map_err(|e| e.to_string())
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weft-benchplot: {}: {e}", args.out.display());
            ExitCode::FAILURE
        }
    }
}
