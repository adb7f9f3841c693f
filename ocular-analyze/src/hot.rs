//! `hot`: the loops that took the most time, with their bodies disassembled (base -> specialized opcode).

use crate::analysis::{instructions, specialization, Analysis};
use ocular_format::{EventKind, Mode};
use serde::Serialize;

/// One hot loop.
#[derive(Debug, Serialize)]
pub struct HotLoop {
    /// The process that ran it.
    pub pid: u32,
    /// Qualified name of the function.
    pub function: String,
    /// Source file.
    pub file: String,
    /// First line of the loop.
    pub first_line: i32,
    /// Last line of the loop.
    pub last_line: i32,
    /// Offset of the loop head (the backward jump's destination).
    pub head_offset: u32,
    /// Offset of the backward jump.
    pub end_offset: u32,
    /// Recorded iterations (executions of the backward jump).
    pub iterations: u64,
    /// Whether the de-instrumentation threshold stopped the recording of this loop (then `iterations` is
    /// the number recorded, not the number run).
    pub sampled: bool,
    /// Mean time per iteration, recorder cost subtracted: of the quiet iterations when there are at least
    /// [`MIN_QUIET`] (see `timing`), else of all timed ones. None (null) when no iteration was timed, or
    /// what they took was no more than the recorder's cost: nothing was measured.
    pub ns_per_iteration: Option<f64>,
    /// Which iterations `ns_per_iteration` averages: "quiet" (only the loop's backward jump was recorded:
    /// the loop ran specialized, as it does unrecorded) or "instrumented" (every branch and call recorded:
    /// CPython runs the loop's branches de-specialized, so this overstates the unrecorded time).
    pub timing: String,
    /// Quiet iterations measured.
    pub quiet_iterations: u64,
    /// Iterations timed (each but the first of a run of them).
    pub timed_iterations: u64,
    /// The same in ticks.
    pub ticks_per_iteration: f64,
    /// Time in the loop, ns: the measured iterations plus `unrecorded_ns`.
    pub total_ns: f64,
    /// Time the loop ran after the threshold stopped recording it (adaptive mode), ns: from its last
    /// recorded event to the frame's next event outside it. Loops are ranked by `total_ns`.
    pub unrecorded_ns: f64,
    /// Performance counters (FORMAT.md 6.9) sampled while this loop ran: empty if none were recorded.
    pub counters: Vec<LoopCounter>,
    /// The loop body.
    pub instructions: Vec<Instruction>,
}

/// A performance counter's events in one loop, from the samples taken while it was its frame's innermost
/// running loop (a loop shorter than a few sampling periods has few: estimated).
#[derive(Debug, Serialize)]
pub struct LoopCounter {
    /// `task-clock`, `page-faults`, ...
    pub name: String,
    /// What one event is: `ns`, `faults`, ...
    pub unit: String,
    /// Events in the loop (samples times their period).
    pub total: u64,
    /// Events per iteration: `total` over the iterations run (recorded, or estimated from the loop's time
    /// where the threshold stopped recording it).
    pub per_iteration: f64,
    /// Samples behind `total`.
    pub samples: u64,
}

/// One instruction of a loop body.
#[derive(Debug, Serialize)]
pub struct Instruction {
    /// Byte offset.
    pub offset: u32,
    /// Source line, -1 if none.
    pub line: i32,
    /// Base opcode name.
    pub base: String,
    /// Specialized opcode name at stop, if different from the base.
    pub specialized: Option<String>,
    /// The instruction was still instrumented when the snapshot was taken, so its specialization is not
    /// visible.
    pub instrumented_at_stop: bool,
    /// Average ticks per execution (see `cost_kind`), if any were measured.
    pub ticks: Option<f64>,
    /// The same in ns.
    pub ns: Option<f64>,
    /// For a conditional branch: which way it went in its recorded hits.
    pub branch: Option<Branch>,
}

/// Which way a conditional branch went, over its recorded hits (with a threshold, its first N: in the
/// proportions of the run's start). From CPython 3.14 the events say so (BRANCH_RIGHT: the jump was taken,
/// BRANCH_LEFT: not); before, a destination other than the next instruction is the jump taken.
#[derive(Debug, Serialize)]
pub struct Branch {
    /// The jump was taken (control went to its target).
    pub taken: u64,
    /// It was not (control went on to the next instruction).
    pub not_taken: u64,
}

