//! The scale curve as a PNG, drawn by gnuplot (Debian's `gnuplot-nox`): API requests per
//! second against the fleet size (idle, the return's peak second, the outage's connection
//! attempts), and the seconds until every agent is synced and has retired its checkpoints.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::command::run_command;

/// One fleet size's figures on the plot.
pub(crate) struct Point {
    pub(crate) agents: usize,
    pub(crate) idle_per_second: f64,
    pub(crate) return_peak: f64,
    pub(crate) outage_attempts_per_second: f64,
    pub(crate) synced_s: Option<f64>,
    pub(crate) retired_s: Option<f64>,
}

/// Writes `png`, with its data and script beside it (`.dat`, `.gp`).
pub(crate) fn draw(png: &Path, points: &[Point], commit: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!points.is_empty(), "no fleet size was measured");
    let data = png.with_extension("dat");
    let script = png.with_extension("gp");
    fs::write(&data, data_text(points)).with_context(|| format!("cannot write {}", data.display()))?;
    fs::write(&script, script_text(png, &data, commit))
        .with_context(|| format!("cannot write {}", script.display()))?;
    run_command(Command::new("gnuplot").arg(&script)).context("gnuplot failed")?;
    Ok(())
}

/// A row per size; `NaN` where nothing was measured (gnuplot leaves a gap).
fn data_text(points: &[Point]) -> String {
    let mut text =
        String::from("# agents idle_rps return_peak_rps outage_attempts_per_s synced_s retired_s\n");
    let opt = |v: Option<f64>| v.map_or("NaN".to_owned(), |v| format!("{v:.3}"));
    for p in points {
        let _ = writeln!(
            text,
            "{} {:.4} {:.1} {:.2} {} {}",
            p.agents,
            p.idle_per_second,
            p.return_peak,
            p.outage_attempts_per_second,
            opt(p.synced_s),
            opt(p.retired_s)
        );
    }
    text
}

fn script_text(png: &Path, data: &Path, commit: &str) -> String {
    // Paths and the commit are quoted for gnuplot: single quotes, doubled inside.
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let data = quote(&data.display().to_string());
    format!(
        "set terminal pngcairo size 1200,480 font 'sans,10'\n\
         set output {png}\n\
         set multiplot layout 1,2 title {title}\n\
         set grid\n\
         set key top left\n\
         set xlabel 'agents'\n\
         set logscale y\n\
         set ylabel 'per second (log scale)'\n\
         set title 'API server load'\n\
         plot {data} using 1:2 with linespoints title 'idle: requests', \
              '' using 1:3 with linespoints title 'return: requests in the peak second', \
              '' using 1:4 with linespoints title 'outage: connection attempts'\n\
         unset logscale y\n\
         set yrange [0:*]\n\
         set ylabel 'seconds after the first /readyz 200'\n\
         set title 'Return: the last agent'\n\
         set key bottom right\n\
         plot {data} using 1:5 with linespoints title 'synced again', \
              '' using 1:6 with linespoints title 'checkpoints retired'\n\
         unset multiplot\n",
        png = quote(&png.display().to_string()),
        title = quote(&format!(
            "pod-checkpointer: a fleet against one kube-apiserver ({commit})"
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_has_a_row_per_size_and_gaps_for_the_unmeasured() {
        let points = [
            Point {
                agents: 50,
                idle_per_second: 0.5,
                return_peak: 120.0,
                outage_attempts_per_second: 40.0,
                synced_s: Some(3.25),
                retired_s: None,
            },
            Point {
                agents: 100,
                idle_per_second: 1.0,
                return_peak: 240.0,
                outage_attempts_per_second: 80.0,
                synced_s: None,
                retired_s: Some(5.0),
            },
        ];
        assert_eq!(
            data_text(&points),
            "# agents idle_rps return_peak_rps outage_attempts_per_s synced_s retired_s\n\
             50 0.5000 120.0 40.00 3.250 NaN\n\
             100 1.0000 240.0 80.00 NaN 5.000\n"
        );
        let script = script_text(Path::new("/r/fleet's.png"), Path::new("/r/fleet.dat"), "abc");
        assert!(script.contains("set output '/r/fleet''s.png'"));
    }
}
