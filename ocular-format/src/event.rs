//! The raw event record (FORMAT.md section 5.1) and event kinds.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// One recorded event: what the recording thread appends to its buffer, 24 bytes, little-endian.
///
/// The fields are byte-order wrappers, so on little-endian machines reading and writing them is a plain
/// load or store.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RawEvent {
    /// Tick counter when the callback ran, in ticks of the file's clock (FORMAT.md 4.1).
    pub ticks: U64,
    /// Code id (FORMAT.md 6.1); 0 for none.
    pub code: U32,
    /// Instruction offset in bytes into `co_code`.
    pub offset: U32,
    /// Destination offset in bytes for JUMP and BRANCH events; 0 otherwise.
    pub arg: U32,
    /// Event kind, see [`EventKind`].
    pub kind: u8,
    /// For function boundaries, bits of [`flags`] (FORMAT.md 5.5, since 2.8); 0 otherwise.
    pub flags: u8,
    /// Bits 32-47 of the frame id when `flags` has [`flags::FRAME`]; 0 otherwise.
    pub reserved: U16,
}

const _: () = assert!(std::mem::size_of::<RawEvent>() == 24);
const _: () = assert!(std::mem::align_of::<RawEvent>() == 1);

impl RawEvent {
    /// All fields zero.
    pub const ZERO: RawEvent = RawEvent {
        ticks: U64::ZERO,
        code: U32::ZERO,
        offset: U32::ZERO,
        arg: U32::ZERO,
        kind: 0,
        flags: 0,
        reserved: U16::ZERO,
    };

    /// An event with the given fields and zeroed reserved fields.
    #[inline(always)]
    pub fn new(ticks: u64, code: u32, offset: u32, arg: u32, kind: u8) -> Self {
        Self {
            ticks: U64::new(ticks),
            code: U32::new(code),
            offset: U32::new(offset),
            arg: U32::new(arg),
            kind,
            flags: 0,
            reserved: U16::new(0),
        }
    }

    /// The length in ticks of a `PAUSE` (FORMAT.md 5.6): the recorder's time inside the interval that ends
    /// at it; `0` for any other kind.
    #[inline]
    pub fn pause_ticks(&self) -> u64 {
        if self.kind == EventKind::PAUSE as u8 {
            (self.offset.get() as u64) << 32 | self.arg.get() as u64
        } else {
            0
        }
    }

    /// The frame id of a function boundary of coroutine code (FORMAT.md 5.5), if it has one.
    #[inline]
    pub fn frame_id(&self) -> Option<u64> {
        (self.flags & flags::FRAME != 0).then(|| self.arg.get() as u64 | (self.reserved.get() as u64) << 32)
    }

    /// Sets the frame id (FORMAT.md 5.5): bits 0-31 in `arg`, 32-47 in `reserved`, and [`flags::FRAME`].
    #[inline(always)]
    pub fn set_frame_id(&mut self, id: u64) {
        self.arg = U32::new(id as u32);
        self.reserved = U16::new((id >> 32) as u16);
        self.flags |= flags::FRAME;
    }

    /// What a `PY_YIELD` with a frame id yielded (FORMAT.md 5.5).
    #[inline]
    pub fn awaited(&self) -> Awaited {
        Awaited::from_bits(self.flags >> flags::AWAITED_SHIFT & 7)
    }

    /// The kind as an [`EventKind`], if it is one this reader knows.
    #[inline]
    pub fn event_kind(&self) -> Option<EventKind> {
        EventKind::from_u8(self.kind)
    }
}

impl std::fmt::Debug for RawEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ticks={} code={} offset={} arg={}",
            kind_name(self.kind),
            self.ticks.get(),
            self.code.get(),
            self.offset.get(),
            self.arg.get()
        )?;
        if self.flags != 0 || self.reserved.get() != 0 {
            write!(f, " flags={:#04x} reserved={:#06x}", self.flags, self.reserved.get())?;
        }
        Ok(())
    }
}

