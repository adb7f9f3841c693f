//! Frozen files, one per format version, read by this test forever. Never regenerate them: a reader
//! change that breaks this test breaks every user's old traces.

use crate::util::read_all;

fn fixture(rel: &str) -> Vec<u8> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/");
    std::fs::read(format!("{path}{rel}")).unwrap_or_else(|e| panic!("{path}{rel}: {e}"))
}

/// The content every synthetic fixture holds (`make_fixture` wrote each in its version's layout).
fn check_synthetic(bytes: &[u8], version: (u16, u16)) {
    let r = ocular_format::Reader::new(std::io::Cursor::new(bytes), "fixture", Default::default()).unwrap();
    let h = r.header();
    assert_eq!(r.version(), version);
    assert_eq!((h.python_version.as_str(), h.python_hexversion, h.pid), ("3.12.1", 0x030c01f0, 4242));
    assert_eq!(h.options.mode, ocular_format::Mode::Adaptive);
    assert_eq!(h.options.exclude, ["threading"]);
    assert_eq!(h.opcodes.name(194), "FOR_ITER_RANGE");
    assert_eq!(h.opcodes.base[194], 93);
    assert_eq!(h.ticks_per_second, 3.0e9);

    let all = read_all(bytes, false).unwrap();
    assert!(all.report.clean());
    let per_thread: Vec<(u64, usize)> = all.events.iter().map(|(t, e)| (*t, e.len())).collect();
    // Since 2.2 the fixture also has a window, its stack and a return in it (FORMAT.md 5.3).
    let windows = version >= (2, 2);
    if version >= (2, 13) {
        // Since 2.13 also a span around a call of `main` (FORMAT.md 5.9).
        assert_eq!(per_thread.len(), 9);
        let s = &all.events[8].1;
        let mut marks = ocular_format::span::Marks::default();
        let mut got: Vec<_> = s.iter().filter_map(|e| marks.push(e)).collect();
        got.extend(marks.finish());
        let [ocular_format::span::Mark::Begin { key: 1, ticks: 300_000, record: Some(b) }, ocular_format::span::Mark::End { key: 1, ticks: 302_500, record: Some(e) }] =
            &got[..]
        else {
            panic!("{got:?}")
        };
        assert_eq!(
            (b.name.as_str(), b.trace_id.len(), b.span_id[0], b.attributes[0].value.as_str()),
            ("GET /orders", 16, 17, "/orders")
        );
        assert_eq!((e.status, e.message.as_str()), (2, "KeyError: 42"));
        assert_eq!(format!("{:?}", s[0]), "SPAN ticks=300000 code=0 offset=0 arg=1");
    }
    if version >= (2, 10) {
        // Since 2.10 also windows with their due moments (FORMAT.md 5.7) and a counted call (5.8).
        assert_eq!(
            per_thread[..8],
            [(1001, 43), (1002, 27), (1001, 13), (1001, 3), (1001, 6), (1001, 4), (1001, 4), (1001, 10)]
        );
        let d = &all.events[7].1;
        assert_eq!(format!("{:?}", d[0]), "COUNT ticks=110000 code=1 offset=0 arg=0");
        assert_eq!(format!("{:?}", d[2]), "DUE ticks=200000 code=0 offset=2 arg=1");
        assert_eq!(format!("{:?}", d[3]), "DUE_STACK ticks=200000 code=1 offset=0 arg=0");
        assert_eq!(format!("{:?}", d[6]), "DUE ticks=200000 code=0 offset=1 arg=1");
    } else if version >= (2, 9) {
        // Since 2.9 also a recorder pause (FORMAT.md 5.6) in a call of `main`.
        assert_eq!(per_thread, [(1001, 43), (1002, 27), (1001, 13), (1001, 3), (1001, 6), (1001, 4), (1001, 4)]);
    }
    if version >= (2, 9) {
        let p = all.events[6].1[1];
        assert_eq!(format!("{p:?}"), "PAUSE ticks=100400 code=0 offset=0 arg=3000");
        assert_eq!(p.pause_ticks(), 3000);
    }
    if version >= (2, 8) {
        // Since 2.8 also a coroutine's boundaries with its frame id (FORMAT.md 5.5), in a columnar v2 chunk.
        assert_eq!(per_thread[..6], [(1001, 43), (1002, 27), (1001, 13), (1001, 3), (1001, 6), (1001, 4)]);
        let c = &all.events[5].1;
        assert!(c.iter().all(|e| e.frame_id() == Some(0x7f3a_0012_3456)));
        assert_eq!(c[1].flags, 0x0b, "FRAME | ALWAYS | Future << 2");
        assert_eq!(c[1].awaited(), ocular_format::Awaited::Future);
        assert_eq!(
            format!("{:?}", c[2]),
            "PY_RESUME ticks=90000 code=3 offset=10 arg=1193046 flags=0x03 reserved=0x7f3a"
        );
    } else if version >= (2, 7) {
        // Since 2.7 also calls of C functions (FORMAT.md 5.4).
        assert_eq!(per_thread, [(1001, 43), (1002, 27), (1001, 13), (1001, 3), (1001, 6)]);
        let c = &all.events[4].1;
        assert_eq!(format!("{:?}", c[1]), "CALL ticks=40100 code=1 offset=4 arg=1");
        assert_eq!(format!("{:?}", c[4]), "C_RAISE ticks=40700 code=1 offset=6 arg=0");
        let names: Vec<_> = all.cfuncs.iter().map(|f| (f.id, f.qualname.as_str(), f.module.as_str(), f.kind)).collect();
        assert_eq!(names, [(1, "len", "builtins", 0), (2, "int", "builtins", 2)]);
    } else if windows {
        assert_eq!(per_thread, [(1001, 43), (1002, 27), (1001, 13), (1001, 3)]);
        let w = &all.events[3].1;
        assert_eq!(format!("{:?}", w[0]), "WINDOW ticks=30000 code=3 offset=1 arg=100");
        assert_eq!(format!("{:?}", w[1]), "STACK ticks=30000 code=1 offset=8 arg=0");
    } else {
        assert_eq!(per_thread, [(1001, 43), (1002, 27), (1001, 13)]);
    }
    let first = &all.events[0].1;
    assert_eq!(format!("{:?}", first[0]), "PY_START ticks=10000 code=1 offset=0 arg=0");
    assert_eq!(format!("{:?}", first[2]), "JUMP ticks=10240 code=1 offset=8 arg=2");
    assert_eq!(format!("{:?}", first[42]), "PY_RETURN ticks=15060 code=1 offset=10 arg=0");
    let qualnames: Vec<_> = all.code.iter().map(|c| c.qualname.as_str()).collect();
    assert_eq!(
        qualnames,
        if version >= (2, 8) { &["main", "Worker.run", "handler"][..] } else { &["main", "Worker.run"] }
    );
    let p = all.code[1].positions[5];
    assert_eq!((p.line, p.end_line, p.column, p.end_column), (12, 12, 4, 12));
    assert_eq!(all.code[1].positions.len(), 6);
    assert_eq!(all.lost[0].count, 3);
    assert_eq!(all.snapshots[0].bytecode, [151, 0, 194, 2, 0, 0, 1, 0, 140, 4, 83, 0]);
    let t = all.trailer.unwrap();
    // Since 2.3 a RING chunk follows the header (FORMAT.md 6.7): one chunk more.
    // Since 2.4 a DROPPED chunk (FORMAT.md 6.8), since 2.5 a COUNTERS chunk (6.9), since 2.6 a PROCESS
    // chunk (6.10): one more each.
    let want = if version >= (2, 13) {
        // And the EVENTS chunk of the span: its SPAN with 7 pieces of record, a call of `main`, its
        // SPAN_END with 2.
        (122, 3, 23)
    } else if version >= (2, 12) {
        // And the stop's CALIBRATION chunk.
        (110, 3, 22)
    } else if version >= (2, 11) {
        // And the CALIBRATION chunk.
        (110, 3, 21)
    } else if version >= (2, 10) {
        // And the EVENTS chunk of the windows with their due moments and the counted call.
        (110, 3, 20)
    } else if version >= (2, 9) {
        // And the EVENTS chunk of the call with the pause.
        (100, 3, 19)
    } else if version >= (2, 8) {
        // And a CODE chunk and the EVENTS chunk of the coroutine.
        (96, 3, 18)
    } else if version >= (2, 7) {
        // And a CFUNC chunk and the EVENTS chunk of the C calls.
        (92, 3, 16)
    } else if version >= (2, 6) {
        (86, 3, 14)
    } else if version >= (2, 5) {
        (86, 3, 13)
    } else if version >= (2, 4) {
        (86, 3, 12)
    } else if version >= (2, 3) {
        (86, 3, 11)
    } else if windows {
        (86, 3, 10)
    } else {
        (83, 3, 9)
    };
    assert_eq!((t.events, t.lost, t.chunks), want);
}

