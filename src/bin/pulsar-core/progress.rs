//! Progress of a run on stderr: a bar on a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a plain progress line is printed off a terminal.
const LINE_INTERVAL: Duration = Duration::from_secs(10);

/// Reports `done / total` acknowledgements.
pub enum Progress {
    /// `--quiet`.
    Off,
    /// stderr is a terminal.
    Bar(indicatif::ProgressBar),
    /// stderr is a pipe or a file (CI): one line every [`LINE_INTERVAL`].
    Lines {
        /// Start of the run.
        start: Instant,
        /// When the last line was printed.
        last: Mutex<Option<Instant>>,
    },
}

impl Progress {
    /// Chooses the form for this process's stderr.
    pub fn new(quiet: bool) -> Self {
        if quiet {
            return Progress::Off;
        }
        if std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new(1);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} acks {percent}% eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            return Progress::Bar(b);
        }
        Progress::Lines {
            start: Instant::now(),
            last: Mutex::new(None),
        }
    }

    /// Records progress (called by the simulator).
    pub fn update(&self, done: u64, total: u64) {
        match self {
            Progress::Off => {}
            Progress::Bar(b) => {
                b.set_length(total);
                b.set_position(done);
            }
            Progress::Lines { start, last } => {
                let now = Instant::now();
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                let due = match *last {
                    None => now.duration_since(*start) >= LINE_INTERVAL,
                    Some(t) => now.duration_since(t) >= LINE_INTERVAL,
                };
                if due || (done == total && last.is_some()) {
                    *last = Some(now);
                    eprintln!("{}", line(done, total, now.duration_since(*start)));
                }
            }
        }
    }

    /// Clears the bar at the end of the run.
    pub fn finish(&self) {
        if let Progress::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

/// `progress: 1200/5000 acks (24%), 12 s elapsed, eta 38 s`.
fn line(done: u64, total: u64, elapsed: Duration) -> String {
    let pct = done.saturating_mul(100).checked_div(total).unwrap_or(0);
    let secs = elapsed.as_secs();
    let eta = if done == 0 || done >= total {
        String::new()
    } else {
        let rest = elapsed.as_secs_f64() * (total - done) as f64 / done as f64;
        format!(", eta {} s", rest.round() as u64)
    };
    format!("progress: {done}/{total} acks ({pct}%), {secs} s elapsed{eta}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_line_says_count_percentage_elapsed_and_eta() {
        assert_eq!(
            line(1_200, 5_000, Duration::from_secs(12)),
            "progress: 1200/5000 acks (24%), 12 s elapsed, eta 38 s"
        );
        assert_eq!(
            line(5_000, 5_000, Duration::from_secs(50)),
            "progress: 5000/5000 acks (100%), 50 s elapsed"
        );
    }
}
