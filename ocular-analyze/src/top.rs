//! `top`: a live view of a running recording (RING.md 6): the hottest functions and loops of the last
//! seconds, per thread or merged, from a cursor that follows the recording's ring file.

use crate::walk::{Frames, Step, Walk};
use ocular_format::live::{Cursor, End};
use ocular_format::{EventKind, Header, RawEvent};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How often the cursor is polled: often enough that a recording made with `--live` loses nothing at
/// tens of millions of events per second (16 spare slots of 65,536 events).
const POLL: Duration = Duration::from_millis(2);
/// Aggregation bucket.
const BUCKET: Duration = Duration::from_millis(250);

/// Per function (and thread): calls and exclusive ticks.
#[derive(Clone, Copy, Debug, Default)]
struct Func {
    calls: u64,
    excl: u64,
}

#[derive(Debug, Default)]
struct Bucket {
    at: Option<Instant>,
    funcs: HashMap<(u64, u32), Func>,
    /// (code, loop head offset) -> backward jumps (iterations).
    loops: HashMap<(u32, u32), u64>,
    events: u64,
    missed: u64,
    /// Ticks of function-boundary recording in this bucket (the windows of --sampled).
    covered: u64,
    /// The recorder's cost of the events recorded in windows, ticks: time of `covered` the program did not
    /// run, as `stats` takes it out of each window.
    window_cost: f64,
    /// Code objects called in windows, by id: how many windows called each, in each thread. A window
    /// re-arms every code object (`sys.monitoring.restart_events`) and each is instrumented again at its
    /// first call in it, on the window's time: costed at the snapshot, where code objects' sizes are known.
    reinstrumented: HashMap<u32, u64>,
    /// The earliest and latest tick of the events read into this bucket (u64::MAX, 0: none): the span of
    /// the program they cover, which a reader that falls behind reads in more wall time than it took.
    first_tick: u64,
    last_tick: u64,
    /// The tick when it began: its exclusive time is the program's from then to the next one's.
    from_tick: u64,
    /// Time read into this bucket that ran before it began: (thread, code, from, to), given to the buckets
    /// it ran in once the poll is done ([`Top::poll`]).
    spill: Vec<(u64, u32, u64, u64)>,
}

impl Bucket {
    /// The program's time from `from` to `to` was read into this bucket.
    fn covers(&mut self, from: u64, to: u64) {
        self.first_tick = if self.first_tick == 0 { from } else { self.first_tick.min(from) };
        self.last_tick = self.last_tick.max(to);
    }
}

#[derive(Debug)]
struct ThreadState {
    stack: Vec<u32>,
    last: Option<u64>,
    /// Windows, their stacks and the recorder's pauses.
    walk: Walk,
}

impl ThreadState {
    fn new(tps: f64, last: Option<u64>) -> Self {
        ThreadState { stack: Vec::new(), last, walk: Walk::new(tps) }
    }
}

/// Events of each thread's past that `top` reads at its opening, at most (1.5 MiB): the calls a thread is
/// in began after its last event that returned to below them, so its innermost frames, where its time
/// goes, are among its last events; frames that began before these are not known, as before.
const HISTORY_EVENTS: u64 = 1 << 16;

/// A thread's stack as the walk moves it.
struct Moves<'a>(&'a mut Vec<u32>);

impl Frames for Moves<'_> {
    fn depth(&self) -> usize {
        self.0.len()
    }

    fn code(&self, i: usize) -> u32 {
        self.0[i]
    }

    fn lose_above(&mut self, depth: usize, _t: u64) {
        self.0.truncate(depth);
    }
}

/// The aggregation behind the view.
#[derive(Debug)]
pub struct Top {
    cursor: Cursor,
    header: Option<Header>,
    tps: f64,
    threads: HashMap<u64, ThreadState>,
    buckets: VecDeque<Bucket>,
    /// --sampled records calls in windows only: until when the current one records them.
    window_end: u64,
    windowed: bool,
    /// The current window's due moment and length, ticks, and until when its calls count (FORMAT.md 5.7).
    due: Due,
    ended: Option<End>,
    started: Instant,
    /// The recorder's cost per event kind, ticks (measured at the recording's start, FORMAT.md 6.6).
    cost: Costs,
    /// The tick when the cursor opened: a thread's first event read ends an interval that began then.
    opened_tick: u64,
    /// The tick just before the last poll read: where the function a thread was last seen running in had run
    /// to, as far as what was read says.
    polled_tick: u64,
}

/// The recorder's cost per event kind, in ticks: the header's until the calibration is read, then the
/// calibration's (FORMAT.md 6.6), as `stats` takes them out.
#[derive(Debug)]
struct Costs {
    kinds: [f64; 256],
    calibrated: bool,
}

