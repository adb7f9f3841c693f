//! Spans (FORMAT.md 5.9, since 2.13): a stretch of the program its code marks as one unit of work, written
//! into the event stream of the thread where it runs as a `SPAN` and a `SPAN_END` carrying the span's key,
//! each followed by its record in 12-byte `SPAN_DATA` pieces.

use crate::{EventKind, RawEvent};
use serde::{Deserialize, Serialize};

/// The largest record a span event carries, in bytes (its length varint aside).
pub const MAX_RECORD: usize = 65_536;

/// Bytes of a record per `SPAN_DATA` event: its `code`, `offset` and `arg`.
const PIECE: usize = 12;

/// What a span's attribute value was, in Python (FORMAT.md 5.9, `Attribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u8)]
pub enum ValueKind {
    /// `str`.
    Str = 0,
    /// `bool`.
    Bool = 1,
    /// `int`.
    Int = 2,
    /// `float`.
    Float = 3,
    /// A sequence of these (written as its `repr()`).
    Sequence = 4,
    /// Another object (its `str()`).
    Other = 5,
}

/// An attribute of a span: a key and its value as Python's `str()` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attribute {
    /// Its key.
    pub key: String,
    /// The value's type, as a number ([`ValueKind`]); kept as a number so that a later version's kinds read.
    pub kind: u8,
    /// The value as text.
    pub value: String,
}

/// A span's record at its beginning (FORMAT.md 5.9, `SpanBegin`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpanBegin {
    /// The span's name.
    pub name: String,
    /// The OpenTelemetry trace id (16 bytes), or empty.
    #[serde(with = "serde_bytes")]
    pub trace_id: Vec<u8>,
    /// The OpenTelemetry span id (8 bytes), or empty.
    #[serde(with = "serde_bytes")]
    pub span_id: Vec<u8>,
    /// The OpenTelemetry parent span's id (8 bytes), or empty.
    #[serde(with = "serde_bytes")]
    pub parent_span_id: Vec<u8>,
    /// The key of the span of this recording that encloses it (0: none).
    pub parent: u64,
    /// 0: the span is its thread's; otherwise the frame id (FORMAT.md 5.5) of its asyncio task's coroutine.
    pub frame: u64,
    /// Its attributes when it began.
    pub attributes: Vec<Attribute>,
    /// Attribute values were cut to fit [`MAX_RECORD`].
    pub cut: bool,
}

/// [`SpanBegin`] borrowed: what the recorder writes a span's beginning from without copying its name and
/// attributes. It serializes to the same bytes.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SpanBeginRef<'a> {
    /// The span's name.
    pub name: &'a str,
    /// The OpenTelemetry trace id (16 bytes), or empty.
    #[serde(with = "serde_bytes")]
    pub trace_id: &'a [u8],
    /// The OpenTelemetry span id (8 bytes), or empty.
    #[serde(with = "serde_bytes")]
    pub span_id: &'a [u8],
    /// The OpenTelemetry parent span's id (8 bytes), or empty.
    #[serde(with = "serde_bytes")]
    pub parent_span_id: &'a [u8],
    /// The key of the span of this recording that encloses it (0: none).
    pub parent: u64,
    /// 0: the span is its thread's; otherwise the frame id (FORMAT.md 5.5) of its asyncio task's coroutine.
    pub frame: u64,
    /// Its attributes when it began.
    pub attributes: &'a [Attribute],
    /// Attribute values were cut to fit [`MAX_RECORD`] (false: [`write_begin_ref`] cuts them if it must).
    pub cut: bool,
}

impl SpanBeginRef<'_> {
    fn owned(self) -> SpanBegin {
        SpanBegin {
            name: self.name.to_owned(),
            trace_id: self.trace_id.to_vec(),
            span_id: self.span_id.to_vec(),
            parent_span_id: self.parent_span_id.to_vec(),
            parent: self.parent,
            frame: self.frame,
            attributes: self.attributes.to_vec(),
            cut: self.cut,
        }
    }
}

/// A span's record at its end (FORMAT.md 5.9, `SpanEnd`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpanEnd {
    /// `0` unset, `1` ok, `2` error.
    pub status: u8,
    /// The status's description, or the exception that ended the span.
    pub message: String,
    /// Attributes set after the span began.
    pub attributes: Vec<Attribute>,
    /// Attribute values were cut to fit [`MAX_RECORD`].
    pub cut: bool,
}

