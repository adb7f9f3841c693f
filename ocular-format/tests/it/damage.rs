//! Damaged input: every truncation, every flipped byte, absurd lengths, foreign files and future versions.
//! The reader must answer each with data or a clear error, never a panic or an unbounded allocation.

use crate::alloc_meter::peak_during;
use crate::util::{chunk_bounds, read_all, reseal, sample_file};
use ocular_format::*;

#[test]
fn truncation_at_every_offset_reads_every_whole_chunk() {
    let (bytes, _) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    let header_end = bounds[0].1;
    for cut in 0..bytes.len() {
        let data = &bytes[..cut];
        read_all_for_fuzzing(data);
        match read_all(data, false) {
            Err(e) => {
                assert!(cut < header_end, "cut {cut}: unexpected error {e}");
                let msg = e.to_string();
                if cut == 0 {
                    assert_eq!(msg, "mem.ocl is truncated at offset 0: the file is empty");
                } else {
                    assert!(msg.starts_with("mem.ocl is truncated at offset "), "cut {cut}: {msg}");
                }
            }
            Ok(all) => {
                assert!(cut >= header_end);
                // Exactly the chunks that end at or before the cut were read.
                let whole = bounds.iter().filter(|(_, end)| *end <= cut).count() as u64;
                assert_eq!(all.report.chunks, whole, "cut {cut}");
                let partial = bounds.iter().find(|(s, e)| *s < cut && cut < *e);
                assert_eq!(all.report.truncated, partial.map(|&(s, _)| (s as u64, (cut - s) as u64)), "cut {cut}");
                assert_eq!(all.report.clean(), cut == bytes.len());
            }
        }
    }
}

#[test]
fn every_flipped_byte_is_detected_strictly_and_contained_in_salvage_mode() {
    let (bytes, _) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    let total = read_all(&bytes, false).unwrap();
    for at in 0..bytes.len() {
        let mut data = bytes.clone();
        data[at] ^= 0x5a;
        read_all_for_fuzzing(&data);
        let strict = read_all(&data, false);
        if (10..16).contains(&at) {
            // The preamble's minor version and reserved flags: any 1.x is read by design.
            assert_eq!(strict.unwrap().event_count(), total.event_count());
            continue;
        }
        let Err(err) = strict.map(|a| a.event_count()) else {
            panic!("flip at {at} went unnoticed; chunks {bounds:?}")
        };
        let err = err.to_string();
        let (cs, ce) = bounds.iter().copied().find(|(s, e)| (*s..*e).contains(&at)).unwrap_or((0, 16));
        if cs >= bounds[0].1 {
            assert!(err.contains(&format!("corrupt chunk at offset {cs}:")), "flip at {at}: {err}");
            // Salvage: only the damaged chunk is lost, and the damage report says where.
            let all = read_all(&data, true).unwrap();
            let lost_events = total.event_count() - all.event_count();
            let chunk_events = u32::from_le_bytes(bytes[cs + 48..cs + 52].try_into().unwrap()) as usize;
            let is_events = bytes[cs + 4] == 2;
            assert_eq!(lost_events, if is_events { chunk_events } else { 0 }, "flip at {at}");
            assert!(
                !all.report.damage.is_empty() && all.report.damage[0].offset == cs as u64,
                "flip at {at}: {:?}",
                all.report.damage
            );
            assert_eq!(all.report.damage[0].len, (ce - cs) as u64, "flip at {at}");
        }
    }
}

#[test]
fn foreign_file_is_named_with_its_first_bytes() {
    let err = read_all(b"PK\x03\x04 this is a zip file, not a trace", false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem.ocl is not an Ocular trace: bytes at offset 0 are 50 4b 03 04 20 74 68 69, expected 89 4f 43 4c 0d 0a 1a 0a"
    );
}