/// When the current window fell due, its length, and until when its calls count, ticks: from its opening
/// for its length, or, where its `DUE` marker says calls count from the due moment, to the due moment plus
/// its length (as `stats` counts them). A window that opened late, after the program had been off the CPU
/// or in a long C call, then counts calls for the part of its length left: counting them for its whole
/// length gave a program sharing its CPU with two others 1.5x its own call rate.
#[derive(Debug, Default)]
struct Due {
    at: u64,
    len: u64,
    calls_until: u64,
}

/// One row of the function table.
#[derive(Debug, Serialize, Clone)]
pub struct FuncRow {
    /// Thread (0: merged).
    pub thread_id: u64,
    /// Qualified name.
    pub function: String,
    /// File.
    pub file: String,
    /// First line.
    pub line: u32,
    /// Calls per second.
    pub calls_per_s: f64,
    /// Where windows sampled the calls (`--sampled`), the lowest rate they allow: as if recording had cost
    /// the windows nothing, so that all of their length was the program's; `calls_per_s` where every call
    /// was read.
    pub calls_per_s_low: f64,
    /// The highest: as if recording had cost the windows as much as `stats` allows for
    /// ([`crate::analysis::cost_far_end`], three times the cost measured at the start);
    /// `null` where that much would have taken 90% of them or more (call-dense code: the windows then
    /// bound the rate from below only).
    pub calls_per_s_high: Option<f64>,
    /// Share of the recorded threads' time spent in it (not in its callees).
    pub exclusive_share: f64,
}

/// One row of the loop table.
#[derive(Debug, Serialize, Clone)]
pub struct LoopRow {
    /// The function.
    pub function: String,
    /// File.
    pub file: String,
    /// Line of the loop's head.
    pub line: i32,
    /// Iterations per second (backward jumps recorded).
    pub iterations_per_s: f64,
    /// With a threshold (the default), a loop's backward jump is recorded for its first 2 x threshold
    /// iterations only, then it runs unrecorded: the rate is a lower bound, and a loop past them reads 0.
    pub iterations_lower_bound: bool,
}

/// What `top --json` prints, and what the view shows.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    /// The recording process.
    pub pid: u32,
    /// Its Python and mode, if its ring file says.
    pub python_version: String,
    /// Recording mode.
    pub mode: String,
    /// Seconds the figures cover.
    pub seconds: f64,
    /// The recording's threshold, if its ring file says (a loop's backward jump is recorded for its first
    /// 2 x threshold iterations; 0: every one).
    pub loop_threshold: Option<u32>,
    /// Events read per second.
    pub events_per_s: f64,
    /// Events the cursor could not read in time (the recording reused their memory), in that span.
    pub missed: u64,
    /// Whether call figures are estimates (--sampled records calls in windows; events were missed).
    pub estimated: bool,
    /// `null`, `"stopped"` or `"killed"`.
    pub ended: Option<&'static str>,
    /// Threads seen, by id, with names.
    pub threads: Vec<(u64, String)>,
    /// Hottest functions.
    pub functions: Vec<FuncRow>,
    /// Hottest loops.
    pub loops: Vec<LoopRow>,
}

impl Top {
    /// Follows the recording of `target`: a pid, or a ring file's path.
    pub fn open(target: &str) -> anyhow::Result<Top> {
        let cursor = match target.parse::<u32>() {
            Ok(pid) => Cursor::open_pid(pid)?,
            Err(_) => Cursor::open(std::path::Path::new(target))?,
        };
        let header = ocular_format::ring::RingFile::open(cursor.path())
            .ok()
            .and_then(|r| r.header_record().and_then(|b| postcard::take_from_bytes::<Header>(b).ok()).map(|(h, _)| h));
        let (tps, _) = cursor.clock();
        let cost = ocular_format::cost_table(header.as_ref().map_or(0.0, |h| h.event_cost_ticks), None);
        let opened_tick = ocular_format::now_ticks();
        let mut top = Top {
            opened_tick,
            polled_tick: opened_tick,
            cost: Costs { kinds: cost, calibrated: false },
            cursor,
            header,
            tps: if tps > 0.0 { tps } else { 1e9 },
            threads: HashMap::new(),
            buckets: VecDeque::new(),
            window_end: 0,
            windowed: false,
            due: Due::default(),
            ended: None,
            started: Instant::now(),
        };
        top.calibrate();
        top.follow_history();
        Ok(top)
    }

