//! The walk of one thread's events: what the recording's own structure means for the call stack, said
//! once for every pass that keeps a stack. Windows (FORMAT.md 5.3), the stack a window's opening writes
//! (`STACK`), the recorder's pauses (5.6) and its notes (5.7, 5.8) are interpreted here; a pass keeps its
//! own frames and is told, per event, what happened to them.
//!
//! Rules:
//! - Between windows function boundaries are not recorded (the gap). A window opens at its `WINDOW`
//!   marker and ends at its `WINDOW_END`, or, for a timed one, at its length: the first event at or past
//!   it is in the gap.
//! - The `STACK` events after an opening are the thread's stack then, outermost first. A frame of the same
//!   code at the same depth as before is the same activation, as far as can be told; any other ends the
//!   frames from that depth up (unrecorded ends). At the first other event the stack is complete: frames
//!   above what it confirmed have returned.
//! - An exit (`PY_RETURN`, `PY_YIELD`, `PY_UNWIND`) of a frame below the top ends the frames above it
//!   first; an exit of code not on the stack (the recording started inside it) moves nothing.
//! - A location event (a jump, a branch, an instruction) of code not on top: the frames above its
//!   innermost frame have returned, or, not on the stack at all, it was called unrecorded.
//! - A window re-arms every code object: each is instrumented again, on the program's time, at its first
//!   start or resumption in the window, unless the opening's stack held it.
//! - A coroutine's or asyncio loop function's boundary in the gap (recorded for the async view, 5.5) is
//!   left out, as the boundaries around it there are not recorded.

use crate::codemap::CodeMap;
use ocular_format::event::flags;
use ocular_format::{EventKind, Pauses, RawEvent};

/// A pass's stack of frames, as the walk sees it.
pub trait Frames {
    /// Frames on the stack.
    fn depth(&self) -> usize;
    /// The code id of the frame at `i` (0: outermost).
    fn code(&self, i: usize) -> u32;
    /// The frames from `depth` up ended without their ends recorded, before the event at tick `t`.
    fn lose_above(&mut self, depth: usize, t: u64);
    /// The thread's window ended at tick `end` (its length ran out before the current event, or its end
    /// marker came), before the current event moves anything.
    fn window_ended(&mut self, _end: u64) {}
}

/// What one event is, for the stack, after the walk has ended the frames it implies ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A recorder pause: no event of the program. Its ticks come out with the next event's
    /// ([`Walk::paused`]).
    Pause,
    /// A kind this reader does not know.
    Unknown,
    /// A recorder note (`DUE`, `DUE_STACK`, `COUNT`): no frame moves.
    Note(EventKind),
    /// A window opened: `len_us` its length (`u32::MAX`: until its end marker), `end` the tick it ends
    /// at (`u64::MAX`: at its marker). The stack follows as [`Step::Found`].
    Opened {
        /// Length in microseconds.
        len_us: u32,
        /// End tick.
        end: u64,
    },
    /// A window's end marker (after [`Frames::window_ended`]).
    Closed,
    /// A frame of the stack at an opening, at `depth`: `same` when the frame there is that activation
    /// (nothing to do), otherwise the frames from `depth` up have been lost and this one is to be pushed.
    Found {
        /// Its depth.
        depth: usize,
        /// The activation already there.
        same: bool,
    },
    /// A function's start or resumption: a frame to push.
    Enter(EventKind),
    /// The exit of the frame on top (frames above it already lost).
    Exit(EventKind),
    /// An exit of code not on the stack: nothing moves.
    ExitUnknown(EventKind),
    /// A location event of the frame on top; `enter`: its frame was not on the stack and is to be pushed
    /// first (called unrecorded).
    Location {
        /// The event's kind.
        kind: EventKind,
        /// Push its frame first.
        enter: bool,
    },
    /// A frame of a window's stack that is on no stack here: of code that is not recorded, or outside an
    /// opening.
    Unplaced,
    /// An event that moves no frame here (C calls, a boundary left out in the gap).
    Other(EventKind),
}

