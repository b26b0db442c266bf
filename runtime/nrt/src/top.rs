//! `nrt top`: a live view of the runtime processes like neuron-top — a header (period, device,
//! runtimes), a table of logical cores (utilisation, executions/s, latency p50/p99, errors) and a
//! table of processes (models, device memory) — redrawn once per period.
//!
//! The terminal is put in raw mode on the alternate screen and restored on every way out: `q`,
//! Esc or Ctrl-C, SIGTERM, an error (a drop guard) and a panic (ratatui's hook). ratatui draws
//! into a back buffer and writes only the cells that changed, so a redraw does not flicker.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};

use crate::monitor::collect::{Figures, collect};
use crate::monitor::hw::{HwReader, HwSample};
use crate::monitor::{Source, parse_period, sample, stop_signal};

/// `nrt top`'s options.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// Time between refreshes (`200ms`, `1s`, ...).
    #[arg(long, default_value = "1s", value_parser = parse_period)]
    pub period: Duration,
}

/// What one screen shows.
#[derive(Clone, Debug)]
pub struct View {
    /// The refresh period.
    pub period: Duration,
    /// The figures of the last period.
    pub figures: Figures,
    /// simdev's counters (for the device line).
    pub hw: HwSample,
    /// Refreshes so far.
    pub refresh: u64,
}

/// `ns` as a short latency (`850.0us`, `1.23ms`, `2.50s`); `-` when unknown.
fn latency(ns: Option<u64>) -> String {
    #[allow(clippy::cast_precision_loss)]
    match ns {
        None => "-".into(),
        Some(ns) if ns < 1_000_000 => format!("{:.1}us", ns as f64 / 1e3),
        Some(ns) if ns < 1_000_000_000 => format!("{:.2}ms", ns as f64 / 1e6),
        Some(ns) => format!("{:.2}s", ns as f64 / 1e9),
    }
}

/// `bytes` in binary units.
fn bytes(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let f = n as f64;
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", f / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{:.1} MiB", f / f64::from(1u32 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", f / 1024.0),
        n => format!("{n} B"),
    }
}

/// A command line with its program's directory dropped (`/usr/bin/python3 x.py` → `python3
/// x.py`), so the narrow column shows what runs.
fn short_command(command: &str) -> String {
    let (program, args) = command.split_once(' ').unwrap_or((command, ""));
    let name = program.rsplit('/').next().unwrap_or(program);
    if args.is_empty() {
        name.to_owned()
    } else {
        format!("{name} {args}")
    }
}