#[test]
fn v1_0_synthetic_reads_forever() {
    let bytes = fixture("v1.0/synthetic.ocl");
    assert_eq!(bytes.len(), 1918);
    check_synthetic(&bytes, (1, 0));
}

#[test]
fn v2_0_synthetic_reads_forever() {
    let bytes = fixture("v2.0/synthetic.ocl");
    assert_eq!(bytes.len(), 1889);
    check_synthetic(&bytes, (2, 0));
}

#[test]
fn v2_1_synthetic_reads_forever() {
    // Its snapshot was given a filled inline cache unit (offset 4), which 2.1 stores as zeros.
    let bytes = fixture("v2.1/synthetic.ocl");
    assert_eq!(bytes.len(), 1889);
    check_synthetic(&bytes, (2, 1));
}

#[test]
fn v2_2_synthetic_reads_forever() {
    let bytes = fixture("v2.2/synthetic.ocl");
    assert_eq!(bytes.len(), 1976);
    check_synthetic(&bytes, (2, 2));
}

#[test]
fn v2_8_synthetic_reads_forever() {
    let bytes = fixture("v2.8/synthetic.ocl");
    assert_eq!(bytes.len(), 2811);
    check_synthetic(&bytes, (2, 8));
    // The coroutine's chunk is the one columnar v2 chunk (codec 0x21): the others stay v1 (0x10 where zstd
    // would not make them smaller).
    let mut r = ocular_format::Reader::new(std::io::Cursor::new(&bytes), "fixture", Default::default()).unwrap();
    let mut codecs = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        if matches!(c.body, ocular_format::Body::Events(_)) {
            codecs.push(c.info.codec);
        }
    }
    assert_eq!(codecs, [0x11, 0x11, 0x10, 0x10, 0x10, 0x21]);
}