macro_rules! event_kinds {
    ($($name:ident = $value:literal,)*) => {
        /// Event kinds, numbered as FORMAT.md section 5.1 fixes them (the `sys.monitoring` ids of CPython
        /// 3.12 and 3.13, spelled as `sys.monitoring.events` spells them; 64 and above are Ocular's own
        /// window and stack markers, section 5.3, and pauses, 5.6).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        pub enum EventKind { $(#[allow(missing_docs)] $name = $value,)* }

        impl EventKind {
            /// Every kind, in numeric order.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$name,)*];

            /// The kind with this number, if known.
            #[inline(always)]
            pub fn from_u8(v: u8) -> Option<Self> {
                match v { $($value => Some(EventKind::$name),)* _ => None }
            }

            /// The name `sys.monitoring.events` uses, e.g. `PY_START`.
            pub fn name(self) -> &'static str {
                match self { $(EventKind::$name => stringify!($name),)* }
            }
        }
    };
}

event_kinds! {
    PY_START = 0,
    PY_RESUME = 1,
    PY_RETURN = 2,
    PY_YIELD = 3,
    CALL = 4,
    LINE = 5,
    INSTRUCTION = 6,
    JUMP = 7,
    BRANCH = 8,
    STOP_ITERATION = 9,
    RAISE = 10,
    EXCEPTION_HANDLED = 11,
    PY_UNWIND = 12,
    PY_THROW = 13,
    RERAISE = 14,
    C_RETURN = 15,
    C_RAISE = 16,
    BRANCH_LEFT = 17,
    BRANCH_RIGHT = 18,
    // Ocular's own kinds (FORMAT.md 5.3, since 2.2), never `sys.monitoring` events.
    WINDOW = 64,
    WINDOW_END = 65,
    STACK = 66,
    // The recorder held the thread up (FORMAT.md 5.6, since 2.9).
    PAUSE = 67,
    // When a window was due, and each thread's stack at that moment (FORMAT.md 5.7, since 2.10).
    DUE = 68,
    DUE_STACK = 69,
    // A call started outside windows, counted (FORMAT.md 5.8, since 2.10).
    COUNT = 70,
    // A span's beginning and end, and their records' pieces (FORMAT.md 5.9, since 2.13).
    SPAN = 71,
    SPAN_END = 72,
    SPAN_DATA = 73,
}

impl EventKind {
    /// The recorder's notes, which change no stack of the passes that do not read them (FORMAT.md 5.7, 5.8,
    /// 5.9): when a window was due, the stack then, calls counted outside windows (the function view reads
    /// these), and spans.
    #[inline]
    pub fn is_recorder_note(self) -> bool {
        matches!(
            self,
            EventKind::DUE
                | EventKind::DUE_STACK
                | EventKind::COUNT
                | EventKind::SPAN
                | EventKind::SPAN_END
                | EventKind::SPAN_DATA
        )
    }
}

/// Bits of a `DUE` event's `offset` (FORMAT.md 5.7).
pub mod due {
    /// No function of the thread started between the moment the window was due and its opening: its calls
    /// count from the due moment, for the window's length.
    pub const CALLS_FROM_DUE: u32 = 1;
    /// The window fell due while an earlier one waited to open: nothing of it is recorded, it stands for its
    /// length spent where its `DUE_STACK` events place the thread, and for no calls of a thread that was
    /// not running Python code then.
    pub const MISSED: u32 = 2;
    /// The thread was running Python code at the due moment (its current frame moved while its stack was
    /// read): the `DUE_STACK` events are the outer frames that stayed.
    pub const RUNNING: u32 = 4;
}

/// A reader's hold on the recorder's pauses of one thread (FORMAT.md 5.6): a `PAUSE` comes before the event
/// that waited, and its length lies in the interval from that event to the next. Give it every event of the
/// thread in order: [`Pauses::pause`] keeps a `PAUSE`, [`Pauses::take`] hands each other event the pause
/// time inside the interval that ends at it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pauses {
    /// Lies after the next event.
    next: u64,
    /// Lies before the next event.
    armed: u64,
}

impl Pauses {
    /// Keeps `e` if it is a `PAUSE` and says so: it is nothing else to a reader.
    #[inline]
    pub fn pause(&mut self, e: &RawEvent) -> bool {
        let p = e.kind == EventKind::PAUSE as u8;
        if p {
            self.next += e.pause_ticks();
        }
        p
    }

    /// Whether no pause waits to be taken: [`Pauses::take`] would say 0, and leave it so.
    #[inline(always)]
    pub fn none_waiting(&self) -> bool {
        self.next == 0 && self.armed == 0
    }

