//! One streaming pass over a trace that rebuilds each thread's call stack and collects function
//! statistics and hot loops. Memory: one chunk of events, one stack per thread, counters per function and
//! per loop; never the whole event stream.
//!
//! Timing rules, stated where they are used:
//! - Every event costs the recorder its kind's calibrated cost (the file's CALIBRATION chunk, else the
//!   header's single `event_cost_ticks`). The time from one event's clock read to a later one's holds the
//!   overhead of the later event plus every event in between: a span from event `a` to event `b` is
//!   corrected by the sum of the costs of the events in `(a, b]`. Threads keep that sum running.
//! - A loop is a backward `JUMP` (destination < offset) in a code object: its head is the destination, its
//!   end the jump. One iteration is the time from one execution of that jump to the next in the same frame.
//! - In adaptive mode the time between two consecutive events of one frame is the cost of the block of
//!   instructions that ran between them; it is spread evenly over that block's instructions. In precise
//!   mode the time from one INSTRUCTION event to the next is the cost of the first instruction.

use crate::codemap::CodeMap;
use crate::walk::{Frames, Marker, Step, Walk};
use ocular_format::{Body, CodeObject, EventKind, Header, Mode, RawEvent, ReadOptions, Reader};
use rustc_hash::FxHashMap as HashMap;
use std::path::Path;

/// Per function (code object).
///
/// In a recording with windows (FORMAT.md 5.3) each figure is what the complete part of the recording
/// holds plus what the later windows hold, scaled by the time they stand for ([`Windows::scale`]); such a
/// figure is `estimated`. Without windows every figure is as recorded.
#[derive(Clone, Debug, Default)]
pub struct FunctionStats {
    /// Calls (PY_START events), estimated where `estimated`.
    pub calls: u64,
    /// Inclusive ticks, outermost activations only (recursion is not counted twice), corrected; may be
    /// slightly negative for tiny functions before clamping at report time.
    pub inclusive: f64,
    /// Exclusive ticks (callees removed), corrected; see `inclusive`.
    pub exclusive: f64,
    /// Calls actually recorded (equal to `calls` unless `estimated`).
    pub observed_calls: u64,
    /// Part of the run was seen through windows only: the figures are estimates.
    pub estimated: bool,
    /// The same for `calls` (a separate field, so that a later format can tell them apart): false for a
    /// function whose every call was recorded or counted (FORMAT.md 5.8), even in a sampled run.
    pub calls_estimated: bool,
    /// Half the width of a 95% interval around an estimated `calls` (0 when exact), from how the later
    /// windows' counts of it vary.
    pub calls_ci: f64,
    /// Half the width of 95% intervals around an estimated `inclusive` and `exclusive` (ticks; 0 when exact),
    /// from how the later windows' times of the function vary: the truth lies within them 19 times in 20,
    /// as far as the windows can tell.
    pub inclusive_ci: f64,
    pub exclusive_ci: f64,
    /// Calls known to have happened: recorded anywhere or counted (FORMAT.md 5.8). An estimate is never
    /// below it.
    pub calls_at_least: u64,
    /// The count is a lower bound only: calls were made beyond what was counted outside windows, and no
    /// window saw one, so nothing says how many (`calls` is `calls_at_least`; no interval).
    pub calls_lower_bound: bool,
    /// The times are lower bounds only: the function was called after the part recorded completely and no
    /// window saw it run, so nothing says how long it ran then.
    pub times_lower_bound: bool,
    /// [complete part, window part] of calls, inclusive and exclusive ticks, before scaling.
    parts: Parts,
}

/// What the figures of a recording are estimated with ([`FunctionStats::finish`]).
#[derive(Clone, Copy, Debug)]
struct Estimation {
    /// [`Windows::scale`].
    scale: f64,
    /// Part of the run was seen through windows only.
    sampled: bool,
    /// The later windows, and their mean length in ticks.
    windows: u64,
    window_len: f64,
    /// [`cost_far_end`].
    cost_far: f64,
    /// [`DENSE_BIN_S`] in ticks.
    dense_bin: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Parts {
    /// Calls recorded: [complete part, later windows].
    calls: [u64; 2],
    /// The later windows' calls, each window's times its factor ([`ThreadState::flush_window`]), and the
    /// sum of their squares (for the estimate's interval).
    window_calls: f64,
    window_calls_sq: f64,
    /// The most calls one later window held (times its factor): what a window spent where the function is
    /// called most densely holds, the pseudo-count of the count's interval.
    window_calls_max: f64,
    /// The complete part's densest stretch of this function's calls: the most calls in [`DENSE_BIN_S`] of
    /// the program's time (the recorder's cost taken out); with `dense_bin`, the current stretch's index
    /// and its calls so far.
    dense_max: u32,
    dense_bin: (u64, u32),
    /// What `window_calls` would add had the recorder's cost in each window been `1 + COST_UNCERTAINTY`
    /// times the calibrated one: the far end of the count's systematic error.
    window_calls_for_cost: f64,
    /// The sums of the squares of the later windows' times (inclusive, exclusive), each window's times its
    /// factor: their spread across windows.
    window_times_sq: [f64; 2],
    /// The later windows in which the function had time (inclusive, exclusive).
    window_times_seen: [u64; 2],
    /// Threads merged: the sums of the threads' squared interval half widths (calls, inclusive, exclusive).
    /// Each thread's windows vary on their own, so the merged intervals add in quadrature; summing the
    /// threads' squares into one spread would not (a function in every window of three threads has no
    /// spread in each, and its merged sum none across them either, yet each thread's share of it does).
    merged_ci_sq: Option<[f64; 3]>,
    /// Every PY_START recorded, in or out of windows (and each call a window opened at the start of, whose
    /// PY_START is not recorded), and calls counted outside windows (FORMAT.md 5.8).
    starts: u64,
    counted: u64,
    inclusive: [f64; 2],
    exclusive: [f64; 2],
    /// The recorder's cost taken out of the complete part's inclusive and exclusive times (ticks).
    cost: [f64; 2],
    /// The times' intervals from the windows' spread alone (inclusive, exclusive; ticks): threads' add in
    /// quadrature, their cost terms linearly.
    spread_ci: [f64; 2],
}

impl FunctionStats {
    fn add(&mut self, o: &FunctionStats) {
        for i in 0..2 {
            self.parts.calls[i] += o.parts.calls[i];
            self.parts.inclusive[i] += o.parts.inclusive[i];
            self.parts.exclusive[i] += o.parts.exclusive[i];
        }
        self.parts.window_calls += o.parts.window_calls;
        self.parts.window_calls_sq += o.parts.window_calls_sq;
        self.parts.window_calls_max = self.parts.window_calls_max.max(o.parts.window_calls_max);
        self.parts.dense_max = self.parts.dense_max.max(o.parts.dense_max);
        self.parts.window_calls_for_cost += o.parts.window_calls_for_cost;
        self.parts.window_times_sq[0] += o.parts.window_times_sq[0];
        self.parts.window_times_sq[1] += o.parts.window_times_sq[1];
        self.parts.window_times_seen[0] += o.parts.window_times_seen[0];
        self.parts.window_times_seen[1] += o.parts.window_times_seen[1];
        self.parts.cost[0] += o.parts.cost[0];
        self.parts.cost[1] += o.parts.cost[1];
        let sq = self.parts.merged_ci_sq.get_or_insert([0.0; 3]);
        sq[0] += o.calls_ci * o.calls_ci;
        sq[1] += o.parts.spread_ci[0] * o.parts.spread_ci[0];
        sq[2] += o.parts.spread_ci[1] * o.parts.spread_ci[1];
        self.parts.starts += o.parts.starts;
        self.parts.counted += o.parts.counted;
    }

    /// Caps an estimate's times at `limit` ticks (what its threads could have run); exact figures are
    /// never above it.
    fn cap(&mut self, limit: f64) {
        if self.estimated && limit > 0.0 {
            self.inclusive = self.inclusive.min(limit);
            self.exclusive = self.exclusive.min(self.inclusive);
            self.inclusive_ci = self.inclusive_ci.min(limit);
            self.exclusive_ci = self.exclusive_ci.min(limit);
        }
    }

    /// Sets the reported figures from the parts, the window part scaled by `scale`. `sampled`: part of
    /// the run was only seen through windows, so every figure is an estimate (a function that ran only
    /// between windows there adds nothing, which is an estimate too).
    ///
    /// `windows`: the number of later windows; `counted_all`: every call of the function outside windows
    /// was counted (FORMAT.md 5.8: it never reached the recorder's limit), so its calls are exact.
    ///
    /// `window_len`: the later windows' mean length in ticks; `cost_far`: [`cost_far_end`].
    fn finish(&mut self, e: &Estimation, counted_all: bool) {
        let Estimation { scale, sampled, windows, window_len, cost_far, dense_bin } = *e;
        let p = &self.parts;
        self.observed_calls = p.calls[0] + p.calls[1];
        self.calls_at_least = p.starts + p.counted;
        self.inclusive = p.inclusive[0] + p.inclusive[1] * scale;
        self.exclusive = p.exclusive[0] + p.exclusive[1] * scale;
        // A function's inclusive time is at least its exclusive time, which the corrections can break:
        // callees whose corrected time comes out below zero (the calibrated cost is an average, and a
        // coroutine resumed thousands of times for microseconds has callees shorter than it) leave their
        // caller more exclusive time than inclusive; and between windows a frame left from before can hide
        // that an activation was the outermost one, so its inclusive time goes uncounted.
        self.inclusive = self.inclusive.max(self.exclusive);
        self.estimated = sampled;
        // The time a window stands for is spent where the program was in it (or where it was when the
        // window fell due): over many windows an unbiased sample of the run's time, whose error is the
        // spread of a function's time across them, its zeros included. A function few windows saw has a
        // spread that chance makes small as often as large (3 windows where 8 were due read 21 ms +-26 for
        // a true 57; 1 of 8 windows, a sliver of it, 1 ms +-4 for 15): two more windows spent wholly in it
        // are added to the variance, as the Agresti-Coull interval of a proportion adds two successes. So
        // are they for a function no window saw that is known to have run between them (its calls were
        // counted there): chance puts no window on a function holding 3% of a run's time about one run in
        // eight, and its time then read 2 ms +-1.9 (the recorder's cost alone) for a true 38.
        let windows_f = windows as f64;
        let ran_between = self.calls_at_least > p.calls[0];
        let spread = |sum: f64, sq: f64, seen: u64| {
            if !sampled || windows < 2 {
                return 0.0;
            }
            let mean = sum / windows_f;
            let var = ((sq - windows_f * mean * mean) / (windows_f - 1.0)).max(0.0);
            let pseudo = if seen > 0 || ran_between { 2.0 * window_len * window_len } else { 0.0 };
            1.96 * scale * (windows_f * var + pseudo).sqrt()
        };
        self.inclusive_ci = spread(p.inclusive[1], p.window_times_sq[0], p.window_times_seen[0]);
        self.exclusive_ci = spread(p.exclusive[1], p.window_times_sq[1], p.window_times_seen[1]);
        if let Some([_, inclusive, exclusive]) = p.merged_ci_sq {
            self.inclusive_ci = inclusive.sqrt();
            self.exclusive_ci = exclusive.sqrt();
        }
        self.parts.spread_ci = [self.inclusive_ci, self.exclusive_ci];
        // The complete part's times are its clock's less the recorder's cost of its events, which is the
        // cost measured at the start times their number. The machine's speed moves that cost: on this
        // project's machine the measurement read 21 or 36 ns per call event in the same program from one
        // process to the next, as the CPU ran fast or slow in the few milliseconds it took, while the
        // recording actually cost 19-21 (its traced time less its untraced); on tomlkit's parser it cost
        // 1.5 times the measurement, on PyYAML's loaders and BeautifulSoup's parser 1.8-2.6 times (the
        // measurement is of a small loop, not of the program's code). The truth lies anywhere from nothing
        // taken out to three times what was.
        let p = &self.parts;
        self.inclusive_ci = self.inclusive_ci.hypot((cost_far - 1.0) * p.cost[0].max(0.0));
        self.exclusive_ci = self.exclusive_ci.hypot((cost_far - 1.0) * p.cost[1].max(0.0));
        if sampled && counted_all {
            // Every call was recorded or counted.
            self.calls = self.calls_at_least;
            self.calls_estimated = false;
            self.calls_ci = 0.0;
            return;
        }
        let estimate = p.calls[0] as f64 + p.window_calls * scale;
        self.calls = (estimate.round() as u64).max(self.calls_at_least);
        self.calls_estimated = sampled;
        self.calls_lower_bound = sampled && p.window_calls == 0.0 && self.calls_at_least > 0;
        // Called after the part recorded whole (its calls counted, or seen in windows as starts) and in
        // no window's time: how long those calls ran, nothing says (8 calls of 2 ms each read 0 +-0).
        self.times_lower_bound =
            sampled && p.inclusive[1] == 0.0 && p.exclusive[1] == 0.0 && self.calls_at_least > p.calls[0];
        // The windows are a sample of the run's time: the spread of a function's count across them (its
        // zeros included) gives the standard error of their sum, times what they stand for. To that the
        // recorder's cost adds an error of its own, the same in every window: a window holds as many of
        // the program's calls as its length less what recording them cost, and that cost, measured once at
        // the start on a small loop, is not what a window of real code spends. On tomlkit's parser a call
        // event cost 34.5 ns in calls mode where the calibration read 23.1, windows ran at calls mode's
        // rate, and the counts read 0.63 of the truth (0.55-1.04 on sqlglot, 1.0 on jinja2): the cost is
        // taken to be anything up to three times the calibrated one, and in call-dense code, where the recording
        // takes much of a window, that leaves a wide interval, as it should.
        self.calls_ci = if let Some([calls, ..]) = p.merged_ci_sq {
            calls.sqrt()
        } else if self.calls_lower_bound {
            0.0 // no window saw a call: nothing says how many more there were
        } else if sampled && windows > 1 {
            let n = windows as f64;
            let mean = p.window_calls / n;
            let var = ((p.window_calls_sq - n * mean * mean) / (n - 1.0)).max(0.0);
            // As for the times, two more windows are added to the variance, each as dense in the
            // function's calls as the densest stretch of it seen, in a later window or in the complete
            // part: a function few windows saw has a spread that chance makes small as often as large
            // (one window in py_heavy's 5% of a run, where 3.5 were due, read 145,171 +-211,252 calls for
            // a true 960,000). The later windows alone are not enough: where the few that saw it caught
            // a sliver of it at a window's edge, or the thread was preempted in them, the densest read
            // low too (72,126 calls, its interval narrower than that, for 960,000).
            let densest = p.window_calls_max.max(f64::from(p.dense_max) / dense_bin * window_len);
            let pseudo = 2.0 * densest * densest;
            let spread = 1.96 * scale * (n * var + pseudo).sqrt();
            let cost = scale * p.window_calls_for_cost;
            spread.hypot(cost)
        } else {
            0.0
        };
    }
}

/// The stretch of the complete part over which a function's calls are counted for its densest (seconds of
/// the program's time): a later window's default length.
const DENSE_BIN_S: f64 = 500e-6;

/// How far above the calibration at the start what recording costs a window may be, as a fraction of it:
/// the systematic part of an estimated count's interval (`FunctionStats::finish`).
pub const COST_UNCERTAINTY: f64 = 2.0;

/// The far end of the recorder's cost, as a multiple of the cost taken out: `1 + COST_UNCERTAINTY` times
/// the larger of the two calibrations. Where the machine ran faster at the stop than at the start
/// (`speed_ratio` below 1), the cost taken out is the start's scaled down, yet the two measurements
/// disagree and nothing says which was right: on CPython 3.14 a busy machine's start read 21.8 ns per
/// event, its stop 13.2, and a window of one-line calls cost 50 ns an event; three times the stop's
/// cost left the count's interval short of the truth (145,171 +-338,681 calls for 960,000).
pub fn cost_far_end(speed_ratio: f64) -> f64 {
    let ratio = if speed_ratio > 0.0 && speed_ratio.is_finite() { speed_ratio.min(1.0) } else { 1.0 };
    (1.0 + COST_UNCERTAINTY) / ratio
}

/// The windows of a recording that has them (FORMAT.md 5.3), and how its function figures were scaled.
#[derive(Clone, Debug, Default)]
pub struct Windows {
    /// Ticks from the recording's start to the end of its first window (recorded completely).
    pub complete_ticks: u64,
    /// Ticks after the first window, which the later windows sample.
    pub sampled_ticks: u64,
    /// Later windows seen, and their total length in ticks (within the recording).
    pub windows: u64,
    /// Total length of the later windows in ticks.
    pub window_ticks: u64,
    /// What a tick of the program inside a later window stands for: `sampled_ticks` over the windows'
    /// length less the recorder's cost of the events in them (0 without any window).
    pub scale: f64,
}

impl Windows {
    /// Whether the figures are estimates: part of the run was seen through windows only.
    pub fn estimated(&self) -> bool {
        self.sampled_ticks > 0
    }