/// What a window's marker (FORMAT.md 5.3) is to a pass's clock, which it may advance before the walk
/// moves frames for the event ([`Walk::moves`]): the markers place time differently from the program's
/// events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// A window opened, `lead_us` microseconds after it was due; `len_us` its length (`u32::MAX`: until
    /// its end marker).
    Opened {
        /// Microseconds from when it was due.
        lead_us: u32,
        /// Its length in microseconds.
        len_us: u32,
    },
    /// A window closed.
    Closed,
    /// A frame of the stack a window's opening wrote.
    Stack,
}

impl Marker {
    /// The marker `e` is, if it is one.
    #[inline(always)]
    pub fn of(e: &RawEvent) -> Option<Marker> {
        match e.event_kind()? {
            EventKind::WINDOW => Some(Marker::Opened { lead_us: e.code.get(), len_us: e.arg.get() }),
            EventKind::WINDOW_END => Some(Marker::Closed),
            EventKind::STACK => Some(Marker::Stack),
            _ => None,
        }
    }
}

/// One thread's walk.
#[derive(Debug)]
pub struct Walk {
    pauses: Pauses,
    paused: u64,
    gap: bool,
    window_end: u64,
    windowed: bool,
    /// While a window's `STACK` events arrive: how many frames they have confirmed.
    sync: Option<usize>,
    ticks_per_us: f64,
    /// The tick of the thread's last event if it was a `PY_START` or `PY_RETURN` (0: it was not).
    boundary_at: u64,
    /// The intervals from such an event to a start, and to a return, in a row ([`Walk::cost`]): how many
    /// were counted, their histogram (while it is kept), and the bound it gives each kind's cost.
    seen: [u32; 2],
    spacing: Option<Box<Spacing>>,
    bound: [f64; 2],
    /// Code objects instrumented in the current window: on the stack at its opening, or started since
    /// ([`Walk::instruments_again`]).
    instrumented: CodeMap<()>,
}

/// How long the intervals that end at a start, and at a return, were: a histogram each, and the cost bound
/// it gives ([`Walk::cost`]).
#[derive(Debug)]
struct Spacing {
    bins: [[u32; SPACING_BINS]; 2],
}

/// Intervals are counted in bins of this many ticks, the last for anything longer.
const SPACING_BIN: u64 = 8;
const SPACING_BINS: usize = 128;
/// The share of the intervals before its events that a cost may make negative ([`Walk::cost`]).
const SPACING_SHARE: f64 = 0.1;
/// The bound is read again from the histogram every this many intervals, from the first time there, up to
/// the last it counts: a thread's first 65,536 intervals of each kind say what its calls cost (a sampled
/// recording's first window holds its first 50,000 calls), and counting them all cost `stats` 14% of its
/// speed.
const SPACING_EVERY: u32 = 1024;
const SPACING_LAST: u32 = 65_536;

impl Spacing {
    /// The interval below which `SPACING_SHARE` of those of kind `which` lie (the lower edge of its bin).
    fn bound(&self, which: usize, seen: u32) -> f64 {
        let want = (f64::from(seen) * SPACING_SHARE).ceil() as u64;
        let mut below = 0u64;
        for (i, &n) in self.bins[which].iter().enumerate() {
            below += u64::from(n);
            if below >= want && i + 1 < SPACING_BINS {
                return (i as u64 * SPACING_BIN) as f64;
            }
        }
        f64::INFINITY
    }
}

impl Walk {
    /// A thread's walk in a file whose clock runs at `ticks_per_second`.
    pub fn new(ticks_per_second: f64) -> Self {
        Walk {
            pauses: Pauses::default(),
            paused: 0,
            gap: false,
            window_end: u64::MAX,
            windowed: false,
            sync: None,
            ticks_per_us: ticks_per_second / 1e6,
            boundary_at: 0,
            seen: [0; 2],
            spacing: None,
            bound: [f64::INFINITY; 2],
            instrumented: CodeMap::default(),
        }
    }