    /// For an event that is not a `PAUSE`, once each in order: the ticks of pauses between the thread's
    /// previous event and this one.
    #[inline]
    pub fn take(&mut self) -> u64 {
        std::mem::replace(&mut self.armed, std::mem::take(&mut self.next))
    }
}

/// Bits of [`RawEvent::flags`] on function boundaries (FORMAT.md 5.5, since 2.8).
pub mod flags {
    /// `arg` and `reserved` hold the frame's id: coroutine code.
    pub const FRAME: u8 = 0x01;
    /// The code's boundaries are recorded outside windows too (5.3 does not apply to them).
    pub const ALWAYS: u8 = 0x02;
    /// Bits 2-4 of a `PY_YIELD` with `FRAME`: what was yielded, an [`super::Awaited`].
    pub const AWAITED_SHIFT: u8 = 2;
}

/// What a coroutine frame yielded (FORMAT.md 5.5): in asyncio, what the await chain ends in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Awaited {
    /// Not classified (a writer that does not classify, or a value this reader does not know).
    Unknown,
    /// `None`: a bare yield, as `asyncio.sleep(0)` makes.
    Nothing,
    /// An asyncio `Future` (by type name, `Future` or `_asyncio.Future`, or a subclass of one).
    Future,
    /// An asyncio `Task` (`Task` or `_asyncio.Task`, or a subclass).
    Task,
    /// Any other object.
    Other,
}

impl Awaited {
    /// From bits 2-4 of `flags`, shifted down.
    pub fn from_bits(b: u8) -> Self {
        match b {
            1 => Awaited::Nothing,
            2 => Awaited::Future,
            3 => Awaited::Task,
            4 => Awaited::Other,
            _ => Awaited::Unknown,
        }
    }

    /// The bits to OR into `flags`.
    pub fn bits(self) -> u8 {
        let b = match self {
            Awaited::Unknown => 0,
            Awaited::Nothing => 1,
            Awaited::Future => 2,
            Awaited::Task => 3,
            Awaited::Other => 4,
        };
        b << flags::AWAITED_SHIFT
    }

    /// How reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Awaited::Unknown => "?",
            Awaited::Nothing => "yield",
            Awaited::Future => "Future",
            Awaited::Task => "Task",
            Awaited::Other => "other",
        }
    }
}

/// asyncio's event loop functions whose boundaries are recorded always (FORMAT.md 5.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopFunction {
    /// `BaseEventLoop._run_once`: one turn of the loop.
    RunOnce,
    /// `BaseEventLoop._call_soon`: a callback appended to the loop's ready queue.
    CallSoon,
    /// `Handle._run`, or `_ThreadSafeHandle._run` around it: a callback taken from the ready queue (or a
    /// timer's, or an I/O one's) runs.
    HandleRun,
    /// `BaseEventLoop.call_soon_threadsafe`: another thread schedules a callback. Up to CPython 3.13.0 it
    /// appends through `_call_soon`; from 3.14 (and later 3.13 and 3.12 releases) it appends to the ready
    /// queue itself, so a call of it that runs no `_call_soon` is the append.
    CallSoonThreadsafe,
}

/// Which of asyncio's event loop functions a code object is, by its file and qualified name.
pub fn asyncio_loop_function(filename: &str, qualname: &str) -> Option<LoopFunction> {
    let file = filename.rsplit(['/', '\\']).take(2).collect::<Vec<_>>();
    if file.get(1) != Some(&"asyncio") {
        return None;
    }
    match (file[0], qualname) {
        ("base_events.py", "BaseEventLoop._run_once") => Some(LoopFunction::RunOnce),
        ("base_events.py", "BaseEventLoop._call_soon") => Some(LoopFunction::CallSoon),
        ("base_events.py", "BaseEventLoop.call_soon_threadsafe") => Some(LoopFunction::CallSoonThreadsafe),
        ("events.py", "Handle._run" | "_ThreadSafeHandle._run") => Some(LoopFunction::HandleRun),
        _ => None,
    }
}

