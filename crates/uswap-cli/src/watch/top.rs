//! `uswap top`: a live view of every paged process of this user, as
//! `top` and `systemd-cgtop` show theirs: resident memory against the
//! budget, what is swapped, the store's ratio, faults per second and
//! pressure, refreshed every second, sorted, `q` to quit.
//!
//! Drawn with ratatui over crossterm (the alternate screen, raw mode):
//! it works wherever a terminal does, over ssh and in tmux.  A terminal
//! too small for the table gets one line saying so, not a panic.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Args;
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Row, Table};
use ratatui::Frame;
use uswap::PAGE_SIZE;

use super::{gather, human, store_ratio, Group};

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(short = 'd', long = "delay", default_value_t = 1.0, value_name = "SECONDS")]
    pub delay: f64,
}

/// What the rows are sorted by (`s` moves on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SortBy {
    Resident,
    FaultRate,
    Pressure,
    Swapped,
    Pid,
}

impl SortBy {
    fn next(self) -> SortBy {
        match self {
            SortBy::Resident => SortBy::FaultRate,
            SortBy::FaultRate => SortBy::Pressure,
            SortBy::Pressure => SortBy::Swapped,
            SortBy::Swapped => SortBy::Pid,
            SortBy::Pid => SortBy::Resident,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SortBy::Resident => "resident",
            SortBy::FaultRate => "faults/s",
            SortBy::Pressure => "pressure",
            SortBy::Swapped => "swapped",
            SortBy::Pid => "pid",
        }
    }
}

/// One row of the table.
struct RowData {
    pid: i32,
    group: i32,
    resident: u64,
    budget: u64,
    share: u64,
    swapped: u64,
    ratio: Option<f64>,
    fault_rate: f64,
    some10: f64,
    full10: f64,
    command: String,
}

/// The previous refresh's fault counts, for rates.
type Seen = HashMap<(i32, u64), (u64, Instant)>;

fn rows(groups: &[Group], seen: &mut Seen, sort: SortBy) -> Vec<RowData> {
    let page = PAGE_SIZE as u64;
    let now = Instant::now();
    let mut next: Seen = HashMap::new();
    let mut out = Vec::new();
    for g in groups {
        for m in &g.members {
            let key = (m.id.pid, m.id.born_unix_ns);
            let faults = m.stats.counters.faults;
            let rate = match seen.get(&key) {
                Some(&(f, t)) if now > t => faults.saturating_sub(f) as f64 / (now - t).as_secs_f64(),
                _ => 0.0,
            };
            next.insert(key, (faults, now));
            let gs = &m.stats.gauges;
            out.push(RowData {
                pid: m.id.pid,
                group: g.id,
                resident: gs.resident * page,
                budget: gs.budget * page,
                share: gs.share * page,
                swapped: m.stats.devices.iter().map(|d| d.used).sum::<u64>() * page,
                ratio: store_ratio(gs),
                fault_rate: rate,
                some10: m.stats.pressure.some.avg10,
                full10: m.stats.pressure.full.avg10,
                command: m.id.command.clone(),
            });
        }
    }
    *seen = next;
    match sort {
        SortBy::Resident => out.sort_by_key(|r| std::cmp::Reverse(r.resident)),
        SortBy::FaultRate => out.sort_by(|a, b| b.fault_rate.total_cmp(&a.fault_rate)),
        SortBy::Pressure => out.sort_by(|a, b| b.some10.total_cmp(&a.some10)),
        SortBy::Swapped => out.sort_by_key(|r| std::cmp::Reverse(r.swapped)),
        SortBy::Pid => out.sort_by_key(|r| r.pid),
    }
    out
}

/// A bar of `width` cells for `used` of `of`, and its percent.
fn bar(used: u64, of: u64, width: usize) -> String {
    let share = if of == 0 { 0.0 } else { used as f64 / of as f64 };
    let filled = ((share * width as f64).round() as usize).min(width);
    format!(
        "{}{} {:>3.0}%",
        "#".repeat(filled),
        ".".repeat(width - filled),
        share * 100.0
    )
}

/// The smallest terminal the table is drawn in.
const MIN_WIDTH: u16 = 60;
const MIN_HEIGHT: u16 = 4;

fn draw(f: &mut Frame, data: &[RowData], groups: usize, sort: SortBy, error: Option<&str>) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "uswap top: terminal {}x{} too small (needs {MIN_WIDTH}x{MIN_HEIGHT}); q quits",
            area.width, area.height
        );
        f.render_widget(Paragraph::new(msg), area);
        return;
    }
    let [head, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(area);
    let title = match error {
        Some(e) => format!("uswap top: {e}"),
        None => format!(
            "uswap top: {} process{} in {} group{}, sorted by {} (s: sort, q: quit)",
            data.len(),
            if data.len() == 1 { "" } else { "es" },
            groups,
            if groups == 1 { "" } else { "s" },
            sort.name()
        ),
    };
    f.render_widget(Paragraph::new(Line::from(title)), head);
    let header = Row::new([
        "PID",
        "GROUP",
        "RESIDENT/SHARE",
        "RES",
        "BUDGET",
        "SWAPPED",
        "RATIO",
        "FAULTS/S",
        "SOME10",
        "FULL10",
        "COMMAND",
    ])
    .style(Style::default().add_modifier(Modifier::REVERSED));
    let table_rows = data.iter().map(|r| {
        Row::new([
            r.pid.to_string(),
            r.group.to_string(),
            // Against the share it holds now: the tree's budget split.
            bar(r.resident, r.share.max(1), 10),
            human(r.resident),
            human(r.budget),
            human(r.swapped),
            r.ratio.map_or("-".into(), |x| format!("{x:.2}")),
            format!("{:.0}", r.fault_rate),
            format!("{:.2}", r.some10),
            format!("{:.2}", r.full10),
            r.command.clone(),
        ])
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(16),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(9),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Min(10),
    ];
    f.render_widget(Table::new(table_rows, widths).header(header), body);
}

pub fn run(args: &TopArgs) -> anyhow::Result<()> {
    if !(args.delay.is_finite() && args.delay >= 0.1) {
        anyhow::bail!("--delay {}: give at least 0.1 seconds", args.delay);
    }
    let groups = gather()?;
    if groups.is_empty() {
        println!(
            "uswap top: no program is paged by uswap for this user now (nothing in {})",
            uswap::stats::live::directory().display()
        );
        return Ok(());
    }
    let mut terminal = ratatui::try_init()?;
    let result = (|| -> anyhow::Result<()> {
        let mut seen = Seen::new();
        let mut sort = SortBy::Resident;
        let mut groups = Some(groups);
        loop {
            let (list, error) = match groups.take().map(Ok).unwrap_or_else(gather) {
                Ok(g) => (g, None),
                Err(e) => (Vec::new(), Some(format!("{e:#}"))),
            };
            let data = rows(&list, &mut seen, sort);
            terminal.draw(|f| draw(f, &data, list.len(), sort, error.as_deref()))?;
            let until = Instant::now() + Duration::from_secs_f64(args.delay);
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                if !event::poll(left)? {
                    break;
                }
                match event::read()? {
                    Event::Key(k) if k.kind == KeyEventKind::Press => match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                        KeyCode::Char('s') => {
                            sort = sort.next();
                            break;
                        }
                        _ => {}
                    },
                    // Redraw at the new size at once.
                    Event::Resize(..) => break,
                    _ => {}
                }
            }
        }
    })();
    ratatui::restore();
    result
}