    /// Each thread's stack at the opening, from the events the ring held then (their time is before the
    /// span, and goes nowhere): a thread in a call that began before `top` opened, a sleep or a long C call,
    /// has that call's time from the opening, though it records nothing until it returns. The windows'
    /// state is taken from them too. A thread that has exited since keeps no stack.
    fn follow_history(&mut self) {
        let mut scratch = Bucket::default();
        let (threads, cost, tps) = (&mut self.threads, &self.cost, self.tps);
        let (window_end, due, windowed) = (&mut self.window_end, &mut self.due, &mut self.windowed);
        self.cursor.history(HISTORY_EVENTS, |tid, e| {
            let ts = threads.entry(tid).or_insert_with(|| ThreadState::new(tps, None));
            step(ts, tid, e, &mut scratch, (tps, cost), (window_end, due), windowed);
        });
        let tasks = std::path::PathBuf::from(format!("/proc/{}/task", self.cursor.pid()));
        let here = tasks.is_dir();
        for (&tid, ts) in &mut self.threads {
            ts.last = Some(self.opened_tick);
            if here && !tasks.join(tid.to_string()).exists() {
                ts.stack.clear();
            }
        }
    }

    /// Takes the costs the recording measured at its start, once the cursor has read them.
    fn calibrate(&mut self) {
        if let (false, Some(c)) = (self.cost.calibrated, &self.cursor.calibration) {
            let default = self.header.as_ref().map_or(0.0, |h| h.event_cost_ticks);
            self.cost = Costs { kinds: ocular_format::cost_table(default, Some(c)), calibrated: true };
        }
    }

    /// Reads what the recording wrote since the last call.
    pub fn poll(&mut self) {
        self.calibrate();
        let now = Instant::now();
        let fresh = match self.buckets.back().and_then(|b| b.at) {
            None => true,
            Some(at) => now.duration_since(at) >= BUCKET,
        };
        self.polled_tick = ocular_format::now_ticks();
        if fresh {
            self.buckets.push_back(Bucket { at: Some(now), from_tick: self.polled_tick, ..Bucket::default() });
        }
        while self.buckets.len() > 240 {
            self.buckets.pop_front();
        }
        let bucket = self.buckets.back_mut().expect("pushed above");
        let threads = &mut self.threads;
        let (window_end, windowed, cost, due) = (&mut self.window_end, &mut self.windowed, &self.cost, &mut self.due);
        let (tps, opened_tick) = (self.tps, self.opened_tick);
        let gaps = std::cell::RefCell::new(Vec::new());
        let p = self.cursor.poll_gaps(
            |tid, e| {
                // The thread ran from when the cursor opened to its first event read, in the function that
                // event shows running (unless it starts a call: its caller is not known).
                let ts = threads.entry(tid).or_insert_with(|| ThreadState::new(tps, Some(opened_tick)));
                if gaps.borrow().contains(&tid) {
                    // Events were missed just before: the time across the gap and the stack are unknown.
                    gaps.borrow_mut().retain(|&t| t != tid);
                    ts.last = None;
                    ts.stack.clear();
                }
                let t = e.ticks.get();
                if t > 0 {
                    bucket.covers(t, t);
                }
                step(ts, tid, e, bucket, (tps, cost), (window_end, due), windowed)
            },
            |tid, _| gaps.borrow_mut().push(tid),
        );
        bucket.events += p.events;
        bucket.missed += p.missed;
        let spill = std::mem::take(&mut bucket.spill);
        for (tid, code, from, mut to) in spill {
            for b in self.buckets.iter_mut().rev().skip(1) {
                let start = from.max(b.from_tick);
                if start < to {
                    b.funcs.entry((tid, code)).or_default().excl += to - start;
                    b.covers(start, to);
                    to = start;
                }
                if to <= from {
                    break;
                }
            }
        }
        if self.ended.is_none() {
            self.ended = p.ended;
        }
    }

    /// Whether the recording has ended.
    pub fn ended(&self) -> Option<End> {
        self.ended
    }