/// The postcard encoding of `record`, cut to fit [`MAX_RECORD`] if it must be: its `cut` set, then the
/// longest attribute values halved again and again; a record whose other fields alone do not fit keeps no
/// attributes, and its `text` (a name, a message) is cut to 1 KiB.
fn encode<T: Serialize + Clone>(
    record: &T,
    attributes: fn(&mut T) -> &mut Vec<Attribute>,
    text: fn(&mut T) -> &mut String,
    cut: fn(&mut T) -> &mut bool,
) -> Vec<u8> {
    let bytes = postcard::to_allocvec(record).expect("a span record always serializes");
    if bytes.len() <= MAX_RECORD {
        return bytes;
    }
    let mut r = record.clone();
    *cut(&mut r) = true;
    loop {
        let bytes = postcard::to_allocvec(&r).expect("a span record always serializes");
        if bytes.len() <= MAX_RECORD {
            return bytes;
        }
        let attrs = attributes(&mut r);
        let longest = (0..attrs.len()).max_by_key(|&i| attrs[i].value.len());
        match longest {
            Some(i) if attrs[i].value.len() > 16 => {
                let half = attrs[i].value.len() / 2;
                truncate_at_char(&mut attrs[i].value, half);
            }
            Some(_) => attrs.clear(),
            None => {
                let t = text(&mut r);
                assert!(t.len() > 1024, "a span record without attributes and a text of 1 KiB fits");
                truncate_at_char(t, 1024);
            }
        }
    }
}

fn truncate_at_char(s: &mut String, at: usize) {
    let mut at = at.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
}

/// Writes the events of a span's beginning through `push`: a `SPAN` of `key` at `ticks`, then its record's
/// pieces. A record too long is cut to fit, and says so (`cut`).
pub fn write_begin(ticks: u64, key: u64, record: &SpanBegin, push: impl FnMut(RawEvent)) {
    let r = SpanBeginRef {
        name: &record.name,
        trace_id: &record.trace_id,
        span_id: &record.span_id,
        parent_span_id: &record.parent_span_id,
        parent: record.parent,
        frame: record.frame,
        attributes: &record.attributes,
        cut: record.cut,
    };
    write_begin_ref(ticks, key, &r, push);
}

/// [`write_begin`] from a borrowed record. A span's beginning is written on the program's thread, as it
/// runs: a record that fits 512 bytes is encoded there, without an allocation.
pub fn write_begin_ref(ticks: u64, key: u64, record: &SpanBeginRef<'_>, push: impl FnMut(RawEvent)) {
    let mut buf = [0u8; ENCODED_ON_STACK];
    match postcard::to_slice(record, &mut buf) {
        Ok(bytes) => events(EventKind::SPAN, ticks, key, Some(bytes), push),
        Err(_) => {
            let owned = record.owned();
            let bytes = encode(&owned, |r| &mut r.attributes, |r| &mut r.name, |r| &mut r.cut);
            events(EventKind::SPAN, ticks, key, Some(&bytes), push);
        }
    }
}

/// The longest span record encoded on the stack (a name, ids and a few short attributes).
const ENCODED_ON_STACK: usize = 512;

/// Writes the events of a span's end through `push`: a `SPAN_END` of `key` at `ticks`, then its record's
/// pieces if it adds anything to the beginning's.
pub fn write_end(ticks: u64, key: u64, record: Option<&SpanEnd>, push: impl FnMut(RawEvent)) {
    match record {
        Some(e) if e.status != 0 || !e.message.is_empty() || !e.attributes.is_empty() || e.cut => {
            let bytes = encode(e, |r| &mut r.attributes, |r| &mut r.message, |r| &mut r.cut);
            events(EventKind::SPAN_END, ticks, key, Some(&bytes), push);
        }
        _ => events(EventKind::SPAN_END, ticks, key, None, push),
    }
}

/// [`write_begin`]'s events.
pub fn begin_events(ticks: u64, key: u64, record: &SpanBegin) -> Vec<RawEvent> {
    let mut out = Vec::new();
    write_begin(ticks, key, record, |e| out.push(e));
    out
}

/// [`write_end`]'s events.
pub fn end_events(ticks: u64, key: u64, record: Option<&SpanEnd>) -> Vec<RawEvent> {
    let mut out = Vec::new();
    write_end(ticks, key, record, |e| out.push(e));
    out
}

fn events(kind: EventKind, ticks: u64, key: u64, record: Option<&[u8]>, mut push: impl FnMut(RawEvent)) {
    push(RawEvent::new(ticks, 0, (key >> 32) as u32, key as u32, kind as u8));
    let Some(record) = record else { return };
    // The varint length, then the record, in 12-byte pieces.
    let mut head = [0u8; 3];
    let mut h = 0;
    let mut n = record.len();
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        head[h] = if n == 0 { b } else { b | 0x80 };
        h += 1;
        if n == 0 {
            break;
        }
    }
    let mut bytes = head[..h].iter().chain(record).copied();
    loop {
        let mut p = [0u8; PIECE];
        let mut filled = 0;
        for (slot, b) in p.iter_mut().zip(&mut bytes) {
            *slot = b;
            filled += 1;
        }
        if filled == 0 {
            return;
        }
        let word = |i: usize| u32::from_le_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
        push(RawEvent::new(ticks, word(0), word(4), word(8), EventKind::SPAN_DATA as u8));
        if filled < PIECE {
            return;
        }
    }
}

