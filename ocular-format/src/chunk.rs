//! The preamble and chunk header (FORMAT.md sections 2 and 3).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The file magic: `\x89OCL\r\n\x1a\n`.
pub const MAGIC: [u8; 8] = *b"\x89OCL\r\n\x1a\n";
/// Format major version this crate writes and the newest it reads.
pub const MAJOR: u16 = 2;
/// Format minor version this crate writes.
pub const MINOR: u16 = 13;
/// The chunk sync marker.
pub const SYNC: [u8; 4] = *b"OCCH";

/// Largest stored payload a reader accepts (64 MiB).
pub const MAX_STORED_LEN: u32 = 64 << 20;
/// Largest decompressed payload a reader accepts (256 MiB).
pub const MAX_RAW_LEN: u32 = 256 << 20;
/// Most events in one EVENTS chunk (2^22).
pub const MAX_CHUNK_EVENTS: u32 = 1 << 22;
/// Most records in one metadata chunk.
pub const MAX_CHUNK_RECORDS: u32 = 1 << 20;
/// Most events an EVENTS chunk may claim per stored byte (FORMAT.md 3.1), so that a reader's work follows the
/// bytes it has rather than what a header claims.
pub const MAX_EVENTS_PER_STORED_BYTE: u64 = 64;

/// The 16-byte preamble at offset 0.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Preamble {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// Format major version.
    pub major: U16,
    /// Format minor version.
    pub minor: U16,
    /// Reserved, 0.
    pub flags: U32,
}
const _: () = assert!(std::mem::size_of::<Preamble>() == 16);

/// The 56-byte header in front of every chunk.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ChunkHeader {
    /// [`SYNC`].
    pub sync: [u8; 4],
    /// Chunk kind, see [`kind`].
    pub kind: U16,
    /// Codec byte, see [`codec`].
    pub codec: u8,
    /// Reserved, 0.
    pub flags: u8,
    /// Bytes of payload following the header, in bytes.
    pub stored_len: U32,
    /// Payload bytes after decompression.
    pub raw_len: U32,
    /// Native thread id, 0 for file-wide chunks.
    pub thread_id: U64,
    /// Chunk sequence number, from 0.
    pub seq: U64,
    /// Ticks of the first event (EVENTS, LOST), else 0.
    pub first_ts: U64,
    /// Ticks of the last event (EVENTS, LOST), else 0.
    pub last_ts: U64,
    /// Events or records in the payload.
    pub count: U32,
    /// CRC-32 of header bytes 0..52 and the stored payload.
    pub crc32: U32,
}
/// Size of [`ChunkHeader`] in bytes.
pub const CHUNK_HEADER_LEN: usize = 56;
const _: () = assert!(std::mem::size_of::<ChunkHeader>() == CHUNK_HEADER_LEN);

/// The chunks laid end to end in `bytes` as a writer wrote them (a copy of a trace's chunks, not a file to
/// check: the reader does that): each one's header and its whole bytes, header included. A chunk cut off
/// at the end is given as far as it goes.
pub fn chunks(bytes: &[u8]) -> impl Iterator<Item = (ChunkHeader, &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let head = bytes.get(at..at.checked_add(CHUNK_HEADER_LEN)?)?;
        let (header, _) = ChunkHeader::read_from_prefix(head).ok()?;
        let end = at.saturating_add(CHUNK_HEADER_LEN).saturating_add(header.stored_len.get() as usize).min(bytes.len());
        let chunk = &bytes[at..end];
        at = end;
        Some((header, chunk))
    })
}