    /// A one-line account of what was recorded completely and what is estimated.
    pub fn describe(&self, tps: f64) -> String {
        let ms = |t: u64| t as f64 * 1e3 / tps;
        let total = self.complete_ticks + self.sampled_ticks;
        if self.sampled_ticks == 0 || total == 0 {
            return "every call recorded (the run ended inside its first window): nothing is estimated from windows"
                .into();
        }
        let share = self.complete_ticks as f64 / total as f64 * 100.0;
        if self.windows == 0 {
            return format!(
                "calls recorded completely for the first {:.1} ms ({share:.0}% of the run); the remaining {:.1} ms \
                 had no window: figures (marked ~) hold the first part only",
                ms(self.complete_ticks),
                ms(self.sampled_ticks)
            );
        }
        format!(
            "calls recorded completely for the first {:.1} ms ({share:.0}% of the run), then in {} window{} \
             ({:.1} ms, {:.1}% of the remaining {:.1} ms) scaled by {:.1}: figures marked ~ are estimates, each with its 95% interval (--mode calls counts \
             every call)",
            ms(self.complete_ticks),
            self.windows,
            if self.windows == 1 { "" } else { "s" },
            ms(self.window_ticks),
            self.window_ticks as f64 / self.sampled_ticks as f64 * 100.0,
            ms(self.sampled_ticks),
            self.scale
        )
    }
}

/// Per loop (code id and head offset).
#[derive(Clone, Debug, Default)]
pub struct LoopStats {
    /// The furthest backward jump to this head: the loop body is `head..=end`. A loop can have several
    /// (`continue`, an `except` that falls back to the loop head); they are one loop.
    pub end: u32,
    /// Times the backward jump ran (recorded).
    pub iterations: u64,
    /// Iterations with a measured duration (all but the first of each run of the loop).
    pub timed: u64,
    /// Sum of the measured iterations' ticks, corrected.
    pub ticks: f64,
    /// Quiet iterations: timed ones whose backward jump was the thread's very next event after the
    /// previous one (no other event of the loop, or of anything it called, was recorded in between). With a
    /// threshold, the recorder keeps a loop's backward jump on after its other locations went quiet, so
    /// these run nearly as unrecorded code does: specialized, with one callback to subtract.
    pub quiet: u64,
    /// Sum of the quiet iterations' ticks, corrected.
    pub quiet_ticks: f64,
    /// Adaptive mode: ticks from the loop's last recorded backward jump to the first sign that its frame
    /// left it, corrected: the frame's next event outside the loop, its return, a window's stack placing it
    /// outside, or a call after which it went on outside (the call then ends the tail). Once the threshold
    /// stops the loop's events, the rest of the loop runs in that gap: this is its unrecorded time (it also
    /// holds the few instructions from the loop's exit to that sign).
    pub tail_ticks: f64,
    /// Per counter (FORMAT.md 6.9), the events of the samples taken while this was its frame's innermost
    /// running loop, by counter index (empty if none).
    pub counters: Vec<u64>,
    /// Per instruction of the code object, by its position in the code (not its offset): (ticks, visits).
    per_instruction: Vec<(f64, u64)>,
    /// Offset of each instruction position (shared with the code object's table).
    offsets: Vec<u32>,
    /// Adaptive mode: per block of instructions from offset `start` to offset `end`, (start, end, ticks,
    /// visits), spread over the instructions when the pass ends (one addition per event instead of one per
    /// instruction, and no lookup of positions per event).
    blocks: Vec<(u32, u32, f64, u64)>,
    /// Indexes in `blocks` of recently hit blocks, by a hash of their offsets.
    recent: [u32; BLOCK_CACHE],
}

const BLOCK_CACHE: usize = 8;

impl LoopStats {
    /// Average ticks per visit of the instruction at `offset`, if it was measured.
    pub fn cost_at(&self, offset: u32) -> Option<f64> {
        let i = self.offsets.binary_search(&offset).ok()?;
        self.per_instruction.get(i).filter(|c| c.1 > 0).map(|c| c.0 / c.1 as f64)
    }

    /// Ticks spent at the instruction at `offset` over its measured visits, and those visits, if any.
    pub fn spent_at(&self, offset: u32) -> Option<(f64, u64)> {
        let i = self.offsets.binary_search(&offset).ok()?;
        self.per_instruction.get(i).filter(|c| c.1 > 0).copied()
    }

    fn slots(&mut self, all: &[u32]) -> &mut [(f64, u64)] {
        if self.per_instruction.len() != all.len() {
            self.per_instruction = vec![(0.0, 0); all.len()];
            self.offsets = all.to_vec();
        }
        &mut self.per_instruction
    }

    #[inline]
    fn add_block(&mut self, start: u32, end: u32, ticks: f64) {
        // A loop alternates between a few blocks (the two sides of an `if`): a small direct-mapped table
        // of recent ones finds them without searching.
        let h = (start.wrapping_mul(0x9e37_79b9) ^ end) as usize % BLOCK_CACHE;
        let i = match self.blocks.get(self.recent[h] as usize) {
            Some(b) if b.0 == start && b.1 == end => self.recent[h] as usize,
            _ => {
                let i = match self.blocks.iter().position(|b| b.0 == start && b.1 == end) {
                    Some(i) => i,
                    None => {
                        self.blocks.push((start, end, 0.0, 0));
                        self.blocks.len() - 1
                    }
                };
                self.recent[h] = i as u32;
                i
            }
        };
        let b = &mut self.blocks[i];
        b.2 += ticks;
        b.3 += 1;
    }

    /// Spreads each block's time evenly over its instructions (blocks that do not start and end on
    /// instruction boundaries, which only damaged data makes, are dropped).
    fn spread_blocks(&mut self, index: &CodeIndex) {
        let blocks = std::mem::take(&mut self.blocks);
        let slots = self.slots(&index.offsets);
        for (start, end, ticks, visits) in blocks {
            let (Some(lo), Some(hi)) = (index.position(start), index.position(end)) else { continue };
            if lo > hi {
                continue;
            }
            let share = ticks / (hi - lo + 1) as f64;
            for slot in &mut slots[lo..=hi] {
                slot.0 += share;
                slot.1 += visits;
            }
        }
    }
}

/// A loop's identity: code id and the offset of its head (the backward jumps' destination).
pub type LoopKey = (u32, u32);

/// A loop running in a frame: head offset, the loop's position in the pass's loop table, and ticks,
/// running cost sum and thread event count at the last backward jump to it.
type LoopRun = (u32, u32, u64, f64, u64, f64);

struct Frame {
    code: u32,
    /// Position of the code's entry in the thread's figures (and in [`ThreadState::active`]).
    stats: u32,
    /// A C call's frame (code id from [`c_code_id`]): its caller's code id and call offset, which its
    /// `C_RETURN` or `C_RAISE` carries too (FORMAT.md 5.4). `None` for a Python frame.
    c_site: Option<(u32, u32)>,
    /// This activation's node in the call tree (its stack).
    node: u32,
    /// The thread's effective clocks ([`ThreadState::e`]) when the frame was entered.
    entered_e: [f64; 2],
    /// Effective time spent in callees.
    child_e: [f64; 2],
    /// The thread's [`ThreadState::ce`] when the frame was entered, and the part of it its callees took.
    entered_ce: f64,
    child_ce: f64,
    /// Whether this activation is the outermost one of its code object on the stack.
    outermost: bool,
    /// The previous event of this frame: ticks, running cost sum, the offset where execution continued
    /// after it.
    prev: Option<(u64, f64, u32)>,
    /// Per loop head in this frame: head offset, the loop's position in the pass's loop table, and ticks,
    /// running cost sum, thread event count and the loop's ticks counted on the thread
    /// ([`ThreadState::loop_ticks`]) at the last backward jump to it.
    loops: Vec<LoopRun>,
    /// A call made while the frame's last event was inside a loop: (loop position, ticks and running cost
    /// sum at the call). If the frame's next event is inside the loop, the call was inside it and the
    /// iteration's time holds it; if it is outside, the loop ended before the call, which is then where its
    /// unrecorded end (its tail) stops.
    pending_tail: Option<(u32, u64, f64)>,
}

/// Which part of the recording a thread's events are in (FORMAT.md 5.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    /// Every function boundary recorded: a file without windows, or the first window.
    #[default]
    Complete,
    /// A later window: every function boundary recorded, to be scaled.
    Sampled,
    /// Between windows: function boundaries not recorded.
    Gap,
}

/// One thread in the pass: the walk of its events (windows, their stacks, pauses: walk.rs) and the
/// figures it keeps.
struct Thread {
    walk: Walk,
    ts: ThreadState,
}

