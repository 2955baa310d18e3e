//! `--plot FILE.png|svg`: three panels from a workload report: the latency
//! CDF of every variant, throughput over time, and each variant's
//! throughput against its baseline (the ablation or comparison bars).
//!
//! Text is drawn with a TrueType font read from a file (plotters'
//! `ab_glyph`, pure Rust: no fontconfig to build against): the file in
//! `USWAP_PLOT_FONT`, else the first of the usual DejaVu or Liberation
//! paths, else the first `*.ttf` under /usr/share/fonts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::register_font;

use crate::report::{Report, Variant};

/// The environment variable that names the font file to draw text with.
pub const FONT_ENV: &str = "USWAP_PLOT_FONT";

/// Where the usual sans-serif fonts are, tried in this order when
/// [`FONT_ENV`] is not set.
const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Searched for any `*.ttf` when none of [`FONT_PATHS`] exists.
const FONT_DIR: &str = "/usr/share/fonts";

/// The font file to draw with: `env` (the value of [`FONT_ENV`]) when set
/// and not empty, else the first of `paths` that is a file, else the first
/// `*.ttf` found walking `dir` in name order.  The error is one line
/// saying what to do.
fn find_font(env: Option<OsString>, paths: &[&Path], dir: &Path) -> Result<PathBuf, String> {
    if let Some(v) = env.filter(|v| !v.is_empty()) {
        let p = PathBuf::from(v);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "--plot: {FONT_ENV}={} is not a file; set it to a TrueType font (.ttf), or unset it to use one from {}",
                p.display(),
                dir.display()
            ))
        };
    }
    if let Some(p) = paths.iter().find(|p| p.is_file()) {
        return Ok(p.to_path_buf());
    }
    first_ttf(dir, 8).ok_or_else(|| {
        format!(
            "--plot needs a TrueType font and found none (no *.ttf under {}): install fonts-dejavu-core (apt-get install fonts-dejavu-core), or set {FONT_ENV}=path/to/font.ttf",
            dir.display()
        )
    })
}

/// The first `*.ttf` file under `dir`, entries in name order, at most
/// `depth` directories down (a bound, should a link loop).
fn first_ttf(dir: &Path, depth: usize) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).collect();
    entries.sort();
    entries.into_iter().find_map(|p| {
        if p.is_dir() {
            depth.checked_sub(1).and_then(|d| first_ttf(&p, d))
        } else {
            let ttf = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf"));
            (ttf && p.is_file()).then_some(p)
        }
    })
}

/// Find the font, read it, and register it as plotters' sans-serif: once
/// per process (plotters keeps it for good, so its bytes are leaked).
fn load_font() -> Result<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let paths = FONT_PATHS.map(Path::new);
            let path = find_font(std::env::var_os(FONT_ENV), &paths, Path::new(FONT_DIR))?;
            let bytes = std::fs::read(&path).map_err(|e| {
                format!(
                    "--plot: cannot read the font {}: {e}; set {FONT_ENV}=path/to/font.ttf",
                    path.display()
                )
            })?;
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| {
                format!(
                    "--plot: {} is not a TrueType font that can be read; set {FONT_ENV}=path/to/font.ttf",
                    path.display()
                )
            })
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

/// Refuse a plot that cannot be drawn, before the bench runs: a path that
/// cannot be written, or no font to draw text with.
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
    load_font()
}

/// Draw `report` to `path`, as PNG or SVG by its extension.
pub fn draw(report: &Report, path: &Path) -> Result<()> {
    load_font()?;
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

/// `bench program --plot`: each runner's memory over time (its first
/// run), one line each, in MiB against seconds.
pub fn draw_memory(title: &str, lines: &[(String, Vec<(f64, f64)>)], path: &Path) -> Result<()> {
    load_font()?;
    let size = (1100, 600);
    if path.extension().is_some_and(|e| e == "svg") {
        let root = SVGBackend::new(path, size).into_drawing_area();
        memory_panel(&root, title, lines)?;
        root.present().map_err(err)
    } else {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        memory_panel(&root, title, lines)?;
        root.present().map_err(err)
    }
}

fn memory_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let all = lines.iter().flat_map(|(_, p)| p.iter());
    let (t_max, m_max) = all.fold((1.0f64, 1.0f64), |(t, m), &(x, y)| (t.max(x), m.max(y)));
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..t_max * 1.02, 0.0..m_max * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("tree's anonymous memory, MiB")
        .draw()
        .map_err(err)?;
    for (i, (name, pts)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    #[test]
    fn font_search_order() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("fonts");
        let (a, b) = (root.path().join("a.ttf"), root.path().join("b.ttf"));
        let nested = dir.join("x/y/Some.TTF");
        touch(&b);
        touch(&nested);
        touch(&dir.join("z/Later.ttf"));
        touch(&dir.join("notes.txt"));
        let paths = [a.as_path(), b.as_path()];
        // The environment variable first, then the usual paths in order,
        // then the walk, in name order.
        let env = Some(OsString::from(root.path().join("env.ttf")));
        touch(&root.path().join("env.ttf"));
        assert_eq!(find_font(env, &paths, &dir), Ok(root.path().join("env.ttf")));
        assert_eq!(find_font(Some(OsString::new()), &paths, &dir), Ok(b.clone()));
        assert_eq!(find_font(None, &paths, &dir), Ok(b.clone()));
        assert_eq!(find_font(None, &paths[..1], &dir), Ok(nested));
    }

    #[test]
    fn no_font_is_one_line_saying_what_to_do() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("none.ttf");
        let e = find_font(None, &[missing.as_path()], root.path()).unwrap_err();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.contains("fonts-dejavu-core") && e.contains("USWAP_PLOT_FONT="),
            "{e}"
        );
        let e = find_font(Some(missing.clone().into()), &[], root.path()).unwrap_err();
        assert!(
            !e.contains('\n') && e.contains("USWAP_PLOT_FONT=") && e.contains("none.ttf"),
            "{e}"
        );
        // A set variable is not silently passed over for another font.
        touch(&root.path().join("other.ttf"));
        assert!(find_font(Some(missing.into()), &[], root.path()).is_err());
    }
}
