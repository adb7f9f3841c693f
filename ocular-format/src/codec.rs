//! Columnar delta v1 (FORMAT.md 5.2): the transform that makes event buffers compress to about a byte per
//! event. It runs on the writer's background thread, never on the recording thread.
//!
//! ```text
//!   events ──split──> kind | zz(Δcode) | zz(Δoffset) | zz(Δarg) | zz(Δticks)
//!   each column:  [w] plane0 plane1 … plane(w-1)     w ∈ {0,1,2,4,8}
//!   plane k = byte k (little-endian) of every value, so high planes are long runs of zeros
//! ```

use crate::event::RawEvent;
use zerocopy::little_endian::{U16, U32, U64};

#[inline(always)]
fn zz32(d: u32) -> u32 {
    let d = d as i32;
    ((d << 1) ^ (d >> 31)) as u32
}
#[inline(always)]
fn unzz32(v: u32) -> u32 {
    (v >> 1) ^ (v & 1).wrapping_neg()
}
#[inline(always)]
fn zz64(d: u64) -> u64 {
    let d = d as i64;
    ((d << 1) ^ (d >> 63)) as u64
}
#[inline(always)]
fn unzz64(v: u64) -> u64 {
    (v >> 1) ^ (v & 1).wrapping_neg()
}

fn width_for(max: u64) -> u8 {
    match max {
        0 => 0,
        1..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    }
}

/// Appends one column: width byte and byte planes.
fn put_column(out: &mut Vec<u8>, values: &[u64]) {
    let max = values.iter().fold(0u64, |m, &v| m | v);
    let w = width_for(max);
    out.push(w);
    for k in 0..w as usize {
        let shift = 8 * k;
        out.extend(values.iter().map(|&v| (v >> shift) as u8));
    }
}

fn delta_column(
    events: &[RawEvent],
    scratch: &mut [u64],
    out: &mut Vec<u8>,
    field: impl Fn(&RawEvent) -> u32,
) {
    let mut prev = 0u32;
    for (slot, e) in scratch.iter_mut().zip(events) {
        let v = field(e);
        *slot = zz32(v.wrapping_sub(prev)) as u64;
        prev = v;
    }
    put_column(out, scratch);
}

/// Encodes `events` (all of one thread) into `out` (cleared first), with `first_ts = events[0].ticks`.
/// `scratch` is reused between calls so the writer does not allocate per chunk.
pub fn encode(events: &[RawEvent], out: &mut Vec<u8>, scratch: &mut Vec<u64>) {
    out.clear();
    let n = events.len();
    // Kind: one plane of raw bytes.
    let any_kind = events.iter().any(|e| e.kind != 0);
    out.push(if any_kind { 1 } else { 0 });
    if any_kind {
        out.extend(events.iter().map(|e| e.kind));
    }
    scratch.clear();
    scratch.resize(n, 0);
    delta_column(events, scratch, out, |e| e.code.get());
    delta_column(events, scratch, out, |e| e.offset.get());
    delta_column(events, scratch, out, |e| e.arg.get());
    let mut prev = events.first().map_or(0, |e| e.ticks.get());
    for (slot, e) in scratch.iter_mut().zip(events) {
        let v = e.ticks.get();
        *slot = zz64(v.wrapping_sub(prev));
        prev = v;
    }
    put_column(out, scratch);
}

/// Why a payload could not be decoded.
pub type DecodeError = String;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// Takes one column's width byte and its planes.
    fn column(&mut self, n: usize, name: &str) -> Result<(u8, &'a [u8]), DecodeError> {
        let w = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| format!("{name} column: missing width byte"))?;
        if !matches!(w, 0 | 1 | 2 | 4 | 8) {
            return Err(format!("{name} column: invalid width {w}"));
        }
        self.pos += 1;
        let len = n * w as usize;
        let planes = self.buf.get(self.pos..self.pos + len).ok_or_else(|| {
            format!(
                "{name} column: needs {len} bytes, {} left",
                self.buf.len() - self.pos
            )
        })?;
        self.pos += len;
        Ok((w, planes))
    }
}

/// Reassembles the values of a column into `dst` (zigzag-encoded, before un-delta).
fn gather(w: u8, planes: &[u8], dst: &mut [u64]) {
    let n = dst.len();
    dst.fill(0);
    for k in 0..w as usize {
        let plane = &planes[k * n..(k + 1) * n];
        let shift = 8 * k;
        for (d, &b) in dst.iter_mut().zip(plane) {
            *d |= (b as u64) << shift;
        }
    }
}