    /// What the recorder's event `e` cost the program, in ticks: `table`'s cost of its kind, except that a
    /// `PY_START`'s or a `PY_RETURN`'s is never more than the interval below which a tenth of those that
    /// end at its kind lie, in this thread (from a start or a return to it, in a row). A pass takes an
    /// event's cost out of the interval that ends at it, the time of the function that ran then: a cost
    /// that makes more than a tenth of them negative is not what the recording cost. (Some can be: the cost
    /// is a mean, and an interval where the machine ran at its fastest held less.) The cost is measured
    /// once, on a small loop, and scaled by the machine's speed at the stop; where that read the machine
    /// slow (0.67x on CPython 3.14), 41.7 ns an event was taken out of one-line calls 30 ns apart, their
    /// function read no time at all, and windows of them stood for 2.5x their calls. The bound is read
    /// from the intervals seen so far, once 1,024 of them were, and fixed after 65,536.
    ///
    /// Call it for every event of the thread that the pass takes the cost of: it keeps the bounds. (An
    /// event it is not called for, a note or a pause, can only make an interval it spans longer.)
    #[inline(always)]
    pub fn cost(&mut self, e: &RawEvent, table: &[f64; 256]) -> f64 {
        let c = table[e.kind as usize];
        let which = if e.kind == EventKind::PY_START as u8 {
            0
        } else if e.kind == EventKind::PY_RETURN as u8 {
            1
        } else {
            self.boundary_at = 0;
            return c;
        };
        let (t, before) = (e.ticks.get(), self.boundary_at);
        self.boundary_at = t;
        if self.seen[which] < SPACING_LAST && before != 0 && t > before {
            self.count_interval(which, t - before);
        }
        c.min(self.bound[which])
    }

    /// Whether `e`, a start, resumption or throw, is its code object's first in the current window: a
    /// window re-arms every code object (`sys.monitoring.restart_events`), and CPython instruments each
    /// again at its first call in the window, before its first event, on the program's time (0.1-9 us a
    /// code object). Code on the stack at the opening was instrumented by the opening itself, whose cost
    /// is its own. A pass asks this of the events of the part of a window where it takes costs out.
    #[inline]
    pub fn instruments_again(&mut self, e: &RawEvent) -> bool {
        matches!(e.event_kind(), Some(EventKind::PY_START | EventKind::PY_RESUME | EventKind::PY_THROW))
            && self.instrumented.insert(e.code.get(), ())
    }

    /// Counts an interval that ends at an event of kind `which` ([`Walk::cost`]).
    #[cold]
    fn count_interval(&mut self, which: usize, ticks: u64) {
        let s = self.spacing.get_or_insert_with(|| Box::new(Spacing { bins: [[0; SPACING_BINS]; 2] }));
        s.bins[which][((ticks / SPACING_BIN) as usize).min(SPACING_BINS - 1)] += 1;
        self.seen[which] += 1;
        let seen = self.seen[which];
        if seen % SPACING_EVERY == 0 {
            self.bound[which] = s.bound(which, seen);
        }
        if self.seen.iter().all(|&n| n >= SPACING_LAST) {
            self.spacing = None; // the bounds stay
        }
    }

    /// Whether the last event fell between windows.
    #[inline]
    pub fn gap(&self) -> bool {
        self.gap
    }

    /// Whether a timed window was seen: figures from this thread are estimates.
    #[inline]
    pub fn windowed(&self) -> bool {
        self.windowed
    }

    /// The recorder's pauses between the thread's previous event and the last one, in ticks: not the
    /// program's time.
    #[inline]
    pub fn paused(&self) -> u64 {
        self.paused
    }

    /// While a window's stack is being read: the frames it has confirmed.
    #[inline]
    pub fn syncing(&self) -> Option<usize> {
        self.sync
    }

