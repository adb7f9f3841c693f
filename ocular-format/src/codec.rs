//! Columnar v1 and v2 (FORMAT.md 5.2): the transform that makes event buffers compress to under a byte per
//! event. It runs on the writer's background thread, never on the recording thread.
//!
//! Each event is a *location* (kind, code, offset, arg; v2 adds flags and reserved) and a time. A buffer visits few distinct
//! locations, over and over, and a location's block costs about the same each time it runs. So:
//!
//! ```text
//!   dictionary: the distinct locations in first-seen order, as columns
//!               kind | zz(Δcode) | zz(Δoffset) | zz(Δarg) [| flags + reserved << 8, v2 only]
//!   events:     location index | zz(Δticks − previous Δticks at the same location)
//!   each column:  [w] plane0 plane1 … plane(w-1)     w ∈ {0,1,2,4,8}
//!   plane k = byte k (little-endian) of every value, so high planes are long runs of zeros
//! ```

use crate::event::RawEvent;
use rustc_hash::FxHashMap;
use zerocopy::little_endian::U64;

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

fn delta_column(dict: &[RawEvent], scratch: &mut Vec<u64>, out: &mut Vec<u8>, field: impl Fn(&RawEvent) -> u32) {
    scratch.clear();
    let mut prev = 0u32;
    scratch.extend(dict.iter().map(|e| {
        let v = field(e);
        let z = zz32(v.wrapping_sub(prev)) as u64;
        prev = v;
        z
    }));
    put_column(out, scratch);
}

/// A location: kind, code, offset, arg, and `flags | reserved << 8`.
type Key = (u8, u32, u32, u32, u32);

/// The `flags` and `reserved` fields of an event as one value (the v2 dictionary's extra column).
#[inline(always)]
fn extra(e: &RawEvent) -> u32 {
    e.flags as u32 | (e.reserved.get() as u32) << 8
}

/// A new location in the dictionary; its position.
#[inline(always)]
fn add_location(dict: &mut Vec<RawEvent>, last: &mut Vec<u64>, key: Key) -> u32 {
    let mut d = RawEvent::new(0, key.1, key.2, key.3, key.0);
    d.flags = key.4 as u8;
    d.reserved.set((key.4 >> 8) as u16);
    dict.push(d);
    last.push(0);
    dict.len() as u32 - 1
}

/// Slots of the encoder's direct-mapped location cache, at most: a chunk of fewer events uses fewer (a
/// power of two, twice its events, at least 64), so that a small chunk does not clear 24 KiB of them (a thread
/// per request writes a chunk of a few hundred events per thread, and clearing took as long as encoding).
/// The cache only saves lookups in the index: what is encoded does not depend on its size.
const RECENT: usize = 1024;

/// Reusable state of the encoder, so the writer does not allocate per chunk.
#[derive(Debug, Default)]
pub struct Encoder {
    index: FxHashMap<Key, u32>,
    /// Direct-mapped cache in front of `index`: most events hit a location seen a few events ago, and a
    /// slot compare is several times cheaper than a hash-map probe. Entries are `(key, location + 1)`, 0
    /// meaning empty. For a chunk of at most half its size, the whole index instead (linear probing).
    recent: Vec<(Key, u32)>,
    dict: Vec<RawEvent>,
    locs: Vec<u64>,
    ticks: Vec<u64>,
    last: Vec<u64>,
    scratch: Vec<u64>,
}

impl Encoder {
    /// Encodes `events` (all of one thread, in order) into `out` (cleared first). Returns the version
    /// used: 1, or 2 when an event's `flags` or `reserved` is not zero (v1 does not store them).
    pub fn encode(&mut self, events: &[RawEvent], out: &mut Vec<u8>) -> u8 {
        self.encode_with(events, out, true)
    }

