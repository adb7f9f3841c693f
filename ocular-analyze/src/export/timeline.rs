//! The timeline that exporters serialize: one streaming pass that turns a thread's events into balanced
//! function slices and loop iterations. Exporters only decide how each item is written.
//!
//! Rules (shared by every exporter):
//! - `Begin` at PY_START, PY_RESUME, PY_THROW; `End` at PY_RETURN, PY_YIELD, PY_UNWIND. An exit without
//!   its entry (the recording started inside the function) is dropped; an exit of a frame below the top
//!   ends the frames above it first. Frames still open at the end of the file end at their thread's last
//!   event, so every thread's slices balance.
//! - Every activation gets a call id, counted from 0 in the order activations begin (file order).
//! - `Loop` at every backward JUMP in the frame on top: `cycles` are the ticks since the previous
//!   iteration of that loop in the same frame (none for the first), `uops` the instructions in the body.
//! - A recording with windows (FORMAT.md 5.3) has slices inside windows only: a window's stack begins
//!   frames at its opening, and every frame still open when the window closes ends there. Such slices are
//!   `clipped` (a window edge, not the call's own start or end), and every call carries its window.

use crate::spans::Holds;
use crate::walk::{Frames, Step, Walk};
use ocular_format::{Body, CodeObject, EventKind, Header, RawEvent, ReadOptions, Reader};
use rustc_hash::FxHashMap as HashMap;
use std::path::Path;

/// One thing on the timeline. Times are in ticks of the file's clock.
#[derive(Debug)]
pub enum Item<'a> {
    /// A thread's first events are about to follow; its name if already known.
    Thread {
        /// Native thread id.
        tid: u64,
        /// Name, if the file named the thread before its first events.
        name: Option<&'a str>,
    },
    /// A chunk's recorded events, in order, before the items they cause.
    Events {
        /// Native thread id.
        tid: u64,
        /// The raw records.
        events: &'a [RawEvent],
    },
    /// The recorder dropped `count` of a thread's events between `first` and `last` (a LOST record,
    /// FORMAT.md 6.3): it had no free buffer for them.
    Lost {
        /// Native thread id.
        tid: u64,
        /// Ticks of the first dropped event.
        first: u64,
        /// Ticks of the last.
        last: u64,
        /// How many.
        count: u64,
    },
    /// A performance counter's sample (FORMAT.md 6.9): the thread's running total of the counter's events.
    Counter {
        /// Native thread id.
        tid: u64,
        /// Ticks of the sample.
        ticks: u64,
        /// The counter's index in the file.
        counter: u8,
        /// The counter's name.
        name: &'a str,
        /// What one of its events is (`ns`, `faults`, ...).
        unit: &'a str,
        /// The thread's total of it so far.
        total: u64,
    },
    /// A function activation starts.
    Begin {
        /// Native thread id.
        tid: u64,
        /// Ticks.
        ticks: u64,
        /// Code id.
        code: u32,
        /// The activation's call id.
        call: u64,
    },
    /// The innermost open activation ends.
    End {
        /// Native thread id.
        tid: u64,
        /// Ticks.
        ticks: u64,
        /// Code id.
        code: u32,
        /// The activation that ends.
        call: Call,
    },
    /// A loop iteration ends (a backward jump ran).
    Loop {
        /// Native thread id.
        tid: u64,
        /// Ticks.
        ticks: u64,
        /// Code id.
        code: u32,
        /// Offset of the loop head.
        head: u32,
        /// Instructions in the loop body.
        uops: usize,
        /// Ticks since the previous iteration of this loop in this frame.
        cycles: Option<u64>,
    },
    /// Last item of a thread, after its open frames ended; its final name if known.
    ThreadDone {
        /// Native thread id.
        tid: u64,
        /// Name, if the file named the thread.
        name: Option<&'a str>,
    },
}

/// A function activation, as known when it ends.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// Call id: activations numbered from 0 in the order they begin.
    pub id: u64,
    /// The caller's call id; `None` for the outermost recorded activation of a thread.
    pub parent: Option<u64>,
    /// Ticks when it began.
    pub start: u64,
    /// Frames below it on its thread's recorded stack (0 for the outermost).
    pub depth: u32,
    /// The window it was recorded in (FORMAT.md 5.3); `None` in a recording without windows.
    pub window: Option<u32>,
    /// Its start or its end is a window's edge, not the call's own: it began before the window opened
    /// (found on the window's stack) or was still running when the window closed.
    pub clipped: bool,
    /// The key of the innermost span (FORMAT.md 5.9) it began inside; 0: none, or a timeline not given the
    /// spans ([`Timeline::with_spans`]).
    pub span: u64,
}

struct Frame {
    code: u32,
    /// The frame id of a coroutine's activation (FORMAT.md 5.5; 0 otherwise).
    frame: u64,
    call: Call,
    loops: Vec<(u32, u64)>,
}

struct Thread {
    stack: Vec<Frame>,
    last: u64,
    /// The current window's sequence number and, for a timed one, its end tick.
    window: Option<u32>,
    window_end: Option<u64>,
    /// Windows, their stacks and the recorder's pauses.
    walk: Walk,
    /// Spans open on the thread, in the order they began: (key, what they hold, end tick if they end).
    spans: Vec<(u64, Holds, Option<u64>)>,
}