/// The taken and not-taken counts of the branch at `off` whose next instruction is at `next`.
fn branch_of(a: &Analysis, id: u32, off: u32, next: Option<u32>) -> Option<Branch> {
    let ways = a.branches.get(&(id, off))?;
    let mut b = Branch { taken: 0, not_taken: 0 };
    for w in ways {
        let taken = match w.kind {
            EventKind::BRANCH_RIGHT => true,
            EventKind::BRANCH_LEFT => false,
            _ => Some(w.dest) != next,
        };
        if taken {
            b.taken += w.count;
        } else {
            b.not_taken += w.count;
        }
    }
    Some(b)
}

/// The report.
#[derive(Debug, Serialize)]
pub struct HotReport {
    /// Recording mode.
    pub mode: String,
    /// How per-instruction costs were obtained.
    pub cost_kind: String,
    /// What the recorder's own cost was and how it was removed.
    pub correction: String,
    /// Loops, hottest first.
    pub loops: Vec<HotLoop>,
    /// Threads that lost events (their loops' figures miss those stretches).
    pub lost: Vec<crate::analysis::Loss>,
    /// A run of several processes: how many (0 for one); each loop names its process.
    #[serde(skip_serializing_if = "is_zero")]
    pub processes: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The `top` hottest loops of a run of several processes, over all of them: each process's report, the
/// loops merged by total time.
pub fn report_run(analyses: &[&Analysis], top: usize) -> HotReport {
    let mut reports: Vec<HotReport> = analyses.iter().map(|a| report(a, top)).collect();
    let mut first = reports.remove(0);
    for r in reports {
        first.loops.extend(r.loops);
        first.lost.extend(r.lost);
    }
    first.loops.sort_by(|x, y| y.total_ns.total_cmp(&x.total_ns).then(y.iterations.cmp(&x.iterations)));
    first.loops.truncate(top);
    first.processes = analyses.len();
    first
}

/// Quiet iterations needed before `ns_per_iteration` uses them.
pub const MIN_QUIET: u64 = 16;

/// The loops that ran, hottest first: by time in the loop (measured plus unrecorded), then iterations, then
/// code id and head. `hot` and `specialize` show them in this order.
pub fn ranked(a: &Analysis) -> Vec<(&crate::analysis::LoopKey, &crate::analysis::LoopStats)> {
    let mut keys: Vec<_> = a.loops.iter().filter(|(_, s)| s.iterations > 0).collect();
    let total = |s: &crate::analysis::LoopStats| s.ticks + s.tail_ticks;
    keys.sort_by(|x, y| total(y.1).total_cmp(&total(x.1)).then(y.1.iterations.cmp(&x.1.iterations)).then(x.0.cmp(y.0)));
    keys
}

/// The `top` hottest loops by measured time.
pub fn report(a: &Analysis, top: usize) -> HotReport {
    let header = a.header.as_ref().expect("analysis has a header");
    let cost_ns = a.ns(header.event_cost_ticks);
    let keys = ranked(a);
    let threshold = header.options.deinstrument_threshold as u64;
    let mut loops = Vec::new();
    for (&(id, head), s) in keys.into_iter().take(top) {
        let end = s.end;
        let Some(co) = a.code.get(&id) else { continue };
        let snap = a.snapshots.get(&id);
        let names = &header.opcodes;
        let mut body = Vec::new();
        let (mut lo, mut hi) = (i32::MAX, i32::MIN);
        let offsets = instructions(co, header, head, end);
        let all = instructions(co, header, 0, u32::MAX);
        let next_of = |off: u32| all.iter().position(|&o| o == off).and_then(|i| all.get(i + 1).copied());
        for off in offsets {
            let op = co.bytecode[off as usize];
            let line = co.positions.get(off as usize / 2).map_or(-1, |p| p.line);
            if line >= 0 {
                lo = lo.min(line);
                hi = hi.max(line);
            }
            let base_op = names.base.get(op as usize).copied().unwrap_or(op);
            let at_stop = snap.and_then(|b| b.get(off as usize).copied());
            // CPython removes instrumentation lazily, when a code object next runs: an instruction still
            // INSTRUMENTED_* at stop hides its specialization, and we say so rather than guess.
            let spec = at_stop.map(|sop| specialization(header, base_op, sop));
            let instrumented = spec == Some(Err(true));
            let specialized =
                spec.and_then(Result::ok).filter(|&sop| sop != base_op).map(|sop| names.name(sop).into_owned());
            let cost = s.cost_at(off);
            body.push(Instruction {
                offset: off,
                line,
                base: names.name(base_op).into_owned(),
                specialized,
                instrumented_at_stop: instrumented,
                ticks: cost,
                ns: cost.map(|c| a.ns(c)),
                branch: branch_of(a, id, off, next_of(off)),
            });
        }
        let (per, timing) = if s.quiet >= MIN_QUIET {
            (s.quiet_ticks / s.quiet as f64, "quiet")
        } else {
            (if s.timed > 0 { s.ticks / s.timed as f64 } else { 0.0 }, "instrumented")
        };
        // Iterations run: recorded, or where the threshold stopped recording the loop, its time at the
        // measured rate.
        let run = if threshold > 0 && s.iterations >= threshold && per > 0.0 {
            ((s.ticks + s.tail_ticks) / per).max(s.iterations as f64)
        } else {
            s.iterations as f64
        };
        let counters = a
            .counters
            .iter()
            .zip(&s.counters)
            .filter(|(c, _)| c.error.is_empty())
            .map(|(c, &total)| LoopCounter {
                name: c.name.clone(),
                unit: c.unit.clone(),
                total,
                per_iteration: total as f64 / run,
                samples: total / c.period.max(1),
            })
            .collect();
        loops.push(HotLoop {
            pid: header.pid,
            function: co.qualname.clone(),
            file: co.filename.clone(),
            first_line: if lo == i32::MAX { co.first_line as i32 } else { lo },
            last_line: if hi == i32::MIN { co.first_line as i32 } else { hi },
            head_offset: head,
            end_offset: end,
            iterations: s.iterations,
            sampled: threshold > 0 && s.iterations >= threshold,
            ns_per_iteration: (per > 0.0).then(|| a.ns(per)),
            timing: timing.into(),
            quiet_iterations: s.quiet,
            timed_iterations: s.timed,
            ticks_per_iteration: per,
            total_ns: a.ns(s.ticks + s.tail_ticks),
            unrecorded_ns: a.ns(s.tail_ticks),
            counters,
            instructions: body,
        });
    }
    let (mode, cost_kind) = match header.options.mode {
        Mode::Precise => (
            "precise",
            "measured per instruction: time from one INSTRUCTION event to the next. CPython runs the base \
             (de-specialized) instruction while INSTRUCTION events are on, so these are costs of the base \
             instruction; the specialized name shows what it runs as when not recorded",
        ),
        Mode::Adaptive => (
            "adaptive",
            "estimated: the time between two events of a frame is the cost of the block that ran between them, \
             spread evenly over its instructions (callee time excluded). While BRANCH events are on, CPython runs \
             FOR_ITER and conditional jumps de-specialized",
        ),
        Mode::Calls => ("calls", "none: calls mode records no jumps, so no loops are found"),
    };
    HotReport {
        processes: 0,
        lost: a.losses.clone(),
        mode: mode.into(),
        cost_kind: cost_kind.into(),
        correction: match &a.calibration {
            Some(c) => {
                // Kinds with the same cost are listed together: "JUMP, BRANCH 47.2 ns; PY_START, ... 36.0 ns".
                let mut groups: Vec<(f64, Vec<String>)> = Vec::new();
                let ratio = a.cost_speed_ratio.unwrap_or(1.0);
                // Event kinds only: the pseudo-kinds (instrumenting, the machine's speed) are not events'.
                for &(k, ticks) in c.costs.iter().filter(|(k, _)| *k < ocular_format::Calibration::INSTRUMENT_CODE) {
                    let ticks = ticks * ratio;
                    let name = ocular_format::kind_name(k).into_owned();
                    match groups.iter_mut().find(|g| g.0 == ticks) {
                        Some(g) => g.1.push(name),
                        None => groups.push((ticks, vec![name])),
                    }
                }
                let list: Vec<String> =
                    groups.iter().map(|(t, names)| format!("{} {:.1} ns", names.join(", "), a.ns(*t))).collect();
                let when = match a.cost_speed_ratio {
                    Some(r) => {
                        format!("calibrated when recording started, x{r:.2} for the machine's speed at the stop")
                    }
                    None => "calibrated when recording started".into(),
                };
                format!(
                    "the recorder's own cost per event kind ({when}: {}) is subtracted for every event recorded inside \
                     each timed span",
                    list.join("; ")
                )
            }
            None => format!(
                "the recorder's own cost, {cost_ns:.1} ns per event (calibrated when recording started), is subtracted \
                 once for every event recorded inside each timed span"
            ),
        },
        loops,
    }
}

/// "task-clock 12.345 ms (1.2 us/iteration, 12 samples)"; "page-faults 300 (0.03/iteration, 30 samples)".
fn counter_text(c: &LoopCounter) -> String {
    let (total, per) = if c.unit == "ns" {
        (format!("{:.3} ms", c.total as f64 / 1e6), format!("{:.1} ns", c.per_iteration))
    } else {
        (c.total.to_string(), format!("{:.3}", c.per_iteration))
    };
    format!("{} {total} ({per}/iteration, {} samples)", c.name, c.samples)
}

impl std::fmt::Display for HotReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "Hot loops ({} mode), hottest first", self.mode)?;
        writeln!(f, "  time per iteration: {}", self.correction)?;
        writeln!(f, "  per-instruction cost: {}", self.cost_kind)?;
        if self.loops.iter().flat_map(|l| &l.instructions).any(|i| i.branch.is_some()) {
            writeln!(
                f,
                "  branches: \"taken N of M\" counts the recorded hits in which a conditional jump jumped (FOR_ITER: \
                 the loop ended)"
            )?;
        }
        if self.loops.is_empty() {
            writeln!(f, "\n  no loops recorded")?;
        }
        for (i, l) in self.loops.iter().enumerate() {
            writeln!(f)?;
            let sampled = if l.sampled { " (first ones only: de-instrumented at the threshold)" } else { "" };
            let unrecorded = if l.unrecorded_ns > 0.0 && l.sampled {
                let all = match l.ns_per_iteration {
                    Some(ns) => format!("; ~{:.0} iterations in all at that rate", l.total_ns / ns),
                    None => String::new(),
                };
                format!(
                    " ({:.3} ms of it after the threshold stopped recording the loop, timed from its last recorded \
                     event to its frame's next event outside it{all})",
                    l.unrecorded_ns / 1e6,
                )
            } else {
                String::new()
            };
            // No iteration timed (every one was the first of its run), or none took longer than recording it
            // costs: say so rather than print 0 ns.
            let per = if let Some(ns) = l.ns_per_iteration {
                format!(
                    "{ns:.1} ns/iteration ({:.0} ticks{})",
                    l.ticks_per_iteration,
                    if l.timing == "quiet" {
                        format!(", from {} quiet iterations", l.quiet_iterations)
                    } else {
                        String::new()
                    }
                )
            } else if l.timed_iterations == 0 {
                "no iteration timed".to_string()
            } else {
                format!(
                    "no time per iteration measured (its {} timed iterations took no longer than the recorder's cost \
                     of their events)",
                    l.timed_iterations
                )
            };
            let pid = if self.processes > 0 { format!(" (pid {})", l.pid) } else { String::new() };
            writeln!(
                f,
                "#{} {}{pid}  {}:{}-{}\n   {} iterations{sampled}, {per}, {:.3} ms in total{unrecorded}",
                i + 1,
                l.function,
                l.file,
                l.first_line,
                l.last_line,
                l.iterations,
                l.total_ns / 1e6
            )?;
            if !l.counters.is_empty() {
                let list: Vec<String> = l.counters.iter().map(counter_text).collect();
                writeln!(f, "   counters (sampled): {}", list.join(", "))?;
            }
            for (k, ins) in l.instructions.iter().enumerate() {
                let name = match (&ins.specialized, ins.instrumented_at_stop) {
                    (Some(s), _) => format!("{} -> {}", ins.base, s),
                    (None, true) => format!("{} (instrumented at stop)", ins.base),
                    (None, false) => ins.base.clone(),
                };
                let cost = match (ins.ticks, ins.ns) {
                    (Some(t), Some(n)) => format!("~{t:.0} ticks ({n:.1} ns)"),
                    _ => "-".into(),
                };
                let branch = match &ins.branch {
                    Some(b) if b.taken + b.not_taken > 0 => format!(
                        " | taken {} of {} ({:.0}%)",
                        b.taken,
                        b.taken + b.not_taken,
                        b.taken as f64 * 100.0 / (b.taken + b.not_taken) as f64
                    ),
                    _ => String::new(),
                };
                let line = format!(
                    "   [{k:03}] offset {:<4} line {:<4} {name:<44} | {cost:<20}{branch}",
                    ins.offset, ins.line
                );
                writeln!(f, "{}", line.trim_end())?;
            }
        }
        Ok(())
    }
}