    /// [`Encoder::encode`]; `whole_table` false keeps even a small chunk's locations in the index (the tests
    /// hold the two ways to the same bytes).
    fn encode_with(&mut self, events: &[RawEvent], out: &mut Vec<u8>, whole_table: bool) -> u8 {
        out.clear();
        // A map grown by a large chunk is cleared at its whole capacity: made anew for a much smaller one.
        if self.index.capacity() >= 16 * events.len().max(RECENT) {
            self.index = FxHashMap::default();
        }
        self.index.clear();
        self.dict.clear();
        self.locs.clear();
        self.ticks.clear();
        self.last.clear();
        let mut prev_ticks = events.first().map_or(0, |e| e.ticks.get());
        let recent = (2 * events.len()).next_power_of_two().clamp(64, RECENT);
        self.recent.clear();
        self.recent.resize(recent, ((0, 0, 0, 0, 0), 0));
        let mut extras = 0u32;
        // A chunk of at most half as many events as the table has slots (a short thread's, or a request
        // thread's last buffer) has fewer locations than that too: the table holds every one of them, probed
        // on from its slot, and the index is not used. Many of such a chunk's locations are new in it, and a
        // hash-map insert each is dear: 400 events at 200 locations took 5.8 us with the index, 4.1 without.
        let whole = whole_table && 2 * events.len() <= recent;
        for e in events {
            let key = (e.kind, e.code.get(), e.offset.get(), e.arg.get(), extra(e));
            extras |= key.4;
            let h = (key.2.wrapping_mul(0x9e37_79b1) ^ key.1.wrapping_mul(0x85eb_ca77) ^ key.3 ^ key.4 ^ key.0 as u32)
                as usize;
            let mut at = (h ^ (h >> 10)) & (recent - 1);
            if whole {
                while self.recent[at].1 != 0 && self.recent[at].0 != key {
                    at = (at + 1) & (recent - 1);
                }
            }
            let slot = &mut self.recent[at];
            let loc = if slot.1 != 0 && slot.0 == key {
                slot.1 - 1
            } else if whole {
                let loc = add_location(&mut self.dict, &mut self.last, key);
                *slot = (key, loc + 1);
                loc
            } else {
                let (dict, last) = (&mut self.dict, &mut self.last);
                let loc = *self.index.entry(key).or_insert_with(|| add_location(dict, last, key));
                *slot = (key, loc + 1);
                loc
            };
            let t = e.ticks.get();
            let delta = t.wrapping_sub(prev_ticks);
            prev_ticks = t;
            let predicted = std::mem::replace(&mut self.last[loc as usize], delta);
            self.locs.push(loc as u64);
            self.ticks.push(zz64(delta.wrapping_sub(predicted)));
        }
        out.extend_from_slice(&(self.dict.len() as u32).to_le_bytes());
        self.scratch.clear();
        self.scratch.extend(self.dict.iter().map(|e| e.kind as u64));
        put_column(out, &self.scratch);
        delta_column(&self.dict, &mut self.scratch, out, |e| e.code.get());
        delta_column(&self.dict, &mut self.scratch, out, |e| e.offset.get());
        delta_column(&self.dict, &mut self.scratch, out, |e| e.arg.get());
        if extras != 0 {
            self.scratch.clear();
            self.scratch.extend(self.dict.iter().map(|e| extra(e) as u64));
            put_column(out, &self.scratch);
        }
        put_column(out, &self.locs);
        put_column(out, &self.ticks);
        if extras != 0 {
            2
        } else {
            1
        }
    }
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
        let w = *self.buf.get(self.pos).ok_or_else(|| format!("{name} column: missing width byte"))?;
        if !matches!(w, 0 | 1 | 2 | 4 | 8) {
            return Err(format!("{name} column: invalid width {w}"));
        }
        self.pos += 1;
        let len = n * w as usize;
        let planes = self
            .buf
            .get(self.pos..self.pos + len)
            .ok_or_else(|| format!("{name} column: needs {len} bytes, {} left", self.buf.len() - self.pos))?;
        self.pos += len;
        Ok((w, planes))
    }
}

/// Reassembles the values of a column into `dst` (before any un-delta).
fn gather(w: u8, planes: &[u8], dst: &mut Vec<u64>, n: usize) {
    gather_range(w, planes, n, 0..n, dst);
}

/// Reassembles values `range` of a column of `n` values into `dst`.
fn gather_range(w: u8, planes: &[u8], n: usize, range: std::ops::Range<usize>, dst: &mut Vec<u64>) {
    dst.clear();
    match w {
        0 => dst.resize(range.len(), 0),
        _ => {
            dst.extend(planes[range.clone()].iter().map(|&b| b as u64));
            for k in 1..w as usize {
                let shift = 8 * k;
                for (d, &b) in dst.iter_mut().zip(&planes[k * n + range.start..k * n + range.end]) {
                    *d |= (b as u64) << shift;
                }
            }
        }
    }
}

/// Events decoded per block: the block's locations and residuals stay in the L1/L2 cache between being
/// gathered and being used, instead of a chunk's worth (1 MiB) going out to memory and back.
const BLOCK: usize = 4096;

/// Reusable state of the decoder.
#[derive(Debug, Default)]
pub struct Decoder {
    dict: Vec<RawEvent>,
    last: Vec<u64>,
    a: Vec<u64>,
    b: Vec<u64>,
}