/// A thread's frames as the walk moves them: the ones it ends, with the tick they end at, wait in
/// `ended` for their items.
struct Moves<'a> {
    stack: &'a mut Vec<Frame>,
    ended: &'a mut Vec<(Frame, u64)>,
}

impl Frames for Moves<'_> {
    fn depth(&self) -> usize {
        self.stack.len()
    }

    fn code(&self, i: usize) -> u32 {
        self.stack[i].code
    }

    fn lose_above(&mut self, depth: usize, t: u64) {
        while self.stack.len() > depth {
            let fr = self.stack.pop().expect("longer than depth");
            self.ended.push((fr, t));
        }
    }

    /// Every frame still open when its window closes ends there, at the window's edge.
    fn window_ended(&mut self, end: u64) {
        while let Some(mut fr) = self.stack.pop() {
            fr.call.clipped = true;
            self.ended.push((fr, end));
        }
    }
}

/// The key of the innermost span open on `th` at `ticks` that holds a call beginning there (of a coroutine
/// with frame id `frame`, or 0) on top of its stack; 0: none. Spans ended by then are dropped.
fn innermost_span(th: &mut Thread, frame: u64, ticks: u64) -> u64 {
    if th.spans.is_empty() {
        return 0;
    }
    th.spans.retain(|&(_, _, end)| end.map_or(true, |e| e > ticks));
    let stack = &th.stack;
    th.spans
        .iter()
        .rev()
        .find(|&&(_, root, _)| root.holds(std::iter::once(frame).chain(stack.iter().map(|fr| fr.frame))))
        .map_or(0, |&(key, ..)| key)
}

/// An opened trace, ready to be walked.
#[derive(Debug)]
pub struct Timeline {
    reader: Reader<ocular_format::Source>,
    path: String,
    size: u64,
    loops: bool,
    /// Per span key, the coroutine frame id it belongs to (0: its thread's) and its end tick.
    spans: Option<HashMap<u64, (u64, Option<u64>)>>,
}

impl Timeline {
    /// Opens `path`.
    pub fn open(path: &Path, opts: ReadOptions) -> ocular_format::Result<Self> {
        Ok(Timeline {
            reader: Reader::open_with(path, opts)?,
            path: path.display().to_string(),
            size: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            loops: true,
            spans: None,
        })
    }

    /// Each [`Call`] says the innermost of `spans` (this file's, [`crate::spans::list`]) it began inside.
    pub fn with_spans(mut self, spans: &[crate::spans::Span]) -> Self {
        self.spans = Some(spans.iter().map(|s| (s.key, (s.frame, s.end))).collect());
        self
    }

    /// No [`Item::Loop`]: for a consumer that ignores them (the tables), which then does not pay for
    /// tracking loop heads at every backward jump.
    pub fn without_loops(mut self) -> Self {
        self.loops = false;
        self
    }

    /// The file's format version (major, minor).
    pub fn version(&self) -> (u16, u16) {
        self.reader.version()
    }

    /// The file header.
    pub fn header(&self) -> &Header {
        self.reader.header()
    }