/// The first `max` characters of `s`.
fn clip(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// Draws `view` on `frame`.
pub fn draw(frame: &mut Frame, view: &View) {
    let fig = &view.figures;
    let live = fig.live().count();
    let cores = fig.live().map(|p| p.cores.len()).sum::<usize>().max(1);
    let [header, cores_area, procs_area] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Min(u16::try_from(cores + 3).unwrap_or(u16::MAX).min(20)),
        Constraint::Min(5),
    ])
    .areas(frame.area());

    let device = match &view.hw.device {
        Some(d) => format!("{} · {} NCs (simdev)", d.arch, d.nc_count),
        None => format!("unknown — {}", view.hw.error),
    };
    let header_text = vec![
        Line::from(format!(
            "period {}   runtimes {} live, {} stale   refresh #{}",
            humantime::format_duration(view.period),
            live,
            fig.stale_count(),
            view.refresh
        )),
        Line::from(format!("device {device}")),
    ];
    frame.render_widget(
        Paragraph::new(header_text).block(Block::bordered().title(" nrt top ")),
        header,
    );

    let bold = Style::default().add_modifier(Modifier::BOLD);
    let core_rows: Vec<Row> = fig
        .live()
        .flat_map(|p| {
            p.cores.iter().map(move |c| {
                Row::new(vec![
                    clip(&short_command(&p.command), 24),
                    p.pid.to_string(),
                    format!("nc{}", c.logical_id),
                    format!("{:.1}%", c.utilization_pct),
                    format!("{:.1}", c.executions_per_s),
                    latency(c.total_latency.percentile(50.0)),
                    latency(c.total_latency.percentile(99.0)),
                    format!("{} ({} total)", c.errors, c.errors_total),
                ])
            })
        })
        .collect();
    let core_table = Table::new(
        core_rows,
        [
            Constraint::Length(24),
            Constraint::Length(8),
            Constraint::Length(6),
            Constraint::Length(8),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Min(14),
        ],
    )
    .header(
        Row::new(vec![
            "PROCESS", "PID", "CORE", "UTIL", "EXEC/S", "P50", "P99", "ERRORS",
        ])
        .style(bold),
    )
    .block(Block::bordered().title(" NeuronCores "));
    frame.render_widget(core_table, cores_area);

    let proc_rows: Vec<Row> = fig
        .processes
        .iter()
        .map(|p| {
            let models: Vec<&str> = p
                .models
                .iter()
                .filter(|m| m.loaded)
                .map(|m| m.name.as_str())
                .collect();
            Row::new(vec![
                p.pid.to_string(),
                clip(&short_command(&p.command), 32),
                if p.stale {
                    "stale"
                } else if p.closed {
                    "closed"
                } else {
                    "live"
                }
                .to_string(),
                format!("{} {}", models.len(), clip(&models.join(","), 30)),
                bytes(p.device_bytes()),
                p.execution_total.completed.to_string(),
                p.error_total.total().to_string(),
            ])
        })
        .collect();
    let proc_table = Table::new(
        proc_rows,
        [
            Constraint::Length(8),
            Constraint::Length(32),
            Constraint::Length(6),
            Constraint::Length(34),
            Constraint::Length(11),
            Constraint::Length(10),
            Constraint::Min(7),
        ],
    )
    .header(
        Row::new(vec![
            "PID",
            "COMMAND",
            "STATE",
            "MODELS",
            "DEVICE MEM",
            "COMPLETED",
            "ERRORS",
        ])
        .style(bold),
    )
    .block(Block::bordered().title(" Processes  (q: quit) "));
    frame.render_widget(proc_table, procs_area);
}

/// Restores the terminal when dropped (errors and early returns included).
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// Whether `ev` asks to quit: `q`, Esc or Ctrl-C.
fn is_quit(ev: &Event) -> bool {
    let Event::Key(k) = ev else { return false };
    k.kind == KeyEventKind::Press
        && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
            || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL)))
}

fn run(args: &TopArgs, source: &mut dyn Source) -> std::io::Result<()> {
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return Err(std::io::Error::other(
            "needs a terminal, and its output is not one (`nrt monitor` prints the same \
             figures as one JSON document per period)",
        ));
    }
    let stop = stop_signal();
    let mut hw = HwReader::from_env();
    let mut prev = sample(source);
    let mut view = View {
        period: args.period,
        figures: collect(None, &prev),
        hw: hw.read(),
        refresh: 0,
    };
    // Armed first: try_init may fail after raw mode is on.
    let _restore = Restore;
    let mut terminal = ratatui::try_init()?;
    loop {
        terminal.draw(|f| draw(f, &view))?;
        let deadline = Instant::now() + args.period;
        loop {
            if stop.as_ref().is_some_and(|rx| rx.try_recv().is_ok()) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if event::poll(left.min(Duration::from_millis(100)))? {
                let ev = event::read()?;
                if is_quit(&ev) {
                    return Ok(());
                }
                if matches!(ev, Event::Resize(..)) {
                    terminal.draw(|f| draw(f, &view))?;
                }
            }
        }
        let cur = sample(source);
        view.figures = collect(Some(&prev), &cur);
        view.hw = hw.read();
        view.refresh += 1;
        prev = cur;
    }
}

