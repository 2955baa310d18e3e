//! `--plot FILE.png|svg`: three panels from a workload report: the latency
//! CDF of every variant, throughput over time, and each variant's
//! throughput against its baseline (the ablation or comparison bars).

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::{Report, Variant};

/// Refuse a plot path that cannot be written, before the bench runs.
pub fn check_path(p: &Path) -> Result<()> {
    match p.extension().and_then(|e| e.to_str()) {
        Some("png") | Some("svg") => {}
        _ => bail!("--plot {}: the file name must end in .png or .svg", p.display()),
    }
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!(
            "--plot {}: the directory {} does not exist",
            p.display(),
            dir.display()
        );
    }
    Ok(())
}

/// Draw `report` to `path`, as PNG or SVG by its extension.
pub fn draw(report: &Report, path: &Path) -> Result<()> {
    let size = (1100, 1300);
    if path.extension().is_some_and(|e| e == "svg") {
        let root = SVGBackend::new(path, size).into_drawing_area();
        panels(&root, report)?;
        root.present().map_err(err)
    } else {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        panels(&root, report)?;
        root.present().map_err(err)
    }
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e}")
}

fn points(v: &Variant, key: &str) -> Vec<(f64, f64)> {
    v.extra
        .get(key)
        .and_then(|x| x.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|p| Some((p.get(0)?.as_f64()?, p.get(1)?.as_f64()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn label(v: &Variant) -> String {
    format!("{} x{}", v.name, v.threads)
}

/// One line per variant, in its palette colour, with a legend entry.
fn draw_lines<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    vs: &[Variant],
    lines: &[Vec<(f64, f64)>],
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (i, (v, pts)) in vs.iter().zip(lines).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(label(v))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    Ok(())
}

fn panels<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, report: &Report) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(&format!("uswap bench {}", report.bench), ("sans-serif", 26))
        .map_err(err)?;
    let areas = root.split_evenly((3, 1));
    let vs = &report.variants;

    // Latency CDF, log x axis in microseconds.
    let cdfs: Vec<Vec<(f64, f64)>> = vs
        .iter()
        .map(|v| {
            points(v, "cdf")
                .into_iter()
                .map(|(ns, q)| ((ns / 1000.0).max(0.01), q))
                .collect()
        })
        .collect();
    let xmax = cdfs.iter().flatten().map(|p| p.0).fold(1.0, f64::max) * 1.5;
    let xmin = cdfs.iter().flatten().map(|p| p.0).fold(xmax, f64::min).max(0.01) / 1.5;
    let mut chart = ChartBuilder::on(&areas[0])
        .caption("latency CDF", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..1f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency of one operation (us)")
        .y_desc("fraction at or below")
        .draw()
        .map_err(err)?;
    draw_lines(&mut chart, vs, &cdfs)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;

    // Throughput over time.
    let lines: Vec<Vec<(f64, f64)>> = vs.iter().map(|v| points(v, "timeline")).collect();
    let tmax = lines.iter().flatten().map(|p| p.0).fold(0.1, f64::max);
    let ymax = lines.iter().flatten().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&areas[1])
        .caption("throughput over time (last round)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(75)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("operations/s")
        .y_label_formatter(&|y| format!("{y:.1e}"))
        .draw()
        .map_err(err)?;
    draw_lines(&mut chart, vs, &lines)?;
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;

    // Throughput against the baseline, one bar per variant.
    let ratios: Vec<f64> = vs
        .iter()
        .map(|v| v.extra.get("vs_baseline").and_then(|x| x.as_f64()).unwrap_or(1.0))
        .collect();
    let rmax = ratios.iter().copied().fold(1.0, f64::max) * 1.15;
    let names: Vec<String> = vs.iter().map(label).collect();
    let mut chart = ChartBuilder::on(&areas[2])
        .caption(
            "throughput against the baseline (1.0 = uswap default)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        // A segmented axis over 0..=n-1 has one segment per variant.
        .build_cartesian_2d((0..vs.len().saturating_sub(1)).into_segmented(), 0f64..rmax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(vs.len())
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("x baseline")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .margin(25)
                .style_func(|x, _| {
                    let i = match x {
                        SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => *i,
                        SegmentValue::Last => 0,
                    };
                    Palette99::pick(i).to_rgba().filled()
                })
                .data(ratios.iter().copied().enumerate()),
        )
        .map_err(err)?;
    Ok(())
}
