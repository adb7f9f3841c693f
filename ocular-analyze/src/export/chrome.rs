//! Chrome Trace Event JSON (what `ui.perfetto.dev` and `chrome://tracing` open), streamed from the
//! [`Timeline`](super::timeline): memory holds one chunk of events and one call stack per
//! thread, never the trace.
//!
//! - Function slices: `B`/`E` events per real process id and thread id, named by qualified name, balanced
//!   per thread (the timeline's rules).
//! - Loops: an instant event `"loop"` (category `loop`) at every recorded backward jump, with `uops` and
//!   `cycles`, as the earlier prototype documented them.
//! - Metadata: `process_name` and `thread_name` events.
//! - asyncio tasks ([`crate::awaits`]), when the trace has coroutine frames: one track per task (a thread
//!   id from 2^30 up, named `task handler#3`), with complete slices `running`, `awaiting <chain>` and
//!   `ready (waiting for the loop)`.
//! - Spans ([`crate::spans`], FORMAT.md 5.9): an async slice each (`b`/`e`, category `span`, id the
//!   span's key, on the thread it began on), with its trace id, span id, parent span id, status and
//!   attributes as arguments: spans of one thread need not nest.

use super::timeline::{Item, Timeline};
use ocular_format::ReadOptions;
use rustc_hash::FxHashMap as HashMap;
use std::io::Write;
use std::path::Path;

/// What was written.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Trace events written (slices' B and E counted separately, instants, metadata).
    pub events: u64,
    /// Events of the .ocl file read.
    pub read: u64,
}

/// Streams `path` as Chrome Trace Event JSON into `out`. Returns counts and the reader's warnings.
pub fn export(path: &Path, opts: ReadOptions, out: &mut dyn Write) -> anyhow::Result<(Written, Vec<String>)> {
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    let mut first = true;
    let r = events(path, opts, out, &mut first, None)?;
    out.write_all(b"\n]}\n")?;
    out.flush()?;
    Ok(r)
}

/// Streams a run of several processes (FORMAT.md 10) as one Chrome Trace Event JSON: each process under
/// its own pid, named with its command line and labelled with its parent, on one time line (microseconds
/// since the first process started, through `CLOCK_MONOTONIC`, which the processes share).
pub fn export_run(
    run: &crate::procs::Run,
    opts: ReadOptions,
    out: &mut dyn Write,
) -> anyhow::Result<(Written, Vec<String>)> {
    let origin = Timeline::open(&run.processes[0].path, opts)?.header().start_monotonic_ns;
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    let mut first = true;
    let mut all = Written::default();
    let mut warnings = Vec::new();
    for (i, p) in run.processes.iter().enumerate() {
        let (w, warn) = events(&p.path, opts, out, &mut first, Some((origin, i, p)))?;
        all.events += w.events;
        all.read += w.read;
        warnings.extend(warn);
    }
    out.write_all(b"\n]}\n")?;
    out.flush()?;
    Ok((all, warnings))
}