/// Runs `nrt top` on `source` until the user quits.
pub fn main(args: &TopArgs, mut source: impl Source) -> ExitCode {
    match run(args, &mut source) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nrt top: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_show_the_program_name_and_arguments() {
        assert_eq!(
            short_command("/usr/bin/python3 train.py --x"),
            "python3 train.py --x"
        );
        assert_eq!(short_command("/opt/nrt"), "nrt");
        assert_eq!(short_command("nrt bench"), "nrt bench");
    }
    use crate::monitor::collect::Sample;
    use crate::monitor::collect::tests::{core, process};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn screen(view: &View) -> String {
        let mut t = Terminal::new(TestBackend::new(140, 30)).unwrap();
        t.draw(|f| draw(f, view)).unwrap();
        let buf = t.backend().buffer().clone();
        let mut out = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                out.push_str(buf[(x, y)].symbol());
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn shows_every_live_core_and_process_with_its_figures() {
        let t0 = Instant::now();
        let prev = Sample {
            at: t0,
            processes: vec![
                process(101, 5, vec![core(0, 0, 0, 1, 0), core(1, 0, 0, 1, 0)]),
                process(202, 5, vec![core(0, 0, 0, 1, 0)]),
            ],
        };
        let mut stale = process(303, 9, vec![core(0, 5, 0, 1, 0)]);
        stale.liveness = runtime::datastore::snapshot::Liveness::Stale;
        let cur = Sample {
            at: t0 + Duration::from_secs(1),
            processes: vec![
                process(
                    101,
                    6,
                    vec![core(0, 50, 2, 2000, 500), core(1, 10, 0, 300, 100)],
                ),
                process(202, 6, vec![core(0, 7, 0, 40, 1000)]),
                stale,
            ],
        };
        let view = View {
            period: Duration::from_secs(1),
            figures: collect(Some(&prev), &cur),
            hw: HwSample {
                error: "NEURON_SIMDEV_SOCKET is not set".into(),
                ..HwSample::default()
            },
            refresh: 3,
        };
        let s = screen(&view);
        assert!(s.contains("runtimes 2 live, 1 stale"), "{s}");
        assert!(s.contains("refresh #3"), "{s}");
        assert!(s.contains("NEURON_SIMDEV_SOCKET is not set"), "{s}");
        // Cores: logical ids 4, 5 (pid 101) and 4 (pid 202).
        let core_lines: Vec<&str> = s.lines().filter(|l| l.contains(" nc")).collect();
        assert_eq!(core_lines.len(), 3, "{s}");
        assert!(core_lines[0].contains("101") && core_lines[0].contains("nc4"));
        assert!(
            core_lines[0].contains("50.0%") && core_lines[0].contains("52.0"),
            "{s}"
        );
        assert!(core_lines[0].contains("2 (2 total)"), "{s}");
        assert!(core_lines[1].contains("nc5") && core_lines[1].contains("10.0%"));
        assert!(core_lines[2].contains("202") && core_lines[2].contains("100.0%"));
        // p50 of 2 ms executions, within a bucket.
        assert!(core_lines[0].contains("ms"), "{s}");
        assert!(s.contains("stale") && s.contains("303"), "{s}");
        assert!(s.contains("1 digits"), "{s}");
        assert!(s.contains("2.9 KiB"), "device memory of one core: {s}");
    }

    #[test]
    fn latency_and_bytes_are_short_and_unit_bearing() {
        assert_eq!(latency(None), "-");
        assert_eq!(latency(Some(850_000)), "850.0us");
        assert_eq!(latency(Some(1_230_000)), "1.23ms");
        assert_eq!(latency(Some(2_500_000_000)), "2.50s");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn q_esc_and_ctrl_c_quit_other_keys_do_not() {
        use crossterm::event::KeyEvent;
        let key = |code, m| Event::Key(KeyEvent::new(code, m));
        assert!(is_quit(&key(KeyCode::Char('q'), KeyModifiers::NONE)));
        assert!(is_quit(&key(KeyCode::Esc, KeyModifiers::NONE)));
        assert!(is_quit(&key(KeyCode::Char('c'), KeyModifiers::CONTROL)));
        assert!(!is_quit(&key(KeyCode::Char('c'), KeyModifiers::NONE)));
        assert!(!is_quit(&key(KeyCode::Char('x'), KeyModifiers::NONE)));
    }
}