/// Decodes a raw columnar payload of `n` events with first timestamp `first_ts` into `out` (cleared
/// first). Errors describe the first inconsistency; nothing panics on any input.
pub fn decode(
    raw: &[u8],
    n: usize,
    first_ts: u64,
    out: &mut Vec<RawEvent>,
    scratch: &mut Vec<u64>,
) -> Result<(), DecodeError> {
    out.clear();
    let mut cur = Cursor { buf: raw, pos: 0 };
    let (kw, kinds) = cur.column(n, "kind")?;
    if kw > 1 {
        return Err(format!("kind column: width {kw}, expected 0 or 1"));
    }
    let cols = [
        cur.column(n, "code")?,
        cur.column(n, "offset")?,
        cur.column(n, "arg")?,
    ];
    let ticks = cur.column(n, "ticks")?;
    if cur.pos != raw.len() {
        return Err(format!(
            "{} bytes after the last column",
            raw.len() - cur.pos
        ));
    }
    out.resize(n, RawEvent::default());
    for (i, e) in out.iter_mut().enumerate() {
        e.kind = if kw == 1 { kinds[i] } else { 0 };
    }
    scratch.resize(n, 0);
    for (c, (w, planes)) in cols.iter().enumerate() {
        gather(*w, planes, scratch);
        let mut prev = 0u32;
        for (e, &z) in out.iter_mut().zip(scratch.iter()) {
            prev = prev.wrapping_add(unzz32(z as u32));
            let v = U32::new(prev);
            match c {
                0 => e.code = v,
                1 => e.offset = v,
                _ => e.arg = v,
            }
        }
    }
    gather(ticks.0, ticks.1, scratch);
    let mut prev = first_ts;
    for (e, &z) in out.iter_mut().zip(scratch.iter()) {
        prev = prev.wrapping_add(unzz64(z));
        e.ticks = U64::new(prev);
        e.flags = 0;
        e.reserved = U16::new(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_is_its_own_inverse_at_the_edges() {
        for d in [0u32, 1, u32::MAX, i32::MAX as u32, i32::MIN as u32, 12345] {
            assert_eq!(unzz32(zz32(d)), d);
        }
        for d in [0u64, 1, u64::MAX, i64::MAX as u64, i64::MIN as u64] {
            assert_eq!(unzz64(zz64(d)), d);
        }
        assert_eq!(zz32(-4i32 as u32), 7);
        assert_eq!(zz32(4), 8);
    }

    #[test]
    fn round_trip_with_wide_and_wrapping_values() {
        let events = vec![
            RawEvent::new(u64::MAX - 5, 7, 0, 0, 0),
            RawEvent::new(3, u32::MAX, 1 << 31, 9, 18),
            RawEvent::new(1 << 40, 1, 200, u32::MAX, 200),
        ];
        let (mut raw, mut scratch, mut out) = (Vec::new(), Vec::new(), Vec::new());
        encode(&events, &mut raw, &mut scratch);
        decode(&raw, 3, events[0].ticks.get(), &mut out, &mut scratch).unwrap();
        assert_eq!(out, events);
    }

    #[test]
    fn malformed_payloads_are_errors_naming_the_column() {
        let events = vec![RawEvent::new(10, 1, 2, 3, 7); 4];
        let (mut raw, mut scratch, mut out) = (Vec::new(), Vec::new(), Vec::new());
        encode(&events, &mut raw, &mut scratch);
        // kind w=1 ×4, code/offset/arg w=1 ×4, ticks all equal: w=0.
        assert_eq!(raw.len(), 5 * 3 + 5 + 1);
        let mut dec = |bytes: &[u8], n| decode(bytes, n, 10, &mut out, &mut scratch).unwrap_err();
        assert_eq!(
            dec(&raw[..raw.len() - 1], 4),
            "ticks column: missing width byte"
        );
        assert_eq!(dec(&[1, 0, 0], 3), "kind column: needs 3 bytes, 2 left");
        assert_eq!(dec(&[3], 1), "kind column: invalid width 3");
        assert_eq!(dec(&[2, 0, 0], 1), "kind column: width 2, expected 0 or 1");
        let mut long = raw.clone();
        long.push(0);
        assert_eq!(dec(&long, 4), "1 bytes after the last column");
    }
}