#[derive(Default)]
struct ThreadState {
    stack: Vec<Frame>,
    /// The thread's root node in the call tree.
    root: u32,
    /// The code id of the thread's last event.
    last_code: u32,
    /// Sum of the recorder's cost of every event of this thread so far, in ticks.
    cost: f64,
    last_ticks: u64,
    /// Events of this thread so far.
    count: u64,
    /// Activations on the stack per code id, by its entry's position in the thread's figures.
    active: Vec<u32>,
    phase: Phase,
    /// The tick at which the current `Sampled` window ends.
    window_end: u64,
    /// Calls that start before this tick count as a later window's: a window's length from when it
    /// opened (its time counts from when it was due, but its calls are recorded from its opening).
    calls_until: u64,
    /// Effective clocks: ticks spent in the complete part and in later windows, minus the recorder's cost
    /// of the events in them. Frames take differences of these, so time between windows counts nowhere.
    e: [f64; 2],
    /// The recorder's cost taken out of `e[0]` so far: what a complete part's time is uncertain by.
    ce: f64,
    /// The tick up to which `e` has advanced (`None` before the thread's first event).
    clock_at: Option<u64>,
    /// The current later window's start: when it was due (FORMAT.md 5.3, 5.7).
    window_from: u64,
    /// The current later window is a missed one (FORMAT.md 5.7), and `e[1]` when it began: it stands for
    /// its whole length, even where its markers came after later events of the thread (below).
    window_missed: bool,
    window_e1: f64,
    /// When the current later window opened (its marker's tick).
    window_opened: u64,
    /// When the recorder closed the current (or last) later window: its opening plus its length, whatever
    /// its calls count from.
    recorded_until: u64,
    /// While a window's DUE_STACK events arrive (FORMAT.md 5.7): how many frames of the stack at the due
    /// moment they have confirmed.
    due_sampling: Option<usize>,
    /// The stack at the due moment is in place: the window's lead is spent there, up to the next event.
    lead_on_due: bool,
    /// This thread's calls count from the current window's due moment (FORMAT.md 5.7, calls from due).
    calls_from_due: bool,
    /// The window's stack ended in a frame at a RESUME, until the thread's next event: that frame's start
    /// (a PY_START in the window, a COUNT after it) or resumption (PY_RESUME, PY_THROW) may come next.
    started_at_open: Option<AtResume>,
    /// The code whose start (PY_START or COUNT) was the thread's last event, window markers aside, its
    /// tick, and whether it was a PY_START recorded between windows: only code whose every start is
    /// recorded (threads' bootstraps, coroutines) has one there, so a stack that finds that code at its
    /// first instruction next finds that very call.
    started_last: Option<(u32, u64, bool)>,
    /// Missed windows (5.7) in which this thread was running Python code, since its last opened window:
    /// their calls were not recorded, and the next opened window's stand for them too.
    missed_running: u32,
    /// What the current window's calls stand for: itself and the missed windows before it (0: unset, 1).
    calls_weight: f64,
    /// The recorder's time opening the current window (FORMAT.md 5.7), taken out at the next program event.
    open_cost: f64,
    /// The loops of generator and coroutine frames that yielded, by code id, until they resume, with the
    /// tick and the recorder's cost sum at the yield: a yield suspends a loop, it does not end it, and the
    /// time until the resumption is the consumer's, not the loop's.
    suspended: CodeMap<Option<(Vec<LoopRun>, u64, f64)>>,
    /// Per loop (its position in the pass's loop table), the ticks counted for it on this thread so far,
    /// iterations and tails: a run of the loop in one frame holds the runs counted meanwhile in another
    /// frame of the same loop (recursion, or a frame whose return was lost and whose next event belongs to
    /// a later call), and those are counted once ([`loop_span`]).
    loop_ticks: Vec<f64>,
    /// The current later window's figures before its factor: exclusive ticks per call tree node, and
    /// (exclusive, inclusive, calls) per code id. See [`ThreadState::flush_window`].
    window_nodes: Vec<(u32, f64)>,
    window_funcs: CodeMap<[f64; 3]>,
    /// The call tree nodes of the calls made in the current later window, one entry per call.
    window_call_nodes: Vec<u32>,
    /// The recorder's cost of this thread's events in the current later window's time (from when it was
    /// due, for its length), in the span its calls count in (from its opening, or from when it was due:
    /// FORMAT.md 5.7), and its length in ticks (0: no window pending).
    window_cost: f64,
    window_calls_cost: f64,
    window_len: u64,
    /// One over [`DENSE_BIN_S`] in ticks.
    dense_per_tick: f64,
}

impl ThreadState {
    /// Ends the time of a later window: the frames still open give it their time so far, and count on
    /// from here (between windows their clocks stand still).
    fn checkpoint_window(&mut self) {
        let mut inner = 0.0;
        for f in self.stack.iter_mut().rev() {
            let inclusive = self.e[1] - f.entered_e[1];
            let exclusive = inclusive - f.child_e[1] - inner;
            self.window_nodes.push((f.node, exclusive));
            let w = self.window_funcs.entry(f.code);
            w[0] += exclusive;
            if f.outermost {
                w[1] += inclusive;
            }
            f.entered_e[1] = self.e[1];
            f.child_e[1] = 0.0;
            inner = inclusive;
        }
    }

    /// Adds the current later window's figures, times its factor: the window's length over the part of
    /// it the program ran (its length less the recorder's cost of its events). A window stands for its
    /// length of the program, wherever it fell: one in call-dense code, where the recording takes half of
    /// it, holds half as much of the program as one in a loop that records nothing, and weighs as much.
    /// (One factor for all windows over-weighed the cheap ones: a page-touching loop next to call-dense
    /// code read 1.3x its time.)
    ///
    /// `cost_far`: how many times the cost taken out the recorder's cost may have been ([`cost_far_end`]).
    fn flush_window(&mut self, tree: &mut CallTree, per: &mut CodeMap<FunctionStats>, cost_far: f64) {
        if self.window_len == 0 {
            return;
        }
        let len = ticks_f64(self.window_len);
        // Time and calls each over the program's part of their own span: a window that opened after its
        // span had passed (its time spent where the stack at the due moment says, no recorder cost in
        // it) must not take the cost of the calls recorded after its opening as its own.
        let factor = len / (len - self.window_cost.clamp(0.0, 0.9 * len));
        let weight = if self.calls_weight > 0.0 { self.calls_weight } else { 1.0 };
        self.calls_weight = 0.0;
        let calls_factor = weight * len / (len - self.window_calls_cost.clamp(0.0, 0.9 * len));
        // The same had recording cost the window three times the larger calibration: the far end of the
        // count's systematic error ([`cost_far_end`]). Not linear in the cost: a window the recording took half
        // of held half the program, one it took all of, none.
        let cost_hi = cost_far.max(1.0) * self.window_calls_cost;
        let calls_factor_hi = weight * len / (len - cost_hi.clamp(0.0, 0.9 * len));
        for (node, x) in self.window_nodes.drain(..) {
            tree.parts[node as usize][1] += x * factor;
        }
        for node in self.window_call_nodes.drain(..) {
            tree.calls[node as usize][1] += calls_factor;
        }
        for (code, [exclusive, inclusive, calls]) in self.window_funcs.drain() {
            let p = &mut per.entry(code).parts;
            p.exclusive[1] += exclusive * factor;
            p.inclusive[1] += inclusive * factor;
            p.window_calls += calls * calls_factor;
            p.window_calls_sq += (calls * calls_factor).powi(2);
            p.window_calls_max = p.window_calls_max.max(calls * calls_factor);
            p.window_calls_for_cost += calls * (calls_factor_hi - calls_factor);
            p.window_times_sq[0] += (inclusive * factor).powi(2);
            p.window_times_sq[1] += (exclusive * factor).powi(2);
            p.window_times_seen[0] += u64::from(inclusive > 0.0);
            p.window_times_seen[1] += u64::from(exclusive > 0.0);
        }
        self.window_cost = 0.0;
        self.window_calls_cost = 0.0;
        self.window_len = 0;
    }

    /// The effective clocks ([`ThreadState::e`]), read a clock at a time. Each event writes the first alone
    /// (8 bytes), and a frame's push or pop reads both just after: read as one 16-byte load, as the compiler
    /// would, the load cannot be served from that pending store and waits for it to reach the cache, which
    /// made it the hottest instruction of the pass (9% of its samples under `perf`). Volatile reads keep the two
    /// loads apart.
    #[inline(always)]
    fn e_now(&self) -> [f64; 2] {
        // SAFETY: both pointers come from references to this struct's own initialized, aligned fields.
        unsafe { [std::ptr::read_volatile(&self.e[0]), std::ptr::read_volatile(&self.e[1])] }
    }

    /// Advances the effective clocks to tick `t`.
    #[inline]
    fn advance(&mut self, t: u64) {
        let at = self.clock_at.unwrap_or(t);
        if t > at {
            let d = ticks_f64(t - at);
            match self.phase {
                Phase::Complete => self.e[0] += d,
                Phase::Sampled => self.e[1] += d,
                Phase::Gap => {}
            }
        }
        self.clock_at = Some(t.max(at));
    }
}

/// Every distinct call stack seen, interned as a tree: node 0 is the root, under it one node per thread,
/// and under those each other node is (parent, code id). Exclusive time accumulates per node, which is a
/// flame graph's data.
#[derive(Debug)]
pub struct CallTree {
    nodes: Vec<(u32, u32)>,
    index: HashMap<(u32, u32), u32>,
    /// Per node: the code and node of the two children last looked up, the latest first (node 0, the root:
    /// none). A loop calls the same function or two again and again: most lookups are answered here, without
    /// hashing.
    last_child: Vec<[(u32, u32); 2]>,
    /// The threads whose root nodes are children of node 0: the k-th one's node has code `u32::MAX - k`.
    threads: Vec<u64>,
    /// Per node: [complete part, window part] of exclusive ticks.
    parts: Vec<[f64; 2]>,
    /// Per node: exclusive ticks, the window part scaled (set when the pass ends).
    exclusive: Vec<f64>,
    /// Per node: calls made with this stack (PY_START and C calls), [complete part, later windows' calls
    /// each times its window's factor], as [`FunctionStats`] counts them.
    calls: Vec<[f64; 2]>,
    /// Per node: each counter's events in the node's function itself, the windows' scaled (set when the
    /// pass ends; absent for nodes without samples).
    counters: HashMap<u32, Vec<u64>>,
    /// [`Windows::scale`], for the windows' calls.
    scale: f64,
}

impl Default for CallTree {
    fn default() -> Self {
        CallTree {
            nodes: vec![(0, 0)],
            index: HashMap::default(),
            last_child: vec![[(0, 0); 2]],
            threads: Vec::new(),
            parts: vec![[0.0; 2]],
            exclusive: vec![0.0],
            calls: vec![[0.0; 2]],
            counters: HashMap::default(),
            scale: 0.0,
        }
    }
}

/// What a call tree node stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// The root of one thread's stacks.
    Thread(u64),
    /// A call of this code id.
    Code(u32),
}

impl CallTree {
    #[inline]
    fn child(&mut self, parent: u32, code: u32) -> u32 {
        if let Some(last) = self.last_child.get_mut(parent as usize) {
            if last[0].0 == code && last[0].1 != 0 {
                return last[0].1;
            }
            if last[1].0 == code && last[1].1 != 0 {
                last.swap(0, 1);
                return last[0].1;
            }
        }
        self.child_slow(parent, code)
    }

    #[inline(never)]
    fn child_slow(&mut self, parent: u32, code: u32) -> u32 {
        let next = self.nodes.len() as u32;
        let id = *self.index.entry((parent, code)).or_insert(next);
        if id == next {
            self.nodes.push((parent, code));
            self.parts.push([0.0; 2]);
            self.exclusive.push(0.0);
            self.calls.push([0.0; 2]);
            self.last_child.push([(0, 0); 2]);
        }
        if let Some(last) = self.last_child.get_mut(parent as usize) {
            *last = [(code, id), last[0]];
        }
        id
    }

    /// The root node of thread `tid`'s stacks (made on first use).
    fn thread_root(&mut self, tid: u64) -> u32 {
        let k = match self.threads.iter().position(|&t| t == tid) {
            Some(k) => k,
            None => {
                self.threads.push(tid);
                self.threads.len() - 1
            }
        };
        self.child(0, u32::MAX - k as u32)
    }

    fn finish(&mut self, scale: f64) {
        for (x, p) in self.exclusive.iter_mut().zip(&self.parts) {
            *x = p[0] + p[1] * scale;
        }
        self.scale = scale;
    }

    /// Calls made with node `node`'s stack (of its leaf function), the windows' scaled as
    /// [`FunctionStats::calls`] are (unrounded: a function's nodes sum to its calls).
    pub fn calls(&self, node: u32) -> f64 {
        self.calls.get(node as usize).map_or(0.0, |c| c[0] + c[1] * self.scale)
    }

    /// Each counter's events in node `node`'s function itself with its stack (`None`: no samples), the
    /// windows' scaled as [`Analysis::counter_totals`] are.
    pub fn counters(&self, node: u32) -> Option<&[u64]> {
        self.counters.get(&node).map(Vec::as_slice)
    }

    /// Every node but the root, in the order made (a parent before its children): `(node, parent, what it
    /// stands for, exclusive ticks)`. A thread's node has no time of its own.
    pub fn nodes(&self) -> impl Iterator<Item = (u32, u32, Node, f64)> + '_ {
        self.nodes.iter().zip(&self.exclusive).enumerate().skip(1).map(|(i, (&(parent, code), &x))| {
            let node =
                if parent == 0 { Node::Thread(self.threads[(u32::MAX - code) as usize]) } else { Node::Code(code) };
            (i as u32, parent, node, x)
        })
    }

    /// `(thread, code ids from the outermost call, exclusive ticks)` for every stack with time in it.
    pub fn thread_stacks(&self) -> Vec<(u64, Vec<u32>, f64)> {
        let mut out = Vec::new();
        for (node, &ticks) in self.exclusive.iter().enumerate().skip(1) {
            if ticks <= 0.0 {
                continue;
            }
            let mut path = Vec::new();
            let mut n = node as u32;
            loop {
                let (parent, code) = self.nodes[n as usize];
                if parent == 0 {
                    out.push((self.threads[(u32::MAX - code) as usize], path.into_iter().rev().collect(), ticks));
                    break;
                }
                path.push(code);
                n = parent;
            }
        }
        out
    }

    /// `(code ids from the outermost call, exclusive ticks)` for every stack with time in it, threads
    /// merged.
    pub fn stacks(&self) -> Vec<(Vec<u32>, f64)> {
        let mut merged: HashMap<Vec<u32>, f64> = HashMap::default();
        for (_, path, ticks) in self.thread_stacks() {
            *merged.entry(path).or_default() += ticks;
        }
        merged.into_iter().collect()
    }
}

/// What a pass produced.
#[derive(Debug, Default)]
pub struct Analysis {
    /// Exclusive time per call stack, under a root per thread.
    pub tree: CallTree,
    /// Per code id.
    pub functions: HashMap<u32, FunctionStats>,
    /// Per thread, per code id (for per-thread reports).
    pub per_thread: HashMap<u64, HashMap<u32, FunctionStats>>,
    /// Per loop.
    pub loops: HashMap<LoopKey, LoopStats>,
    /// Code objects by id.
    pub code: HashMap<u32, CodeObject>,

