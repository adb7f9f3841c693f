//! CPython's location table (`co_linetable`, 3.11+), which `CodeObject` records store as they are since
//! format 2.0 (FORMAT.md 6.1.1): decoded here into one [`Position`] per code unit, the same values
//! `co_positions()` gives, and encoded for writers that start from positions (tests, synthetic files).

use crate::meta::Position;

const NONE: Position = Position { line: -1, end_line: -1, column: -1, end_column: -1 };

/// Entry codes (bits 3-6 of an entry's first byte), CPython's `_PyCodeLocationInfoKind`.
const ONE_LINE0: u8 = 10;
const NO_COLUMNS: u8 = 13;
const LONG: u8 = 14;
const NO_LOCATION: u8 = 15;

/// The positions of `units` code units from a location table starting at `first_line`. Never panics:
/// a damaged table yields what it encodes up to the damage, and units it does not cover get `-1`s (no
/// position), so the result always has exactly `units` entries.
pub fn decode(table: &[u8], first_line: u32, units: usize) -> Vec<Position> {
    let mut out = Vec::with_capacity(units);
    let mut r = Bytes { b: table, i: 0 };
    let mut line = first_line as i32;
    while out.len() < units {
        let Some(first) = r.next() else { break };
        if first & 0x80 == 0 {
            break; // not the start of an entry: damaged
        }
        let code = (first >> 3) & 15;
        let len = (first & 7) as usize + 1;
        let pos = match code {
            NO_LOCATION => NONE,
            LONG => {
                line = line.wrapping_add(r.svarint());
                let end_line = line.wrapping_add(r.varint() as i32);
                let column = r.varint() as i32 - 1;
                let end_column = r.varint() as i32 - 1;
                Position { line, end_line, column, end_column }
            }
            NO_COLUMNS => {
                line = line.wrapping_add(r.svarint());
                Position { line, end_line: line, column: -1, end_column: -1 }
            }
            ONE_LINE0..=12 => {
                line += (code - ONE_LINE0) as i32;
                let column = r.byte() as i32;
                let end_column = r.byte() as i32;
                Position { line, end_line: line, column, end_column }
            }
            _ => {
                let second = r.byte() as i32;
                let column = (code as i32) << 3 | (second >> 4);
                Position { line, end_line: line, column, end_column: column + (second & 15) }
            }
        };
        let n = len.min(units - out.len());
        out.resize(out.len() + n, pos);
    }
    out.resize(units, NONE);
    out
}

/// A location table for `positions`, starting at `first_line`: one entry per run of equal positions (at
/// most 8 code units each), in the long form, or "no location" where all four values are `-1`. Valid for
/// CPython's decoder and for [`decode`], though not as short as CPython's own encoder makes it.
pub fn encode(positions: &[Position], first_line: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut line = first_line as i32;
    let mut i = 0;
    while i < positions.len() {
        let p = positions[i];
        let mut n = 1;
        while n < 8 && i + n < positions.len() && positions[i + n] == p {
            n += 1;
        }
        if p == NONE {
            out.push(0x80 | NO_LOCATION << 3 | (n - 1) as u8);
        } else {
            out.push(0x80 | LONG << 3 | (n - 1) as u8);
            svarint(&mut out, p.line.wrapping_sub(line));
            varint(&mut out, p.end_line.wrapping_sub(p.line) as u32);
            varint(&mut out, (p.column + 1) as u32);
            varint(&mut out, (p.end_column + 1) as u32);
            line = p.line;
        }
        i += n;
    }
    out
}

/// 6-bit chunks, least significant first, bit 6 set on all but the last.
fn varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 64 {
        out.push((v & 63) as u8 | 64);
        v >>= 6;
    }
    out.push(v as u8);
}

fn svarint(out: &mut Vec<u8>, v: i32) {
    varint(out, if v < 0 { (v.unsigned_abs() << 1) | 1 } else { (v as u32) << 1 });
}

/// A cursor that reads zeros past the end (the caller stops at the next entry byte, which is then missing).
struct Bytes<'a> {
    b: &'a [u8],
    i: usize,
}

impl Bytes<'_> {
    fn next(&mut self) -> Option<u8> {
        let v = self.b.get(self.i).copied();
        self.i += 1;
        v
    }

    fn byte(&mut self) -> u8 {
        self.next().unwrap_or(0)
    }

    fn varint(&mut self) -> u32 {
        let mut read = self.byte();
        let mut v = (read & 63) as u32;
        let mut shift = 0;
        while read & 64 != 0 && shift < 30 {
            read = self.byte();
            shift += 6;
            v |= ((read & 63) as u32) << shift;
        }
        v
    }

    fn svarint(&mut self) -> i32 {
        let u = self.varint();
        if u & 1 != 0 {
            -((u >> 1) as i32)
        } else {
            (u >> 1) as i32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: i32, end_line: i32, column: i32, end_column: i32) -> Position {
        Position { line, end_line, column, end_column }
    }

    /// The table of `def f(x):\n    return x + 1` at line 1 on CPython 3.12: RESUME (no columns),
    /// LOAD_FAST, LOAD_CONST, BINARY_OP (+1 cache unit), RETURN_VALUE, written by CPython's encoder
    /// (short and one-line forms): `f.__code__.co_linetable`.
    #[test]
    fn decodes_cpython_tables() {
        let table = [0x80, 0x00, 0xd8, 0x0b, 0x0c, 0x88, 0x71, 0x89, 0x35, 0x80, 0x4c];
        let got = decode(&table, 1, 6);
        assert_eq!(
            got,
            vec![p(1, 1, 0, 0), p(2, 2, 11, 12), p(2, 2, 15, 16), p(2, 2, 11, 16), p(2, 2, 11, 16), p(2, 2, 4, 16)]
        );
    }

    #[test]
    fn round_trips_every_form_of_position() {
        let ps = vec![
            NONE,
            NONE,
            p(10, 10, -1, -1),
            p(12, 15, 4, 200),
            p(12, 15, 4, 200),
            p(3, 3, 0, 1),
            p(100_000, 100_000, 70_000, 70_001),
            NONE,
            p(-1, -1, 5, 6),
        ];
        let many: Vec<Position> = (0..20).map(|_| p(7, 7, 1, 2)).collect();
        for case in [ps, many, vec![]] {
            assert_eq!(decode(&encode(&case, 5), 5, case.len()), case);
        }
    }

    #[test]
    fn damage_never_panics_and_always_gives_one_position_per_unit() {
        let good = encode(&[p(3, 4, 1, 2), p(9, 9, -1, -1), NONE], 1);
        for cut in 0..good.len() {
            assert_eq!(decode(&good[..cut], 1, 5).len(), 5);
        }
        for flip in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[flip / 8] ^= 1 << (flip % 8);
            assert_eq!(decode(&bad, 1, 5).len(), 5);
        }
        assert_eq!(decode(&[0xff; 64], u32::MAX, 3).len(), 3);
        assert_eq!(decode(&[0xf0, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f], 0, 3).len(), 3);
    }
}
