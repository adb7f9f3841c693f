//! `stats --async`: where coroutines' wall time goes, awaits included, from the coroutine events a trace
//! holds (FORMAT.md 5.5). A pass of its own over the events, apart from [`crate::analysis`]'s.
//!
//! How the figures are made:
//! - A coroutine **instance** is a frame id: its `PY_START` begins it, `PY_RETURN` / `PY_UNWIND` end it.
//!   Between a `PY_YIELD` and the next `PY_RESUME` / `PY_THROW` of the same id it is **suspended**; between
//!   a start or resume and the next yield or end it is **running** (its own code, the functions it called
//!   and the coroutines it awaited that ran meanwhile: inclusive, as a call tree's inclusive time).
//! - The coroutine running below another on the same thread when it starts or resumes is the one awaiting
//!   it (`await child()`, `async for`); one with none below it was resumed by the event loop: it is a
//!   **task**'s coroutine, and the coroutines it awaits belong to that task. So is one started on top of
//!   another whose first yield that other did not pass on (an eager task: `promote`). When a task's turn ends, its
//!   frames yield innermost first: that order is the task's **await chain**, ending in what the innermost
//!   yielded (a Future, a Task, a bare yield).
//! - A suspension is split into **awaiting** (what it awaited was not done) and **ready** (it was done, and
//!   the coroutine waited for the loop to get to it). asyncio resumes a task from a callback that
//!   `BaseEventLoop._call_soon` appended to the loop's ready queue, and the loop runs that queue in order
//!   (`BaseEventLoop._run_once` takes what is in it, `Handle._run` runs each): the n-th callback run in a
//!   turn of the loop is the n-th one appended before it. The moment a task's callback was appended is
//!   when it became ready. From CPython 3.14 `call_soon_threadsafe` appends without `_call_soon`, and the
//!   callback it appends runs in `_ThreadSafeHandle._run` around `Handle._run`: `queue_event` reads
//!   both shapes alike. Without these functions' events (another event loop, such as uvloop) the whole
//!   suspension counts as awaiting, and the report says so.
//! - A coroutine still suspended at the end of the trace was awaiting until its last event.

use ocular_format::{asyncio_loop_function, Awaited, Body, EventKind, LoopFunction, ReadOptions, Reader};
use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;
use std::collections::VecDeque;
use std::fmt;
use std::path::Path;

/// Figures of one coroutine function.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Function {
    /// Qualified name.
    pub function: String,
    /// Source file.
    pub file: String,
    /// First line.
    pub line: u32,
    /// Instances started.
    pub calls: u64,
    /// Turns: starts and resumptions.
    pub steps: u64,
    /// Time running, inclusive of what it called and awaited while running, ns.
    pub running_ns: f64,
    /// Time suspended while what it awaited was not done, ns.
    pub awaiting_ns: f64,
    /// Time suspended while ready to go on, waiting for the event loop, ns.
    pub ready_ns: f64,
    /// Instances that were tasks' coroutines (resumed by the event loop).
    pub tasks: u64,
    /// What it awaited, with the suspended time (awaiting + ready) behind each, most first: another
    /// coroutine's name, or `Future`, `Task`, `yield` (a bare yield), `other`.
    pub awaited: Vec<(String, f64)>,
}

/// Time the tasks spent suspended at the end of one await chain.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Chain {
    /// The chain: the task's coroutine first, the innermost last, then what that one yielded.
    pub chain: Vec<String>,
    /// Suspensions that ended (or the trace ended) at this chain.
    pub count: u64,
    /// Awaiting time, ns.
    pub awaiting_ns: f64,
    /// Ready time, ns.
    pub ready_ns: f64,
}

/// One task: a coroutine resumed by the event loop, and the coroutines it awaited.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Task {
    /// Process id.
    pub pid: u32,
    /// Thread the task ran on (its first turn's).
    pub thread_id: u64,
    /// The task's coroutine and its ordinal among that function's tasks, from 1: `handler#3`.
    pub name: String,
    /// Became ready for its first turn (its callback appended to the ready queue) or, when that is not
    /// known, started: ns from the recording's start.
    pub created_ns: f64,
    /// Its coroutine's start, ns from the recording's start.
    pub started_ns: f64,
    /// Its coroutine's end, ns from the recording's start; `None` when still alive at the end.
    pub ended_ns: Option<f64>,
    /// Turns.
    pub steps: u64,
    /// Running, ns.
    pub running_ns: f64,
    /// Awaiting, ns.
    pub awaiting_ns: f64,
    /// Ready (including waiting for its first turn), ns.
    pub ready_ns: f64,
}

/// What a task was doing over one span of time, for timelines (Perfetto tracks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Its coroutines ran.
    Running,
    /// Suspended, what it awaited not done.
    Awaiting,
    /// Ready, waiting for the loop.
    Ready,
}