#[test]
fn newer_major_version_asks_for_an_upgrade() {
    let (mut bytes, _) = sample_file(true);
    bytes[8] = 3;
    bytes[10] = 1;
    let err = read_all(&bytes, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "mem.ocl uses .ocl format 3.1, but this Ocular reads formats up to 2.x: upgrade Ocular to read it"
    );
}

#[test]
fn absurd_lengths_are_errors_not_allocations() {
    let (bytes, _) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    let (a, _) = bounds[1];
    // A stored length past the limit: rejected from the header alone.
    let mut huge = bytes[..bounds[1].1].to_vec();
    huge[a + 8..a + 12].copy_from_slice(&u32::MAX.to_le_bytes());
    let err = read_all(&huge, false).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("mem.ocl: corrupt chunk at offset {a}: stored length 4294967295 exceeds the limit of 67108864")
    );
    // A length within the limit (60 MiB) but far past the data: read as a truncated tail, and the memory used
    // follows the data present, not the claim.
    let mut claim = bytes[..bounds[1].1].to_vec();
    claim[a + 8..a + 12].copy_from_slice(&(60u32 << 20).to_le_bytes());
    claim[a + 12..a + 16].copy_from_slice(&(60u32 << 20).to_le_bytes());
    let peak = peak_during(|| {
        let all = read_all(&claim, false).unwrap();
        assert_eq!(all.report.truncated.map(|t| t.0), Some(a as u64));
    });
    assert!(peak < 8 << 20, "peak {peak} bytes for a {}-byte file", claim.len());
    // A count past the limit.
    let mut count = bytes.clone();
    let (e, _) = bounds[3];
    count[e + 48..e + 52].copy_from_slice(&(1u32 << 30).to_le_bytes());
    let err = read_all(&count, false).unwrap_err().to_string();
    assert!(err.ends_with(&format!("offset {e}: count 1073741824 exceeds the limit of 4194304")), "{err}");
}

#[test]
fn a_zstd_frame_larger_than_its_declared_raw_length_is_refused() {
    let (bytes, _) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    let (a, b) = bounds[3];
    let mut c = bytes[a..b].to_vec();
    assert_eq!(c[6], 0x11);
    // Declare a raw length one byte short, re-seal: the CRC is right, the payload is a lie.
    let raw = u32::from_le_bytes(c[12..16].try_into().unwrap());
    c[12..16].copy_from_slice(&(raw - 1).to_le_bytes());
    reseal(&mut c, 3);
    let mut data = bytes[..a].to_vec();
    data.extend(c);
    data.extend(&bytes[b..]);
    let err = read_all(&data, false).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("mem.ocl: corrupt chunk at offset {a}: payload decompresses to {raw} bytes, header says {}", raw - 1)
    );
}

#[test]
fn a_missing_chunk_is_an_error_strictly_and_a_counted_gap_in_salvage() {
    let (bytes, sent) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    let mut data = bytes[..bounds[4].0].to_vec();
    data.extend(&bytes[bounds[4].1..]);
    let err = read_all(&data, false).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("mem.ocl: corrupt chunk at offset {}: chunk sequence number 5 where 4 was expected", bounds[4].0)
    );
    let all = read_all(&data, true).unwrap();
    assert_eq!(all.event_count(), sent[0].1.len() + sent[2].1.len());
    assert!(all.report.damage[0].reason.starts_with("1 chunks missing before this one"), "{:?}", all.report.damage);
    assert!(!all.report.clean());
}

#[test]
fn bytes_after_the_trailer_are_reported() {
    let (mut bytes, _) = sample_file(true);
    let end = bytes.len();
    bytes.extend(b"junk");
    let err = read_all(&bytes, false).unwrap_err().to_string();
    assert_eq!(err, format!("mem.ocl: corrupt chunk at offset {end}: 4 bytes after the trailer"));
    let all = read_all(&bytes, true).unwrap();
    assert_eq!(all.report.damage[0], Damage { offset: end as u64, len: 4, reason: "4 bytes after the trailer".into() });
}

