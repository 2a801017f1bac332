//! The progress line: on a terminal, one line redrawn in place; otherwise (a log file, a
//! `nohup` run) a plain line every tenth of the way.

use std::cell::Cell;
use std::io::{IsTerminal, Write};

/// The progress line (stderr).
pub struct Progress {
    on: bool,
    tty: bool,
    label: String,
    /// Tenths already logged (non-terminal mode).
    logged: Cell<u32>,
}

impl Progress {
    /// A progress line, shown if `want` and stderr is a terminal.
    pub fn new(want: bool) -> Progress {
        let tty = std::io::stderr().is_terminal();
        Progress {
            on: want && tty,
            tty,
            label: String::new(),
            logged: Cell::new(0),
        }
    }

    /// A progress report that also logs a line every tenth when stderr is not a terminal
    /// (long runs: `soak`).
    pub fn logging(want: bool) -> Progress {
        let mut p = Progress::new(want);
        p.on = want;
        p
    }

    /// Sets the label (which rule, which round).
    pub fn label(&mut self, label: String) {
        self.label = label;
        self.logged.set(0);
    }

    /// Shows `frac` of the way done and the counts so far.
    pub fn show(&self, frac: f64, completed: u64, aborted: u64, corrupted: u64) {
        if !self.on {
            return;
        }
        if !self.tty {
            let tenth = (frac.clamp(0.0, 1.0) * 10.0) as u32;
            if tenth > self.logged.get() {
                self.logged.set(tenth);
                eprintln!(
                    "{} {:3}%: {completed} completed, {aborted} aborted, {corrupted} corrupted",
                    self.label,
                    tenth * 10
                );
            }
            return;
        }
        let width = 30;
        let filled = ((frac.clamp(0.0, 1.0)) * width as f64) as usize;
        eprint!(
            "\r{:<18} [{}{}] {:3.0}%  {completed} completed, {aborted} aborted, {corrupted} corrupted   ",
            self.label,
            "#".repeat(filled),
            ".".repeat(width - filled),
            frac * 100.0
        );
        let _ = std::io::stderr().flush();
    }

    /// Clears the line.
    pub fn clear(&self) {
        if self.on && self.tty {
            eprint!("\r{:<110}\r", "");
            let _ = std::io::stderr().flush();
        }
    }
}