#[test]
fn v2_7_synthetic_reads_forever() {
    let bytes = fixture("v2.7/synthetic.ocl");
    assert_eq!(bytes.len(), 2569);
    check_synthetic(&bytes, (2, 7));
}

#[test]
fn v2_6_synthetic_reads_forever() {
    let bytes = fixture("v2.6/synthetic.ocl");
    assert_eq!(bytes.len(), 2373);
    check_synthetic(&bytes, (2, 6));
    let mut r = ocular_format::Reader::new(std::io::Cursor::new(&bytes), "fixture", Default::default()).unwrap();
    let mut got = None;
    while let Some(c) = r.next_chunk().unwrap() {
        if let ocular_format::Body::Process(p) = c.body {
            got = Some(p);
        }
    }
    let p = got.expect("a PROCESS chunk");
    assert_eq!((p.run_id, p.parent_pid, p.started.as_str()), (0x5eed, 4242, "fork"));
    assert_eq!(p.argv, ["python3", "workload.py"]);
}

#[test]
fn v2_5_synthetic_reads_forever() {
    let bytes = fixture("v2.5/synthetic.ocl");
    check_synthetic(&bytes, (2, 5));
    let mut r = ocular_format::Reader::new(std::io::Cursor::new(&bytes), "fixture", Default::default()).unwrap();
    let mut got = None;
    while let Some(c) = r.next_chunk().unwrap() {
        if let ocular_format::Body::Counters(cs) = c.body {
            got = Some(cs);
        }
    }
    let cs = got.expect("a COUNTERS chunk");
    assert_eq!(cs.counters.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["page-faults", "instructions"]);
    assert_eq!((cs.counters[1].error.as_str(), cs.samples.len(), cs.lost.clone()), ("no PMU", 2, vec![(1001, 0, 3)]));
    assert_eq!(cs.samples[1].monotonic_ns, 1_000_900);
}

