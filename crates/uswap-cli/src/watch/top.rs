//! `uswap top`: a live view of every paged process of this user, as
//! `top` and `systemd-cgtop` show theirs: resident memory against the
//! budget, what is swapped, the store's ratio, faults per second and
//! pressure, refreshed every second, sorted, `q` to quit.
//!
//! The selected row's tree (up and down move the selection) takes `uswap
//! ctl`'s actions from a key: `-` and `+` move its budget a tenth, `r`
//! reclaims a tenth of what it holds, `f` freezes it, `t` thaws it, `a`
//! turns `--budget auto` off or on.  Each goes through the tree's control
//! socket, as `uswap ctl` does, on a thread of its own (a lower budget is
//! answered when the tree has followed); the answer is the bottom line.
//!
//! Drawn with ratatui over crossterm (the alternate screen, raw mode):
//! it works wherever a terminal does, over ssh and in tmux.  A terminal
//! too small for the table gets one line saying so, not a panic.

use std::collections::HashMap;
use std::sync::mpsc;
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
    /// Whether the group is a `uswap run` tree (which `uswap ctl` reaches).
    tree: bool,
    /// The tree's budget and resident memory, for the keys' tenths.
    tree_budget: u64,
    tree_resident: u64,
    /// `--budget auto`: whether it drives the budget, and what it saved.
    auto: Option<(bool, u64)>,
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
        let gauges = g.gauges();
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
                tree: g.tree,
                tree_budget: gauges.budget * page,
                tree_resident: gauges.resident * page,
                auto: g.auto.as_ref().map(|a| (a.on, a.saved)),
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

/// What a key asks of the selected row's tree: the request line `uswap
/// ctl` would send, or why there is none.
fn action(key: char, r: &RowData) -> Option<Result<String, String>> {
    let tenth = |b: u64| (b / 10).max(1 << 20);
    let line = match key {
        '-' => format!(
            "budget {}",
            r.tree_budget.saturating_sub(tenth(r.tree_budget)).max(1 << 20)
        ),
        '+' => format!("budget {}", r.tree_budget + tenth(r.tree_budget)),
        'r' => format!("reclaim {}", tenth(r.tree_resident)),
        'f' => "freeze".into(),
        't' => "thaw".into(),
        'a' => match r.auto {
            Some((on, _)) => format!("auto {}", if on { "off" } else { "on" }),
            None => return Some(Err(format!("tree {}: not started with --budget auto", r.group))),
        },
        _ => return None,
    };
    if !r.tree {
        return Some(Err(format!(
            "process {}: not under uswap run (a library's instance); there is no tree to control",
            r.pid
        )));
    }
    Some(Ok(line))
}

const KEYS: &str = "up/down: select  -/+: budget  r: reclaim  f: freeze  t: thaw  a: auto";