    /// Specialized bytecode by id.
    pub snapshots: HashMap<u32, Vec<u8>>,
    /// Thread names.
    pub threads: HashMap<u64, String>,
    /// The file header.
    pub header: Option<Header>,
    /// The recorder's cost per event kind, if the file has it (format 1.1).
    pub calibration: Option<ocular_format::Calibration>,
    /// What those costs were scaled by for the machine's speed at the stop (FORMAT.md 6.6, since 2.12),
    /// where it differed from the start's.
    pub cost_speed_ratio: Option<f64>,
    /// The file's format version (major, minor).
    pub format_version: (u16, u16),
    /// Events read.
    pub events: u64,
    /// Reader warnings.
    pub warnings: Vec<String>,
    /// The recording's windows, if it has them (FORMAT.md 5.3): then function figures are estimates.
    pub windows: Option<Windows>,
    /// Threads that lost events (the recorder had no free buffer for them), by thread id.
    pub losses: Vec<Loss>,
    /// Threads whose oldest events a flight recorder overwrote (FORMAT.md 6.8): the trace is the newest part.
    pub dropped: Vec<ocular_format::Dropped>,
    /// Performance counters recorded (FORMAT.md 6.9), by index.
    pub counters: Vec<ocular_format::CounterInfo>,
    /// Per (thread, code id), each counter's events in the function itself (its samples' periods), by
    /// counter index. With windows (FORMAT.md 5.3): those of the complete part plus those of the later
    /// windows scaled by [`Windows::scale`], as the functions' times (an estimate).
    pub counter_totals: HashMap<(u64, u32), Vec<u64>>,
    /// Per counter, events of samples taken while no Python function ran on their thread (before its first
    /// event, between recorded frames).
    pub counter_unattributed: Vec<u64>,
    /// Per counter, events of samples taken between windows, where the running function is not recorded:
    /// the windows' samples, scaled, stand for them in `counter_totals`.
    pub counter_between_windows: Vec<u64>,
    /// Per counter, samples lost by the kernel.
    pub counter_lost: Vec<u64>,
    /// Branch events per (code id, branch offset): each destination seen, with the event's kind
    /// (BRANCH up to CPython 3.13; BRANCH_LEFT or BRANCH_RIGHT from 3.14) and how many times.
    pub branches: HashMap<(u32, u32), Vec<BranchWay>>,
    /// From the first event to the last, of any thread, by the chunks' headers (before
    /// [`crate::stats::Span::to_the_stop`]).
    pub span: crate::stats::Span,
}

/// One way a branch went: where to, as which event kind, how many times (recorded hits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchWay {
    /// Destination offset in bytes.
    pub dest: u32,
    /// BRANCH, BRANCH_LEFT or BRANCH_RIGHT.
    pub kind: EventKind,
    /// Recorded hits.
    pub count: u64,
}

/// Events a thread lost: the recorder had no free buffer for them (FORMAT.md 6.3), so the thread's
/// figures miss those stretches. Reported by every command, and in JSON, Parquet and `ocular.load()`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Loss {
    /// Native thread id.
    pub thread_id: u64,
    /// Events dropped.
    pub lost: u64,
    /// Events recorded.
    pub recorded: u64,
    /// `lost / (lost + recorded)`.
    pub share: f64,
    /// When, in ms after the recording's start: (first, last) dropped event of each stretch (the first
    /// 256 stretches).
    pub ranges_ms: Vec<(f64, f64)>,
}

/// The losses a reader found, per thread.
pub fn losses(report: &ocular_format::Report) -> Vec<Loss> {
    report
        .losses
        .values()
        .map(|l| Loss {
            thread_id: l.thread_id,
            lost: l.count,
            recorded: report.thread_events.get(&l.thread_id).copied().unwrap_or(0),
            share: report.lost_share(l.thread_id),
            ranges_ms: l
                .ranges
                .iter()
                .map(|&(a, b)| (report.ms_after_start(a).unwrap_or(0.0), report.ms_after_start(b).unwrap_or(0.0)))
                .collect(),
        })
        .collect()
}

impl Analysis {
    /// The share of events lost in `thread_id`, or in every thread with 0.
    pub fn lost_share(&self, thread_id: u64) -> f64 {
        let (lost, recorded) = self
            .losses
            .iter()
            .filter(|l| thread_id == 0 || l.thread_id == thread_id)
            .fold((0, 0), |(a, b), l| (a + l.lost, b + l.recorded));
        if lost == 0 {
            return 0.0;
        }
        // Merged: the events of threads that lost none count too.
        let recorded = if thread_id == 0 { self.events } else { recorded };
        lost as f64 / (lost + recorded) as f64
    }
}

impl Analysis {
    /// Ticks to nanoseconds.
    pub fn ns(&self, ticks: f64) -> f64 {
        let tps = self.header.as_ref().map_or(1e9, |h| h.ticks_per_second);
        ticks * 1e9 / tps
    }
}

/// Code indexes and loops, addressed by position so the per-event work does no hashing.
#[derive(Default)]
struct Tables {
    branches: HashMap<(u32, u32), Vec<BranchWay>>,
    index_of: CodeMap<u32>,
    indexes: Vec<CodeIndex>,
    loop_of: HashMap<LoopKey, u32>,
    loop_keys: Vec<LoopKey>,
    loops: Vec<LoopStats>,
    /// Code ids whose calls outside windows stopped being counted (FORMAT.md 5.8), and whether the
    /// recording counted any.
    count_ended: std::collections::HashSet<u32>,
    counted_any: bool,
    /// The file is of 2.10 or later: outside windows every call start is counted until its function's last
    /// counted call (FORMAT.md 5.8).
    counts_starts: bool,
    /// Bytes of bytecode per code id, and the interpreter's cost of instrumenting a code object (ticks:
    /// per object, per byte; FORMAT.md 6.6), paid at its first call in each later window.
    code_len: CodeMap<u32>,
    instrument: (f64, f64),
}

impl Tables {
    fn code_index(&self, code: u32) -> u32 {
        self.index_of.get(code).copied().unwrap_or(u32::MAX)
    }

    fn loop_id(&mut self, key: LoopKey) -> u32 {
        let next = self.loops.len() as u32;
        let id = *self.loop_of.entry(key).or_insert(next);
        if id == next {
            self.loop_keys.push(key);
            self.loops.push(LoopStats::default());
        }
        id
    }
}

/// What the pass learns of the windows (FORMAT.md 5.3), across threads.
#[derive(Default)]
struct WindowLog {
    /// The recording has windows: function boundaries are recorded in them only.
    windowed: bool,
    ticks_per_us: f64,
    /// When the first window closed.
    first_close: Option<u64>,
    /// Later windows by sequence number: (opened, length in ticks).
    later: HashMap<u32, (u64, u64)>,
    /// The last tick of any event.
    end: u64,
}

impl WindowLog {
    fn len_ticks(&self, len_us: u32) -> u64 {
        (len_us as f64 * self.ticks_per_us).ceil() as u64
    }

    fn summary(&self, start: u64) -> Option<Windows> {
        if !self.windowed {
            return None;
        }
        let close = self.first_close.unwrap_or(self.end).clamp(start, self.end.max(start));
        let mut w =
            Windows { complete_ticks: close - start, sampled_ticks: self.end.max(close) - close, ..Windows::default() };
        for &(open, len) in self.later.values() {
            if open < self.end {
                w.windows += 1;
                w.window_ticks += len.min(self.end - open);
            }
        }
        // Each window's figures were already brought to its length (`ThreadState::flush_window`).
        if w.window_ticks > 0 {
            w.scale = w.sampled_ticks as f64 / w.window_ticks as f64;
        }
        Some(w)
    }
}

/// A thread's counter samples as (ticks, counter index, period), in time order.
pub(crate) type SampleQueue = std::collections::VecDeque<(u64, u8, u64)>;

/// A file's counter samples (FORMAT.md 6.9).
#[derive(Default)]
pub(crate) struct Samples {
    /// The counters, by index.
    pub counters: Vec<ocular_format::CounterInfo>,
    /// Per thread, its samples as (ticks, counter, period), in time order.
    pub by_thread: HashMap<u64, SampleQueue>,
    /// Per counter, samples the kernel lost.
    pub lost: Vec<u64>,
    /// The calibration written at the stop, with the machine's speed then (FORMAT.md 6.6, since 2.12): it
    /// comes after the events whose costs it scales.
    pub stop_calibration: Option<ocular_format::Calibration>,
}

/// Reads the counter samples of the file, which come in their own chunks, anywhere in it: a pass over
/// the metadata (nothing when `opts` skips events).
pub(crate) fn read_samples(
    path: &Path,
    opts: ReadOptions,
    header: &ocular_format::Header,
) -> ocular_format::Result<Samples> {
    let mut out = Samples::default();
    let mut by_thread: HashMap<u64, Vec<(u64, u8, u64)>> = HashMap::default();
    if !opts.skip_events {
        let mut r = Reader::open_with(path, ReadOptions { skip_events: true, skip_code: true, ..opts })?;
        let tps = header.ticks_per_second;
        let to_ticks = |ns: u64| {
            let d = (ns as f64 - header.start_monotonic_ns as f64) * tps / 1e9;
            (header.start_ticks as f64 + d).max(0.0) as u64
        };
        while let Some(c) = r.next_chunk()? {
            if let Body::Calibration(cal) = &c.body {
                if cal.is_stop() {
                    out.stop_calibration = Some(cal.clone());
                }
            }
            if let Body::Counters(cs) = c.body {
                if out.counters.is_empty() {
                    out.counters = cs.counters.clone();
                    out.lost = vec![0; cs.counters.len()];
                }
                for x in cs.samples {
                    if (x.counter as usize) < out.counters.len() {
                        by_thread.entry(x.thread_id).or_default().push((to_ticks(x.monotonic_ns), x.counter, x.period));
                    }
                }
                for (_, k, n) in cs.lost {
                    if let Some(l) = out.lost.get_mut(k as usize) {
                        *l += n;
                    }
                }
            }
        }
    }
    out.by_thread = by_thread
        .into_iter()
        .map(|(t, mut v)| {
            v.sort_unstable();
            (t, v.into())
        })
        .collect();
    Ok(out)
}

/// Counter samples attributed during the pass.
#[derive(Default)]
struct Tally {
    /// Per (thread, code id): samples of the complete part (exact).
    exact: HashMap<(u64, u32), Vec<u64>>,
    /// Per (thread, code id): samples of the later windows, to be scaled.
    windows: HashMap<(u64, u32), Vec<u64>>,
    /// The same per call tree node: [complete part, later windows].
    nodes: [HashMap<u32, Vec<u64>>; 2],
    unattributed: Vec<u64>,
    between: Vec<u64>,
}

impl Tally {
    /// Attributes a thread's samples up to tick `t` to the function running then, the innermost frame
    /// of its stack (before the event at `t` changes it), and to that frame's innermost running loop, if
    /// any: the loop it entered last and has not been seen to leave. Between windows the stack is not
    /// recorded: a sample there goes to a loop only if the thread's last event was in its frame (the loop
    /// still runs its recorded backward jumps), and to no function (the windows stand for it).
    fn attribute(
        &mut self,
        q: &mut SampleQueue,
        t: u64,
        tid: u64,
        ts: &ThreadState,
        sync: Option<usize>,
        loops: &mut [LoopStats],
    ) {
        while q.front().is_some_and(|s| s.0 <= t) {
            let (at, k, period) = q.pop_front().expect("checked");
            let n = self.unattributed.len();
            // While a window's stack arrives, the frames it has confirmed (those above are left from
            // before the window).
            let top = match sync {
                Some(depth) => ts.stack[..depth.min(ts.stack.len())].last(),
                None => ts.stack.last(),
            };
            let Some(f) = top else {
                self.unattributed[k as usize] += period;
                continue;
            };
            let gap = match ts.phase {
                Phase::Complete => false,
                Phase::Sampled => at > ts.window_end,
                Phase::Gap => true,
            };
            if gap {
                self.between[k as usize] += period;
            } else {
                let m = if ts.phase == Phase::Complete { &mut self.exact } else { &mut self.windows };
                m.entry((tid, f.code)).or_insert_with(|| vec![0; n])[k as usize] += period;
                let m = &mut self.nodes[usize::from(ts.phase != Phase::Complete)];
                m.entry(f.node).or_insert_with(|| vec![0; n])[k as usize] += period;
            }
            if gap && ts.last_code != f.code {
                continue;
            }
            // Nested loops: the inner one's head comes after its outer loop's head.
            if let Some(l) = f.loops.iter().max_by_key(|l| l.0).and_then(|l| loops.get_mut(l.1 as usize)) {
                l.counters.resize(n, 0);
                l.counters[k as usize] += period;
            }
        }
    }

    /// The totals per (thread, code id): exact plus the windows' scaled by `scale`.
    fn totals(self, scale: f64) -> HashMap<(u64, u32), Vec<u64>> {
        scaled(self.exact, self.windows, scale)
    }
}

/// `exact` plus `windows` scaled by `scale`, per key.
fn scaled<K: std::hash::Hash + Eq>(
    mut out: HashMap<K, Vec<u64>>,
    windows: HashMap<K, Vec<u64>>,
    scale: f64,
) -> HashMap<K, Vec<u64>> {
    for (key, w) in windows {
        let v = out.entry(key).or_insert_with(|| vec![0; w.len()]);
        for (a, b) in v.iter_mut().zip(w) {
            *a += (b as f64 * scale).round() as u64;
        }
    }
    out
}

impl Analysis {
    /// Each counter's events in function `code` itself, on thread `tid` (0: every thread).
    pub fn counters_of(&self, tid: u64, code: u32) -> Vec<u64> {
        let mut v = vec![0; self.counters.len()];
        for ((t, c), x) in &self.counter_totals {
            if *c == code && (tid == 0 || *t == tid) {
                for (a, b) in v.iter_mut().zip(x) {
                    *a += b;
                }
            }
        }
        v
    }
}