/// The name of an event kind number: the `sys.monitoring` spelling, or `UNKNOWN(n)`.
pub fn kind_name(kind: u8) -> std::borrow::Cow<'static, str> {
    match EventKind::from_u8(kind) {
        Some(k) => k.name().into(),
        None => format!("UNKNOWN({kind})").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn layout_matches_format_md() {
        let e = RawEvent::new(0x0807060504030201, 0x0c0b0a09, 0x100f0e0d, 0x14131211, 0x15);
        let b = e.as_bytes();
        assert_eq!(b, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0x11, 0x12, 0x13, 0x14, 0x15, 0, 0, 0]);
    }

    #[test]
    fn frame_ids_take_48_bits_in_arg_and_reserved() {
        let mut e = RawEvent::new(1, 2, 3, 0, EventKind::PY_YIELD as u8);
        assert_eq!(e.frame_id(), None);
        e.set_frame_id(0x7f12_3456_789a);
        e.flags |= Awaited::Task.bits();
        assert_eq!(&e.as_bytes()[16..24], &[0x9a, 0x78, 0x56, 0x34, 3, 0x0d, 0x12, 0x7f]);
        assert_eq!(e.frame_id(), Some(0x7f12_3456_789a));
        assert_eq!(e.awaited(), Awaited::Task);
        for a in [Awaited::Unknown, Awaited::Nothing, Awaited::Future, Awaited::Task, Awaited::Other] {
            assert_eq!(Awaited::from_bits(a.bits() >> flags::AWAITED_SHIFT), a);
        }
    }

    #[test]
    fn asyncio_loop_functions_by_file_and_name() {
        let f = asyncio_loop_function;
        assert_eq!(
            f("/usr/lib/python3.13/asyncio/base_events.py", "BaseEventLoop._run_once"),
            Some(LoopFunction::RunOnce)
        );
        assert_eq!(f("/x/asyncio/events.py", "Handle._run"), Some(LoopFunction::HandleRun));
        assert_eq!(f("C:\\py\\asyncio\\base_events.py", "BaseEventLoop._call_soon"), Some(LoopFunction::CallSoon));
        assert_eq!(f("/x/asyncio/events.py", "_ThreadSafeHandle._run"), Some(LoopFunction::HandleRun));
        assert_eq!(
            f("/x/asyncio/base_events.py", "BaseEventLoop.call_soon_threadsafe"),
            Some(LoopFunction::CallSoonThreadsafe)
        );
        assert_eq!(f("/x/myasyncio/events.py", "Handle._run"), None);
        assert_eq!(f("/x/asyncio/events.py", "TimerHandle._run"), None);
    }

    #[test]
    fn a_pause_is_as_long_as_its_offset_and_arg_say_and_other_kinds_are_no_pause() {
        let p = RawEvent::new(5, 0, 2, 7, EventKind::PAUSE as u8);
        assert_eq!(p.pause_ticks(), (2 << 32) + 7);
        assert_eq!(RawEvent::new(5, 0, 2, 7, EventKind::JUMP as u8).pause_ticks(), 0);
    }

    #[test]
    fn a_pause_belongs_to_the_interval_after_the_event_that_follows_it() {
        let j = |t| RawEvent::new(t, 1, 0, 0, EventKind::JUMP as u8);
        let stream = [j(10), RawEvent::new(20, 0, 0, 300, EventKind::PAUSE as u8), j(20), j(400), j(410)];
        let mut p = Pauses::default();
        let mut got = Vec::new();
        for e in &stream {
            if !p.pause(e) {
                got.push((e.ticks.get(), p.take()));
            }
        }
        assert_eq!(got, [(10, 0), (20, 0), (400, 300), (410, 0)]);
    }

    #[test]
    fn kinds_round_trip_and_unknown_is_named() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_u8(*k as u8), Some(*k));
        }
        assert_eq!(EventKind::ALL.len(), 29);
        assert_eq!(kind_name(66), "STACK");
        assert_eq!(kind_name(67), "PAUSE");
        assert_eq!(kind_name(68), "DUE");
        assert_eq!(kind_name(69), "DUE_STACK");
        assert_eq!(kind_name(70), "COUNT");
        assert_eq!(kind_name(71), "SPAN");
        assert_eq!(kind_name(72), "SPAN_END");
        assert_eq!(kind_name(73), "SPAN_DATA");
        assert_eq!(kind_name(74), "UNKNOWN(74)");
        assert_eq!(kind_name(8), "BRANCH");
        assert_eq!(kind_name(200), "UNKNOWN(200)");
    }
}