#[test]
fn v2_4_synthetic_reads_forever() {
    let bytes = fixture("v2.4/synthetic.ocl");
    check_synthetic(&bytes, (2, 4));
    let all = read_all(&bytes, false).unwrap();
    let d = all.report.dropped.get(&1002).expect("a DROPPED chunk for thread 1002");
    assert_eq!((d.events, d.first_ticks, d.last_ticks), (640, 2_000, 9_990));
    assert_eq!(all.report.dropped.len(), 1);
}

#[test]
fn v2_3_synthetic_reads_forever() {
    let bytes = fixture("v2.3/synthetic.ocl");
    assert_eq!(bytes.len(), 2071);
    check_synthetic(&bytes, (2, 3));
    let mut r = ocular_format::Reader::new(std::io::Cursor::new(&bytes), "fixture", Default::default()).unwrap();
    let first = r.next_chunk().unwrap().unwrap();
    match first.body {
        ocular_format::Body::Ring(info) => assert_eq!(info.path, "/tmp/ocular-fixture/synthetic.ocl.ring"),
        other => panic!("the chunk after the header is {other:?}, not RING"),
    }
}

#[test]
fn v2_9_synthetic_reads_forever() {
    let bytes = fixture("v2.9/synthetic.ocl");
    assert_eq!(bytes.len(), 2909);
    check_synthetic(&bytes, (2, 9));
}

#[test]
fn v2_13_synthetic_reads_forever() {
    let bytes = fixture("v2.13/synthetic.ocl");
    check_synthetic(&bytes, (2, 13));
}

#[test]
fn v2_12_synthetic_reads_forever() {
    let bytes = fixture("v2.12/synthetic.ocl");
    assert_eq!(bytes.len(), 3207);
    check_synthetic(&bytes, (2, 12));
    // The start's calibration with its speed, and the stop's with its own (FORMAT.md 6.6).
    let mut r = ocular_format::Reader::new(std::io::Cursor::new(&bytes[..]), "v2.12", Default::default()).unwrap();
    let mut cals = Vec::new();
    while let Some(c) = r.next_chunk().unwrap() {
        if let ocular_format::Body::Calibration(c) = c.body {
            cals.push(c);
        }
    }
    assert_eq!(cals.len(), 2);
    assert_eq!(cals[0].instrument(), (1700.0, 8.5));
    assert!(!cals[0].is_stop() && cals[1].is_stop());
    assert_eq!(cals[0].speed_ratio(&cals[1]), Some(0.75));
}

#[test]
fn v2_11_synthetic_reads_forever() {
    let bytes = fixture("v2.11/synthetic.ocl");
    assert_eq!(bytes.len(), 3132);
    check_synthetic(&bytes, (2, 11));
    // The calibration's instrumenting cost (FORMAT.md 6.6).
    let mut r = ocular_format::Reader::new(std::io::Cursor::new(&bytes[..]), "v2.11", Default::default()).unwrap();
    let mut cal = None;
    while let Some(c) = r.next_chunk().unwrap() {
        if let ocular_format::Body::Calibration(c) = c.body {
            cal = Some(c);
        }
    }
    assert_eq!(cal.unwrap().instrument(), (1700.0, 8.5));
}

#[test]
fn v2_10_synthetic_reads_forever() {
    let bytes = fixture("v2.10/synthetic.ocl");
    assert_eq!(bytes.len(), 3048);
    check_synthetic(&bytes, (2, 10));
}