/// Reads `path` once and analyzes it.
pub fn analyze(path: &Path, opts: ReadOptions) -> ocular_format::Result<Analysis> {
    let r = Reader::open_with(path, opts)?;
    let header = r.header().clone();
    let version = r.version();
    // Decoded ahead on a thread of its own: a fifth of the pass, overlapped.
    let mut r = ocular_format::Prefetch::new(r)?;
    let mut a = Analysis::default();
    let mut cost = ocular_format::cost_table(header.event_cost_ticks, None);
    let mut cost_far = cost_far_end(1.0);
    let precise = header.options.mode == Mode::Precise;
    let mut threads: HashMap<u64, Thread> = HashMap::default();
    // Each thread's figures per code id during the pass (`a.per_thread` at its end).
    let mut pers: HashMap<u64, CodeMap<FunctionStats>> = HashMap::default();
    let mut tables = Tables { counts_starts: version >= (2, 10), ..Tables::default() };
    // Since 2.2 a thresholded recording records function boundaries in windows only (FORMAT.md 5.3).
    let mut log = WindowLog { ticks_per_us: header.ticks_per_second / 1e6, ..WindowLog::default() };
    let dense_bin = (DENSE_BIN_S * header.ticks_per_second).max(1.0);
    // The run's span, first to last event of any thread: no function runs longer than it on one thread.
    let (mut first_tick, mut last_tick) = (u64::MAX, 0u64);
    let mut with_events: Vec<u64> = Vec::new();
    // Counter samples (FORMAT.md 6.9) come in their own chunks, anywhere in the file: gathered first, in a
    // pass over the metadata, to be attributed as each thread's events go by.
    let Samples { counters, by_thread: mut samples, lost, stop_calibration } = read_samples(path, opts, &header)?;
    let mut tally =
        Tally { unattributed: vec![0; counters.len()], between: vec![0; counters.len()], ..Tally::default() };
    a.counters = counters;
    a.counter_lost = lost;
    crate::progress::begin("analyzing", std::fs::metadata(path).map(|m| m.len()).unwrap_or(0));
    while let Some(c) = r.next_chunk()? {
        crate::progress::at(c.info.offset);
        match c.body {
            Body::Events(evs) => {
                let tid = c.info.thread_id;
                if c.info.count > 0 {
                    first_tick = first_tick.min(c.info.first_ts);
                    last_tick = last_tick.max(c.info.last_ts);
                    if !with_events.contains(&tid) {
                        with_events.push(tid);
                    }
                }
                let th = threads.entry(tid).or_insert_with(|| Thread {
                    walk: Walk::new(header.ticks_per_second),
                    ts: ThreadState {
                        root: a.tree.thread_root(tid),
                        dense_per_tick: 1.0 / dense_bin,
                        ..ThreadState::default()
                    },
                });
                let per = pers.entry(tid).or_default();
                let mut pending = samples.get_mut(&tid);
                for e in evs {
                    if let Some(q) = pending.as_deref_mut() {
                        tally.attribute(q, e.ticks.get(), tid, &th.ts, th.walk.syncing(), &mut tables.loops);
                    }
                    if !plain_step(th, e, &cost, precise, (&mut tables, &mut a.tree, per), &mut log) {
                        step(th, e, (&cost, cost_far), precise, &mut tables, &mut a.tree, per, &mut log);
                    }
                }
                a.events += evs.len() as u64;
            }
            Body::Code(objs) => {
                for o in objs {
                    let i = tables.indexes.len() as u32;
                    tables.indexes.push(CodeIndex::new(instructions(&o, &header, 0, u32::MAX), &o, &header));
                    tables.index_of.insert(o.id, i);
                    tables.code_len.insert(o.id, o.bytecode.len() as u32);
                    a.code.insert(o.id, o);
                }
            }
            Body::Snapshot(s) => {
                for x in s {
                    a.snapshots.insert(x.id, x.bytecode);
                }
            }
            Body::Thread(t) => {
                a.threads.insert(t.thread_id, t.name);
            }
            // C callables (FORMAT.md 6.11) become code objects of their own, in a range of ids apart.
            Body::CFunctions(fs) => {
                for f in fs {
                    let co = c_code_object(&f);
                    a.code.insert(co.id, co);
                }
            }
            Body::Calibration(c) if c.is_stop() => {}
            Body::Calibration(c) => {
                let ratio;
                (cost, ratio) =
                    ocular_format::cost_table_at_speed(header.event_cost_ticks, &c, stop_calibration.as_ref());
                let (per_code, per_byte) = c.instrument();
                tables.instrument = (per_code * ratio, per_byte * ratio);
                a.cost_speed_ratio = (ratio != 1.0).then_some(ratio);
                a.calibration = Some(c);
                cost_far = cost_far_end(ratio);
            }
            // The recording's end, where frames still open in a recording with windows end.
            Body::Trailer(t) if log.windowed => log.end = log.end.max(t.end_ticks),
            Body::Lost(_)
            | Body::Trailer(_)
            | Body::Skipped(_)
            | Body::Ring(_)
            | Body::Dropped(_)
            | Body::Counters(_)
            | Body::Process(_) => {}
        }
    }
    // Samples after a thread's last event: the function it was in then.
    for (tid, q) in samples.iter_mut() {
        let empty = ThreadState::default();
        let (ts, sync) = threads.get(tid).map_or((&empty, None), |th| (&th.ts, th.walk.syncing()));
        tally.attribute(q, u64::MAX, *tid, ts, sync, &mut tables.loops);
    }
    // Frames still open at the end (the recording stopped inside them) end at their thread's last event,
    // or, in a window, when the window or the recording ended.
    for (tid, th) in threads.iter_mut() {
        let per = pers.entry(*tid).or_default();
        let ts = &mut th.ts;
        if let Some(depth) = th.walk.syncing() {
            // A window's stack the thread's last event: frames above what it confirmed had returned.
            truncate(ts, depth, ts.last_ticks, &mut a.tree, per, &mut tables);
        }
        // With windows, a thread's last event is not where it stopped running (nothing of its calls is
        // recorded between windows): its frames end with the recording (a thread that ended before has
        // none left, its `Thread._bootstrap` return is always recorded).
        if ts.phase == Phase::Sampled {
            // Its last window: function time up to its end, then nothing.
            ts.advance(ts.window_end.min(log.end));
            ts.checkpoint_window();
            ts.phase = Phase::Gap;
        }
        let end = if ts.phase == Phase::Gap && log.windowed { log.end.max(ts.last_ticks) } else { ts.last_ticks };
        ts.advance(end);
        while !ts.stack.is_empty() {
            pop(ts, end, &mut a.tree, per, &mut tables);
        }
        ts.flush_window(&mut a.tree, per, cost_far);
    }
    a.per_thread = pers.into_iter().map(|(tid, per)| (tid, per.into_map())).collect();
    let windows = log.summary(header.start_ticks);
    let scale = windows.as_ref().map_or(0.0, |w| w.scale);
    let sampled = windows.as_ref().is_some_and(|w| w.sampled_ticks > 0);
    a.windows = windows;
    a.counter_unattributed = std::mem::take(&mut tally.unattributed);
    a.counter_between_windows = std::mem::take(&mut tally.between);
    let [exact, windows] = std::mem::take(&mut tally.nodes);
    a.tree.counters = scaled(exact, windows, scale);
    a.counter_totals = tally.totals(scale);
    a.tree.finish(scale);
    let n_windows = a.windows.as_ref().map_or(0, |w| w.windows);
    let window_len = a.windows.as_ref().map_or(0.0, |w| w.window_ticks as f64 / w.windows.max(1) as f64);
    let ended = std::mem::take(&mut tables.count_ended);
    // Since 2.10 a recording with windows counts every function's calls outside them up to its limit: one
    // that made calls outside windows has COUNT events (a file without is read as 2.9 was).
    let r = r.finish();
    let counting = version >= (2, 10) && tables.counted_any;
    a.format_version = version;
    // Estimates are capped at what is possible: a function's inclusive time at its thread's part of the run
    // (the run's span), merged over threads at the span times the threads. The windows' scale can carry a
    // top-level frame a few percent past it (a window's length stands for the run's time around it, and
    // the last one is cut by the run's end).
    a.span = crate::stats::Span::of_ticks(&header, first_tick, last_tick, with_events.len());
    // As `stats` counts the wall time: to the stop when the recording ended (frames open then end there).
    if log.end > last_tick && first_tick != u64::MAX {
        last_tick = log.end;
    }
    let span = ticks_f64(last_tick.saturating_sub(first_tick));
    let estimation = Estimation { scale, sampled, windows: n_windows, window_len, cost_far, dense_bin };
    for per in a.per_thread.values_mut() {
        for (id, s) in per.iter_mut() {
            s.finish(&estimation, counting && !ended.contains(id));
            s.cap(span);
        }
    }
    // Threads merged: the per-thread statistics summed (kept per thread during the pass: one update per
    // call instead of two).
    for per in a.per_thread.values() {
        for (id, s) in per {
            a.functions.entry(*id).or_default().add(s);
        }
    }
    let threads_run = a.per_thread.values().filter(|p| !p.is_empty()).count().max(1) as f64;
    for (id, s) in a.functions.iter_mut() {
        s.finish(&estimation, counting && !ended.contains(id));
        s.cap(span * threads_run);
    }
    for (key, mut stats) in tables.loop_keys.into_iter().zip(tables.loops) {
        if !stats.blocks.is_empty() {
            if let Some(&i) = tables.index_of.get(key.0) {
                stats.spread_blocks(&tables.indexes[i as usize]);
            }
        }
        // A loop is timed in real time, to the first sign its frame left it or the recording's end; its
        // function's time is estimated from windows, or ends at its frame's last event when the recording
        // stopped inside it (a signal): it cannot be below what its loop was measured to take.
        if let Some(f) = a.functions.get_mut(&key.0) {
            f.inclusive = f.inclusive.max(stats.ticks + stats.tail_ticks);
        }
        a.loops.insert(key, stats);
    }
    crate::progress::end();
    let name = path.display().to_string();
    a.warnings = r.report().warnings(&name);
    a.losses = losses(r.report());
    a.dropped = r.report().dropped.values().cloned().collect();
    a.branches = std::mem::take(&mut tables.branches);
    a.header = Some(header);
    Ok(a)
}

/// [`step`] for an event the walk calls plain ([`Walk::plain`]) in a thread where it only enters or exits a
/// frame ([`plain`]), most of a recording of every call: what `step` does with it, without asking what it is
/// not, and without `step`'s own entry and exit (a fifth of the pass's instructions). Whether it was one.
#[inline(always)]
fn plain_step(
    th: &mut Thread,
    e: &RawEvent,
    cost: &[f64; 256],
    precise: bool,
    (tables, tree, per): (&mut Tables, &mut CallTree, &mut CodeMap<FunctionStats>),
    log: &mut WindowLog,
) -> bool {
    let Thread { walk, ts } = th;
    if !(walk.plain(e) && plain(ts, e)) {
        return false;
    }
    let (t, id) = (e.ticks.get(), e.code.get());
    log.end = log.end.max(t);
    let t = t.max(ts.last_ticks);
    ts.lead_on_due = false;
    ts.advance(t);
    let c = walk.cost(e, cost);
    ts.cost += c;
    ts.e[0] -= c;
    ts.ce += c;
    ts.last_ticks = t;
    ts.last_code = id;
    ts.count += 1;
    // One of the four (`Walk::plain`): told apart without a lookup of every kind.
    let kind = match e.kind {
        k if k == EventKind::PY_START as u8 => EventKind::PY_START,
        k if k == EventKind::PY_RESUME as u8 => EventKind::PY_RESUME,
        k if k == EventKind::PY_RETURN as u8 => EventKind::PY_RETURN,
        _ => EventKind::PY_YIELD,
    };
    ts.started_last = (kind == EventKind::PY_START).then_some((id, t, false));
    match kind {
        EventKind::PY_START | EventKind::PY_RESUME => {
            let mut started = usize::MAX;
            if kind == EventKind::PY_START {
                started = per.position_or_insert(id);
                per.at(started).parts.starts += 1;
            }
            enter(ts, kind, started, e, t, (tables, tree, per));
        }
        _ => exit(ts, kind, e, t, precise, (tables, tree, per)),
    }
    true
}

/// Whether the thread is in the state where an event the walk calls plain ([`Walk::plain`]) means only
/// a frame entered or exited: every call recorded (the complete part), no window's stack or opening
/// pending, and for an exit the frame on top is the code's.
#[inline(always)]
fn plain(ts: &ThreadState, e: &RawEvent) -> bool {
    let exit = e.kind == EventKind::PY_RETURN as u8 || e.kind == EventKind::PY_YIELD as u8;
    ts.phase == Phase::Complete
        && ts.due_sampling.is_none()
        && ts.open_cost == 0.0
        && ts.started_at_open.is_none()
        && (!exit || ts.stack.last().is_some_and(|f| f.code == e.code.get()))
}

/// A call of `id` recorded at `t`: in the complete part, or in a window while its calls count.
fn recorded_call(ts: &mut ThreadState, per: &mut CodeMap<FunctionStats>, pos: usize, id: u32, t: u64) {
    let s = per.at(pos);
    if ts.phase == Phase::Complete {
        s.parts.calls[0] += 1;
        // The stretch of the complete part this call falls in, by the program's own time.
        // Through i64 (one instruction, where f64 to u64 is a branchy sequence): the index is far below 2^63.
        let bin = (ts.e[0].max(0.0) * ts.dense_per_tick) as i64 as u64;
        let d = &mut s.parts.dense_bin;
        *d = if d.0 == bin && d.1 > 0 { (bin, d.1 + 1) } else { (bin, 1) };
        s.parts.dense_max = s.parts.dense_max.max(d.1);
    } else if t < ts.calls_until {
        s.parts.calls[1] += 1;
        ts.window_funcs.entry(id)[2] += 1.0;
    }
}