/// Writes the trace events of one file; in a run, `process` is (the run's origin, monotonic ns; the
/// process's place in the run; the process).
fn events(
    path: &Path,
    opts: ReadOptions,
    out: &mut dyn Write,
    first: &mut bool,
    process: Option<(u64, usize, &crate::procs::Process)>,
) -> anyhow::Result<(Written, Vec<String>)> {
    let timeline = Timeline::open(path, opts)?;
    let h = timeline.header().clone();
    let pid = h.pid;
    // In a run, from the first process's start; alone, from the file's own.
    let offset_us = process.map_or(0.0, |(origin, _, _)| (h.start_monotonic_ns as f64 - origin as f64) / 1e3);
    let us = |ticks: u64| offset_us + ticks.wrapping_sub(h.start_ticks) as i64 as f64 * 1e6 / h.ticks_per_second;
    // Names escaped for JSON once per code object, not once per event.
    let mut escaped: HashMap<u32, String> = HashMap::default();
    let mut w = Written::default();
    let mut coroutines = false;
    let mut spans = false;
    let mut emit = |out: &mut dyn Write, json: std::fmt::Arguments| -> std::io::Result<()> {
        if !*first {
            out.write_all(b",\n")?;
        }
        *first = false;
        w.events += 1;
        out.write_fmt(json)
    };
    let (read, warnings) = timeline.run(|code, item| {
        let mut name = |id: u32| -> String {
            escaped
                .entry(id)
                .or_insert_with(|| json_str(code.get(&id).map_or("?", |c| c.qualname.as_str())))
                .clone()
        };
        match item {
            Item::Thread { .. } => Ok(()),
            Item::Events { events, .. } => {
                coroutines = coroutines || crate::awaits::has_frames(events);
                spans = spans || crate::spans::has_spans(events);
                Ok(())
            }
            // A counter track per counter (FORMAT.md 6.9), one series per thread: its running total.
            Item::Counter { tid, ticks, name, total, .. } => {
                let (n, ts) = (json_str(name), us(ticks));
                emit(out, format_args!(
                    "{{\"name\":{n},\"cat\":\"counter\",\"ph\":\"C\",\"ts\":{ts:.3},\"pid\":{pid},\"args\":{{\"thread {tid}\":{total}}}}}"
                ))
            }
            // A stretch without events shows as a slice of its own, so no one reads the gap as idle time.
            Item::Lost { tid, first, last, count } => {
                let (ts, dur) = (us(first), (us(last) - us(first)).max(0.001));
                emit(out, format_args!(
                    "{{\"name\":\"events lost\",\"cat\":\"ocular\",\"ph\":\"X\",\"ts\":{ts:.3},\"dur\":{dur:.3},\"pid\":{pid},\
                     \"tid\":{tid},\"args\":{{\"lost\":{count}}}}}"
                ))
            }
            Item::Begin { tid, ticks, code: id, .. } | Item::End { tid, ticks, code: id, .. } => {
                let ph = if matches!(item, Item::Begin { .. }) { "B" } else { "E" };
                let (n, ts) = (name(id), us(ticks));
                // A slice cut by a window's edge (FORMAT.md 5.3) says so in its arguments (Perfetto
                // merges an end event's args into the slice).
                let args = match item {
                    Item::End { call, .. } if call.clipped => ",\"args\":{\"clipped\":true}",
                    _ => "",
                };
                emit(out, format_args!(
                    "{{\"name\":{n},\"cat\":\"python\",\"ph\":\"{ph}\",\"ts\":{ts:.3},\"pid\":{pid},\"tid\":{tid}{args}}}"
                ))
            }
            Item::Loop { tid, ticks, code: id, head, uops, cycles } => {
                let (n, ts) = (name(id), us(ticks));
                let cycles = cycles.map_or("null".to_string(), |c| c.to_string());
                emit(out, format_args!(
                    "{{\"name\":\"loop\",\"cat\":\"loop\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts:.3},\"pid\":{pid},\"tid\":{tid},\
                     \"args\":{{\"function\":{n},\"offset\":{head},\"uops\":{uops},\"cycles\":{cycles}}}}}"
                ))
            }
            Item::ThreadDone { tid, name: thread } => {
                let thread = json_str(&thread.map_or_else(|| format!("Thread-{tid}"), str::to_string));
                emit(out, format_args!(
                    "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{thread}}}}}"
                ))
            }
        }
    })?;
    if coroutines {
        let a = crate::awaits::analyze(path, opts)?;
        for (i, t) in a.tasks.iter().enumerate() {
            let (tid, name) = (TASK_TID + i as u64, json_str(&format!("task {}", t.name)));
            emit(
                out,
                format_args!(
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{name}}}}}"
            ),
            )?;
        }
        for s in &a.spans {
            let (tid, n) = (TASK_TID + s.task as u64, json_str(&a.span_name(s)));
            let (ts, dur) = (us(s.start), us(s.end) - us(s.start));
            emit(out, format_args!(
                "{{\"name\":{n},\"cat\":\"asyncio\",\"ph\":\"X\",\"ts\":{ts:.3},\"dur\":{dur:.3},\"pid\":{pid},\"tid\":{tid}}}"
            ))?;
        }
    }
    if spans {
        let (list, _) = crate::spans::list(path, opts)?;
        for s in &list {
            let Some(end_ns) = s.end_ns else { continue };
            let (n, id, tid) = (json_str(&s.name), s.key, s.thread_id);
            let mut args = serde_json::Map::new();
            for (k, v) in [("trace_id", &s.trace_id), ("span_id", &s.span_id), ("parent_span_id", &s.parent_span_id)] {
                if !v.is_empty() {
                    args.insert(k.into(), v.clone().into());
                }
            }
            args.insert("status".into(), s.status.into());
            if !s.message.is_empty() {
                args.insert("message".into(), s.message.clone().into());
            }
            for (k, v) in &s.attributes {
                args.entry(k.clone()).or_insert_with(|| v.clone().into());
            }
            let args = serde_json::Value::Object(args);
            let (b, e) = (offset_us + s.begin_ns / 1e3, offset_us + end_ns / 1e3);
            emit(out, format_args!(
                "{{\"name\":{n},\"cat\":\"span\",\"ph\":\"b\",\"id\":{id},\"ts\":{b:.3},\"pid\":{pid},\"tid\":{tid},\"args\":{args}}}"
            ))?;
            emit(
                out,
                format_args!(
                "{{\"name\":{n},\"cat\":\"span\",\"ph\":\"e\",\"id\":{id},\"ts\":{e:.3},\"pid\":{pid},\"tid\":{tid}}}"
            ),
            )?;
        }
    }
    let mut label = format!("python {} (pid {pid}, {} mode)", h.python_version, h.options.mode.name());
    if let Some((_, place, p)) = process {
        if let Some(info) = &p.info {
            label = format!("{label}: {}", crate::procs::command(&info.argv));
            if let Some(parent) = p.parent_label() {
                let parent = json_str(&parent);
                emit(
                    out,
                    format_args!(
                        "{{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"labels\":{parent}}}}}"
                    ),
                )?;
            }
        }
        emit(
            out,
            format_args!(
                "{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"sort_index\":{place}}}}}"
            ),
        )?;
    }
    let process = json_str(&label);
    emit(
        out,
        format_args!("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":{process}}}}}"),
    )?;
    w.read = read;
    Ok((w, warnings))
}

/// Thread ids of task tracks start here: above any Linux thread id (at most 2^22).
pub const TASK_TID: u64 = 1 << 30;

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".into())
}