    /// The figures of the last `seconds`, `top` rows each, merged or per thread.
    pub fn snapshot(&self, seconds: f64, per_thread: bool, top: usize) -> Snapshot {
        let now = Instant::now();
        let span = Duration::from_secs_f64(seconds);
        let recent: Vec<&Bucket> =
            self.buckets.iter().filter(|b| b.at.is_some_and(|at| now.duration_since(at) <= span + BUCKET)).collect();
        let secs = recent
            .first()
            .and_then(|b| b.at)
            .map_or(0.0, |at| now.duration_since(at).as_secs_f64().min(now.duration_since(self.started).as_secs_f64()))
            .max(1e-3);
        // Every call recorded: rates over the span of the program the events read cover, so that a reader that
        // fell behind (reading 1.5 s of the program in 2 s) does not read them low. The wall span stands for a
        // program whose events cover little of it (idle, or calling little: its rate is over the whole
        // span), unless the reader was not keeping up with it: it missed events, or the recording ended while
        // the reader still had its events to read (beside six busy processes on two cores, a debug build of
        // the reader took 14 s to read 4 s of a program, and read its rate at 0.2x over the wall span). With
        // windows the wall span stands, as the windows' scale is taken against it.
        let mut first = recent.iter().map(|b| b.first_tick).filter(|&t| t > 0).min();
        let mut last = recent.iter().map(|b| b.last_tick).max().unwrap_or(0);
        // A thread in a function now, since its last event read (a long call, a sleep, a loop past its
        // recorded iterations): that function's, up to the last poll, and the program's span read runs to
        // the poll. Without, a call that takes the whole span read no time at all until it returned. With
        // windows the time since is the gap's.
        let mut open = Vec::new();
        if !self.windowed && self.ended.is_none() {
            let from = recent.first().map_or(0, |b| b.from_tick);
            for (&tid, ts) in &self.threads {
                if let (Some(since), Some(&r)) = (ts.last, ts.stack.last()) {
                    let since = since.max(from);
                    if since < self.polled_tick {
                        open.push(((if per_thread { tid } else { 0 }, r), self.polled_tick - since));
                        first = Some(first.map_or(since, |f| f.min(since)));
                        last = last.max(self.polled_tick);
                    }
                }
            }
        }
        let behind = self.ended.is_some() || recent.iter().any(|b| b.missed > 0);
        let secs = match first {
            Some(f) if !self.windowed && last > f => {
                let program = (last - f) as f64 / self.tps;
                if program > 0.25 * secs || behind {
                    program.min(secs)
                } else {
                    secs
                }
            }
            _ => secs,
        };
        let mut funcs: HashMap<(u64, u32), Func> = HashMap::new();
        let mut loops: HashMap<(u32, u32), u64> = HashMap::new();
        let (mut events, mut missed, mut covered, mut window_cost) = (0u64, 0u64, 0u64, 0.0);
        let mut reinstrumented: HashMap<u32, u64> = HashMap::new();
        for b in &recent {
            for (&(tid, code), f) in &b.funcs {
                let e = funcs.entry((if per_thread { tid } else { 0 }, code)).or_default();
                e.calls += f.calls;
                e.excl += f.excl;
            }
            for (&k, &n) in &b.loops {
                *loops.entry(k).or_default() += n;
            }
            events += b.events;
            missed += b.missed;
            covered += b.covered;
            window_cost += b.window_cost;
            for (&code, &n) in &b.reinstrumented {
                *reinstrumented.entry(code).or_default() += n;
            }
        }
        // Instrumenting each code object again at its first call in each window (FORMAT.md 6.6), as `stats`
        // takes it out: on real packages' work, without it, a window's calls were scaled up as if the
        // program had run all of it, and rates read 0.35-0.5 of the program's own.
        if let Some((per_code, per_byte)) = self.cursor.calibration.as_ref().map(|c| c.instrument()) {
            for (code, n) in reinstrumented {
                let len = self.cursor.code.get(&code).map_or(0, |c| c.bytecode.len());
                window_cost += n as f64 * (per_code + per_byte * len as f64);
            }
        }
        // With --sampled, calls are recorded in windows covering a share of the time; scale them up, by
        // the part of the windows the program ran (their length less the recorder's cost of their events,
        // as stats weighs them: without, call-dense code's rate read low by what recording it cost).
        let windows = self.windowed && covered > 0;
        let scale_over = |cost: f64| {
            let ran = covered as f64 - cost.clamp(0.0, 0.9 * covered as f64);
            if windows {
                (secs * self.tps / ran).max(1.0)
            } else {
                1.0
            }
        };
        // How sure the scale is. The cost per event is measured once, at the start, on a small loop, and a
        // window of real code can cost more (as `stats` allows for: `cost_far_end`); on this project's
        // 2-CPU virtual machines a window of one-line calls on CPython 3.14 also loses 10-40% of its length
        // to stalls of the whole virtual CPU that nothing in it records, and read 0.2-0.6 of the program's
        // own rate. Nothing the windows hold tells such time from the program's, so the rate is given
        // between what it is if recording cost nothing and what it is at the far end of its cost.
        let (mut scale, mut scale_low) = (scale_over(window_cost), scale_over(0.0));
        let far = crate::analysis::cost_far_end(1.0) * window_cost;
        let mut scale_high = (!windows || far < 0.9 * covered as f64).then(|| scale_over(far));
        // Events the cursor missed are of the same functions, in the same mix as far as it can tell.
        if missed > 0 && events > 0 {
            let m = (events + missed) as f64 / events as f64;
            scale *= m;
            scale_low *= m;
            scale_high = scale_high.map(|h| h * m);
        }
        for (key, d) in open {
            funcs.entry(key).or_default().excl += d;
        }
        let total_excl: u64 = funcs.values().map(|f| f.excl).sum();
        let code = &self.cursor.code;
        let name = |id: u32| {
            code.get(&id).map_or_else(
                || (format!("<code {id}>"), String::new(), 0),
                |c| (c.qualname.clone(), c.filename.clone(), c.first_line),
            )
        };
        let mut frows: Vec<FuncRow> = funcs
            .iter()
            .map(|(&(tid, id), f)| {
                let (function, file, line) = name(id);
                FuncRow {
                    thread_id: tid,
                    function,
                    file,
                    line,
                    calls_per_s: f.calls as f64 * scale / secs,
                    calls_per_s_low: f.calls as f64 * scale_low / secs,
                    calls_per_s_high: scale_high.map(|h| f.calls as f64 * h / secs),
                    exclusive_share: if total_excl > 0 { f.excl as f64 / total_excl as f64 } else { 0.0 },
                }
            })
            .collect();
        frows.sort_by(|a, b| {
            b.exclusive_share.total_cmp(&a.exclusive_share).then(b.calls_per_s.total_cmp(&a.calls_per_s))
        });
        frows.truncate(top);
        // A loop's backward jump is recorded for its first 2 x threshold iterations only (the recorder
        // switches it off then): with a threshold, what was read is a lower bound. So it is when the cursor
        // missed events, which may hold iterations (a reader starved of CPU read 0.47 of a loop's rate, and
        // did not say it was a bound).
        let bounded = missed > 0 || self.header.as_ref().map_or(true, |h| h.options.deinstrument_threshold > 0);
        let mut lrows: Vec<LoopRow> = loops
            .iter()
            .map(|(&(id, head), &n)| {
                let (function, file, first) = name(id);
                let line =
                    code.get(&id).and_then(|c| c.positions.get(head as usize / 2)).map_or(first as i32, |p| p.line);
                LoopRow { function, file, line, iterations_per_s: n as f64 / secs, iterations_lower_bound: bounded }
            })
            .collect();
        lrows.sort_by(|a, b| b.iterations_per_s.total_cmp(&a.iterations_per_s));
        lrows.truncate(top.min(10));
        let mut threads: Vec<(u64, String)> =
            self.threads.keys().map(|&t| (t, self.cursor.threads.get(&t).cloned().unwrap_or_default())).collect();
        threads.sort();
        Snapshot {
            pid: self.cursor.pid(),
            python_version: self.header.as_ref().map_or_else(String::new, |h| h.python_version.clone()),
            mode: self.header.as_ref().map_or_else(String::new, |h| h.options.mode.name().to_string()),
            seconds: secs,
            loop_threshold: self.header.as_ref().map(|h| h.options.deinstrument_threshold),
            events_per_s: events as f64 / secs,
            missed,
            estimated: self.windowed || missed > 0,
            ended: self.ended.map(|e| match e {
                End::Stopped => "stopped",
                End::Gone => "killed",
            }),
            threads,
            functions: frows,
            loops: lrows,
        }
    }
}

