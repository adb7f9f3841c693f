//! Writes the frozen format fixture of the current format version (`testdata/v2.13/synthetic.ocl`): every
//! chunk kind, two threads, a lost record, a snapshot, a window with its stack (since 2.2), the ring file's
//! path (since 2.3), a flight recorder's dropped range (since 2.4), counter samples (since 2.5), the run of
//! processes it belongs to (since 2.6), calls of two C functions, one of which raised (since 2.7), a
//! coroutine's frame id and what it awaited (since 2.8), a recorder pause (since 2.9), due windows and a counted call (since 2.10), a calibration with the cost of instrumenting a code object
//! (since 2.11), the machine's speed at the start and the stop (since 2.12), a span with its records (since
//! 2.13), and a trailer.
//! Frozen files are never rewritten: this refuses to overwrite one.
//!
//!     cargo run -p ocular-format --example make_fixture -- testdata/v2.13/synthetic.ocl

use ocular_format::*;

fn main() -> Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "testdata/v2.13/synthetic.ocl".into());
    if std::path::Path::new(&path).exists() {
        eprintln!("{path} exists: frozen fixtures are never rewritten; make a new version's directory instead");
        std::process::exit(1);
    }
    let file = std::fs::File::create(&path).map_err(|source| Error::Io { path: path.clone(), error: source })?;
    let mut w = Writer::new(file, &path, &testing::header(), WriterOptions::default())?;
    // Since 2.3: the ring file (RING.md); it never existed, and the trailer makes it irrelevant.
    w.ring(&RingInfo { path: "/tmp/ocular-fixture/synthetic.ocl.ring".into() })?;
    // Since 2.6 (FORMAT.md 6.10): a child forked by process 4242.
    w.process(&ProcessInfo {
        run_id: 0x5eed,
        parent_pid: 4242,
        started: "fork".into(),
        executable: "/usr/bin/python3".into(),
        argv: vec!["python3".into(), "workload.py".into()],
    })?;
    let code = |id: u32, qualname: &str, line: u32| CodeObject {
        id,
        name: qualname.rsplit('.').next().unwrap_or(qualname).into(),
        qualname: qualname.into(),
        filename: "workload.py".into(),
        first_line: line,
        flags: 3,
        bytecode: vec![151, 0, 93, 2, 0, 0, 1, 0, 140, 4, 83, 0],
        linetable: Vec::new(),
        positions: (0..6)
            .map(|i| Position { line: line as i32 + i / 2, end_line: line as i32 + i / 2, column: 4, end_column: 12 })
            .collect(),
    };
    w.code_objects(&[code(1, "main", 1), code(2, "Worker.run", 10)])?;
    w.thread(&ThreadInfo { thread_id: 1001, name: "MainThread".into(), is_main: true })?;
    // Since 2.4 (FORMAT.md 6.8): thread 1002's first 640 events were overwritten by a flight recorder.
    w.dropped(&Dropped { thread_id: 1002, events: 640, first_ticks: 2_000, last_ticks: 9_990 })?;
    // Since 2.5 (FORMAT.md 6.9): two page faults of thread 1001 and a counter that could not be opened.
    w.counters(&CounterSamples {
        counters: vec![
            CounterInfo { name: "page-faults".into(), unit: "faults".into(), period: 1, error: String::new() },
            CounterInfo {
                name: "instructions".into(),
                unit: "instructions".into(),
                period: 1_000_000,
                error: "no PMU".into(),
            },
        ],
        samples: vec![
            CounterSample { thread_id: 1001, counter: 0, monotonic_ns: 1_000_500, period: 1 },
            CounterSample { thread_id: 1001, counter: 0, monotonic_ns: 1_000_900, period: 1 },
        ],
        lost: vec![(1001, 0, 3)],
    })?;
    for (tid, id, start, iterations) in [(1001u64, 1u32, 10_000u64, 20u64), (1002, 2, 10_050, 12), (1001, 1, 20_000, 5)]
    {
        let mut ev = vec![RawEvent::new(start, id, 0, 0, EventKind::PY_START as u8)];
        let mut t = start;
        for i in 0..iterations {
            t += 150 + (i * 37) % 11;
            ev.push(RawEvent::new(t, id, 2, 6, EventKind::BRANCH as u8));
            t += 90 + (i * 53) % 7;
            ev.push(RawEvent::new(t, id, 8, 2, EventKind::JUMP as u8));
        }
        t += 40;
        ev.push(RawEvent::new(t, id, 2, 12, EventKind::BRANCH as u8));
        ev.push(RawEvent::new(t + 60, id, 10, 0, EventKind::PY_RETURN as u8));
        w.events(tid, &ev)?;
    }
    // Since 2.2 (FORMAT.md 5.3): a window that was due 3 us before it opened, 100 us long, the stack it found
    // (`main` at offset 8), and main's return inside it.
    let mut window = RawEvent::new(30_000, 3, 1, 100, EventKind::WINDOW as u8);
    window.code.set(3);
    w.events(
        1001,
        &[
            window,
            RawEvent::new(30_000, 1, 8, 0, EventKind::STACK as u8),
            RawEvent::new(30_090, 1, 10, 0, EventKind::PY_RETURN as u8),
        ],
    )?;
    // Since 2.7 (FORMAT.md 5.4, 6.11): main calls `len` (returns) and `int` (raises), after the window.
    w.c_functions(&[
        CFunction { id: 1, qualname: "len".into(), module: "builtins".into(), kind: CFunction::BUILTIN },
        CFunction { id: 2, qualname: "int".into(), module: "builtins".into(), kind: CFunction::TYPE },
    ])?;
    w.events(
        1001,
        &[
            RawEvent::new(40_000, 1, 0, 0, EventKind::PY_START as u8),
            RawEvent::new(40_100, 1, 4, 1, EventKind::CALL as u8),
            RawEvent::new(40_180, 1, 4, 0, EventKind::C_RETURN as u8),
            RawEvent::new(40_300, 1, 6, 2, EventKind::CALL as u8),
            RawEvent::new(40_700, 1, 6, 0, EventKind::C_RAISE as u8),
            RawEvent::new(40_800, 1, 10, 0, EventKind::PY_RETURN as u8),
        ],
    )?;
    // Since 2.8 (FORMAT.md 5.5): the coroutine `handler` starts, awaits a Future, resumes and returns; its
    // boundaries carry its frame id and are recorded always.
    w.code_objects(&[CodeObject { flags: 0x83, ..code(3, "handler", 20) }])?;
    let frame = |t: u64, off: u32, kind: EventKind, awaited: Awaited| {
        let mut e = RawEvent::new(t, 3, off, 0, kind as u8);
        e.set_frame_id(0x7f3a_0012_3456);
        e.flags |= event::flags::ALWAYS | awaited.bits();
        e
    };
    w.events(
        1001,
        &[
            frame(50_000, 4, EventKind::PY_START, Awaited::Unknown),
            frame(50_200, 8, EventKind::PY_YIELD, Awaited::Future),
            frame(90_000, 10, EventKind::PY_RESUME, Awaited::Unknown),
            frame(90_300, 10, EventKind::PY_RETURN, Awaited::Unknown),
        ],
    )?;
    // Since 2.9 (FORMAT.md 5.6): a call of `main` in which the recorder held the thread up 3,000 ticks.
    w.events(
        1001,
        &[
            RawEvent::new(100_000, 1, 0, 0, EventKind::PY_START as u8),
            // The JUMP's callback found the buffer full and waited: its pause comes first.
            RawEvent::new(100_400, 0, 0, 3_000, EventKind::PAUSE as u8),
            RawEvent::new(100_400, 1, 8, 2, EventKind::JUMP as u8),
            RawEvent::new(104_000, 1, 10, 0, EventKind::PY_RETURN as u8),
        ],
    )?;
    // Since 2.10 (FORMAT.md 5.7, 5.8): a call of `main` counted outside windows; a window that fell due
    // while another waited (missed), with the stack at its due moment; the window that then opened, due
    // 20 us before, with the main thread's calls counted from then, its stack at the due moment and at the
    // opening; and `main`'s return inside it.
    let t = 200_000;
    w.events(
        1001,
        &[
            RawEvent::new(110_000, 1, 0, 0, EventKind::COUNT as u8),
            RawEvent::new(t, 50, 2, 100, EventKind::WINDOW as u8),
            RawEvent::new(t, 0, event::due::MISSED, 1, EventKind::DUE as u8),
            RawEvent::new(t, 1, 0, 0, EventKind::DUE_STACK as u8),
            RawEvent::new(t, 0, 2, 0, EventKind::WINDOW_END as u8),
            RawEvent::new(t, 20, 3, 100, EventKind::WINDOW as u8),
            RawEvent::new(t, 0, event::due::CALLS_FROM_DUE, 1, EventKind::DUE as u8),
            RawEvent::new(t, 1, 0, 0, EventKind::DUE_STACK as u8),
            RawEvent::new(t, 1, 8, 0, EventKind::STACK as u8),
            RawEvent::new(t + 500, 1, 10, 0, EventKind::PY_RETURN as u8),
        ],
    )?;
    // Since 2.13 (FORMAT.md 5.9): a span of thread 1001 (key 1) around a call of `main`, with an
    // OpenTelemetry trace id, span id and an attribute; it ends in error.
    let mut spans = span::begin_events(
        300_000,
        1,
        &span::SpanBegin {
            name: "GET /orders".into(),
            trace_id: (1..=16).collect(),
            span_id: (17..=24).collect(),
            parent_span_id: vec![],
            parent: 0,
            frame: 0,
            attributes: vec![span::Attribute {
                key: "http.route".into(),
                kind: span::ValueKind::Str as u8,
                value: "/orders".into(),
            }],
            cut: false,
        },
    );
    spans.push(RawEvent::new(300_100, 1, 0, 0, EventKind::PY_START as u8));
    spans.push(RawEvent::new(302_000, 1, 10, 0, EventKind::PY_RETURN as u8));
    spans.extend(span::end_events(
        302_500,
        1,
        Some(&span::SpanEnd { status: 2, message: "KeyError: 42".into(), attributes: vec![], cut: false }),
    ));
    w.events(1001, &spans)?;
    // Since 2.11 (FORMAT.md 6.6): the calibration holds the cost of instrumenting a code object again, per
    // object (pseudo-kind 250) and per byte of bytecode (251), beside the events' own.
    // Since 2.12: with the machine's speed at the start (pseudo-kind 252), which the stop's calibration
    // (253, below) scales the costs by.
    w.calibration(&Calibration {
        costs: vec![(EventKind::PY_START as u8, 60.0), (250, 1700.0), (251, 8.5), (252, 80.0)],
    })?;
    w.thread(&ThreadInfo { thread_id: 1002, name: "worker-1".into(), is_main: false })?;
    w.lost(&Lost { thread_id: 1002, count: 3, first_ticks: 15_000, last_ticks: 15_200 })?;
    // FOR_ITER specialized, its inline cache unit filled in by the interpreter: since 2.1 it is not stored.
    w.snapshots(&[CodeSnapshot { id: 1, bytecode: vec![151, 0, 194, 2, 0x37, 0x12, 1, 0, 140, 4, 83, 0] }])?;
    w.calibration(&Calibration { costs: vec![(253, 60.0)] })?;
    w.finish(Trailer {
        end_unix_ns: 1_795_000_000_500_000_000,
        end_monotonic_ns: 623_456_789,
        end_ticks: 1_500_001_000,
        events: 0,
        lost: 0,
        chunks: 0,
    })?;
    println!("wrote {path}");
    Ok(())
}
