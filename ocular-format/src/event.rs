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
    /// Reserved, 0.
    pub flags: u8,
    /// Reserved, 0.
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
        )
    }
}

macro_rules! event_kinds {
    ($($name:ident = $value:literal,)*) => {
        /// Event kinds, numbered as FORMAT.md section 5.1 fixes them (the `sys.monitoring` ids of CPython
        /// 3.12 and 3.13, spelled as `sys.monitoring.events` spells them; 64 and above are Ocular's own
        /// window and stack markers, section 5.3).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        pub enum EventKind { $(#[allow(missing_docs)] $name = $value,)* }

        impl EventKind {
            /// Every kind, in numeric order.
            pub const ALL: &'static [EventKind] = &[$(EventKind::$name,)*];

            /// The kind with this number, if known.
            #[inline]
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
    fn kinds_round_trip_and_unknown_is_named() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_u8(*k as u8), Some(*k));
        }
        assert_eq!(EventKind::ALL.len(), 22);
        assert_eq!(kind_name(66), "STACK");
        assert_eq!(kind_name(8), "BRANCH");
        assert_eq!(kind_name(200), "UNKNOWN(200)");
    }
}