/// A span of a task's time.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// Index into [`Awaits::tasks`].
    pub task: u32,
    /// State over the span.
    pub state: State,
    /// Start and end, ticks of the file's clock.
    pub start: u64,
    /// End.
    pub end: u64,
    /// For awaiting and ready spans, index into [`Awaits::chains`] of the chain it ended at.
    pub chain: Option<u32>,
}

/// The async view of one process.
#[derive(Debug, Default)]
pub struct Awaits {
    /// Process id.
    pub pid: u32,
    /// Coroutine functions, in order of first start.
    pub functions: Vec<Function>,
    /// Await chains, in order of first use.
    pub chains: Vec<Chain>,
    /// Tasks, in order of their first turn.
    pub tasks: Vec<Task>,
    /// Spans of the tasks' time, per task in time order (at most [`MAX_SPANS`] in all).
    pub spans: Vec<Span>,
    /// Spans left out past [`MAX_SPANS`].
    pub spans_dropped: u64,
    /// Coroutine events with a frame id were seen (a 2.8 recording of a program that ran coroutines).
    pub has_frames: bool,
    /// asyncio's ready queue was seen, so ready time is measured.
    pub ready_known: bool,
    /// The recording's start, ticks (task times are from it).
    pub origin: u64,
    /// Ticks per nanosecond.
    pub ticks_per_ns: f64,
    /// The file's format version.
    pub version: (u16, u16),
    /// The reader's warnings.
    pub warnings: Vec<String>,
    /// Caveats of the analysis.
    pub notes: Vec<String>,
}

/// Spans kept for timelines, in all.
pub const MAX_SPANS: usize = 2_000_000;

#[derive(Default)]
struct Inst {
    code: u32,
    /// Index into `tasks`.
    task: u32,
    root: bool,
    running_since: Option<u64>,
    suspended_since: Option<u64>,
    /// What it awaited when it last yielded: a coroutine's code id, or an `Awaited` (as `u32::MAX - bits`).
    target: u32,
    /// For a task's coroutine: the chain its last yield ended at.
    chain: Option<u32>,
    /// The coroutine that awaited it at its last start or resumption.
    parent: Option<u64>,
    /// When it started.
    started: u64,
}

#[derive(Default)]
struct Thread {
    /// Frame ids of the coroutines running on this thread, outermost first.
    running: Vec<u64>,
    /// The chain being built by a turn's yields: codes innermost first, what the innermost yielded, and
    /// the frame id of the last one to yield.
    pending: Option<(Vec<u32>, Awaited, u64)>,
    /// Code other than the awaiter's ran since `pending`'s yield (events of functions that are not
    /// coroutines: recorded in `calls` mode and inside windows).
    pending_interrupted: bool,
    /// Callbacks appended to the ready queue since the loop last took it: when.
    queue: VecDeque<u64>,
    /// What the loop took at the start of its turn, in order.
    batch: VecDeque<u64>,
    /// A turn began: the loop takes the queue before its first callback.
    snapshot: bool,
    /// Inside `Handle._run`: when its callback became ready, if known.
    handle: Option<Option<u64>>,
    /// When the running `Handle._run` started.
    handle_start: u64,
    /// `Handle._run` frames open (`_ThreadSafeHandle._run` calls `Handle._run`: one callback, two frames).
    handle_depth: u32,
    /// A running `call_soon_threadsafe` that has not appended through `_call_soon` (yet): its start.
    threadsafe: Option<u64>,
}

/// The ready queue's events in one thread's loop-function events, in the shape of CPython 3.13.0's
/// asyncio, whatever version recorded: an append is a `_call_soon` start (a `call_soon_threadsafe` that
/// ran none appended itself, at its start: 3.14+), and a callback is one `Handle._run` frame (the outer
/// one of `_ThreadSafeHandle._run` and the `Handle._run` it calls). `None`: nothing for the queue.
fn queue_event(th: &mut Thread, f: LoopFunction, kind: EventKind, t: u64) -> Option<(u64, LoopFunction, bool)> {
    let start = kind == EventKind::PY_START;
    let end = matches!(kind, EventKind::PY_RETURN | EventKind::PY_UNWIND);
    match f {
        LoopFunction::CallSoonThreadsafe if start => {
            th.threadsafe = Some(t);
            None
        }
        // One that raised (the loop was closed) appended nothing.
        LoopFunction::CallSoonThreadsafe => {
            let returned = kind == EventKind::PY_RETURN;
            th.threadsafe.take().filter(|_| returned).map(|t0| (t0, LoopFunction::CallSoon, true))
        }
        LoopFunction::CallSoon if start => {
            th.threadsafe = None;
            Some((t, f, true))
        }
        LoopFunction::HandleRun if start => {
            th.handle_depth += 1;
            (th.handle_depth == 1).then_some((t, f, true))
        }
        LoopFunction::HandleRun if end => {
            th.handle_depth = th.handle_depth.saturating_sub(1);
            (th.handle_depth == 0).then_some((t, f, false))
        }
        _ => Some((t, f, start)),
    }
}