    /// Walks `e`: ends the frames it implies ended (through `frames`), and says what is left to do.
    #[inline(always)]
    pub fn step(&mut self, frames: &mut impl Frames, e: &RawEvent) -> Step {
        match self.note(e) {
            Some(s) => s,
            None => self.moves(frames, e),
        }
    }

    /// Whether `e` is a function's start, resumption, return or yield that moves nothing in the walk: no
    /// pause before it, no window's stack being read, inside a window (a recording of every call is one
    /// window). For such an event [`Walk::note`] says `None` and [`Walk::moves`] says `Enter`, or `Exit`
    /// where the frame on top is its code's (the caller checks that), so a pass may skip both; it still
    /// calls [`Walk::cost`]. Most events of a recording of every call are such.
    #[inline(always)]
    pub fn plain(&mut self, e: &RawEvent) -> bool {
        use EventKind as K;
        const BOUNDARIES: u64 =
            1 << K::PY_START as u8 | 1 << K::PY_RETURN as u8 | 1 << K::PY_RESUME as u8 | 1 << K::PY_YIELD as u8;
        let boundary = e.kind < 64 && BOUNDARIES & 1 << e.kind != 0;
        if boundary && self.sync.is_none() && !self.gap && e.ticks.get() < self.window_end && self.pauses.none_waiting()
        {
            self.paused = 0;
            return true;
        }
        false
    }

    /// The first half of [`Walk::step`], for a pass that does its own work between the halves: a pause, a
    /// kind this reader does not know or a recorder note (`Some`, and nothing more to do for the stack), or
    /// an event of the program (`None`: [`Walk::moves`] next).
    #[inline(always)]
    pub fn note(&mut self, e: &RawEvent) -> Option<Step> {
        if self.pauses.pause(e) {
            return Some(Step::Pause);
        }
        self.paused = self.pauses.take();
        let Some(kind) = e.event_kind() else { return Some(Step::Unknown) };
        if kind.is_recorder_note() {
            if kind == EventKind::DUE && e.offset.get() & ocular_format::event::due::MISSED != 0 {
                // A missed window (FORMAT.md 5.7): no stack at an opening follows, and none is due, as no
                // event of it was recorded. The thread's frames are as they were.
                self.sync = None;
            }
            return Some(Step::Note(kind));
        }
        None
    }

    /// The second half of [`Walk::step`], for an event of the program ([`Walk::note`] said `None`).
    #[inline(always)]
    pub fn moves(&mut self, frames: &mut impl Frames, e: &RawEvent) -> Step {
        let Some(kind) = e.event_kind() else { return Step::Unknown };
        let t = e.ticks.get();
        let id = e.code.get();
        if kind != EventKind::STACK {
            if let Some(depth) = self.sync.take() {
                frames.lose_above(depth, t);
            }
        }
        if !self.gap && t >= self.window_end {
            self.gap = true;
            frames.window_ended(self.window_end);
        }
        if self.gap && e.flags & flags::ALWAYS != 0 {
            return Step::Other(kind);
        }
        match kind {
            EventKind::WINDOW => {
                let len_us = e.arg.get();
                self.gap = false;
                self.window_end = if len_us == u32::MAX {
                    u64::MAX
                } else {
                    t.saturating_add((f64::from(len_us) * self.ticks_per_us).ceil() as u64)
                };
                self.windowed |= len_us != u32::MAX;
                self.sync = Some(0);
                self.instrumented.clear();
                Step::Opened { len_us, end: self.window_end }
            }
            EventKind::WINDOW_END => {
                if !self.gap {
                    self.gap = true;
                    frames.window_ended(t);
                }
                Step::Closed
            }
            EventKind::STACK => {
                let Some(depth) = self.sync else { return Step::Unplaced };
                if id == 0 {
                    return Step::Unplaced; // a frame of code that is not recorded: on no stack
                }
                self.sync = Some(depth + 1);
                self.instrumented.insert(id, ());
                let same = depth < frames.depth() && frames.code(depth) == id;
                if !same {
                    frames.lose_above(depth, t);
                }
                Step::Found { depth, same }
            }
            EventKind::PY_START | EventKind::PY_RESUME | EventKind::PY_THROW => Step::Enter(kind),
            EventKind::PY_RETURN | EventKind::PY_YIELD | EventKind::PY_UNWIND => match innermost(frames, id) {
                Some(pos) => {
                    if pos + 1 < frames.depth() {
                        frames.lose_above(pos + 1, t);
                    }
                    Step::Exit(kind)
                }
                None => Step::ExitUnknown(kind),
            },
            EventKind::JUMP
            | EventKind::BRANCH
            | EventKind::BRANCH_LEFT
            | EventKind::BRANCH_RIGHT
            | EventKind::INSTRUCTION => {
                let d = frames.depth();
                if d > 0 && frames.code(d - 1) == id {
                    return Step::Location { kind, enter: false };
                }
                match innermost(frames, id) {
                    Some(pos) => {
                        frames.lose_above(pos + 1, t);
                        Step::Location { kind, enter: false }
                    }
                    None => Step::Location { kind, enter: true },
                }
            }
            _ => Step::Other(kind),
        }
    }
}