fn draw(
    f: &mut Frame,
    data: &[RowData],
    selected: usize,
    groups: usize,
    sort: SortBy,
    error: Option<&str>,
    answer: &str,
) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "uswap top: terminal {}x{} too small (needs {MIN_WIDTH}x{MIN_HEIGHT}); q quits",
            area.width, area.height
        );
        f.render_widget(Paragraph::new(msg), area);
        return;
    }
    let [head, body, foot] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(1), Constraint::Length(1)]).areas(area);
    f.render_widget(
        Paragraph::new(Line::from(if answer.is_empty() { KEYS } else { answer })),
        foot,
    );
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
        "SAVED",
        "SWAPPED",
        "RATIO",
        "FAULTS/S",
        "SOME10",
        "FULL10",
        "COMMAND",
    ])
    .style(Style::default().add_modifier(Modifier::REVERSED));
    let table_rows = data.iter().enumerate().map(|(i, r)| {
        let row = Row::new([
            r.pid.to_string(),
            r.group.to_string(),
            // Against the share it holds now: the tree's budget split.
            bar(r.resident, r.share.max(1), 10),
            human(r.resident),
            human(r.budget),
            // Under the tree's peak, as --budget auto holds it; `*` when
            // the controller is off.
            match r.auto {
                Some((on, saved)) => format!("{}{}", human(saved), if on { "" } else { "*" }),
                None => "-".into(),
            },
            human(r.swapped),
            r.ratio.map_or("-".into(), |x| format!("{x:.2}")),
            format!("{:.0}", r.fault_rate),
            format!("{:.2}", r.some10),
            format!("{:.2}", r.full10),
            r.command.clone(),
        ]);
        if i == selected {
            row.style(Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED))
        } else {
            row
        }
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(16),
        Constraint::Length(7),
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
        // The selection follows its process across refreshes and sorts.
        let mut selected_pid: Option<i32> = None;
        let mut answer = String::new();
        let (tx, rx) = mpsc::channel::<String>();
        loop {
            let (list, error) = match groups.take().map(Ok).unwrap_or_else(gather) {
                Ok(g) => (g, None),
                Err(e) => (Vec::new(), Some(format!("{e:#}"))),
            };
            let data = rows(&list, &mut seen, sort);
            let mut selected = selected_pid
                .and_then(|p| data.iter().position(|r| r.pid == p))
                .unwrap_or(0);
            while let Ok(a) = rx.try_recv() {
                answer = a;
            }
            terminal.draw(|f| draw(f, &data, selected, list.len(), sort, error.as_deref(), &answer))?;
            let until = Instant::now() + Duration::from_secs_f64(args.delay);
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                if !event::poll(left.min(Duration::from_millis(100)))? {
                    // An answer that came meanwhile is shown at once.
                    if let Ok(a) = rx.try_recv() {
                        answer = a;
                        break;
                    }
                    continue;
                }
                match event::read()? {
                    Event::Key(k) if k.kind == KeyEventKind::Press => match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                        KeyCode::Char('s') => {
                            sort = sort.next();
                            break;
                        }
                        KeyCode::Up | KeyCode::Down => {
                            selected = match k.code {
                                KeyCode::Up => selected.saturating_sub(1),
                                _ => (selected + 1).min(data.len().saturating_sub(1)),
                            };
                            selected_pid = data.get(selected).map(|r| r.pid);
                            break;
                        }
                        KeyCode::Char(c) => {
                            let Some(r) = data.get(selected) else { continue };
                            match action(c, r) {
                                None => continue,
                                Some(Err(e)) => answer = e,
                                Some(Ok(line)) => {
                                    answer = format!("tree {}: {line}...", r.group);
                                    let (tx, pid) = (tx.clone(), r.pid);
                                    std::thread::spawn(move || {
                                        let a = match crate::ctl::request(pid, &line) {
                                            Ok(a) => a,
                                            Err(e) => format!("error: {e:#}"),
                                        };
                                        let _ = tx.send(format!("tree of {pid}: {a}"));
                                    });
                                }
                            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tree: bool, auto: Option<(bool, u64)>) -> RowData {
        RowData {
            pid: 42,
            group: 41,
            tree,
            tree_budget: 1000 << 20,
            tree_resident: 600 << 20,
            auto,
            resident: 600 << 20,
            budget: 1000 << 20,
            share: 1000 << 20,
            swapped: 0,
            ratio: None,
            fault_rate: 0.0,
            some10: 0.0,
            full10: 0.0,
            command: "python3".into(),
        }
    }

    /// Each key is the request `uswap ctl` would send for the selected
    /// row's tree; a process alone, and `a` without `--budget auto`, are
    /// told why not; other keys ask nothing.
    #[test]
    fn keys_are_ctl_requests_for_the_selected_tree() {
        let r = row(true, Some((true, 0)));
        let ask = |k| action(k, &r).map(|a| a.unwrap());
        assert_eq!(ask('-').unwrap(), format!("budget {}", 900u64 << 20));
        assert_eq!(ask('+').unwrap(), format!("budget {}", 1100u64 << 20));
        assert_eq!(ask('r').unwrap(), format!("reclaim {}", 60u64 << 20));
        assert_eq!(ask('f').unwrap(), "freeze");
        assert_eq!(ask('t').unwrap(), "thaw");
        assert_eq!(ask('a').unwrap(), "auto off");
        assert_eq!(
            action('a', &row(true, Some((false, 0)))).unwrap().unwrap(),
            "auto on"
        );
        assert!(ask('x').is_none());
        let e = action('a', &row(true, None)).unwrap().unwrap_err();
        assert!(e.contains("--budget auto"), "{e}");
        let e = action('f', &row(false, None)).unwrap().unwrap_err();
        assert!(e.contains("no tree"), "{e}");
        // Never under a batch's room.
        let mut small = row(true, None);
        small.tree_budget = 1 << 20;
        assert_eq!(
            action('-', &small).unwrap().unwrap(),
            format!("budget {}", 1u64 << 20)
        );
    }
}