#[test]
fn salvage_resynchronises_after_garbage_in_the_middle() {
    let (bytes, sent) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    let mut data = bytes[..bounds[3].0].to_vec();
    data.extend(std::iter::repeat_n(0xAAu8, 1000));
    data.extend(b"OCCH fake marker inside garbage");
    data.extend(&bytes[bounds[3].0..]);
    let all = read_all(&data, true).unwrap();
    assert_eq!(all.events, sent);
    let d = &all.report.damage[0];
    assert_eq!((d.offset, d.len), (bounds[3].0 as u64, 1000 + 31));
    assert!(d.reason.starts_with("sync marker is aa aa aa aa"), "{}", d.reason);
}

#[test]
fn a_chunk_removed_and_the_rest_renumbered_is_found_by_the_trailers_counts() {
    // GIVEN a file with its second EVENTS chunk cut out and every later chunk renumbered: no sequence gap.
    let (bytes, sent) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    assert_eq!(bytes[bounds[4].0 + 4], 2, "chunk 4 is an EVENTS chunk");
    let mut data = bytes[..bounds[4].0].to_vec();
    for (i, &(a, b)) in bounds[5..].iter().enumerate() {
        let mut c = bytes[a..b].to_vec();
        reseal(&mut c, 4 + i as u64);
        data.extend(c);
    }
    // WHEN it is read, strictly
    let all = read_all(&data, false).unwrap();
    // THEN what is present is read, the trailer's counts are compared with it, and the file is not clean.
    let (counted, read) = (sent.iter().map(|(_, e)| e.len()).sum::<usize>(), sent[0].1.len() + sent[2].1.len());
    assert_eq!(all.event_count(), read);
    assert!(all.trailer.is_some());
    assert!(!all.report.clean());
    let n = bounds.len() - 1;
    // (The sample file's LOST record is said too, after the damage.)
    assert_eq!(
        all.report.warnings("mem.ocl")[..1],
        [format!(
            "mem.ocl: the trailer does not match what the file holds: {counted} events counted, {read} read ({} \
             missing); {n} chunks counted, {} read (1 missing); chunks were removed from the file (or added) after \
             it was written",
            counted - read,
            n - 1
        )]
    );
}

#[test]
fn a_lost_record_removed_is_found_by_the_trailers_counts() {
    let (bytes, _) = sample_file(false);
    let bounds = chunk_bounds(&bytes);
    let lost = bounds.iter().position(|&(a, _)| bytes[a + 4] == 5).unwrap();
    let mut data = bytes[..bounds[lost].0].to_vec();
    for (i, &(a, b)) in bounds[lost + 1..].iter().enumerate() {
        let mut c = bytes[a..b].to_vec();
        reseal(&mut c, (lost + i) as u64);
        data.extend(c);
    }
    let all = read_all(&data, false).unwrap();
    let m = all.report.mismatch.expect("a mismatch");
    assert_eq!((m.trailer_lost, m.read_lost, m.trailer_chunks - m.read_chunks), (17, 0, 1));
    assert!(all.report.warnings("mem.ocl")[0].contains("; 17 lost events counted, 0 read (17 missing);"));
}