impl Decoder {
    /// Decodes a raw payload of columnar `version` (1 or 2) of `n` events whose first timestamp is
    /// `first_ts` into `out` (cleared first). Errors describe the first inconsistency; nothing panics on
    /// any input.
    pub fn decode(
        &mut self,
        raw: &[u8],
        version: u8,
        n: usize,
        first_ts: u64,
        out: &mut Vec<RawEvent>,
    ) -> Result<(), DecodeError> {
        out.clear();
        let m = raw.get(..4).ok_or("missing dictionary size")?;
        let m = u32::from_le_bytes(m.try_into().expect("4 bytes")) as usize;
        if m > n {
            return Err(format!("dictionary of {m} locations for {n} events"));
        }
        let mut cur = Cursor { buf: raw, pos: 4 };
        let kinds = cur.column(m, "dictionary kind")?;
        if kinds.0 > 1 {
            return Err(format!("dictionary kind column: width {}, expected 0 or 1", kinds.0));
        }
        let fields =
            [cur.column(m, "dictionary code")?, cur.column(m, "dictionary offset")?, cur.column(m, "dictionary arg")?];
        let extras = if version >= 2 { Some(cur.column(m, "dictionary flags")?) } else { None };
        if let Some((w, _)) = extras {
            if w > 4 {
                return Err(format!("dictionary flags column: width {w}, expected at most 4"));
            }
        }
        let locs = cur.column(n, "location")?;
        let ticks = cur.column(n, "ticks")?;
        if cur.pos != raw.len() {
            return Err(format!("{} bytes after the last column", raw.len() - cur.pos));
        }

        self.dict.clear();
        self.dict.resize(m, RawEvent::default());
        gather(kinds.0, kinds.1, &mut self.a, m);
        for (d, &k) in self.dict.iter_mut().zip(&self.a) {
            d.kind = k as u8;
        }
        for (f, (w, planes)) in fields.iter().enumerate() {
            gather(*w, planes, &mut self.a, m);
            let mut prev = 0u32;
            for (d, &z) in self.dict.iter_mut().zip(&self.a) {
                prev = prev.wrapping_add(unzz32(z as u32));
                match f {
                    0 => d.code.set(prev),
                    1 => d.offset.set(prev),
                    _ => d.arg.set(prev),
                }
            }
        }
        if let Some((w, planes)) = extras {
            gather(w, planes, &mut self.a, m);
            for (d, &x) in self.dict.iter_mut().zip(&self.a) {
                if x >> 24 != 0 {
                    return Err(format!("dictionary flags column: value {x:#x} wider than flags and reserved"));
                }
                d.flags = x as u8;
                d.reserved.set((x >> 8) as u16);
            }
        }

        self.last.clear();
        self.last.resize(m, 0);
        out.reserve(n);
        let mut t = first_ts;
        for start in (0..n).step_by(BLOCK) {
            let range = start..(start + BLOCK).min(n);
            gather_range(locs.0, locs.1, n, range.clone(), &mut self.a);
            gather_range(ticks.0, ticks.1, n, range, &mut self.b);
            if let Some(bad) = self.a.iter().position(|&l| l >= m as u64) {
                let loc = self.a[bad];
                out.clear();
                return Err(format!("event {} refers to location {loc} of {m}", start + bad));
            }
            for (&loc, &z) in self.a.iter().zip(&self.b) {
                let loc = loc as usize;
                let delta = self.last[loc].wrapping_add(unzz64(z));
                self.last[loc] = delta;
                t = t.wrapping_add(delta);
                let mut e = self.dict[loc];
                e.ticks = U64::new(t);
                out.push(e);
            }
        }
        Ok(())
    }
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
    fn a_reused_encoder_encodes_each_chunk_as_a_fresh_one_does() {
        // The writer's one encoder takes chunks of every size: its location cache is sized by the chunk and
        // its index made anew after a much larger one, which must not change a byte.
        let chunk = |n: u32, keys: u32| -> Vec<RawEvent> {
            (0..n)
                .map(|i| RawEvent::new(100 + 7 * i as u64, i % keys, (i * 2) % (keys + 3), 0, (1 + i % 3) as u8))
                .collect()
        };
        let chunks = [chunk(300, 40), chunk(40_000, 20_000), chunk(5, 5), chunk(2_000, 600), chunk(300, 40)];
        let mut reused = Encoder::default();
        let (mut a, mut b, mut out) = (Vec::new(), Vec::new(), Vec::new());
        for c in &chunks {
            reused.encode(c, &mut a);
            Encoder::default().encode(c, &mut b);
            assert_eq!(a, b, "a chunk of {} events", c.len());
            Decoder::default().decode(&a, 1, c.len(), c[0].ticks.get(), &mut out).unwrap();
            assert_eq!(&out, c);
        }
    }

