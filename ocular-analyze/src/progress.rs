//! A progress bar on stderr for long work. Silent unless the binary turns it on (`enable`), stderr is a
//! terminal, and the work has taken more than a second: short runs and pipes never see it.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct State {
    bar: Option<ProgressBar>,
    started: Instant,
    total: u64,
    label: String,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Lets the library's long loops report progress (the CLI calls this; library users get nothing).
pub fn enable() {
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(State { bar: None, started: Instant::now(), total: 0, label: String::new() });
}

/// Starts a unit of work over `total` bytes.
pub fn begin(label: &str, total: u64) {
    if let Some(s) = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        if let Some(b) = s.bar.take() {
            b.finish_and_clear();
        }
        s.started = Instant::now();
        s.total = total;
        s.label = label.to_string();
    }
}

/// Reports how many bytes are done; cheap enough to call once per chunk.
pub fn at(done: u64) {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = guard.as_mut() else { return };
    if s.bar.is_none() {
        if s.started.elapsed() < Duration::from_secs(1) {
            return;
        }
        let bar = ProgressBar::with_draw_target(Some(s.total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta} left)")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(s.label.clone());
        s.bar = Some(bar);
    }
    if let Some(b) = &s.bar {
        b.set_position(done);
    }
}

/// Ends the unit of work and clears the bar.
pub fn end() {
    if let Some(s) = STATE.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        if let Some(b) = s.bar.take() {
            b.finish_and_clear();
        }
    }
}