/// Reads `path` and builds its async view.
///
/// The ready queue is followed per thread as the events go by. When a thread that runs no event loop
/// appends to it (`call_soon_threadsafe`: an executor's result, `asyncio.to_thread`), that append sits in
/// the loop's queue among the loop's own, but is in another thread's events, which the file does not
/// interleave in time order: the queue is then simulated again over every thread's loop events sorted by
/// time, and the events read a second time with the ready time of each callback it gives.
pub fn analyze(path: &Path, opts: ReadOptions) -> ocular_format::Result<Awaits> {
    let (out, log) = analyze_with(path, opts, None)?;
    let loops: Vec<u64> = {
        let mut v: Vec<u64> = log.iter().filter(|x| x.2 == LoopFunction::RunOnce).map(|x| x.1).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let foreign = log.iter().any(|x| x.2 == LoopFunction::CallSoon && !loops.contains(&x.1));
    if !foreign {
        return Ok(out);
    }
    if loops.len() != 1 {
        let mut out = out;
        out.notes.push(
            "callbacks were scheduled from other threads while several threads ran event loops: their ready \
             time may be given to the wrong callbacks"
                .into(),
        );
        return Ok(out);
    }
    let ready = global_ready_queue(log, loops[0]);
    let (mut out, _) = analyze_with(path, opts, Some(&ready))?;
    out.notes.push(
        "callbacks scheduled from other threads (call_soon_threadsafe) were placed in the loop's ready queue by time"
            .into(),
    );
    Ok(out)
}

/// One event of asyncio's loop functions: ticks, thread, which, whether its start.
type LoopLog = Vec<(u64, u64, LoopFunction, bool)>;

/// The ready queue of the one loop thread `lt`, fed by every thread's appends in time order: when each
/// callback it ran (keyed by the loop thread and the tick its `Handle._run` started) became ready.
fn global_ready_queue(mut log: LoopLog, lt: u64) -> HashMap<(u64, u64), Option<u64>> {
    log.sort_by_key(|x| x.0);
    // Entries: when the callback became ready, and whether another thread appended it.
    let mut queue: VecDeque<(u64, bool)> = VecDeque::new();
    let mut batch: VecDeque<(u64, bool)> = VecDeque::new();
    let mut snapshot = false;
    let mut out = HashMap::default();
    // The loop thread's running callback, if another thread appended it: when that was, and its start.
    let mut relay: Option<(u64, u64)> = None;
    for (t, tid, f, start) in log {
        if !start {
            if f == LoopFunction::HandleRun && tid == lt {
                relay = None;
            }
            continue;
        }
        match f {
            // What a callback from another thread schedules became ready when that thread appended it, less
            // the loop's delay in running it: such a callback relays a result (an executor's, carried to its
            // Future by `call_soon_threadsafe` of `_set_state`), and the loop's delay in running the relay
            // is the loop's, not the awaited work's. A callback the loop thread appended did its work when
            // it ran: what it schedules became ready then.
            LoopFunction::CallSoon if tid == lt => {
                queue.push_back((relay.map_or(t, |(r, s)| t.saturating_sub(s.saturating_sub(r))), false));
            }
            LoopFunction::CallSoon => queue.push_back((t, true)),
            LoopFunction::RunOnce if tid == lt => snapshot = true,
            // The loop takes its queue after its select, just before the turn's first callback: appends
            // from other threads during the select are in it.
            LoopFunction::HandleRun if tid == lt => {
                if snapshot {
                    batch = std::mem::take(&mut queue);
                    snapshot = false;
                }
                let r = batch.pop_front();
                out.insert((tid, t), r.map(|x| x.0));
                relay = r.filter(|x| x.1).map(|x| (x.0, t));
            }
            _ => {}
        }
    }
    out
}

fn analyze_with(
    path: &Path,
    opts: ReadOptions,
    ready: Option<&HashMap<(u64, u64), Option<u64>>>,
) -> ocular_format::Result<(Awaits, LoopLog)> {
    let mut log: LoopLog = Vec::new();
    let mut r = Reader::open_with(path, opts)?;
    let header = r.header().clone();
    let mut out = Awaits {
        pid: header.pid,
        ticks_per_ns: header.ticks_per_second / 1e9,
        version: r.version(),
        ..Awaits::default()
    };
    let mut fn_index: HashMap<u32, usize> = HashMap::default();
    let mut loop_fns: HashMap<u32, LoopFunction> = HashMap::default();
    let mut code_meta: HashMap<u32, (String, String, u32)> = HashMap::default();
    let mut insts: HashMap<u64, Inst> = HashMap::default();
    let mut threads: HashMap<u64, Thread> = HashMap::default();
    let mut tasks_of = Tasks { pid: header.pid, ..Tasks::default() };
    let mut last = 0u64;
    let mut b = Builder { out: &mut out };
    while let Some(c) = r.next_chunk()? {
        match c.body {
            Body::Code(objs) => {
                for o in objs {
                    if let Some(f) = asyncio_loop_function(&o.filename, &o.qualname) {
                        loop_fns.insert(o.id, f);
                    }
                    tasks_of.names.insert(o.id, o.qualname.clone());
                    code_meta.insert(o.id, (o.qualname, o.filename, o.first_line));
                }
            }
            Body::Events(evs) => {
                let tid = c.info.thread_id;
                let th = threads.entry(tid).or_default();
                for e in evs {
                    let t = e.ticks.get();
                    last = last.max(t);
                    let Some(kind) = e.event_kind() else { continue };
                    if kind.is_recorder_note() {
                        continue;
                    }
                    let code = e.code.get();
                    let Some(fid) = e.frame_id() else {
                        // Other code ran between a coroutine's yield and its awaiter's: not an await.
                        if let Some(p) = &th.pending {
                            let awaiter = insts.get(&p.2).and_then(|c| c.parent).and_then(|a| insts.get(&a));
                            if !awaiter.is_some_and(|a| a.code == code) {
                                th.pending_interrupted = true;
                            }
                        }
                        if let Some(&f) = loop_fns.get(&code) {
                            b.out.ready_known = true;
                            let Some((t, f, start)) = queue_event(th, f, kind, t) else { continue };
                            log.push((t, tid, f, start));
                            match ready {
                                Some(map) if f == LoopFunction::HandleRun && start => {
                                    th.handle = Some(map.get(&(tid, t)).copied().flatten());
                                    th.handle_start = t;
                                }
                                Some(_) if f == LoopFunction::CallSoon => {}
                                _ => loop_event(th, f, start, t),
                            }
                        }
                        continue;
                    };
                    b.out.has_frames = true;
                    let fi = *fn_index.entry(code).or_insert_with(|| {
                        let (function, file, line) = code_meta.get(&code).cloned().unwrap_or_default();
                        b.out.functions.push(Function { function, file, line, ..Function::default() });
                        b.out.functions.len() - 1
                    });
                    match kind {
                        EventKind::PY_START | EventKind::PY_RESUME | EventKind::PY_THROW => {
                            let parent = th.running.last().copied();
                            let fresh = kind == EventKind::PY_START || !insts.contains_key(&fid);
                            if kind == EventKind::PY_START {
                                b.out.functions[fi].calls += 1;
                                // A frame id given again after its frame ended, or whose end was lost.
                                insts.remove(&fid);
                            }
                            b.out.functions[fi].steps += 1;
                            let ready_at = th.handle.flatten();
                            let parent_task = parent.and_then(|p| insts.get(&p)).map_or(u32::MAX, |p| p.task);
                            // A coroutine that yielded on top of this thread's running one, which did not
                            // yield after it but went on: an eager task's first step (see `promote`).
                            if let Some(p) = th.pending.take() {
                                promote(&mut b, &mut insts, &mut tasks_of, &fn_index, p, tid);
                            }
                            let inst = insts.entry(fid).or_insert_with(|| Inst { code, started: t, ..Inst::default() });
                            inst.parent = parent;
                            if fresh {
                                inst.root = parent.is_none();
                                if parent.is_some() {
                                    inst.task = parent_task;
                                } else {
                                    b.out.functions[fi].tasks += 1;
                                    let created = ready_at.filter(|&r| r <= t).unwrap_or(t);
                                    inst.task = tasks_of.task(&mut b, code, tid, created, t);
                                    b.span(inst.task, State::Ready, created, t, None);
                                }
                            }
                            if let Some(y) = inst.suspended_since.take() {
                                let ready = ready_at.filter(|&r| r < t).map_or(0, |r| t.saturating_sub(r.max(y)));
                                let awaiting = t.saturating_sub(y) - ready;
                                let f = &mut b.out.functions[fi];
                                f.awaiting_ns += awaiting as f64;
                                f.ready_ns += ready as f64;
                                add_target(f, inst.target, t.saturating_sub(y) as f64);
                                if inst.root {
                                    let task = &mut b.out.tasks[inst.task as usize];
                                    task.awaiting_ns += awaiting as f64;
                                    task.ready_ns += ready as f64;
                                    if let Some(ch) = inst.chain {
                                        let c = &mut b.out.chains[ch as usize];
                                        c.count += 1;
                                        c.awaiting_ns += awaiting as f64;
                                        c.ready_ns += ready as f64;
                                    }
                                    b.span(inst.task, State::Awaiting, y, t - ready, inst.chain);
                                    b.span(inst.task, State::Ready, t - ready, t, inst.chain);
                                }
                            }
                            if inst.root {
                                if let Some(task) = b.out.tasks.get_mut(inst.task as usize) {
                                    task.steps += 1;
                                }
                            }
                            inst.running_since = Some(t);
                            th.running.push(fid);
                        }
                        EventKind::PY_YIELD | EventKind::PY_RETURN | EventKind::PY_UNWIND => {
                            // Frames above this one that did not say they left (events lost) leave with it.
                            let Some(pos) = th.running.iter().rposition(|&f| f == fid) else { continue };
                            th.running.truncate(pos);
                            let Some(inst) = insts.get_mut(&fid) else { continue };
                            let since = inst.running_since.take().unwrap_or(t);
                            let ran = t.saturating_sub(since) as f64;
                            b.out.functions[fi].running_ns += ran;
                            if inst.root {
                                let task = inst.task;
                                if let Some(tk) = b.out.tasks.get_mut(task as usize) {
                                    tk.running_ns += ran;
                                }
                                b.span(task, State::Running, since, t, None);
                            }
                            if kind == EventKind::PY_YIELD {
                                // The chain: this frame's code after the one it awaited, if that one yielded
                                // just before (it was running above this one).
                                // One that yielded something else, or did not run on top of this one, was
                                // not awaited by it: an eager task's first step.
                                let what_now = e.awaited();
                                let (child, eager) = match th.pending.take() {
                                    Some(p)
                                        if insts.get(&p.2).is_some_and(|c| c.parent == Some(fid))
                                            && (p.1 == what_now || Awaited::Unknown == what_now)
                                            && !th.pending_interrupted =>
                                    {
                                        (Some(p), None)
                                    }
                                    other => (None, other),
                                };
                                if let Some(p) = eager {
                                    promote(&mut b, &mut insts, &mut tasks_of, &fn_index, p, tid);
                                }
                                let (mut codes, what, target) = match child {
                                    Some((codes, what, child)) => (codes, what, insts_code(&insts, child)),
                                    None => (Vec::new(), e.awaited(), u32::MAX - e.awaited() as u32),
                                };
                                codes.push(code);
                                let inst = insts.get_mut(&fid).expect("looked up above");
                                inst.target = target;
                                inst.suspended_since = Some(t);
                                if inst.root {
                                    inst.chain = Some(tasks_of.chain(&mut b, &codes, what));
                                } else {
                                    th.pending = Some((codes, what, fid));
                                    th.pending_interrupted = false;
                                }
                            } else {
                                if let Some(p) = th.pending.take().filter(|p| p.2 != fid) {
                                    promote(&mut b, &mut insts, &mut tasks_of, &fn_index, p, tid);
                                }
                                let inst = insts.remove(&fid).expect("looked up above");
                                if inst.root {
                                    if let Some(tk) = b.out.tasks.get_mut(inst.task as usize) {
                                        tk.ended_ns = Some(t as f64);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    // Still suspended at the end: awaiting until the trace's last event.
    for inst in insts.values() {
        let Some(y) = inst.suspended_since else { continue };
        let Some(&fi) = fn_index.get(&inst.code) else { continue };
        let d = last.saturating_sub(y);
        let f = &mut b.out.functions[fi];
        f.awaiting_ns += d as f64;
        add_target(f, inst.target, d as f64);
        if inst.root {
            if let Some(tk) = b.out.tasks.get_mut(inst.task as usize) {
                tk.awaiting_ns += d as f64;
            }
            if let Some(ch) = inst.chain {
                let c = &mut b.out.chains[ch as usize];
                c.count += 1;
                c.awaiting_ns += d as f64;
            }
            b.span(inst.task, State::Awaiting, y, last, inst.chain);
        }
    }
    // Names of awaited coroutines, now that every code object is known.
    let tpn = out.ticks_per_ns.max(f64::MIN_POSITIVE);
    let origin = header.start_ticks;
    out.origin = origin;
    for f in &mut out.functions {
        f.running_ns /= tpn;
        f.awaiting_ns /= tpn;
        f.ready_ns /= tpn;
        for (name, v) in &mut f.awaited {
            *v /= tpn;
            if let Some(code) = name.strip_prefix('#').and_then(|c| c.parse::<u32>().ok()) {
                *name = tasks_of.names.get(&code).cloned().unwrap_or_else(|| "?".into());
            }
        }
        f.awaited.sort_by(|a, b| b.1.total_cmp(&a.1));
    }
    for c in &mut out.chains {
        c.awaiting_ns /= tpn;
        c.ready_ns /= tpn;
    }
    for t in &mut out.tasks {
        t.created_ns = (t.created_ns - origin as f64) / tpn;
        t.started_ns = (t.started_ns - origin as f64) / tpn;
        t.ended_ns = t.ended_ns.map(|e| (e - origin as f64) / tpn);
        t.running_ns /= tpn;
        t.awaiting_ns /= tpn;
        t.ready_ns /= tpn;
    }
    out.warnings = r.report().warnings(&path.display().to_string());
    Ok((out, log))
}

/// Names the tasks and await chains as the pass finds them.
#[derive(Default)]
struct Tasks {
    pid: u32,
    /// Code id -> qualified name.
    names: HashMap<u32, String>,
    chain_index: HashMap<(Vec<u32>, Awaited), u32>,
    /// Tasks so far per coroutine code, for their ordinals.
    counts: HashMap<u32, u64>,
}

impl Tasks {
    /// A new task whose coroutine is `code`, became ready at `created` and first ran at `started`: its index.
    fn task(&mut self, b: &mut Builder, code: u32, tid: u64, created: u64, started: u64) -> u32 {
        let n = self.counts.entry(code).or_default();
        *n += 1;
        b.out.tasks.push(Task {
            pid: self.pid,
            thread_id: tid,
            name: format!("{}#{n}", self.names.get(&code).map_or("?", String::as_str)),
            created_ns: created as f64,
            started_ns: started as f64,
            ready_ns: started.saturating_sub(created) as f64,
            ..Task::default()
        });
        (b.out.tasks.len() - 1) as u32
    }

    /// The chain of `codes` (innermost first) ending in `what`: its index.
    fn chain(&mut self, b: &mut Builder, codes: &[u32], what: Awaited) -> u32 {
        let key = (codes.iter().rev().copied().collect::<Vec<_>>(), what);
        let names = &self.names;
        *self.chain_index.entry(key).or_insert_with_key(|key| {
            let mut chain: Vec<String> =
                key.0.iter().map(|c| names.get(c).cloned().unwrap_or_else(|| "?".into())).collect();
            chain.push(what.name().into());
            b.out.chains.push(Chain { chain, ..Chain::default() });
            (b.out.chains.len() - 1) as u32
        })
    }
}

/// An eagerly started task (`create_task(..., eager_start=True)`, `asyncio.eager_task_factory`: aiohttp
/// starts its handlers so): its coroutine's first step runs inside `create_task`, on top of the coroutine
/// that made it, and its first yield goes back to `create_task`, not to that coroutine, which goes on
/// running instead of yielding the same thing. `pending` (the chain the yield began) was found to be such
/// a step: its coroutine becomes a task of its own from its start, and its figures go to that task, not to
/// the one it started in. Only a yield of what asyncio's loop waits on (a Future, a Task, a bare yield)
/// counts: an async generator's yield of a value to its `async for` also goes on in the consumer.
fn promote(
    b: &mut Builder,
    insts: &mut HashMap<u64, Inst>,
    tasks_of: &mut Tasks,
    fn_index: &HashMap<u32, usize>,
    pending: (Vec<u32>, Awaited, u64),
    tid: u64,
) {
    let (codes, what, fid) = pending;
    if !matches!(what, Awaited::Future | Awaited::Task | Awaited::Nothing) {
        return;
    }
    let Some(inst) = insts.get_mut(&fid) else { return };
    if inst.root {
        return;
    }
    let (started, yielded) = (inst.started, inst.suspended_since.unwrap_or(inst.started));
    let task = tasks_of.task(b, inst.code, tid, started, started);
    if let Some(&fi) = fn_index.get(&inst.code) {
        b.out.functions[fi].tasks += 1;
    }
    inst.root = true;
    inst.parent = None;
    inst.task = task;
    inst.chain = Some(tasks_of.chain(b, &codes, what));
    let tk = &mut b.out.tasks[task as usize];
    tk.steps = 1;
    tk.running_ns = yielded.saturating_sub(started) as f64;
    b.span(task, State::Running, started, yielded, None);
}

fn insts_code(insts: &HashMap<u64, Inst>, fid: u64) -> u32 {
    insts.get(&fid).map_or(u32::MAX, |i| i.code)
}

/// Adds suspended time to what the function awaited (`target` as [`Inst::target`]).
fn add_target(f: &mut Function, target: u32, ticks: f64) {
    let name = if target >= u32::MAX - 8 {
        Awaited::from_bits((u32::MAX - target) as u8).name().to_string()
    } else {
        format!("#{target}")
    };
    match f.awaited.iter_mut().find(|(n, _)| *n == name) {
        Some((_, v)) => *v += ticks,
        None => f.awaited.push((name, ticks)),
    }
}

/// An event of one of asyncio's loop functions: the ready queue, as the loop keeps it.
fn loop_event(th: &mut Thread, f: LoopFunction, start: bool, t: u64) {
    match f {
        LoopFunction::RunOnce if start => th.snapshot = true,
        LoopFunction::CallSoon if start => th.queue.push_back(t),
        LoopFunction::HandleRun if start => {
            if std::mem::take(&mut th.snapshot) {
                th.batch = std::mem::take(&mut th.queue);
            }
            th.handle = Some(th.batch.pop_front());
            th.handle_start = t;
        }
        LoopFunction::HandleRun => th.handle = None,
        _ => {}
    }
}

struct Builder<'a> {
    out: &'a mut Awaits,
}

impl Builder<'_> {
    fn span(&mut self, task: u32, state: State, start: u64, end: u64, chain: Option<u32>) {
        if end <= start || task == u32::MAX {
            return;
        }
        if self.out.spans.len() >= MAX_SPANS {
            self.out.spans_dropped += 1;
            return;
        }
        self.out.spans.push(Span { task, state, start, end, chain });
    }
}

impl Awaits {
    /// The name of a span for timelines: "running", "awaiting waiter > sleep > Future" (the chain below the
    /// task's coroutine), "ready".
    pub fn span_name(&self, s: &Span) -> String {
        match s.state {
            State::Running => "running".into(),
            State::Ready => "ready (waiting for the loop)".into(),
            State::Awaiting => match s.chain.and_then(|c| self.chains.get(c as usize)) {
                Some(c) if c.chain.len() > 1 => format!("awaiting {}", c.chain[1..].join(" > ")),
                _ => "awaiting".into(),
            },
        }
    }
}

/// Whether a chunk's events hold a coroutine frame (FORMAT.md 5.5): exporters run the async pass only then.
pub fn has_frames(events: &[ocular_format::RawEvent]) -> bool {
    events.iter().any(|e| e.flags & ocular_format::event::flags::FRAME != 0)
}

/// `stats --async`: the async view of one process, or of a run's processes merged.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Coroutine functions, by wall time (running + awaiting + ready) in their instances, most first.
    pub functions: Vec<Function>,
    /// Await chains, by suspended time, most first.
    pub chains: Vec<Chain>,
    /// Tasks, by wall time from created to ended (or the trace's end), most first.
    pub tasks: Vec<Task>,
    /// Rows left out by `top`: functions, chains, tasks.
    pub more: [usize; 3],
    /// Tasks in all.
    pub tasks_total: usize,
    /// Whether the ready time was measured (asyncio's ready queue seen in every process with tasks).
    pub ready_measured: bool,
    /// Caveats.
    pub notes: Vec<String>,
}

impl Report {
    /// Whether any coroutine ran with its frame recorded.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }
}

fn wall(f: &Function) -> f64 {
    f.running_ns + f.awaiting_ns + f.ready_ns
}

fn task_wall(t: &Task) -> f64 {
    t.running_ns + t.awaiting_ns + t.ready_ns
}

/// The report of `parts` (one per process; merged by function and by chain when several), `top` rows of
/// each table.
pub fn report(parts: &[Awaits], top: usize) -> Report {
    let mut functions: Vec<Function> = Vec::new();
    let mut fi: HashMap<(String, String, u32), usize> = HashMap::default();
    let mut chains: Vec<Chain> = Vec::new();
    let mut ci: HashMap<Vec<String>, usize> = HashMap::default();
    let mut tasks = Vec::new();
    for p in parts {
        for f in &p.functions {
            let key = (f.file.clone(), f.function.clone(), f.line);
            match fi.get(&key) {
                Some(&i) => {
                    let g = &mut functions[i];
                    g.calls += f.calls;
                    g.steps += f.steps;
                    g.tasks += f.tasks;
                    g.running_ns += f.running_ns;
                    g.awaiting_ns += f.awaiting_ns;
                    g.ready_ns += f.ready_ns;
                    for (n, v) in &f.awaited {
                        match g.awaited.iter_mut().find(|(m, _)| m == n) {
                            Some((_, w)) => *w += v,
                            None => g.awaited.push((n.clone(), *v)),
                        }
                    }
                }
                None => {
                    fi.insert(key, functions.len());
                    functions.push(f.clone());
                }
            }
        }
        for c in &p.chains {
            match ci.get(&c.chain) {
                Some(&i) => {
                    let d = &mut chains[i];
                    d.count += c.count;
                    d.awaiting_ns += c.awaiting_ns;
                    d.ready_ns += c.ready_ns;
                }
                None => {
                    ci.insert(c.chain.clone(), chains.len());
                    chains.push(c.clone());
                }
            }
        }
        tasks.extend(p.tasks.iter().cloned());
    }
    for f in &mut functions {
        f.awaited.sort_by(|a, b| b.1.total_cmp(&a.1));
    }
    functions.sort_by(|a, b| wall(b).total_cmp(&wall(a)));
    chains.sort_by(|a, b| (b.awaiting_ns + b.ready_ns).total_cmp(&(a.awaiting_ns + a.ready_ns)));
    tasks.sort_by(|a, b| task_wall(b).total_cmp(&task_wall(a)));
    let tasks_total = tasks.len();
    let more = [functions.len().saturating_sub(top), chains.len().saturating_sub(top), tasks.len().saturating_sub(top)];
    functions.truncate(top);
    chains.truncate(top);
    tasks.truncate(top);
    let with_tasks: Vec<&Awaits> = parts.iter().filter(|p| !p.tasks.is_empty()).collect();
    let ready_measured = !with_tasks.is_empty() && with_tasks.iter().all(|p| p.ready_known);
    let mut notes = Vec::new();
    if !with_tasks.is_empty() && !ready_measured {
        notes.push(
            "asyncio's ready queue (BaseEventLoop._call_soon, Handle._run) was not recorded: another event loop \
             (uvloop?) or a filter left it out, so a coroutine's whole suspension counts as awaiting"
                .into(),
        );
    }
    for p in parts {
        for n in &p.notes {
            if !notes.contains(n) {
                notes.push(n.clone());
            }
        }
    }
    if parts.iter().any(|p| p.spans_dropped > 0) {
        notes.push(format!("timelines keep the first {MAX_SPANS} spans of the tasks' time"));
    }
    Report { functions, chains, tasks, more, tasks_total, ready_measured, notes }
}

/// `s` in at most `n` characters: its end kept (a qualified name's last part says the most).
fn clip(s: &str, n: usize) -> String {
    let len = s.chars().count();
    if len <= n {
        s.to_string()
    } else {
        format!("…{}", s.chars().skip(len - n + 1).collect::<String>())
    }
}

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Coroutines, awaits included: running (inclusive), awaiting (what it awaited was not done), ready \
             (done, waiting for the event loop{})",
            if self.ready_measured { "" } else { "; not measured here" }
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<28} {:>7} {:>7} {:>11} {:>12} {:>10}  awaited (suspended ms)",
            "coroutine", "calls", "steps", "running ms", "awaiting ms", "ready ms"
        )?;
        for r in &self.functions {
            let awaited: Vec<String> = r.awaited.iter().take(3).map(|(n, v)| format!("{n} {:.1}", ms(*v))).collect();
            writeln!(
                f,
                "{:<28} {:>7} {:>7} {:>11.1} {:>12.1} {:>10.1}  {}",
                clip(&r.function, 28),
                r.calls,
                r.steps,
                ms(r.running_ns),
                ms(r.awaiting_ns),
                ms(r.ready_ns),
                awaited.join(", ")
            )?;
        }
        if self.more[0] > 0 {
            writeln!(f, "({} more)", self.more[0])?;
        }
        if !self.chains.is_empty() {
            writeln!(f)?;
            writeln!(f, "Where tasks waited (await chains, the task's coroutine first):")?;
            writeln!(f, "{:>12} {:>10} {:>7}  chain", "awaiting ms", "ready ms", "times")?;
            for c in &self.chains {
                writeln!(
                    f,
                    "{:>12.1} {:>10.1} {:>7}  {}",
                    ms(c.awaiting_ns),
                    ms(c.ready_ns),
                    c.count,
                    c.chain.join(" > ")
                )?;
            }
            if self.more[1] > 0 {
                writeln!(f, "({} more)", self.more[1])?;
            }
        }
        if !self.tasks.is_empty() {
            writeln!(f)?;
            writeln!(f, "Tasks ({} in all), longest first:", self.tasks_total)?;
            writeln!(
                f,
                "{:<24} {:>11} {:>11} {:>6} {:>11} {:>12} {:>10}",
                "task", "created ms", "ended ms", "steps", "running ms", "awaiting ms", "ready ms"
            )?;
            for t in &self.tasks {
                writeln!(
                    f,
                    "{:<24} {:>11.1} {:>11} {:>6} {:>11.1} {:>12.1} {:>10.1}",
                    clip(&t.name, 24),
                    ms(t.created_ns),
                    t.ended_ns.map_or("-".to_string(), |e| format!("{:.1}", ms(e))),
                    t.steps,
                    ms(t.running_ns),
                    ms(t.awaiting_ns),
                    ms(t.ready_ns)
                )?;
            }
            if self.more[2] > 0 {
                writeln!(f, "({} more)", self.more[2])?;
            }
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EventKind::{PY_RETURN, PY_START};
    use LoopFunction::{CallSoon, CallSoonThreadsafe, HandleRun};

    fn feed(evs: &[(u64, LoopFunction, EventKind)]) -> Vec<(u64, LoopFunction, bool)> {
        let mut th = Thread::default();
        evs.iter().filter_map(|&(t, f, k)| queue_event(&mut th, f, k, t)).collect()
    }

    #[test]
    fn call_soon_threadsafe_appends_once_in_either_shape() {
        // 3.13.0: call_soon_threadsafe -> _call_soon, which is the append.
        let old = feed(&[
            (10, CallSoonThreadsafe, PY_START),
            (12, CallSoon, PY_START),
            (13, CallSoon, PY_RETURN),
            (15, CallSoonThreadsafe, PY_RETURN),
        ]);
        assert_eq!(old, vec![(12, CallSoon, true), (13, CallSoon, false)]);
        // 3.14: it appends by itself; the append is dated at its start.
        let new = feed(&[(10, CallSoonThreadsafe, PY_START), (15, CallSoonThreadsafe, PY_RETURN)]);
        assert_eq!(new, vec![(10, CallSoon, true)]);
        // One that raised (a closed loop) appended nothing.
        let failed = feed(&[(10, CallSoonThreadsafe, PY_START), (11, CallSoonThreadsafe, EventKind::PY_UNWIND)]);
        assert_eq!(failed, vec![]);
    }

    #[test]
    fn a_thread_safe_handle_is_one_callback() {
        // 3.14: _ThreadSafeHandle._run calls Handle._run: one pop from the queue, one end.
        let evs = feed(&[
            (1, HandleRun, PY_START),
            (2, HandleRun, PY_START),
            (3, HandleRun, PY_RETURN),
            (4, HandleRun, PY_RETURN),
            (5, HandleRun, PY_START),
            (6, HandleRun, PY_RETURN),
        ]);
        assert_eq!(evs, vec![(1, HandleRun, true), (4, HandleRun, false), (5, HandleRun, true), (6, HandleRun, false)]);
    }
}