/// A `DUE` marker (FORMAT.md 5.7), after its window's `WINDOW`: how the window's calls count, and whether
/// the stack at the due moment follows.
fn due_marker(ts: &mut ThreadState, e: &RawEvent) {
    use ocular_format::event::due::{CALLS_FROM_DUE, MISSED, RUNNING};
    if ts.phase != Phase::Sampled {
        return;
    }
    let flags = e.offset.get();
    if flags & MISSED != 0 {
        // No stack at an opening follows: the one at the due moment is all there is. No call of it is
        // recorded: a thread that was not running Python code then made none (the main thread, or one in a
        // C call or waiting); one that was running has its calls stand in the next opened window's.
        ts.calls_until = 0;
        ts.window_missed = true;
        if flags & RUNNING != 0 && flags & CALLS_FROM_DUE == 0 {
            ts.missed_running += 1;
        }
    } else {
        // Written for the thread that opened it only: the others were waiting for the GIL.
        ts.open_cost = f64::from(e.code.get());
        ts.calls_weight = 1.0 + f64::from(std::mem::take(&mut ts.missed_running));
        if flags & CALLS_FROM_DUE != 0 {
            ts.calls_until = ts.window_end;
            ts.calls_from_due = true;
            // The calls count from the due moment, but none is recorded before the opening. A thread that
            // opened promptly (within a fifth of the window) was running Python code until then, making
            // calls of the kind the window goes on to see: that stretch is time the recorded calls stand
            // for, not time they were made in (leaving it in read call-dense code's counts ~10% low). One
            // that opened late was in a C call, a wait or a collection, which makes no calls.
            let lead = ts.window_opened.saturating_sub(ts.window_from);
            if lead.saturating_mul(5) <= ts.window_len {
                ts.window_calls_cost += ticks_f64(lead);
            }
        }
    }
    if e.arg.get() > 0 {
        ts.due_sampling = Some(0);
    }
}

/// A frame of the stack at a window's due moment (FORMAT.md 5.7): the thread was in it then, so it is on
/// the stack from the window's start (the same activation as before, if the same code is at that depth).
fn due_frame(
    ts: &mut ThreadState,
    e: &RawEvent,
    tables: &mut Tables,
    tree: &mut CallTree,
    per: &mut CodeMap<FunctionStats>,
) {
    let Some(depth) = ts.due_sampling else { return };
    let id = e.code.get();
    if id == 0 {
        return; // a frame of code that is not recorded: not on the analysis' stacks either
    }
    if !ts.stack.get(depth).is_some_and(|f| f.code == id) {
        let from = ts.window_from;
        truncate(ts, depth, from, tree, per, tables);
        push(ts, per, id, from, 0, tree);
        ts.stack.last_mut().expect("pushed").prev = None;
    }
    ts.due_sampling = Some(depth + 1);
}

/// When a window marker at tick `t` with a lead of `lead_us` was due: its lead before it, but not before
/// the thread's previous event.
fn due(ts: &ThreadState, t: u64, lead_us: u32, log: &WindowLog) -> u64 {
    t - log.len_ticks(lead_us).min(t.saturating_sub(ts.clock_at.unwrap_or(0)))
}

/// The code id a C callable's frames have (FORMAT.md 6.11: C callable ids are a space of their own, put
/// above the code ids here); `None` for 0 (no callable) or an id beyond the range.
pub fn c_code_id(c_id: u32) -> Option<u32> {
    (c_id != 0).then(|| ocular_format::CFunction::CODE_ID_BASE.checked_add(c_id)).flatten().filter(|&c| c < C_CODE_END)
}

/// Code ids from `u32::MAX - 2^20` up name the call tree's thread roots, not C callables.
const C_CODE_END: u32 = u32::MAX - (1 << 20);

/// Whether a code id is a C callable's ([`c_code_id`]).
pub fn is_c_code(code: u32) -> bool {
    (ocular_format::CFunction::CODE_ID_BASE..C_CODE_END).contains(&code)
}

/// The code object that stands for a C callable in every report: its module and qualified name
/// (`builtins.isinstance`, `builtins.list.append`, `re.Pattern.match`), in file `~` at line 0, as
/// cProfile shows built-ins.
pub fn c_code_object(f: &ocular_format::CFunction) -> CodeObject {
    let qualname = if f.module.is_empty() { f.qualname.clone() } else { format!("{}.{}", f.module, f.qualname) };
    CodeObject {
        id: c_code_id(f.id).unwrap_or(0),
        name: f.qualname.rsplit('.').next().unwrap_or(&f.qualname).to_string(),
        qualname,
        filename: "~".into(),
        first_line: 0,
        flags: 0,
        bytecode: Vec::new(),
        linetable: Vec::new(),
        positions: Vec::new(),
    }
}

/// One event of a thread. `cost`: the recorder's cost per event kind, and how many times it may have been
/// that ([`cost_far_end`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn step(
    th: &mut Thread,
    e: &RawEvent,
    (cost, cost_far): (&[f64; 256], f64),
    precise: bool,
    tables: &mut Tables,
    tree: &mut CallTree,
    per: &mut CodeMap<FunctionStats>,
    log: &mut WindowLog,
) {
    let t = e.ticks.get();
    let id = e.code.get();
    let off = e.offset.get();
    let Thread { walk, ts } = th;
    // The walk interprets the recording's own structure (walk.rs); what is left here is what it means for
    // the figures. A note or an unknown kind moves no frame: `program` is false for them.
    let program = match walk.note(e) {
        // A recorder pause (FORMAT.md 5.6): taken out of the interval after the next event (it can come
        // among a window's stack events, whose buffer filled there), as `walk.paused()` there.
        Some(Step::Pause) => return,
        Some(Step::Note(EventKind::DUE)) => return due_marker(ts, e),
        Some(Step::Note(EventKind::DUE_STACK)) => return due_frame(ts, e, tables, tree, per),
        Some(_) => false,
        None => true,
    };
    if let Some(depth) = ts.due_sampling.take() {
        // The stack at the due moment is complete: frames above what it confirmed had returned by then.
        truncate(ts, depth, ts.window_from, tree, per, tables);
        ts.lead_on_due = true;
    }
    log.end = log.end.max(t);
    let marker = Marker::of(e);
    // A thread's clock does not go back: an event stamped before the thread's previous one (a damaged file,
    // or a counter behind the one the thread last ran on) is taken as at that event's tick. Window markers
    // keep their own (a missed window's can follow the thread's later events, FORMAT.md 5.7).
    let t = if marker.is_none() { t.max(ts.last_ticks) } else { t };
    if let Some(depth) = walk.syncing().filter(|_| marker != Some(Marker::Stack)) {
        // The window's stack is complete: frames above what it confirmed have returned (the walk ends
        // them too, at its next step: nothing is left to it then). Before the window's time is counted
        // (next, if it ended before this event): it belongs to the stack taken at its opening, not to
        // frames left from before it (a caller's events seen between windows push it as a callee of the
        // stale top; such a frame took whole windows when the first event after a window's stack came
        // after the window).
        truncate(ts, depth, t, tree, per, tables);
    }
    if ts.phase == Phase::Sampled && t >= ts.window_end {
        // The window ended before this event: function boundaries stopped being recorded then.
        ts.advance(ts.window_end);
        ts.checkpoint_window();
        ts.phase = Phase::Gap;
    }
    if ts.phase == Phase::Gap && ts.window_len > 0 && t >= ts.calls_until {
        // Its calls too (they count until its length from its opening).
        ts.flush_window(tree, per, cost_far);
    }
    match marker {
        // A window stands for its lead too (FORMAT.md 5.3): it starts `lead` before its marker, and the
        // stack that follows is entered then; the clock catches up at the first event after the stack,
        // or, where the stack at the due moment came first (5.7), at the first event after that one.
        Some(Marker::Opened { lead_us, .. }) => ts.advance(due(ts, t, lead_us, log)),
        Some(Marker::Stack) if ts.lead_on_due => {
            ts.lead_on_due = false;
            ts.advance(t);
        }
        Some(Marker::Stack) => {}
        // A missed window's end (5.7) comes at the tick the next one opens, whose due moment is earlier.
        Some(Marker::Closed) if ts.phase == Phase::Gap => {}
        _ => {
            ts.lead_on_due = false;
            ts.advance(t);
        }
    }
    // A recorder pause (FORMAT.md 5.6) is the recorder's time, taken out as the events' own cost is.
    let mut c = walk.cost(e, cost);
    let paused = walk.paused();
    if paused != 0 {
        c += ticks_f64(paused);
    }
    if ts.phase == Phase::Sampled && walk.instruments_again(e) {
        // The caller's time, and the window's, hold that cost: on real packages' work, windows that call
        // hundreds of functions lost a third of their length to it, and counts read 0.5-0.7x. (The first
        // window's is the first call's in any recording: a complete part has nothing to scale.)
        let len = tables.code_len.get(id).copied().unwrap_or(0);
        c += tables.instrument.0 + tables.instrument.1 * f64::from(len);
    }
    if marker.is_none() && ts.open_cost != 0.0 {
        // A window's opening (FORMAT.md 5.7) ran just before this event, on this thread's time (at most the
        // whole interval: a file that says more is not believed past it).
        let since = ts.last_ticks.max(ts.window_from);
        c += std::mem::take(&mut ts.open_cost).min(ticks_f64(t.saturating_sub(since)));
    }
    ts.cost += c;
    match ts.phase {
        Phase::Complete => {
            ts.e[0] -= c;
            ts.ce += c;
        }
        Phase::Sampled => {
            ts.e[1] -= c;
            ts.window_cost += c;
        }
        Phase::Gap => {}
    }
    // A later window's calls count over a span of their own (from its opening, or from its due moment:
    // FORMAT.md 5.7), and so must their cost: counting the calls of the last `lead` microseconds but not
    // their cost made the windows seem to hold more of the program than they did, and the counts ~4% low.
    if ts.phase != Phase::Complete && ts.window_len > 0 && t < ts.calls_until {
        ts.window_calls_cost += c;
    }
    ts.last_ticks = t;
    ts.last_code = e.code.get();
    ts.count += 1;
    let count = ts.count;
    let Some(kind) = e.event_kind() else { return };
    // CPython's INSTRUMENTED_RESUME runs signal handlers, a window's opening among them, before it fires
    // PY_START: the frame the opening's stack found at its first instruction then starts here, recorded in
    // the window. It is the same call (counting both read 25 calls of a function called 24 times).
    // Markers leave it: the stack can go on with frames of code that is not recorded (Ocular's own, when
    // the window opened inside a callback that ran Python), which are on no stack.
    let started_at_open = if marker.is_some() { None } else { ts.started_at_open.take() };
    ts.started_last = match kind {
        EventKind::PY_START | EventKind::COUNT => {
            let between = kind == EventKind::PY_START && ts.phase != Phase::Complete && t >= ts.recorded_until;
            Some((id, t, between))
        }
        _ if marker.is_some() => ts.started_last,
        _ => None,
    };
    let found = started_at_open.filter(|f| f.code == id && ts.stack.last().is_some_and(|top| top.code == id));
    if kind == EventKind::PY_START {
        match found {
            Some(AtResume { start: true, counted: true, .. }) => return,
            Some(AtResume { start: true, counted: false, .. }) => {
                let pos = per.position_or_insert(id);
                per.at(pos).parts.starts += 1;
                recorded_call(ts, per, pos, id, t);
                count_call(ts, t, tree);
                return;
            }
            _ => {}
        }
    }
    if matches!(kind, EventKind::PY_RESUME | EventKind::PY_THROW) && found.is_some_and(|f| !f.start) {
        // A generator or coroutine the opening found at the RESUME after its yield, which runs signal
        // handlers before it fires PY_RESUME (3.13 on): entered at the opening, the same activation.
        return;
    }
    // The position of the started code's figures (its frame's, once pushed).
    let mut started = usize::MAX;
    match kind {
        EventKind::PY_START => {
            started = per.position_or_insert(id);
            per.at(started).parts.starts += 1;
        }
        EventKind::COUNT => {
            if e.arg.get() & 1 != 0 {
                tables.count_ended.insert(id);
            }
            tables.counted_any = true;
            // A thread that gave up the GIL at a function's RESUME, before its PY_START fired, was found
            // there by a window that another thread opened and that ended before this one ran again: its
            // start, outside the window, is counted, and it is the call the opening counted (a function
            // called 12 times read 13, a worker waiting at its first instruction while another held the
            // GIL in a `json.dumps`).
            if found.is_some_and(|f| f.counted) {
                return;
            }
            // A call started outside windows (FORMAT.md 5.8): counted, no stack changes.
            per.entry(id).parts.counted += 1;
            return;
        }
        _ => {}
    }
    if !program {
        return;
    }
    // Between windows a coroutine's or asyncio loop function's boundary (FORMAT.md 5.5) is recorded for
    // the async view: the walk leaves it out (`Other`), as the other boundaries there are not recorded.
    let step = walk.moves(&mut Moves { ts: &mut *ts, tree: &mut *tree, per: &mut *per, tables: &mut *tables }, e);
    match step {
        Step::Opened { len_us, .. } => {
            let seq = off;
            log.windowed = true;
            if ts.phase == Phase::Sampled {
                ts.checkpoint_window();
            }
            ts.flush_window(tree, per, cost_far);
            if len_us == u32::MAX {
                ts.phase = Phase::Complete;
            } else {
                // The window counts from when it was due, for its length: a fixed span at a time that does
                // not depend on the program. (Counting its lead too would make windows that opened late,
                // after a long C call or a blocking wait, weigh more than others, and over-count that.)
                let len = log.len_ticks(len_us);
                let from = ts.clock_at.unwrap_or(t);
                // The run's windows fell due when their leads say, whatever this thread did since: a
                // missed window's markers can follow the thread's later events (FORMAT.md 5.7).
                let due_at = t.saturating_sub(log.len_ticks(e.code.get())).min(from);
                log.later.entry(seq).or_insert((due_at, len));
                ts.phase = Phase::Sampled;
                ts.window_from = from;
                ts.window_opened = t;
                ts.recorded_until = t.saturating_add(len);
                ts.window_end = from.saturating_add(len);
                ts.calls_until = t.saturating_add(len);
                ts.window_len = len;
                ts.window_missed = false;
                ts.window_e1 = ts.e[1];
                ts.calls_from_due = false;
            }
        }
        Step::Closed => {
            if ts.phase == Phase::Sampled && ts.window_missed {
                // A missed window stands for its length from its due moment, in the stack read then. Its
                // markers can come after events of the thread made since (jumps, counted calls: an ending
                // thread writes the windows still waiting to open before its last return, FORMAT.md 5.7),
                // which moved the thread's clock past that moment: its time is still all of its length.
                let rest = ticks_f64(ts.window_len) - (ts.e[1] - ts.window_e1);
                if rest > 0.0 {
                    ts.e[1] += rest;
                }
            }
            if ts.phase == Phase::Sampled {
                ts.checkpoint_window();
            }
            ts.flush_window(tree, per, cost_far);
            ts.calls_until = 0;
            if off == 0 {
                log.first_close = Some(log.first_close.map_or(t, |c| c.min(t)));
            }
            ts.phase = Phase::Gap;
        }
        Step::Found { depth, same } => {
            let index = tables.indexes.get(tables.code_index(id) as usize);
            // At a RESUME: where a frame starts (the function's first), or goes on after a yield or an
            // await (a generator's or coroutine's resumption: no call).
            let at_resume = index.is_some_and(|i| i.resume.contains(&off));
            let at_start = at_resume && index.is_some_and(|i| i.start == Some(off));
            if at_resume {
                // The window opened at this frame's start (its RESUME, a safe point): it was entered at
                // the opening, and the window's lead ran in its callers, the frames the stack confirmed so
                // far (not frames left from before the window: they go first).
                while ts.stack.len() > depth {
                    pop(ts, t, tree, per, tables);
                }
                ts.advance(t);
            }
            if !at_resume && same {
                // The same activation as before the gap, as far as can be told. Its loops' unrecorded time
                // ends here if the frame is now outside them.
                if depth + 1 == ts.stack.len() {
                    block(ts, t, off, precise, tables, false);
                }
                let now = ts.cost;
                let f = &mut ts.stack[depth];
                f.prev = Some((t, now, off));
            } else {
                while ts.stack.len() > depth {
                    pop(ts, t, tree, per, tables);
                }
                push(ts, per, id, t, off, tree);
                // CPython 3.12's INSTRUMENTED_RESUME fires PY_START before it runs signal handlers: a frame
                // whose start was the thread's last event was counted then (a call read twice otherwise).
                // That start is this call if it came after the window fell due, or if every start of the
                // function since is recorded (its calls outside windows still counted, 5.8): a thread
                // preempted between the start and its RESUME's check opens the window there, its start
                // before the due moment. Otherwise, one in an earlier window may have been another call,
                // its return and the next start unrecorded.
                let every_start = tables.counts_starts && !tables.count_ended.contains(&id);
                let started = ts
                    .started_last
                    .is_some_and(|(code, at, between)| code == id && (at >= ts.window_from || every_start || between));
                // An earlier opening found this frame at its first instruction too, and the thread has
                // recorded nothing since, though any start of the function would have been: it is still
                // waiting there (for the GIL, at its RESUME's check), the call that opening did or did not
                // count, and its start is still to come.
                let waiting = ts
                    .started_at_open
                    .filter(|f| at_start && every_start && f.start && f.code == id && f.depth == depth);
                let counted = at_start && ts.calls_from_due && t < ts.calls_until && !started && waiting.is_none();
                if at_resume {
                    ts.started_at_open =
                        Some(waiting.unwrap_or(AtResume { code: id, counted, depth, start: at_start }));
                }
                if counted {
                    // The window opened at this call's first instruction, inside its span (5.7): the call
                    // started in the window, though no PY_START of it is recorded.
                    // Known to have happened, as a recorded one: no COUNT of it either.
                    let p = &mut per.entry(id).parts;
                    p.calls[1] += 1;
                    p.starts += 1;
                    ts.window_funcs.entry(id)[2] += 1.0;
                    count_call(ts, t, tree);
                }
            }
        }
        Step::Enter(kind) => enter(ts, kind, started, e, t, (tables, tree, per)),
        Step::Other(EventKind::CALL) => {
            // A call of a C function (FORMAT.md 5.4): a frame under its Python caller, counted as a call.
            let Some(code) = c_code_id(e.arg.get()) else { return };
            let pos = per.position_or_insert(code);
            recorded_call(ts, per, pos, code, t);
            call_from_loop(ts, t, tables);
            push(ts, per, code, t, off, tree);
            ts.stack.last_mut().expect("pushed").c_site = Some((id, off));
            count_call(ts, t, tree);
        }
        Step::Other(EventKind::C_RETURN | EventKind::C_RAISE) => {
            // The innermost open C call from this call site, looked for down to its caller's frame: one that
            // matches none (the recording started inside the call) is ignored, and Python frames left above
            // it (events lost) close with it.
            let mut found = None;
            for (i, f) in ts.stack.iter().enumerate().rev() {
                if f.c_site == Some((id, off)) {
                    found = Some(i);
                    break;
                }
                if f.c_site.is_none() && f.code == id {
                    break;
                }
            }
            if let Some(pos) = found {
                while ts.stack.len() > pos {
                    pop(ts, t, tree, per, tables);
                }
            }
        }
        // The exit of the frame on top (the walk ended those above it: events lost or filtered in
        // between); an exit without its entry (recording started inside the function) moves nothing.
        Step::Exit(kind) => exit(ts, kind, e, t, precise, (tables, tree, per)),
        // A location in the frame on top: the walk ended the frames above the one it is in (they returned
        // unrecorded, between windows, or a C call's return was not recorded), or it was called since
        // (`enter`).
        // In a window, a location of code on no frame here is left out (the recording started inside its
        // frame, which no window's stack names, FORMAT.md 5.3): the figures hold frames seen to begin, or
        // called between windows, or above a C call whose return was not recorded.
        Step::Location { enter: true, .. }
            if ts.phase != Phase::Gap && !ts.stack.last().is_some_and(|f| f.c_site.is_some()) => {}
        Step::Location { kind, enter } => {
            if enter {
                push(ts, per, id, t, off, tree);
            }
            block(ts, t, off, precise, tables, true);
            let now = ts.cost;
            let top = ts.stack.last_mut().expect("the walk put it on top");
            let dest = e.arg.get();
            if matches!(kind, EventKind::BRANCH | EventKind::BRANCH_LEFT | EventKind::BRANCH_RIGHT) {
                let ways = tables.branches.entry((id, off)).or_default();
                match ways.iter().position(|w| w.dest == dest && w.kind == kind) {
                    Some(i) => ways[i].count += 1,
                    // A branch has two ways; a crafted file cannot make the list grow without bound.
                    None if ways.len() < 4 => ways.push(BranchWay { dest, kind, count: 1 }),
                    None => {}
                }
            }
            let next = if kind == EventKind::INSTRUCTION { off } else { dest };
            let prev_at = top.prev.map(|p| p.2);
            top.prev = Some((t, now, next));
            if !precise {
                // A recorded exit (a branch or jump out of the loop) ends the loop here.
                let mut i = 0;
                while i < top.loops.len() {
                    let (head, li, lt, lc, _, since) = top.loops[i];
                    let stats = &mut tables.loops[li as usize];
                    let inside = |o: u32| head <= o && o <= stats.end;
                    if inside(off) && !inside(next) {
                        stats.tail_ticks += loop_span(&mut ts.loop_ticks, li, since, (lt, lc), (t, now)).0;
                        top.loops.swap_remove(i);
                    } else {
                        i += 1;
                    }
                }
            }
            // A loop closes where control goes backwards: a backward JUMP (adaptive), or in precise mode an
            // instruction at a lower offset than the previous one of the same frame (that one was the jump).
            let back = match kind {
                EventKind::JUMP if dest < off => Some((dest, off)),
                EventKind::INSTRUCTION => prev_at.filter(|&p| p > off).map(|p| (off, p)),
                _ => None,
            };
            if let Some((dest, off)) = back {
                let li = match top.loops.iter().position(|l| l.0 == dest) {
                    Some(i) => top.loops[i].1,
                    None => tables.loop_id((id, dest)),
                };
                let stats = &mut tables.loops[li as usize];
                stats.iterations += 1;
                stats.end = stats.end.max(off);
                match top.loops.iter_mut().find(|l| l.0 == dest) {
                    Some(l) => {
                        let (ticks, counted) = loop_span(&mut ts.loop_ticks, li, l.5, (l.2, l.3), (t, now));
                        stats.timed += 1;
                        stats.ticks += ticks;
                        if l.4 + 1 == count {
                            stats.quiet += 1;
                            stats.quiet_ticks += ticks;
                        }
                        l.2 = t;
                        l.3 = now;
                        l.4 = count;
                        l.5 = counted;
                    }
                    None => {
                        let since = loop_ticks_of(&mut ts.loop_ticks, li);
                        top.loops.push((dest, li, t, now, count, since));
                    }
                }
            }
        }
        _ => {}
    }
}