/// An EVENTS chunk (FORMAT.md 3.1) with the given codec, count and payload, sealed with a right CRC.
fn events_chunk(seq: u64, codec: u8, count: u32, raw_len: usize, payload: &[u8]) -> Vec<u8> {
    let mut c = vec![0u8; 56];
    c[..4].copy_from_slice(b"OCCH");
    c[4..6].copy_from_slice(&2u16.to_le_bytes());
    c[6] = codec;
    c[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    c[12..16].copy_from_slice(&(raw_len as u32).to_le_bytes());
    c[16..24].copy_from_slice(&100u64.to_le_bytes());
    c[32..48].copy_from_slice(&[0x10, 0x27, 0, 0, 0, 0, 0, 0, 0x10, 0x27, 0, 0, 0, 0, 0, 0]);
    c[48..52].copy_from_slice(&count.to_le_bytes());
    c.extend_from_slice(payload);
    reseal(&mut c, seq);
    c
}

#[test]
fn chunks_claiming_more_events_than_their_bytes_can_hold_are_refused_before_decoding() {
    // GIVEN a small file of chunks that claim 4 M events each: a columnar payload whose columns all have
    // width 0 (10 bytes say "4 M identical events"), and raw records that zstd squeezes 96 MB into a few KB.
    let (bytes, _) = sample_file(true);
    let bounds = chunk_bounds(&bytes);
    let n = 1u32 << 22;
    let columnar = [1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let zeros = zstd::bulk::compress(&vec![0u8; 24 * n as usize], 19).unwrap();
    for (codec, raw_len, payload, limit) in [(0x10, columnar.len(), &columnar[..], "10"), (0x01, 24 << 22, &zeros, "")]
    {
        let mut data = bytes[..bounds[3].0].to_vec();
        let at = data.len();
        for seq in 3..40 {
            data.extend(events_chunk(seq, codec, n, raw_len, payload));
        }
        // WHEN it is read, THEN the first chunk is refused from its header, strictly ...
        let err = read_all(&data, false).unwrap_err().to_string();
        let stored = payload.len();
        assert_eq!(
            err,
            format!(
                "mem.ocl: corrupt chunk at offset {at}: EVENTS chunk claims {n} events in {stored} stored bytes, more \
                 than the 64 per byte a reader decodes"
            ),
            "{limit}"
        );
        // ... and in salvage mode every one is skipped without decoding an event.
        let all = read_all(&data, true).unwrap();
        assert_eq!(all.report.events, 0);
        assert!(all.report.damage[0].reason.starts_with("EVENTS chunk claims 4194304 events in"), "{:?}", all.report);
    }
    // A raw length that does not follow from the count is refused before decompressing.
    let mut data = bytes[..bounds[3].0].to_vec();
    data.extend(events_chunk(3, 0x11, 64, 256 << 20, &zeros));
    let err = read_all(&data, false).unwrap_err().to_string();
    assert!(
        err.ends_with(&format!(
            "columnar EVENTS chunk of 64 events has raw length {}, more than the 2634 it can take",
            256 << 20
        )),
        "{err}"
    );
}

#[test]
fn a_damaged_cfunc_chunk_is_an_error_naming_it_and_never_a_panic() {
    // The 2.7 fixture: its CFUNC chunk (FORMAT.md 6.11) cut and flipped everywhere, then made undecodable
    // under a valid CRC.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/v2.7/synthetic.ocl");
    let bytes = std::fs::read(path).unwrap();
    for cut in 0..bytes.len() {
        read_all_for_fuzzing(&bytes[..cut]);
    }
    for at in 0..bytes.len() {
        let mut data = bytes.clone();
        data[at] ^= 0x5a;
        read_all_for_fuzzing(&data);
    }
    let bounds = chunk_bounds(&bytes);
    let &(s, e) = bounds.iter().find(|(s, _)| bytes[s + 4..s + 6] == [0x0c, 0x00]).expect("a CFUNC chunk");
    let mut data = bytes.clone();
    data[s + 56..e].fill(0xff); // a varint that never ends, or not a zstd frame
    let seq = u64::from_le_bytes(bytes[s + 24..s + 32].try_into().unwrap());
    reseal(&mut data[s..e], seq);
    let err = read_all(&data, false).unwrap_err().to_string();
    assert!(err.contains(&format!("corrupt chunk at offset {s}:")), "{err}");
    let all = read_all(&data, true).unwrap();
    assert_eq!(all.report.damage[0].offset, s as u64);
    assert_eq!(all.event_count(), read_all(&bytes, false).unwrap().event_count());
    assert!(all.cfuncs.is_empty());
}