/// The key a `SPAN` or `SPAN_END` carries.
#[inline]
pub fn key(e: &RawEvent) -> u64 {
    (u64::from(e.offset.get()) << 32) | u64::from(e.arg.get())
}

/// A span's beginning or end, read back from one thread's events.
#[derive(Clone, Debug, PartialEq)]
pub enum Mark {
    /// A `SPAN`: its key, tick and record (`None`: its pieces were cut short or undecodable).
    Begin {
        /// The span's key.
        key: u64,
        /// When it began.
        ticks: u64,
        /// Its record.
        record: Option<SpanBegin>,
    },
    /// A `SPAN_END`: its key, tick and record (`None`: it had none, or it was damaged).
    End {
        /// The span's key.
        key: u64,
        /// When it ended.
        ticks: u64,
        /// Its record.
        record: Option<SpanEnd>,
    },
}

/// Reads the spans of one thread's events: give it every event of the thread in order
/// ([`Marks::push`]); a span mark comes out once its record is whole, at the latest at the thread's next
/// event of another kind, or at [`Marks::finish`].
#[derive(Debug, Default)]
pub struct Marks {
    open: Option<(EventKind, u64, u64, Vec<u8>)>,
}

impl Marks {
    /// Takes `e`; returns the mark it completes, if any. `PAUSE` events among a record's pieces are skipped;
    /// pieces with no `SPAN` or `SPAN_END` before them (a flight recorder overwrote it) are ignored.
    pub fn push(&mut self, e: &RawEvent) -> Option<Mark> {
        match e.event_kind() {
            Some(EventKind::SPAN_DATA) => {
                let (_, _, _, bytes) = self.open.as_mut()?;
                for w in [e.code.get(), e.offset.get(), e.arg.get()] {
                    bytes.extend_from_slice(&w.to_le_bytes());
                }
                if framed_len(bytes).is_some_and(|(n, head)| bytes.len() >= head + n) {
                    return self.finish();
                }
                if bytes.len() > MAX_RECORD + PIECE + 3 {
                    return self.finish(); // longer than any record: damaged
                }
                None
            }
            Some(EventKind::PAUSE) if self.open.is_some() => None,
            Some(k @ (EventKind::SPAN | EventKind::SPAN_END)) => {
                let done = self.finish();
                self.open = Some((k, key(e), e.ticks.get(), Vec::new()));
                done
            }
            _ => self.finish(),
        }
    }

    /// The mark still being read, if any, with what it has: at the thread's last event.
    pub fn finish(&mut self) -> Option<Mark> {
        let (kind, key, ticks, bytes) = self.open.take()?;
        let record = framed_len(&bytes).and_then(|(n, head)| bytes.get(head..head + n));
        Some(if kind == EventKind::SPAN {
            Mark::Begin { key, ticks, record: record.and_then(|r| postcard::from_bytes(r).ok()) }
        } else {
            Mark::End { key, ticks, record: record.and_then(|r| postcard::from_bytes(r).ok()) }
        })
    }
}