/// A frame entered (`Step::Enter`) by event `e` of kind `kind` at tick `t`; `started`, for a `PY_START`,
/// the position of its code's figures (its start already counted there).
#[inline(always)]
fn enter(
    ts: &mut ThreadState,
    kind: EventKind,
    started: usize,
    e: &RawEvent,
    t: u64,
    (tables, tree, per): (&mut Tables, &mut CallTree, &mut CodeMap<FunctionStats>),
) {
    let (id, off) = (e.code.get(), e.offset.get());
    if kind == EventKind::PY_START {
        recorded_call(ts, per, started, id, t);
    }
    call_from_loop(ts, t, tables);
    let stats = if kind == EventKind::PY_START { started } else { per.position_or_insert(id) };
    push_at(ts, per, stats, id, t, off, tree);
    if kind == EventKind::PY_START {
        count_call(ts, t, tree);
    }
    if kind == EventKind::PY_RESUME {
        if let Some((mut loops, at, cost)) = ts.suspended.get_mut(id).and_then(Option::take) {
            // The loops' clocks stood still while the frame was suspended.
            let (away, away_cost) = (t.saturating_sub(at), ts.cost - cost);
            for l in &mut loops {
                l.2 = l.2.saturating_add(away);
                l.3 += away_cost;
                l.5 += loop_ticks_of(&mut ts.loop_ticks, l.1);
            }
            ts.stack.last_mut().expect("pushed").loops = loops;
        }
    }
}

/// The frame on top exited (`Step::Exit`: a return, yield or unwind of its code) by event `e` at tick `t`.
#[inline(always)]
fn exit(
    ts: &mut ThreadState,
    kind: EventKind,
    e: &RawEvent,
    t: u64,
    precise: bool,
    (tables, tree, per): (&mut Tables, &mut CallTree, &mut CodeMap<FunctionStats>),
) {
    if kind != EventKind::PY_YIELD && ts.stack.last().is_some_and(|f| f.loops.is_empty()) {
        // Most exits: `block` has no loop to end (a pending tail is only ever a loop's) and `pop_frame` no
        // loop to close, so only the frame's figures remain, taken inline. (A yield, even without loops,
        // keeps its suspended entry: a resumption of the same code takes its loops from there.)
        pop_figures(ts, t, tree, per);
        return;
    }
    block(ts, t, e.offset.get(), precise, tables, true);
    if kind == EventKind::PY_YIELD {
        let top = ts.stack.last_mut().expect("the walk found it on top");
        top.pending_tail = None;
        let mut loops = std::mem::take(&mut top.loops);
        // While suspended, what other frames count for the loop is not this run's: kept relative.
        for l in &mut loops {
            l.5 -= loop_ticks_of(&mut ts.loop_ticks, l.1);
        }
        *ts.suspended.entry(e.code.get()) = Some((loops, t, ts.cost));
    }
    pop(ts, t, tree, per, tables);
}

/// Pushes a frame of code `id` entered at tick `t` (a call, or a frame found on a window's stack).
fn push(ts: &mut ThreadState, per: &mut CodeMap<FunctionStats>, id: u32, t: u64, off: u32, tree: &mut CallTree) {
    let stats = per.position_or_insert(id);
    push_at(ts, per, stats, id, t, off, tree);
}

/// [`push`], with the position of `id`'s figures in `per` known.
#[inline(always)]
fn push_at(
    ts: &mut ThreadState,
    per: &CodeMap<FunctionStats>,
    stats: usize,
    id: u32,
    t: u64,
    off: u32,
    tree: &mut CallTree,
) {
    if ts.active.len() <= stats {
        ts.active.resize(per.len(), 0);
    }
    ts.active[stats] += 1;
    let outermost = ts.active[stats] == 1;
    let parent = ts.stack.last().map_or(ts.root, |f| f.node);
    // Written where it goes: `push` of a frame this size built it aside and copied it in (a `memcpy`
    // call an event, depending on what the compiler inlined around it).
    let len = ts.stack.len();
    let entered_e = ts.e_now();
    ts.stack.reserve(1);
    ts.stack.spare_capacity_mut()[0].write(Frame {
        code: id,
        stats: stats as u32,
        c_site: None,
        node: tree.child(parent, id),
        entered_e,
        child_e: [0.0; 2],
        entered_ce: ts.ce,
        child_ce: 0.0,
        outermost,
        prev: Some((t, ts.cost, off)),
        loops: Vec::new(),
        pending_tail: None,
    });
    // SAFETY: the element at `len` was just written.
    unsafe { ts.stack.set_len(len + 1) };
}

