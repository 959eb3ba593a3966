//! The power-cut timeline as a PNG, drawn by gnuplot (Debian's `gnuplot-nox`) from the
//! cuts the self-hosted scenario timed (the same figures as its JSON lines): a row per
//! cut, a mark per milestone at its seconds after the cut, so one look shows where a
//! recovery spends its time and how much the cuts vary.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::command::run_command;

/// One cut on the plot: its label, and each milestone's seconds after the cut, in the
/// order of the milestones given to [`draw`] (`None`: not reached or not measured).
pub struct CutRow {
    pub label: String,
    pub seconds: Vec<Option<f64>>,
}

/// Writes `png`, with its data and script beside it (`.dat`, `.gp`).
pub fn draw(png: &Path, milestones: &[&str], rows: &[CutRow], title: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!rows.is_empty(), "no cut was timed");
    let data = png.with_extension("dat");
    let script = png.with_extension("gp");
    fs::write(&data, data_text(milestones, rows))
        .with_context(|| format!("cannot write {}", data.display()))?;
    fs::write(&script, script_text(png, &data, milestones, rows.len(), title))
        .with_context(|| format!("cannot write {}", script.display()))?;
    run_command(Command::new("gnuplot").arg(&script)).context("gnuplot failed")?;
    Ok(())
}

/// A row per cut, numbered from the top; `NaN` where a milestone is missing (gnuplot
/// leaves it out).
fn data_text(milestones: &[&str], rows: &[CutRow]) -> String {
    let mut text = format!("# row \"cut\" {}\n", milestones.join(" | "));
    for (i, row) in rows.iter().enumerate() {
        let _ = write!(text, "{} \"{}\"", rows.len() - i, row.label.replace('"', "'"));
        for s in &row.seconds {
            match s {
                Some(s) => {
                    let _ = write!(text, " {s:.3}");
                }
                None => text.push_str(" NaN"),
            }
        }
        text.push('\n');
    }
    text
}

fn script_text(png: &Path, data: &Path, milestones: &[&str], rows: usize, title: &str) -> String {
    // Paths and titles are quoted for gnuplot: single quotes, doubled inside.
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let data = quote(&data.display().to_string());
    let plots: Vec<String> = milestones
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let source = if i == 0 { data.as_str() } else { "''" };
            let labels = if i == 0 { ":ytic(2)" } else { "" };
            format!(
                "{source} using {}:1{labels} with points pointtype {} pointsize 1.6 title {}",
                i + 3,
                [7, 5, 9, 13, 11, 15, 3, 1][i % 8],
                quote(name)
            )
        })
        .collect();
    format!(
        "set terminal pngcairo size 1100,{height} font 'sans,10'\n\
         set output {png}\n\
         set title {title}\n\
         set grid xtics\n\
         set key outside right top vertical reverse Left\n\
         set xlabel 'seconds after the power cut'\n\
         set xrange [0:*]\n\
         set yrange [0.5:{top}]\n\
         plot {plots}\n",
        height = 200 + 40 * rows,
        png = quote(&png.display().to_string()),
        title = quote(title),
        top = rows as f64 + 0.5,
        plots = plots.join(", \\\n     "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_per_cut_from_the_top_with_gaps_for_the_missing() {
        let rows = [
            CutRow {
                label: "cut 1 (Plain)".into(),
                seconds: vec![Some(1.5), None],
            },
            CutRow {
                label: "cut 2 \"x\"".into(),
                seconds: vec![Some(2.0), Some(30.25)],
            },
        ];
        assert_eq!(
            data_text(&["kubelet up", "API ready"], &rows),
            "# row \"cut\" kubelet up | API ready\n\
             2 \"cut 1 (Plain)\" 1.500 NaN\n\
             1 \"cut 2 'x'\" 2.000 30.250\n"
        );
        let script = script_text(
            Path::new("/r/cuts's.png"),
            Path::new("/r/cuts.dat"),
            &["kubelet up", "API ready"],
            2,
            "t",
        );
        assert!(script.contains("set output '/r/cuts''s.png'"), "{script}");
        assert!(
            script.contains("'/r/cuts.dat' using 3:1:ytic(2) with points"),
            "{script}"
        );
        assert!(script.contains("'' using 4:1 with points"), "{script}");
        assert!(script.contains("set yrange [0.5:2.5]"), "{script}");
    }
}