impl ChunkHeader {
    /// The CRC this header should carry for `payload`.
    pub fn compute_crc(&self, payload: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&self.as_bytes()[..CHUNK_HEADER_LEN - 4]);
        h.update(payload);
        h.finalize()
    }

    /// Checks the fields that can be judged without the payload; the error says which one is wrong.
    pub fn sanity(&self) -> Result<(), String> {
        if self.sync != SYNC {
            return Err(format!("sync marker is {}, expected {}", hex(&self.sync), hex(&SYNC)));
        }
        let (stored, raw, count) = (self.stored_len.get(), self.raw_len.get(), self.count.get());
        if stored > MAX_STORED_LEN {
            return Err(format!("stored length {stored} exceeds the limit of {MAX_STORED_LEN}"));
        }
        if raw > MAX_RAW_LEN {
            return Err(format!("raw length {raw} exceeds the limit of {MAX_RAW_LEN}"));
        }
        let limit = if self.kind.get() == kind::EVENTS { MAX_CHUNK_EVENTS } else { MAX_CHUNK_RECORDS };
        if count > limit {
            return Err(format!("count {count} exceeds the limit of {limit}"));
        }
        if self.codec & 0x0f == codec::NONE && stored != raw {
            return Err(format!("uncompressed chunk has stored length {stored} != raw length {raw}"));
        }
        if self.kind.get() == kind::EVENTS {
            // 2026-11-26: work bounded by the bytes stored (FORMAT.md 3.1, "Work follows the bytes"): a 77 KB
            // file of chunks claiming 4 M events each made `info` decode for 27 s.
            let (stored, raw, count) = (stored as u64, raw as u64, count as u64);
            if count > MAX_EVENTS_PER_STORED_BYTE * stored {
                return Err(format!(
                    "EVENTS chunk claims {count} events in {stored} stored bytes, more than the \
                     {MAX_EVENTS_PER_STORED_BYTE} per byte a reader decodes"
                ));
            }
            match self.codec >> 4 {
                0 if raw != 24 * count => {
                    return Err(format!("raw EVENTS chunk of {count} events has raw length {raw}, not {}", 24 * count));
                }
                1 if raw > 10 + 41 * count => {
                    return Err(format!(
                        "columnar EVENTS chunk of {count} events has raw length {raw}, more than the {} it can take",
                        10 + 41 * count
                    ));
                }
                2 if raw > 11 + 45 * count => {
                    return Err(format!(
                        "columnar v2 EVENTS chunk of {count} events has raw length {raw}, more than the {} it can take",
                        11 + 45 * count
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Chunk kinds (FORMAT.md 3.2).
pub mod kind {
    /// File header.
    pub const HEADER: u16 = 0x0001;
    /// Events of one thread.
    pub const EVENTS: u16 = 0x0002;
    /// Code objects.
    pub const CODE: u16 = 0x0003;
    /// A thread's name.
    pub const THREAD: u16 = 0x0004;
    /// Dropped events.
    pub const LOST: u16 = 0x0005;
    /// Specialized bytecode snapshots.
    pub const SNAPSHOT: u16 = 0x0006;
    /// The recorder's cost per event kind (since 1.1).
    pub const CALIBRATION: u16 = 0x0007;
    /// The recording's ring file (since 2.3, RING.md).
    pub const RING: u16 = 0x0008;
    /// Events a flight recorder overwrote (since 2.4).
    pub const DROPPED: u16 = 0x0009;
    /// Performance counter samples (since 2.5).
    pub const COUNTERS: u16 = 0x000A;
    /// The run of several processes a file belongs to (since 2.6).
    pub const PROCESS: u16 = 0x000B;
    /// C callables called (since 2.7).
    pub const CFUNC: u16 = 0x000C;
    /// Clean close.
    pub const TRAILER: u16 = 0x00FF;

    /// A readable name for a kind number.
    pub fn name(kind: u16) -> &'static str {
        match kind {
            HEADER => "HEADER",
            EVENTS => "EVENTS",
            CODE => "CODE",
            THREAD => "THREAD",
            LOST => "LOST",
            SNAPSHOT => "SNAPSHOT",
            CALIBRATION => "CALIBRATION",
            RING => "RING",
            DROPPED => "DROPPED",
            COUNTERS => "COUNTERS",
            PROCESS => "PROCESS",
            CFUNC => "CFUNC",
            TRAILER => "TRAILER",
            _ => "UNKNOWN",
        }
    }
}

/// Codec byte values (FORMAT.md 3.3): compression in bits 0-3, transform in bits 4-7.
pub mod codec {
    /// No compression.
    pub const NONE: u8 = 0x00;
    /// zstd compression.
    pub const ZSTD: u8 = 0x01;
    /// Columnar delta v1 transform (EVENTS only).
    pub const COLUMNAR: u8 = 0x10;
    /// Columnar delta v2 transform (EVENTS only, since 2.8): v1 plus the events' `flags` and `reserved`.
    pub const COLUMNAR_V2: u8 = 0x20;
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    fn chunk(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut h = ChunkHeader::new_zeroed();
        h.sync = SYNC;
        h.kind = kind.into();
        h.stored_len = (payload.len() as u32).into();
        [h.as_bytes(), payload].concat()
    }

    #[test]
    fn chunks_splits_what_a_writer_laid_end_to_end_and_gives_a_cut_one_as_far_as_it_goes() {
        let (a, b, c) = (chunk(kind::EVENTS, &[1; 10]), chunk(kind::SNAPSHOT, &[]), chunk(kind::CODE, &[3; 40]));
        let bytes = [&a[..], &b[..], &c[..c.len() - 15]].concat();
        let got: Vec<(u16, &[u8])> = chunks(&bytes).map(|(h, bytes)| (h.kind.get(), bytes)).collect();
        assert_eq!(got, vec![(kind::EVENTS, &a[..]), (kind::SNAPSHOT, &b[..]), (kind::CODE, &c[..c.len() - 15])]);
        // A tail shorter than a header is no chunk.
        assert_eq!(chunks(&bytes[..a.len() + 20]).count(), 1);
    }
}