/// One event of one thread: the time since its previous event goes to the function running (the top of
/// its stack, or, for a return seen before the function's start, that function), then the stack moves.
fn step(
    ts: &mut ThreadState,
    tid: u64,
    e: &RawEvent,
    b: &mut Bucket,
    (tps, cost): (f64, &Costs),
    (window_end, due): (&mut u64, &mut Due),
    windowed: &mut bool,
) {
    let step = ts.walk.step(&mut Moves(&mut ts.stack), e);
    if step == Step::Pause {
        return;
    }
    let paused = ts.walk.paused();
    let t = e.ticks.get();
    let code = e.code.get();
    match step {
        Step::Note(EventKind::DUE) => {
            use ocular_format::event::due::{CALLS_FROM_DUE, MISSED};
            let flags = e.offset.get();
            if flags & CALLS_FROM_DUE != 0 && flags & MISSED == 0 && due.len > 0 {
                due.calls_until = due.at + due.len;
            }
            // The opening's own time (non-zero for the thread that opened the window only): the recorder's,
            // inside the window, as `stats` takes it out (FORMAT.md 5.7).
            if *windowed {
                b.window_cost += f64::from(code);
            }
            return;
        }
        // Due stacks and counted calls (FORMAT.md 5.7, 5.8) place no time here.
        Step::Note(_) => return,
        Step::Opened { len_us: len, .. } => {
            *windowed = true;
            ts.last = None;
            let end = if len == u32::MAX { u64::MAX } else { t + (len as f64 * tps / 1e6) as u64 };
            // A missed window's marker comes before the opened one's, at the same tick: the last one holds.
            *due = if len == u32::MAX {
                Due { calls_until: u64::MAX, ..Due::default() }
            } else {
                let lead = (f64::from(code) * tps / 1e6) as u64;
                Due { at: t.saturating_sub(lead), len: end - t, calls_until: end }
            };
            if end > *window_end {
                // Counted once per window, whichever thread's marker comes first.
                if len != u32::MAX && *window_end < t {
                    b.covered += end - t;
                }
                *window_end = end;
            }
            return;
        }
        Step::Closed => {
            *windowed = true;
            *window_end = t;
            ts.last = None;
            return;
        }
        Step::Found { same, .. } => {
            if !same {
                ts.stack.push(code);
            }
            ts.last = Some(t);
            return;
        }
        Step::Unplaced => {
            ts.last = Some(t);
            return;
        }
        _ => {}
    }
    // Outside a window (--sampled), function boundaries are not recorded: time is not attributed.
    let in_window = !*windowed || t < *window_end;
    if *windowed && in_window {
        b.window_cost += ts.walk.cost(e, &cost.kinds);
    }
    let back_jump = matches!(step, Step::Location { kind: EventKind::JUMP, .. }) && e.arg.get() < e.offset.get();
    if *windowed && !in_window {
        ts.last = None;
        if back_jump {
            *b.loops.entry((code, e.arg.get())).or_default() += 1;
        }
        return;
    }
    if let Some(last) = ts.last {
        let running = match (ts.stack.last(), step) {
            (Some(&top), _) => Some(top),
            (None, Step::ExitUnknown(_) | Step::Location { enter: true, .. }) => Some(code),
            _ => None,
        };
        if let Some(r) = running {
            // The part that ran before this bucket began is the earlier buckets' (a long call that returns
            // now ran mostly before, and a span holds only its own part). A recorder pause (FORMAT.md 5.6)
            // is not the program's time: taken from this bucket's part first.
            let start = last.max(b.from_tick).min(t);
            let (own, before) = (t - start, start.saturating_sub(last));
            let here = own.saturating_sub(paused);
            let before = before.saturating_sub(paused - (own - here));
            b.funcs.entry((tid, r)).or_default().excl += here;
            if here > 0 && start > 0 {
                // The program's span read starts where the time it holds does.
                b.covers(start, t);
            }
            if before > 0 {
                b.spill.push((tid, r, last, last + before));
            }
        }
    }
    ts.last = Some(t);
    match step {
        Step::Enter(kind) => {
            if kind == EventKind::PY_START && (!*windowed || t < due.calls_until) {
                b.funcs.entry((tid, code)).or_default().calls += 1;
            }
            if *windowed && ts.walk.instruments_again(e) {
                *b.reinstrumented.entry(code).or_default() += 1;
            }
            ts.stack.push(code);
        }
        Step::Exit(_) => {
            ts.stack.pop();
        }
        Step::Location { enter, .. } => {
            if enter {
                ts.stack.push(code); // called unrecorded
            }
            if back_jump {
                *b.loops.entry((code, e.arg.get())).or_default() += 1;
            }
        }
        _ => {}
    }
}