/// A record's length varint at the start of `bytes`: (length, bytes the varint took).
fn framed_len(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut n = 0usize;
    for (i, &b) in bytes.iter().enumerate().take(3) {
        n |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return (n <= MAX_RECORD).then_some((n, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> SpanBegin {
        SpanBegin {
            name: "GET /orders".into(),
            trace_id: (1..=16).collect(),
            span_id: (1..=8).collect(),
            parent_span_id: vec![],
            parent: 0,
            frame: 0x7f12_3456_789a,
            attributes: vec![Attribute {
                key: "http.route".into(),
                kind: ValueKind::Str as u8,
                value: "/orders".into(),
            }],
            cut: false,
        }
    }

    fn read(events: &[RawEvent]) -> Vec<Mark> {
        let mut m = Marks::default();
        let mut out: Vec<Mark> = events.iter().filter_map(|e| m.push(e)).collect();
        out.extend(m.finish());
        out
    }

    #[test]
    fn a_span_s_events_carry_its_key_and_record_as_format_md_says() {
        let ev = begin_events(1000, 0x1_0000_0002, &request());
        assert_eq!(ev[0].event_kind(), Some(EventKind::SPAN));
        assert_eq!((ev[0].ticks.get(), ev[0].code.get(), ev[0].offset.get(), ev[0].arg.get()), (1000, 0, 1, 2));
        // The record, field by field as FORMAT.md's table gives it (postcard: strings and byte strings as a
        // varint length and the bytes, integers as varints, u8 and bool as one byte).
        let mut record = b"\x0bGET /orders".to_vec();
        record.push(16);
        record.extend(1..=16u8);
        record.push(8);
        record.extend(1..=8u8);
        record.push(0); // no parent span id
        record.push(0); // no enclosing span
        record.extend([0x9a, 0xf1, 0xd9, 0xa2, 0xa3, 0xe2, 0x1f]); // the frame id, 0x7f12_3456_789a, a varint
        record.extend(b"\x01\x0ahttp.route\x00\x07/orders");
        record.push(0); // not cut
        assert_eq!(postcard::to_allocvec(&request()).unwrap(), record);
        // Framed: a varint length, then the record, in 12-byte pieces, zeros after.
        let mut bytes = vec![record.len() as u8];
        bytes.extend_from_slice(&record);
        assert_eq!(ev.len(), 1 + bytes.len().div_ceil(12));
        let mut got = Vec::new();
        for e in &ev[1..] {
            assert_eq!((e.event_kind(), e.ticks.get()), (Some(EventKind::SPAN_DATA), 1000));
            for w in [e.code.get(), e.offset.get(), e.arg.get()] {
                got.extend_from_slice(&w.to_le_bytes());
            }
        }
        assert_eq!(&got[..bytes.len()], &bytes[..]);
        assert!(got[bytes.len()..].iter().all(|&b| b == 0));
    }

    #[test]
    fn marks_read_back_what_was_written_with_pauses_among_the_pieces() {
        let mut ev = vec![RawEvent::new(900, 5, 10, 0, EventKind::PY_START as u8)];
        let begin = begin_events(1000, 7, &request());
        ev.push(begin[0]);
        ev.push(begin[1]);
        ev.push(RawEvent::new(1000, 0, 0, 40, EventKind::PAUSE as u8));
        ev.extend_from_slice(&begin[2..]);
        ev.push(RawEvent::new(1100, 5, 12, 0, EventKind::PY_RETURN as u8));
        let end = SpanEnd { status: 2, message: "ValueError: no such order".into(), ..Default::default() };
        ev.extend(end_events(2000, 7, Some(&end)));
        ev.extend(end_events(2100, 8, None));
        let marks = read(&ev);
        assert_eq!(
            marks,
            [
                Mark::Begin { key: 7, ticks: 1000, record: Some(request()) },
                Mark::End { key: 7, ticks: 2000, record: Some(end) },
                Mark::End { key: 8, ticks: 2100, record: None },
            ]
        );
    }

    #[test]
    fn pieces_whose_mark_was_overwritten_are_ignored_and_a_cut_record_reads_as_none() {
        let begin = begin_events(1000, 7, &request());
        // A flight recorder overwrote the SPAN and the first piece.
        assert_eq!(read(&begin[2..]), []);
        // The thread's stream ends (or another event comes) before the record is whole.
        let short = &begin[..begin.len() - 1];
        assert_eq!(read(short), [Mark::Begin { key: 7, ticks: 1000, record: None }]);
        let mut ev = short.to_vec();
        ev.push(RawEvent::new(1100, 5, 12, 0, EventKind::PY_RETURN as u8));
        assert_eq!(read(&ev), [Mark::Begin { key: 7, ticks: 1000, record: None }]);
    }

    #[test]
    fn a_record_too_long_is_cut_to_fit_and_says_so() {
        let mut r = request();
        r.attributes.push(Attribute { key: "db.statement".into(), kind: 0, value: "é".repeat(100_000) });
        let ev = begin_events(1, 1, &r);
        assert!(ev.len() <= 1 + (MAX_RECORD + 3).div_ceil(12), "{}", ev.len());
        let [Mark::Begin { record: Some(back), .. }] = &read(&ev)[..] else { panic!("{:?}", read(&ev)) };
        assert!(back.cut);
        assert_eq!(back.attributes[0], r.attributes[0], "the short value is kept whole");
        let long = &back.attributes[1].value;
        assert!(long.len() < 65_536 && long.len() > 16_000, "{}", long.len());
        assert!(long.chars().all(|c| c == 'é'));
        // A record that fits is not marked cut.
        let [Mark::Begin { record: Some(back), .. }] = &read(&begin_events(1, 1, &request()))[..] else { panic!() };
        assert!(!back.cut);
    }

    #[test]
    fn a_record_longer_than_the_stack_buffer_but_within_the_limit_is_written_whole() {
        let mut r = request();
        r.attributes.push(Attribute { key: "db.statement".into(), kind: 0, value: "x".repeat(2 * ENCODED_ON_STACK) });
        let [Mark::Begin { record: Some(back), .. }] = &read(&begin_events(1, 1, &r))[..] else { panic!() };
        assert_eq!(back, &r);
    }
}
