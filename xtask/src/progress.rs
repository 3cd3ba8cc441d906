//! One line per long step: `[n/m] doing X ... done (1.2s)`.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Whether a step line was started and not yet ended (notes then go on a new line).
static LINE_OPEN: AtomicBool = AtomicBool::new(false);

/// Numbered progress over a known count of steps.
#[derive(Debug)]
pub struct Progress {
    current: usize,
    total: usize,
}

impl Progress {
    /// A progress reporter over `total` steps.
    pub fn new(total: usize) -> Self {
        Self { current: 0, total }
    }

    /// Runs one step, printing its name before and its outcome and duration after.
    pub fn step<T, E: std::fmt::Display>(
        &mut self,
        what: &str,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        self.current += 1;
        let prefix = format!("[{}/{}] {what} ...", self.current, self.total);
        eprint!("{prefix} ");
        let _ = std::io::stderr().flush();
        LINE_OPEN.store(true, Ordering::SeqCst);
        let start = Instant::now();
        let result = f();
        let secs = start.elapsed().as_secs_f64();
        if !LINE_OPEN.swap(false, Ordering::SeqCst) {
            // Notes were printed in between: repeat the step name so the outcome is readable.
            eprint!("{prefix} ");
        }
        match &result {
            Ok(_) => eprintln!("done ({secs:.1}s)"),
            Err(e) => eprintln!("FAILED ({secs:.1}s): {e}"),
        }
        result
    }
}

/// Prints a note (what a step did) on its own indented line.
pub fn note(msg: impl std::fmt::Display) {
    if LINE_OPEN.swap(false, Ordering::SeqCst) {
        eprintln!();
    }
    eprintln!("      {msg}");
}