impl std::fmt::Display for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match (self.python_version.is_empty(), self.mode.is_empty()) {
            (false, false) => format!(" (Python {}, {} mode)", self.python_version, self.mode),
            _ => String::new(),
        };
        writeln!(
            f,
            "ocular top: pid {}{what}, last {:.1} s: {:.0} events/s, {} missed{}",
            self.pid,
            self.seconds,
            self.events_per_s,
            self.missed,
            match self.ended {
                Some("stopped") => ", recording stopped",
                Some(_) => ", recording process killed",
                None => "",
            }
        )?;
        let names: Vec<String> = self
            .threads
            .iter()
            .map(|(id, n)| if n.is_empty() { id.to_string() } else { format!("{n} ({id})") })
            .collect();
        writeln!(f, "threads: {}", if names.is_empty() { "none yet".into() } else { names.join(", ") })?;
        let est = if self.estimated { "~" } else { "" };
        // The range where windows sampled the calls: what they allow, from no recording cost to its far end.
        let ranged = self.functions.iter().any(|r| r.calls_per_s_high != Some(r.calls_per_s_low));
        let range = |r: &FuncRow| match r.calls_per_s_high {
            _ if !ranged => String::new(),
            Some(h) => format!("  {:>15}", format!("{}-{}", rate(r.calls_per_s_low), rate(h))),
            None => format!("  {:>15}", format!(">= {}", rate(r.calls_per_s_low))),
        };
        let head = if ranged { format!("  {:>15}", "range") } else { String::new() };
        writeln!(f, "{:>14}{head}  {:>7}  function  file:line", "calls/s", "excl %")?;
        for r in &self.functions {
            let thread = if r.thread_id != 0 { format!(" [{}]", r.thread_id) } else { String::new() };
            writeln!(
                f,
                "{:>14}{}  {:>6.1}%  {}{thread}  {}:{}",
                format!("{est}{:.0}", r.calls_per_s),
                range(r),
                r.exclusive_share * 100.0,
                r.function,
                r.file,
                r.line
            )?;
        }
        if !self.loops.is_empty() {
            writeln!(f, "{:>14}  loop", "iterations/s")?;
            for l in &self.loops {
                let bound = if l.iterations_lower_bound { ">=" } else { "" };
                writeln!(
                    f,
                    "{:>14}  {}  {}:{}",
                    format!("{bound}{:.0}", l.iterations_per_s),
                    l.function,
                    l.file,
                    l.line
                )?;
            }
        }
        if self.mode == "adaptive" && self.loop_threshold != Some(0) {
            // Said whether or not a loop is listed: a hot loop past its recorded iterations is not.
            let limit =
                self.loop_threshold.map_or_else(|| "2 x the threshold".into(), |n| format!("{}", 2 * u64::from(n)));
            writeln!(
                f,
                "loops: each loop's iterations are recorded for its first {limit} only, then it runs unrecorded: \
                 rates are lower bounds (>=), and a loop past them is not listed; record with --threshold 0 to \
                 follow loops live"
            )?;
        }
        if self.events_per_s == 0.0 && self.ended.is_none() {
            writeln!(
                f,
                "no events in this span: the program made no call and ran no recorded loop iteration (a long \
                 call, a loop past its recorded iterations, or waiting), in no function top saw it enter"
            )?;
        }
        if self.estimated {
            writeln!(
                f,
                "~ estimated: calls/s scaled up from {}",
                if self.missed > 0 {
                    "the events read (the reader missed some: record with --live, or it is too slow for this rate)"
                } else {
                    "the windows of --sampled, where calls are recorded, less what recording cost them (each \
                     event, and instrumenting each function again at its first call in each window); the \
                     range is what they allow, from recording costing them nothing to three times its cost \
                     measured at the start (>=: where that would take most of them, as in call-dense code and \
                     most real code; record without --sampled for exact counts)"
                }
            )?;
        }
        Ok(())
    }
}