    /// Walks the file, calling `f` with the code objects known so far and each item. Returns the number
    /// of events read and the reader's warnings.
    pub fn run(
        self,
        mut f: impl FnMut(&HashMap<u32, CodeObject>, Item<'_>) -> std::io::Result<()>,
    ) -> anyhow::Result<(u64, Vec<String>)> {
        let header = self.reader.header().clone();
        // Decoded ahead on a thread of its own, beside the writing of the items.
        let mut reader = ocular_format::Prefetch::new(self.reader)?;
        let mut code: HashMap<u32, CodeObject> = HashMap::default();
        let mut uops: HashMap<(u32, u32), usize> = HashMap::default();
        let mut names: HashMap<u64, String> = HashMap::default();
        let mut threads: HashMap<u64, Thread> = HashMap::default();
        let mut read = 0u64;
        let mut calls = 0u64;
        let ticks_per_us = header.ticks_per_second / 1e6;
        let mut counter_totals: HashMap<(u64, u8), u64> = HashMap::default();
        let mut ended: Vec<(Frame, u64)> = Vec::new();
        let spans = self.spans;
        crate::progress::begin("exporting", self.size);
        while let Some(c) = reader.next_chunk()? {
            crate::progress::at(c.info.offset);
            match c.body {
                Body::Code(objs) => {
                    for o in objs {
                        code.insert(o.id, o);
                    }
                }
                Body::Thread(t) => {
                    names.insert(t.thread_id, t.name);
                }
                Body::Counters(cs) => {
                    let to_ticks = |ns: u64| {
                        let d = (ns as f64 - header.start_monotonic_ns as f64) * ticks_per_us / 1e3;
                        (header.start_ticks as f64 + d).max(0.0) as u64
                    };
                    let mut samples = cs.samples.clone();
                    samples.sort_by_key(|x| (x.monotonic_ns, x.thread_id, x.counter));
                    for x in samples {
                        let Some(info) = cs.counters.get(x.counter as usize) else { continue };
                        let total = counter_totals.entry((x.thread_id, x.counter)).or_default();
                        *total += x.period;
                        let item = Item::Counter {
                            tid: x.thread_id,
                            ticks: to_ticks(x.monotonic_ns),
                            counter: x.counter,
                            name: &info.name,
                            unit: &info.unit,
                            total: *total,
                        };
                        f(&code, item)?;
                    }
                }
                Body::Lost(l) => {
                    let (first, last) = (l.first_ticks.min(l.last_ticks), l.first_ticks.max(l.last_ticks));
                    f(&code, Item::Lost { tid: l.thread_id, first, last, count: l.count })?;
                }
                Body::Events(evs) => {
                    let tid = c.info.thread_id;
                    if !threads.contains_key(&tid) {
                        f(&code, Item::Thread { tid, name: names.get(&tid).map(String::as_str) })?;
                    }
                    let th = threads.entry(tid).or_insert_with(|| Thread {
                        stack: Vec::new(),
                        last: 0,
                        window: None,
                        window_end: None,
                        walk: Walk::new(header.ticks_per_second),
                        spans: Vec::new(),
                    });
                    read += evs.len() as u64;
                    f(&code, Item::Events { tid, events: evs })?;
                    for e in evs {
                        let (id, ticks) = (e.code.get(), e.ticks.get());
                        th.last = ticks;
                        let step = th.walk.step(&mut Moves { stack: &mut th.stack, ended: &mut ended }, e);
                        // Frames the walk ended: above an exit or a location of a frame below them, or all of
                        // them where the window closed.
                        for (fr, at) in ended.drain(..) {
                            f(&code, Item::End { tid, ticks: at, code: fr.code, call: fr.call })?;
                        }
                        if th.walk.gap() {
                            th.window_end = None;
                        }
                        match step {
                            Step::Opened { len_us, end } => {
                                // A window opened without its predecessor's close: the frames end here.
                                while let Some(mut fr) = th.stack.pop() {
                                    fr.call.clipped = true;
                                    f(&code, Item::End { tid, ticks, code: fr.code, call: fr.call })?;
                                }
                                th.window = Some(e.offset.get());
                                th.window_end = (len_us != u32::MAX).then_some(end);
                            }
                            // A frame found on a window's stack began before the window: clipped.
                            Step::Found { same: false, .. } | Step::Enter(_) if !th.walk.gap() => {
                                let frame = e.frame_id().unwrap_or(0);
                                let call = Call {
                                    id: calls,
                                    parent: th.stack.last().map(|fr| fr.call.id),
                                    start: ticks,
                                    depth: th.stack.len() as u32,
                                    window: th.window,
                                    clipped: matches!(step, Step::Found { .. }),
                                    span: innermost_span(th, frame, ticks),
                                };
                                calls += 1;
                                th.stack.push(Frame { code: id, frame, call, loops: Vec::new() });
                                f(&code, Item::Begin { tid, ticks, code: id, call: call.id })?;
                            }
                            Step::Note(EventKind::SPAN) => {
                                let key = ocular_format::span::key(e);
                                if let Some(&(frame, end)) = spans.as_ref().and_then(|s| s.get(&key)) {
                                    th.spans.push((key, Holds::of(frame), end));
                                }
                            }
                            Step::Exit(_) => {
                                let fr = th.stack.pop().expect("the walk found it on top");
                                f(&code, Item::End { tid, ticks, code: fr.code, call: fr.call })?;
                            }
                            Step::Location { kind: EventKind::JUMP, enter: false }
                                if self.loops && e.arg.get() < e.offset.get() =>
                            {
                                let Some(top) = th.stack.last_mut() else { continue };
                                let head = e.arg.get();
                                let cycles = match top.loops.iter_mut().find(|l| l.0 == head) {
                                    Some(l) => Some(ticks.saturating_sub(std::mem::replace(&mut l.1, ticks))),
                                    None => {
                                        top.loops.push((head, ticks));
                                        None
                                    }
                                };
                                let n = *uops.entry((id, head)).or_insert_with(|| {
                                    code.get(&id).map_or(0, |co| {
                                        crate::analysis::instructions(co, &header, head, e.offset.get()).len()
                                    })
                                });
                                f(&code, Item::Loop { tid, ticks, code: id, head, uops: n, cycles })?;
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        crate::progress::end();
        let last = threads.values().map(|t| t.last).max().unwrap_or(0);
        let mut tids: Vec<u64> = threads.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            let th = threads.get_mut(&tid).expect("key");
            let end = th.window_end.map_or(th.last, |e| e.min(th.last.max(last)));
            let clipped = th.window.is_some();
            while let Some(mut fr) = th.stack.pop() {
                fr.call.clipped |= clipped;
                f(&code, Item::End { tid, ticks: end, code: fr.code, call: fr.call })?;
            }
            f(&code, Item::ThreadDone { tid, name: names.get(&tid).map(String::as_str) })?;
        }
        Ok((read, reader.finish().report().warnings(&self.path)))
    }
}
