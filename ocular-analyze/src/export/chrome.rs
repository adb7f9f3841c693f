//! Chrome Trace Event JSON (what `ui.perfetto.dev` and `chrome://tracing` open), streamed: memory holds
//! one chunk of events and one call stack per thread, never the trace.
//!
//! - Function slices: `B`/`E` events per real process id and thread id, named by qualified name. They are
//!   balanced per thread: an exit without its entry (the recording started inside the function) is
//!   dropped, and frames still open at the end are closed at the thread's last event.
//! - Loops: an instant event `"loop"` (category `loop`) at every recorded backward jump, with `uops` (the
//!   instructions in the loop body) and `cycles` (TSC ticks since the previous iteration of that loop in the
//!   same frame), as the earlier prototype documented them.
//! - Metadata: `process_name` and `thread_name` events.

use ocular_format::{Body, CodeObject, EventKind, ReadOptions, Reader};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

struct Frame {
    code: u32,
    loops: Vec<(u32, u64)>,
}

#[derive(Default)]
struct Thread {
    stack: Vec<Frame>,
    last_ts: f64,
}

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
    let mut r = Reader::open_with(path, opts)?;
    let header = r.header().clone();
    let pid = header.pid;
    let mut code: HashMap<u32, CodeObject> = HashMap::new();
    // Names escaped for JSON once per code object, not once per event.
    let mut escaped: HashMap<u32, String> = HashMap::new();
    let mut body_len: HashMap<(u32, u32), usize> = HashMap::new();
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut threads: HashMap<u64, Thread> = HashMap::new();
    let mut w = Written::default();
    let mut first = true;
    out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")?;
    let mut emit = |out: &mut dyn Write, w: &mut Written, json: std::fmt::Arguments| -> std::io::Result<()> {
        if !first {
            out.write_all(b",\n")?;
        }
        first = false;
        w.events += 1;
        out.write_fmt(json)
    };
    crate::progress::begin("exporting", std::fs::metadata(path).map(|m| m.len()).unwrap_or(0));
    let us = |ticks: u64| ticks.wrapping_sub(header.start_ticks) as i64 as f64 * 1e6 / header.ticks_per_second;
    while let Some(c) = r.next_chunk()? {
        crate::progress::at(c.info.offset);
        match c.body {
            Body::Code(objs) => {
                for o in objs {
                    escaped.insert(o.id, json_str(&o.qualname));
                    code.insert(o.id, o);
                }
            }
            Body::Thread(t) => {
                names.insert(t.thread_id, t.name);
            }
            Body::Events(evs) => {
                let tid = c.info.thread_id;
                let th = threads.entry(tid).or_default();
                w.read += evs.len() as u64;
                for e in evs {
                    let id = e.code.get();
                    let ts = us(e.ticks.get());
                    th.last_ts = ts;
                    let name = escaped.get(&id).map_or("\"?\"", |s| s.as_str());
                    match e.event_kind() {
                        Some(EventKind::PY_START | EventKind::PY_RESUME | EventKind::PY_THROW) => {
                            th.stack.push(Frame { code: id, loops: Vec::new() });
                            emit(out, &mut w, format_args!(
                                "{{\"name\":{name},\"cat\":\"python\",\"ph\":\"B\",\"ts\":{ts:.3},\"pid\":{pid},\"tid\":{tid}}}"
                            ))?;
                        }
                        Some(EventKind::PY_RETURN | EventKind::PY_YIELD | EventKind::PY_UNWIND) => {
                            let Some(pos) = th.stack.iter().rposition(|f| f.code == id) else { continue };
                            while th.stack.len() > pos {
                                let f = th.stack.pop().expect("non-empty");
                                let n = escaped.get(&f.code).map_or("\"?\"", |s| s.as_str());
                                emit(out, &mut w, format_args!(
                                    "{{\"name\":{n},\"cat\":\"python\",\"ph\":\"E\",\"ts\":{ts:.3},\"pid\":{pid},\"tid\":{tid}}}"
                                ))?;
                            }
                        }
                        Some(EventKind::JUMP) if e.arg.get() < e.offset.get() => {
                            let Some(top) = th.stack.last_mut().filter(|f| f.code == id) else { continue };
                            let head = e.arg.get();
                            let t = e.ticks.get();
                            let cycles = match top.loops.iter_mut().find(|l| l.0 == head) {
                                Some(l) => {
                                    let d = t.saturating_sub(l.1);
                                    l.1 = t;
                                    Some(d)
                                }
                                None => {
                                    top.loops.push((head, t));
                                    None
                                }
                            };
                            let uops = *body_len.entry((id, head)).or_insert_with(|| {
                                code.get(&id).map_or(0, |co| {
                                    crate::analysis::instructions(co, &header, head, e.offset.get()).len()
                                })
                            });
                            let cycles = cycles.map_or("null".to_string(), |c| c.to_string());
                            emit(out, &mut w, format_args!(
                                "{{\"name\":\"loop\",\"cat\":\"loop\",\"ph\":\"i\",\"s\":\"t\",\"ts\":{ts:.3},\"pid\":{pid},\"tid\":{tid},\
                                 \"args\":{{\"function\":{name},\"offset\":{head},\"uops\":{uops},\"cycles\":{cycles}}}}}"
                            ))?;
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    // Close what is still open, so every thread's slices balance.
    let mut tids: Vec<u64> = threads.keys().copied().collect();
    tids.sort_unstable();
    for tid in tids {
        let th = threads.get_mut(&tid).expect("key");
        let ts = th.last_ts;
        while let Some(f) = th.stack.pop() {
            let n = code.get(&f.code).map_or("?", |c| c.qualname.as_str());
            emit(
                out,
                &mut w,
                format_args!(
                    "{{\"name\":{},\"cat\":\"python\",\"ph\":\"E\",\"ts\":{ts:.3},\"pid\":{pid},\"tid\":{tid}}}",
                    json_str(n)
                ),
            )?;
        }
        let name = names.get(&tid).cloned().unwrap_or_else(|| format!("Thread-{tid}"));
        emit(
            out,
            &mut w,
            format_args!(
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{}}}}}",
                json_str(&name)
            ),
        )?;
    }
    let process = format!("python {} (pid {pid}, {} mode)", header.python_version, header.options.mode.name());
    emit(
        out,
        &mut w,
        format_args!(
            "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":{}}}}}",
            json_str(&process)
        ),
    )?;
    crate::progress::end();
    out.write_all(b"\n]}\n")?;
    out.flush()?;
    let name = path.display().to_string();
    Ok((w, r.report().warnings(&name)))
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".into())
}