    #[test]
    fn a_small_chunk_in_the_whole_table_encodes_as_the_index_would() {
        // Every size up to half the table's largest, with few locations (most events a repeat) and with
        // every event a new one (probing runs over many taken slots), flags set on some (the v2 column):
        // the same bytes either way, and they decode back.
        let mut next = crate::testing::xorshift(0x2545_f491_4f6c_dd1d);
        let (mut a, mut b, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let mut enc = Encoder::default();
        for n in (1..=RECENT / 2).step_by(7).chain([RECENT / 2 - 1, RECENT / 2, RECENT / 2 + 1]) {
            for keys in [3, n as u64] {
                let mut t = 1_000;
                let events: Vec<RawEvent> = (0..n)
                    .map(|_| {
                        let k = next() % keys;
                        t += next() % 500;
                        let mut e = RawEvent::new(t, (k % 97) as u32, (k * 2) as u32, (k / 97) as u32, (k % 5) as u8);
                        e.flags = u8::from(k % 11 == 0);
                        e
                    })
                    .collect();
                let version = enc.encode(&events, &mut a);
                assert_eq!(Encoder::default().encode_with(&events, &mut b, false), version);
                assert_eq!(a, b, "{n} events, {keys} locations");
                Decoder::default().decode(&a, version, n, events[0].ticks.get(), &mut out).unwrap();
                assert_eq!(out, events);
            }
        }
    }

    #[test]
    fn round_trip_with_wide_and_wrapping_values() {
        let events = vec![
            RawEvent::new(u64::MAX - 5, 7, 0, 0, 0),
            RawEvent::new(3, u32::MAX, 1 << 31, 9, 18),
            RawEvent::new(1 << 40, 1, 200, u32::MAX, 200),
            RawEvent::new(1 << 41, 7, 0, 0, 0),
        ];
        let mut raw = Vec::new();
        let mut out = Vec::new();
        assert_eq!(Encoder::default().encode(&events, &mut raw), 1);
        Decoder::default().decode(&raw, 1, 4, events[0].ticks.get(), &mut out).unwrap();
        assert_eq!(out, events);
    }

    #[test]
    fn flags_and_reserved_make_version_2_and_round_trip() {
        let mut events = vec![RawEvent::new(5, 1, 2, 0, 0), RawEvent::new(9, 1, 2, 0x1234_5678, 3)];
        events[1].flags = 0x0b;
        events[1].reserved.set(0x7f01);
        let (mut raw, mut out) = (Vec::new(), Vec::new());
        assert_eq!(Encoder::default().encode(&events, &mut raw), 2);
        Decoder::default().decode(&raw, 2, 2, 5, &mut out).unwrap();
        assert_eq!(out, events);
        // The extra column: width 4, values 0 and 0x7f010b in byte planes, after the arg column.
        // m (4 bytes), then kind, code and offset columns of w=1 (3 bytes each), arg of w=4 (9 bytes).
        let at = 4 + 3 + 3 + 3 + 9;
        assert_eq!(&raw[at..at + 9], [4, 0, 0x0b, 0, 0x01, 0, 0x7f, 0, 0]);
        let mut v1 = Vec::new();
        assert_eq!(Encoder::default().encode(&events[..1], &mut v1), 1);
        assert_eq!(
            Decoder::default().decode(&raw, 1, 2, 5, &mut out).unwrap_err(),
            "3 bytes after the last column",
            "read as v1, the extra column is misread and the payload does not end where it should"
        );
    }

    #[test]
    fn malformed_payloads_are_errors_naming_the_column() {
        let events = vec![RawEvent::new(10, 1, 2, 3, 7); 4];
        let (mut raw, mut out) = (Vec::new(), Vec::new());
        assert_eq!(Encoder::default().encode(&events, &mut raw), 1);
        // m=1; dictionary kind/code/offset/arg w=1 ×1; location all 0: w=0; ticks all equal: w=0.
        assert_eq!(raw, [1, 0, 0, 0, 1, 7, 1, 2, 1, 4, 1, 6, 0, 0]);
        let mut d = Decoder::default();
        let mut dec = |bytes: &[u8], n| d.decode(bytes, 1, n, 10, &mut out).unwrap_err();
        assert_eq!(dec(&raw[..raw.len() - 1], 4), "ticks column: missing width byte");
        assert_eq!(dec(&[2, 0, 0, 0, 1, 0], 3), "dictionary kind column: needs 2 bytes, 1 left");
        assert_eq!(dec(&[1, 0, 0, 0, 3], 1), "dictionary kind column: invalid width 3");
        assert_eq!(dec(&[9, 0, 0, 0], 3), "dictionary of 9 locations for 3 events");
        assert_eq!(dec(&[1, 0], 3), "missing dictionary size");
        let mut long = raw.clone();
        long.push(0);
        assert_eq!(dec(&long, 4), "1 bytes after the last column");
        let bad_loc = [1, 0, 0, 0, 1, 7, 1, 2, 1, 4, 1, 6, 1, 0, 1, 0, 0, 0];
        assert_eq!(dec(&bad_loc, 4), "event 1 refers to location 1 of 1");
    }
}