/// The depth of the innermost frame of `code`.
#[inline]
fn innermost(frames: &impl Frames, code: u32) -> Option<usize> {
    (0..frames.depth()).rev().find(|&i| frames.code(i) == code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ocular_format::event::RawEvent;

    /// A stack of code ids that logs what the walk did to it.
    #[derive(Default)]
    struct Log {
        stack: Vec<u32>,
        lost: Vec<(usize, u64)>,
        ended: Vec<u64>,
    }

    impl Frames for Log {
        fn depth(&self) -> usize {
            self.stack.len()
        }
        fn code(&self, i: usize) -> u32 {
            self.stack[i]
        }
        fn lose_above(&mut self, depth: usize, t: u64) {
            if self.stack.len() > depth {
                self.stack.truncate(depth);
                self.lost.push((depth, t));
            }
        }
        fn window_ended(&mut self, end: u64) {
            self.ended.push(end);
        }
    }

    fn ev(kind: EventKind, t: u64, code: u32, arg: u32) -> RawEvent {
        RawEvent::new(t, code, 0, arg, kind as u8)
    }

    /// Applies a step as a pass would: pushes what is to be pushed, pops exits.
    fn apply(log: &mut Log, w: &mut Walk, e: RawEvent) -> Step {
        let s = w.step(log, &e);
        match s {
            Step::Found { same: false, .. } | Step::Enter(_) | Step::Location { enter: true, .. } => {
                log.stack.push(e.code.get())
            }
            Step::Exit(_) => {
                log.stack.pop();
            }
            _ => {}
        }
        s
    }

    #[test]
    fn a_plain_event_is_one_the_whole_step_would_only_enter_or_exit_with() {
        use EventKind as K;
        let mut w = Walk::new(1e6); // a tick a microsecond
        let mut log = Log::default();
        let pause = RawEvent::new(30, 0, 0, 5, K::PAUSE as u8);
        // (event, whether it is plain): every call recorded, a pause, a window with its stack, its gap.
        let events = [
            (ev(K::PY_START, 1, 1, 0), true),
            (ev(K::PY_START, 2, 2, 0), true),
            (ev(K::PY_YIELD, 3, 2, 0), true),
            (ev(K::PY_RESUME, 4, 2, 0), true),
            (ev(K::JUMP, 5, 2, 0), false),
            (ev(K::PY_RETURN, 6, 2, 0), true),
            (pause, false),
            // A pause lies in the interval after the event that follows it: both take it.
            (ev(K::PY_START, 31, 3, 0), false),
            (ev(K::PY_RETURN, 32, 3, 0), false),
            (ev(K::PY_START, 33, 3, 0), true),
            // A return of code below the top (its callee's return was lost) is plain to the walk; the pass
            // checks the top before it takes the short way.
            (ev(K::PY_RETURN, 34, 1, 0), true),
            (ev(K::PY_START, 40, 1, 0), true),
            (ev(K::WINDOW, 100, 0, 10), false),
            (ev(K::STACK, 100, 1, 0), false),
            // The first event after a window's stack ends the frames it did not confirm: not plain.
            (ev(K::PY_START, 101, 4, 0), false),
            (ev(K::PY_RETURN, 102, 4, 0), true),
            (ev(K::C_RETURN, 103, 1, 0), false),
            // Past the window's length: the gap.
            (ev(K::PY_START, 120, 5, 0), false),
        ];
        for (i, (e, want)) in events.into_iter().enumerate() {
            let plain = w.plain(&e);
            assert_eq!(plain, want, "event {i}: {e:?}");
            let (lost, ended, top) = (log.lost.len(), log.ended.len(), log.stack.last().copied());
            let step = apply(&mut log, &mut w, e);
            let kind = e.event_kind().unwrap();
            let enters = matches!(kind, K::PY_START | K::PY_RESUME);
            if plain && (enters || top == Some(e.code.get())) {
                assert_eq!(step, if enters { Step::Enter(kind) } else { Step::Exit(kind) }, "event {i}");
                assert_eq!((log.lost.len(), log.ended.len(), w.paused()), (lost, ended, 0), "event {i}");
            }
        }
    }

    #[test]
    fn a_window_s_stack_keeps_the_same_activations_and_ends_the_rest() {
        let mut w = Walk::new(1e6); // a tick a microsecond
        let mut log = Log::default();
        for (i, c) in [1, 2, 3].into_iter().enumerate() {
            apply(&mut log, &mut w, ev(EventKind::PY_START, i as u64, c, 0));
        }
        // A timed window of 10 us at tick 100: the last event before it was at tick 2.
        assert_eq!(apply(&mut log, &mut w, ev(EventKind::WINDOW, 100, 0, 10)), Step::Opened { len_us: 10, end: 110 });
        assert!(w.windowed());
        assert_eq!(apply(&mut log, &mut w, ev(EventKind::STACK, 100, 1, 0)), Step::Found { depth: 0, same: true });
        assert_eq!(apply(&mut log, &mut w, ev(EventKind::STACK, 100, 4, 0)), Step::Found { depth: 1, same: false });
        assert_eq!(log.stack, [1, 4]);
        assert_eq!(log.lost, [(1, 100)]);
        // The first event after the stack: complete.
        assert_eq!(apply(&mut log, &mut w, ev(EventKind::PY_START, 101, 5, 0)), Step::Enter(EventKind::PY_START));
        assert_eq!(log.stack, [1, 4, 5]);
        // Past the window's length: in the gap, after the window ended at its length.
        assert_eq!(
            apply(&mut log, &mut w, ev(EventKind::JUMP, 120, 1, 0)),
            Step::Location { kind: EventKind::JUMP, enter: false }
        );
        assert_eq!(log.ended, [110]);
        assert!(w.gap());
        assert_eq!(log.stack, [1]);
        assert_eq!(log.lost.last(), Some(&(1, 120)));
    }

    #[test]
    fn a_stack_shorter_than_before_ends_the_frames_above_it_at_the_next_event() {
        let mut w = Walk::new(1e6);
        let mut log = Log::default();
        for c in [1, 2, 3] {
            apply(&mut log, &mut w, ev(EventKind::PY_START, 0, c, 0));
        }
        apply(&mut log, &mut w, ev(EventKind::WINDOW, 10, 0, u32::MAX));
        apply(&mut log, &mut w, ev(EventKind::STACK, 10, 1, 0));
        apply(&mut log, &mut w, ev(EventKind::STACK, 10, 0, 0)); // unrecorded code: on no stack
        assert_eq!(log.stack, [1, 2, 3]);
        assert_eq!(w.syncing(), Some(1));
        apply(&mut log, &mut w, ev(EventKind::JUMP, 11, 1, 0));
        assert_eq!(log.stack, [1]);
        assert!(!w.gap());
    }

    #[test]
    fn exits_of_deeper_frames_end_those_above_and_unknown_exits_move_nothing() {
        let mut w = Walk::new(1e6);
        let mut log = Log::default();
        for c in [1, 2, 3] {
            apply(&mut log, &mut w, ev(EventKind::PY_START, 0, c, 0));
        }
        assert_eq!(apply(&mut log, &mut w, ev(EventKind::PY_RETURN, 1, 9, 0)), Step::ExitUnknown(EventKind::PY_RETURN));
        assert_eq!(log.stack, [1, 2, 3]);
        assert_eq!(apply(&mut log, &mut w, ev(EventKind::PY_RETURN, 2, 2, 0)), Step::Exit(EventKind::PY_RETURN));
        assert_eq!(log.stack, [1]);
        assert_eq!(log.lost, [(2, 2)]);
        // A location of code not on the stack was called unrecorded.
        assert_eq!(
            apply(&mut log, &mut w, ev(EventKind::JUMP, 3, 7, 0)),
            Step::Location { kind: EventKind::JUMP, enter: true }
        );
        assert_eq!(log.stack, [1, 7]);
    }

    #[test]
    fn a_missed_window_s_markers_end_no_frame() {
        use ocular_format::event::due::MISSED;
        let mut w = Walk::new(1e6);
        let mut log = Log::default();
        for c in [1, 2] {
            apply(&mut log, &mut w, ev(EventKind::PY_START, 0, c, 0));
        }
        // A window missed while the thread was in code 2 (FORMAT.md 5.7): its markers, written when the next
        // one opens, carry the stack at its due moment but no stack at an opening.
        apply(&mut log, &mut w, ev(EventKind::WINDOW, 50, 30, 10));
        let due = RawEvent::new(50, 0, MISSED, 2, EventKind::DUE as u8);
        assert_eq!(w.step(&mut log, &due), Step::Note(EventKind::DUE));
        assert_eq!(w.syncing(), None);
        apply(&mut log, &mut w, ev(EventKind::DUE_STACK, 50, 1, 0));
        apply(&mut log, &mut w, ev(EventKind::DUE_STACK, 50, 2, 1));
        assert_eq!(apply(&mut log, &mut w, ev(EventKind::WINDOW_END, 50, 0, 0)), Step::Closed);
        assert_eq!(log.stack, [1, 2]);
        assert!(log.lost.is_empty());
        // The next window's own stack confirms the frames.
        apply(&mut log, &mut w, ev(EventKind::WINDOW, 50, 0, 10));
        apply(&mut log, &mut w, ev(EventKind::STACK, 50, 1, 0));
        apply(&mut log, &mut w, ev(EventKind::STACK, 50, 2, 0));
        apply(&mut log, &mut w, ev(EventKind::JUMP, 51, 2, 0));
        assert_eq!(log.stack, [1, 2]);
        assert!(log.lost.is_empty());
    }

    #[test]
    fn a_code_object_is_instrumented_again_at_its_first_call_in_each_window_unless_the_opening_found_it() {
        use EventKind::{PY_RESUME as RESUME, PY_RETURN as RET, PY_START as START, STACK, WINDOW};
        let mut w = Walk::new(1e6);
        let mut log = Log::default();
        let again = |log: &mut Log, w: &mut Walk, kind, t, code| {
            let e = ev(kind, t, code, 0);
            apply(log, w, e);
            w.instruments_again(&e)
        };
        apply(&mut log, &mut w, ev(START, 0, 1, 0));
        // A window finds code 1 running: the opening instrumented it.
        apply(&mut log, &mut w, ev(WINDOW, 10, 0, 100));
        apply(&mut log, &mut w, ev(STACK, 10, 1, 0));
        assert!(!again(&mut log, &mut w, START, 11, 1), "on the stack at the opening");
        assert!(again(&mut log, &mut w, START, 12, 2), "its first call in the window");
        assert!(!again(&mut log, &mut w, RET, 13, 2), "a return instruments nothing");
        assert!(!again(&mut log, &mut w, START, 14, 2), "its second call");
        assert!(again(&mut log, &mut w, RESUME, 15, 3), "a generator's first resumption in the window");
        // The next window re-arms every code object again.
        apply(&mut log, &mut w, ev(WINDOW, 200, 0, 100));
        apply(&mut log, &mut w, ev(STACK, 200, 1, 0));
        assert!(again(&mut log, &mut w, START, 201, 2));
        assert!(!again(&mut log, &mut w, START, 202, 1));
    }

    #[test]
    fn pauses_come_out_with_the_next_event_and_notes_move_nothing() {
        let mut w = Walk::new(1e6);
        let mut log = Log::default();
        apply(&mut log, &mut w, ev(EventKind::PY_START, 0, 1, 0));
        // A pause of 40 ticks (FORMAT.md 5.6) lies in the interval that ends at the event after the next.
        let pause = RawEvent::new(5, 0, 0, 40, EventKind::PAUSE as u8);
        assert_eq!(w.step(&mut log, &pause), Step::Pause);
        assert_eq!(apply(&mut log, &mut w, ev(EventKind::COUNT, 50, 2, 0)), Step::Note(EventKind::COUNT));
        assert_eq!(w.paused(), 0);
        assert_eq!(log.stack, [1]);
        apply(&mut log, &mut w, ev(EventKind::JUMP, 60, 1, 0));
        assert_eq!(w.paused(), 40);
        apply(&mut log, &mut w, ev(EventKind::JUMP, 70, 1, 0));
        assert_eq!(w.paused(), 0);
    }

    #[test]
    fn a_call_events_cost_is_never_more_than_a_tenth_of_the_intervals_before_its_kind_allow() {
        let mut w = Walk::new(1e9);
        let mut table = [0.0; 256];
        table[EventKind::PY_START as usize] = 100.0;
        table[EventKind::PY_RETURN as usize] = 100.0;
        table[EventKind::JUMP as usize] = 100.0;
        let cost = |w: &mut Walk, table: &[f64; 256], kind, t| w.cost(&ev(kind, t, 1, 0), table);
        use EventKind::{JUMP, PY_RETURN as RET, PY_START as START};
        // A thousand calls: 64 ticks from each start to its return, 200 from the return to the next start.
        let mut t = 1_000;
        for _ in 0..1_023 {
            assert_eq!(cost(&mut w, &table, START, t), 100.0, "too few intervals seen to bound");
            assert_eq!(cost(&mut w, &table, RET, t + 64), 100.0);
            t += 264;
        }
        // The 1,024th interval before a return: the cost of a return is at most 64 ticks (the lower edge of
        // their bin); starts keep the table's, 100 being below their 200.
        assert_eq!(cost(&mut w, &table, START, t), 100.0);
        assert_eq!(cost(&mut w, &table, RET, t + 64), 64.0);
        // Another kind in between: its own cost is the table's, and the interval after it counts for none.
        assert_eq!(cost(&mut w, &table, JUMP, t + 70), 100.0);
        assert_eq!(cost(&mut w, &table, RET, t + 75), 64.0);
        // A table's cost below the bound stands.
        table[EventKind::PY_RETURN as usize] = 30.0;
        assert_eq!(cost(&mut w, &table, RET, t + 500), 30.0);
        // A few short intervals (under a tenth) do not lower it: a cost is a mean.
        let mut w = Walk::new(1e9);
        table[EventKind::PY_RETURN as usize] = 100.0;
        let mut t = 1_000;
        for i in 0..2_048 {
            cost(&mut w, &table, START, t);
            cost(&mut w, &table, RET, t + if i % 20 == 0 { 16 } else { 160 });
            t += 400;
        }
        assert_eq!(cost(&mut w, &table, RET, t + 1), 100.0);
    }
}