/// A rate for the range column: in thousands or millions with three decimals, or whole.
fn rate(x: f64) -> String {
    match x {
        x if x >= 1e6 => format!("{:.3}M", x / 1e6),
        x if x >= 1e3 => format!("{:.3}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

/// `top --once` / `--json`: follow for `seconds`, then one snapshot.
pub fn once(target: &str, seconds: f64, per_thread: bool, top: usize) -> anyhow::Result<Snapshot> {
    let mut t = Top::open(target)?;
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    while Instant::now() < end && t.ended().is_none() {
        t.poll();
        std::thread::sleep(POLL);
    }
    t.poll();
    // Everything since the cursor opened, however long the polls took.
    Ok(t.snapshot(start.elapsed().as_secs_f64().max(seconds), per_thread, top))
}

/// The interactive view: redrawn every `interval` seconds over the last `seconds`, until `q`, Esc or
/// Ctrl-C, or a few seconds after the recording ended.
pub fn interactive(target: &str, interval: f64, seconds: f64, per_thread: bool, top: usize) -> anyhow::Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyModifiers};
    use ratatui::widgets::{Block, Paragraph};
    let mut t = Top::open(target)?;
    let mut terminal = ratatui::try_init()?;
    let _restore = Restore;
    let mut per_thread = per_thread;
    terminal.draw(|f| {
        let p = Paragraph::new(format!("following process {} ...", t.cursor.pid()))
            .block(Block::bordered().title(" ocular top "));
        f.render_widget(p, f.area());
    })?;
    let mut next_draw = Instant::now() + Duration::from_secs_f64(interval.min(seconds));
    let mut ended_at: Option<Instant> = None;
    loop {
        t.poll();
        if Instant::now() >= next_draw {
            let snap = t.snapshot(seconds, per_thread, top);
            let mut text = snap.to_string();
            text.push_str(if ended_at.is_some() || snap.ended.is_some() {
                "\nthe recording ended: q to quit"
            } else {
                "\nq quit   t per thread / merged"
            });
            terminal.draw(|f| {
                let p = Paragraph::new(text).block(Block::bordered().title(" ocular top "));
                f.render_widget(p, f.area());
            })?;
            next_draw = Instant::now() + Duration::from_secs_f64(interval);
        }
        if t.ended().is_some() && ended_at.is_none() {
            ended_at = Some(Instant::now());
            next_draw = Instant::now();
        }
        if ended_at.is_some_and(|at| at.elapsed() > Duration::from_secs(5)) {
            break;
        }
        if event::poll(POLL)? {
            if let Event::Key(k) = event::read()? {
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => break,
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => break,
                    KeyCode::Char('t') => {
                        per_thread = !per_thread;
                        next_draw = Instant::now();
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// Gives the terminal back (raw mode off, main screen) however the view ends.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ocular_format::chunk::kind;
    use ocular_format::ring::{Layout, RingWriter};
    use ocular_format::{Calibration, CodeObject};

    /// A ring file of one thread's sampled window: its stack (code 1), then calls of codes 2..=41, code 2
    /// and code 1 once more; `calibrated`: with a calibration of 100 ticks a start or return, and 500 a
    /// code object plus 5 a byte to instrument one again. `top`'s rate and its low end (recording costing
    /// the windows nothing), read once the events are in.
    fn window_rates(calibrated: bool) -> (f64, f64) {
        let layout =
            Layout { slot_events: 1024, max_slots: 4, meta_capacity: 1 << 16, chunks_capacity: 0, slot_ext: true };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("top.ring");
        let w = RingWriter::create(&path, std::process::id(), 1, 1e9, layout).unwrap();
        if calibrated {
            let c = Calibration {
                costs: vec![
                    (EventKind::PY_START as u8, 100.0),
                    (EventKind::PY_RETURN as u8, 100.0),
                    (Calibration::INSTRUMENT_CODE, 500.0),
                    (Calibration::INSTRUMENT_BYTE, 5.0),
                ],
            };
            assert!(w.append_meta(kind::CALIBRATION, &postcard::to_allocvec(&c).unwrap()));
        }
        for id in 1..=41 {
            let co = CodeObject {
                id,
                name: format!("f{id}"),
                qualname: format!("f{id}"),
                filename: "/src/m.py".into(),
                first_line: id,
                flags: 3,
                bytecode: vec![0; 100],
                linetable: Vec::new(),
                positions: Vec::new(),
            };
            let (mut one, mut framed) = (Vec::new(), Vec::new());
            ocular_format::frame_code(&co, &mut one, &mut framed).unwrap();
            assert!(w.append_meta(kind::CODE, &framed));
        }
        let mut top = Top::open(path.to_str().unwrap()).unwrap();
        // A window of 100 us (100,000 ticks) at tick 1,000,000.
        let t0 = 1_000_000u64;
        let ev = |t: u64, code: u32, arg: u32, k: EventKind| RawEvent::new(t, code, 0, arg, k as u8);
        let mut evs = vec![ev(t0, 0, 100, EventKind::WINDOW), ev(t0, 1, 0, EventKind::STACK)];
        let mut t = t0;
        for id in (2..=41).chain([2, 1]) {
            t += 1_000;
            evs.push(ev(t, id, 0, EventKind::PY_START));
            t += 1_000;
            evs.push(ev(t, id, 0, EventKind::PY_RETURN));
        }
        assert!(t < t0 + 100_000);
        let p = w.prepare_slot(0).unwrap();
        for (i, e) in evs.iter().enumerate() {
            // SAFETY: within the slot's 1,024 events.
            unsafe { p.add(i).write(*e) };
        }
        w.filling(0, 7, t0, 0);
        w.full(0, evs.len() as u32);
        top.poll();
        std::thread::sleep(Duration::from_millis(20)); // the wall span, far longer than the window
        let snap = top.snapshot(1.0, false, 100);
        let f2 = snap.functions.iter().find(|f| f.function == "f2").expect("f2 read");
        (f2.calls_per_s, f2.calls_per_s_low)
    }

    #[test]
    fn a_sampled_rate_takes_out_each_events_cost_and_instrumenting_each_function_again_in_each_window() {
        // 84 starts and returns at 100 ticks, and 40 code objects called (1 was on the stack at the opening,
        // so instrumented by it; 2 is called twice) at 500 + 5 x 100 ticks each: 48,400 of the window's
        // 100,000 ticks were the recorder's, and the rate is the low end's over the 51,600 left.
        let (rate, low) = window_rates(true);
        let want = 100_000.0 / (100_000.0 - 84.0 * 100.0 - 40.0 * 1_000.0);
        assert!((rate / low - want).abs() < 1e-9, "{} against {want}", rate / low);
        // Without a calibration the header's cost (none here) is all that is taken out.
        let (rate, low) = window_rates(false);
        assert_eq!(rate, low);
    }
}