/// Counts a call at the node of the frame just pushed at tick `t`, where its function's calls are counted
/// (see the `PY_START` arm of [`step`]).
fn count_call(ts: &mut ThreadState, t: u64, tree: &mut CallTree) {
    let node = ts.stack.last().expect("pushed").node;
    if ts.phase == Phase::Complete {
        tree.calls[node as usize][0] += 1.0;
    } else if t < ts.calls_until {
        ts.window_call_nodes.push(node);
    }
}

/// A call from the top frame while its last event was inside one of its loops: the time from that event
/// to the call is the loop's, either as part of an iteration (if the loop's backward jump follows) or as
/// its unrecorded end (see `Frame::pending_tail`).
#[inline(always)]
fn call_from_loop(ts: &mut ThreadState, t: u64, tables: &Tables) {
    if ts.stack.last().is_some_and(|top| !top.loops.is_empty() && top.pending_tail.is_none()) {
        call_in_loop(ts, t, tables);
    }
}

/// [`call_from_loop`], with the top frame in a loop and no call from it pending.
fn call_in_loop(ts: &mut ThreadState, t: u64, tables: &Tables) {
    let now = ts.cost;
    let Some(top) = ts.stack.last_mut() else { return };
    let Some((pt, pc, at)) = top.prev else { return };
    // The innermost loop that holds the last event's offset.
    let inner = top
        .loops
        .iter()
        .map(|l| (l.0, l.1, tables.loops[l.1 as usize].end))
        .filter(|&(head, _, end)| head <= at && at <= end)
        .max_by_key(|&(head, ..)| head);
    let Some((_, li, _)) = inner else { return };
    let _ = (pt, pc);
    top.pending_tail = Some((li, t, now));
}

/// The analysis' frames as the walk moves them: a frame it ends is popped with its figures, at the tick
/// of the event that showed it ended. A window's end moves none here: its time is counted from when it
/// was due (FORMAT.md 5.3), by [`ThreadState::advance`]'s phases, and its frames live on into the gap.
struct Moves<'a> {
    ts: &'a mut ThreadState,
    tree: &'a mut CallTree,
    per: &'a mut CodeMap<FunctionStats>,
    tables: &'a mut Tables,
}

impl Frames for Moves<'_> {
    fn depth(&self) -> usize {
        self.ts.stack.len()
    }

    fn code(&self, i: usize) -> u32 {
        self.ts.stack[i].code
    }

    #[inline]
    fn lose_above(&mut self, depth: usize, t: u64) {
        truncate(self.ts, depth, t, self.tree, self.per, self.tables);
    }
}

/// Ends the frames above `depth` at tick `t` (a window's stack did not confirm them).
fn truncate(
    ts: &mut ThreadState,
    depth: usize,
    t: u64,
    tree: &mut CallTree,
    per: &mut CodeMap<FunctionStats>,
    tables: &mut Tables,
) {
    // Where every event is recorded (the complete part), a frame the walk ends had its return lost: its
    // loops end at its last event. Ended at `t`, the event that showed the frame gone, its loop's tail
    // took all of its caller's time up to there.
    let lost = ts.phase == Phase::Complete;
    while ts.stack.len() > depth {
        pop_frame(ts, t, tree, per, tables, lost);
    }
}

/// The ticks counted so far for loop `li` on a thread ([`ThreadState::loop_ticks`]).
#[inline(always)]
fn loop_ticks_of(counted: &mut Vec<f64>, li: u32) -> f64 {
    let i = li as usize;
    if counted.len() <= i {
        counted.resize(i + 1, 0.0);
    }
    counted[i]
}

/// The ticks of a run of loop `li` from `(lt, lc)` (ticks, running cost sum) to `(et, ec)`, less the
/// recorder's cost, less what was counted for the loop on the thread since the run's start (`since`, the
/// thread's [`ThreadState::loop_ticks`] then: the runs of another frame of the loop inside this one); and
/// counts them: (the run's ticks, the loop's ticks on the thread now). A loop's time on a thread is then
/// never more than the thread's. `counted` has the loop: every run starts with [`loop_ticks_of`].
#[inline(always)]
fn loop_span(counted: &mut [f64], li: u32, since: f64, (lt, lc): (u64, f64), (et, ec): (u64, f64)) -> (f64, f64) {
    let c = &mut counted[li as usize];
    let ticks = ((ticks_f64(et.saturating_sub(lt)) - (ec - lc)).max(0.0) - (*c - since)).max(0.0);
    *c += ticks;
    (ticks, *c)
}

/// A tick difference as f64. Through i64: one instruction, where u64 to f64 takes a branchy sequence on
/// x86-64, once per event. (Differences beyond 2^63 ticks, a century, do not occur.)
#[inline(always)]
fn ticks_f64(d: u64) -> f64 {
    d as i64 as f64
}

/// Attributes the time since the frame's previous event to the instructions that ran in between, for the
/// loops that contain them, and ends the loops the frame is now outside of (`off` is outside them): their
/// time from the last backward jump to this sign of the exit is their tail. `costs`: the time since the
/// previous event is one block of instructions (false for a window's stack, which follows a gap).
#[inline(always)]
fn block(ts: &mut ThreadState, t: u64, off: u32, precise: bool, tables: &mut Tables, costs: bool) {
    let now = ts.cost;
    let Some(top) = ts.stack.last_mut() else { return };
    let pending = top.pending_tail.take();
    if top.loops.is_empty() {
        return;
    }
    let Some((pt, pc, start)) = top.prev else { return };
    // The recorder's cost of this event and of every event in between (callees' included).
    let ticks = (ticks_f64(t.saturating_sub(pt)) - (now - pc)).max(0.0);
    // Precise mode's loops time each instruction: their code's index, looked up once per block, and only
    // where a loop runs.
    let index_pos = if precise && !top.loops.is_empty() { tables.code_index(top.code) } else { u32::MAX };
    let mut i = 0;
    while i < top.loops.len() {
        let (head, li, lt, lc, _, since) = top.loops[i];
        let stats = &mut tables.loops[li as usize];
        let end = stats.end;
        let inside = |o: u32| head <= o && o <= end;
        let called = pending.filter(|p| p.0 == li);
        if !inside(off) && (inside(start) || called.is_some()) {
            // Outside now, inside before (or before a call made from it): the loop ended in between, where
            // it was not recorded, and no later than the call.
            let (et, ec) = called.map_or((t, now), |p| (p.1, p.2));
            stats.tail_ticks += loop_span(&mut ts.loop_ticks, li, since, (lt, lc), (et, ec)).0;
            top.loops.swap_remove(i);
            continue;
        }
        if precise {
            // The previous INSTRUCTION's offset is `start`: it took the whole delta.
            if costs && inside(start) {
                let Some(index) = tables.indexes.get(index_pos as usize) else { return };
                if let Some(p) = index.position(start) {
                    let slot = &mut stats.slots(&index.offsets)[p];
                    slot.0 += ticks;
                    slot.1 += 1;
                }
            }
            i += 1;
            continue;
        }
        if costs && start <= off && start >= head && off <= end {
            // The block's instructions: from `start` to `off` (events name instruction boundaries).
            stats.add_block(start, off, ticks);
        }
        i += 1;
    }
}

fn pop(ts: &mut ThreadState, t: u64, tree: &mut CallTree, per: &mut CodeMap<FunctionStats>, tables: &mut Tables) {
    pop_frame(ts, t, tree, per, tables, false);
}

/// [`pop`]; with `lost`, the frame's return was not recorded: its loops end at its last event, not at `t`.
fn pop_frame(
    ts: &mut ThreadState,
    t: u64,
    tree: &mut CallTree,
    per: &mut CodeMap<FunctionStats>,
    tables: &mut Tables,
    lost: bool,
) {
    // Read in place and dropped there: moving a frame out of the stack copied it.
    let Some(f) = ts.stack.last() else { return };
    let end = match f.prev {
        Some((pt, pc, _)) if lost => (pt, pc),
        _ => (t, ts.cost),
    };
    // Loops still running when their frame ends: their time up to here (or up to a call made from them).
    for &(_, li, lt, lc, _, since) in &f.loops {
        let (et, ec) = f.pending_tail.filter(|p| p.0 == li).map_or(end, |p| (p.1, p.2));
        tables.loops[li as usize].tail_ticks += loop_span(&mut ts.loop_ticks, li, since, (lt, lc), (et, ec)).0;
    }
    pop_figures(ts, t, tree, per);
}

/// The figures of the frame on top as it ends at tick `t`, its loops' ended ([`pop_frame`]), and the frame
/// popped: the whole of an exit from a frame without loops, which [`exit`] takes inline.
#[inline(always)]
fn pop_figures(ts: &mut ThreadState, t: u64, tree: &mut CallTree, per: &mut CodeMap<FunctionStats>) {
    let now = ts.cost;
    let Some(f) = ts.stack.last() else { return };
    let d = &mut ts.active[f.stats as usize];
    *d = d.saturating_sub(1);

    // Not clamped per frame: a short frame's corrected time can come out slightly negative (the calibrated
    // cost is an average), and clamping each would bias the sums up; the totals are clamped when reported.
    let e = ts.e_now();
    let inclusive: [f64; 2] = std::array::from_fn(|i| e[i] - f.entered_e[i]);
    let exclusive: [f64; 2] = std::array::from_fn(|i| inclusive[i] - f.child_e[i]);
    let inclusive_cost = ts.ce - f.entered_ce;
    tree.parts[f.node as usize][0] += exclusive[0];
    let stats = per.at(f.stats as usize);
    if f.outermost {
        stats.parts.inclusive[0] += inclusive[0];
        stats.parts.cost[0] += inclusive_cost;
    }
    stats.parts.exclusive[0] += exclusive[0];
    stats.parts.cost[1] += inclusive_cost - f.child_ce;
    // A later window's part waits for the window's factor (the frame's window time is only ever the
    // current window's: `checkpoint_window` restarts it).
    if exclusive[1] != 0.0 || inclusive[1] != 0.0 {
        ts.window_nodes.push((f.node, exclusive[1]));
        let w = ts.window_funcs.entry(f.code);
        w[0] += exclusive[1];
        if f.outermost {
            w[1] += inclusive[1];
        }
    }
    ts.stack.truncate(ts.stack.len() - 1);
    if let Some(parent) = ts.stack.last_mut() {
        for (c, x) in parent.child_e.iter_mut().zip(inclusive) {
            *c += x;
        }
        parent.child_ce += inclusive_cost;
        // The parent continues after the call: its block restarts now.
        if let Some(p) = &mut parent.prev {
            p.0 = t;
            p.1 = now;
        }
    }
}

/// A frame a window's stack ended in, found at a RESUME ([`ThreadState::started_at_open`]).
#[derive(Clone, Copy, Debug)]
struct AtResume {
    code: u32,
    /// The opening counted it as a call.
    counted: bool,
    depth: usize,
    /// At the RESUME where a call starts, not at one after a yield.
    start: bool,
}

/// A code object's instruction offsets, and for every code unit the position of its instruction.
#[derive(Debug)]
struct CodeIndex {
    offsets: Vec<u32>,
    position: Vec<u32>,
    /// Offsets of its RESUME instructions (where a frame starts, or resumes after a yield).
    resume: Vec<u32>,
    /// The offset of the RESUME where a call starts (its oparg's location bits 0), not a resumption.
    start: Option<u32>,
}

impl CodeIndex {
    fn new(offsets: Vec<u32>, co: &CodeObject, header: &Header) -> Self {
        let units = offsets.last().map_or(0, |&o| o as usize / 2 + 1);
        let mut position = vec![u32::MAX; units];
        for (i, &o) in offsets.iter().enumerate() {
            position[o as usize / 2] = i as u32;
        }
        let resume: Vec<u32> = offsets
            .iter()
            .copied()
            .filter(|&o| co.bytecode.get(o as usize).is_some_and(|&op| header.opcodes.name(op) == "RESUME"))
            .collect();
        // RESUME's oparg says where it is: 0 at a function's start, 1-3 after a yield, a `yield from`, an
        // `await` (bit 2, since 3.14, is not the location).
        let start = resume.iter().copied().find(|&o| co.bytecode.get(o as usize + 1).is_some_and(|&arg| arg & 3 == 0));
        CodeIndex { offsets, position, resume, start }
    }

    /// The position of the instruction at byte offset `o`, if an instruction starts there.
    #[inline]
    fn position(&self, o: u32) -> Option<usize> {
        self.position.get(o as usize / 2).filter(|&&p| p != u32::MAX).map(|&p| p as usize)
    }
}

/// Offsets of the instructions from `start` to `end` inclusive, walking the base bytecode with the
/// interpreter's inline-cache table (caches are not instructions).
pub fn instructions(co: &CodeObject, header: &Header, start: u32, end: u32) -> Vec<u32> {
    let table = &header.opcodes;
    let mut out = Vec::new();
    let mut o = 0usize;
    let code = &co.bytecode;
    while o + 1 < code.len() && o as u32 <= end {
        let op = code[o] as usize;
        if o as u32 >= start {
            out.push(o as u32);
        }
        let caches = table.cache_entries.get(op).copied().unwrap_or(0) as usize;
        o += 2 + 2 * caches;
    }
    out
}

/// What an instruction whose base opcode is `base` had become when the recording stopped, given the
/// opcode `at_stop` found at its offset in the snapshot: `Ok(op)` with its specialized form (or `base`
/// itself), `Err(true)` if it was still `INSTRUMENTED_*` (CPython removes instrumentation lazily, when the
/// code next runs, so the specialization is hidden), `Err(false)` if `at_stop` is not a form of `base`.
pub fn specialization(header: &Header, base: u8, at_stop: u8) -> Result<u8, bool> {
    let names = &header.opcodes;
    if names.name(at_stop).starts_with("INSTRUMENTED_") {
        return Err(true);
    }
    if names.base.get(at_stop as usize).copied() == Some(base) {
        Ok(at_stop)
    } else {
        Err(false)
    }
}
