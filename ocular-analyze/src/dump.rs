//! `dump`: every record of a file as text, one line per event. This is the golden format tests compare.

use ocular_format::{kind_name, Body, Header, ReadOptions, Reader};
use std::io::Write;
use std::path::Path;

/// Writes the dump of `path` to `out`; returns the reader's warnings (damage, truncation).
pub fn dump(path: &Path, opts: ReadOptions, out: &mut dyn Write) -> anyhow::Result<Vec<String>> {
    let mut r = Reader::open_with(path, opts)?;
    let (major, minor) = r.version();
    writeln!(out, "format {major}.{minor}")?;
    header(r.header(), out)?;
    while let Some(c) = r.next_chunk()? {
        let i = &c.info;
        write!(
            out,
            "chunk seq={} offset={} kind={} codec=0x{:02x} stored={} raw={} count={}",
            i.seq,
            i.offset,
            ocular_format::chunk::kind::name(i.kind),
            i.codec,
            i.stored_len,
            i.raw_len,
            i.count
        )?;
        if i.thread_id != 0 {
            write!(out, " thread={}", i.thread_id)?;
        }
        if i.first_ts != 0 || i.last_ts != 0 {
            write!(out, " ticks={}..{}", i.first_ts, i.last_ts)?;
        }
        writeln!(out)?;
        match c.body {
            Body::Events(events) => {
                for e in events {
                    write!(
                        out,
                        "  {} {} code={} offset={}",
                        e.ticks.get(),
                        kind_name(e.kind),
                        e.code.get(),
                        e.offset.get()
                    )?;
                    match e.frame_id() {
                        // FORMAT.md 5.5: a coroutine's frame id, not an argument.
                        Some(id) => write!(out, " frame=0x{id:x}")?,
                        None if e.arg.get() != 0 => write!(out, " arg={}", e.arg.get())?,
                        None => {}
                    }
                    if e.flags & ocular_format::event::flags::ALWAYS != 0 {
                        write!(out, " always")?;
                    }
                    if e.flags >> ocular_format::event::flags::AWAITED_SHIFT != 0 {
                        write!(out, " yielded={}", e.awaited().name())?;
                    }
                    writeln!(out)?;
                }
            }
            Body::Code(objects) => {
                for c in objects {
                    writeln!(
                        out,
                        "  code id={} qualname={:?} name={:?} file={:?} first_line={} flags=0x{:x}",
                        c.id, c.qualname, c.name, c.filename, c.first_line, c.flags
                    )?;
                    writeln!(out, "    bytecode={}", hex(&c.bytecode))?;
                    let lines: Vec<String> = c.positions.iter().map(|p| p.line.to_string()).collect();
                    writeln!(out, "    lines={}", lines.join(","))?;
                }
            }
            Body::Snapshot(snaps) => {
                for s in snaps {
                    writeln!(out, "  snapshot id={} bytecode={}", s.id, hex(&s.bytecode))?;
                }
            }
            Body::Thread(t) => writeln!(out, "  thread id={} name={:?} main={}", t.thread_id, t.name, t.is_main)?,
            Body::Lost(l) => writeln!(
                out,
                "  lost thread={} count={} ticks={}..{}",
                l.thread_id, l.count, l.first_ticks, l.last_ticks
            )?,
            Body::Counters(cs) => {
                for (i, c) in cs.counters.iter().enumerate() {
                    writeln!(
                        out,
                        "  counter {i} name={} unit={} period={} error={:?}",
                        c.name, c.unit, c.period, c.error
                    )?;
                }
                for x in &cs.samples {
                    writeln!(
                        out,
                        "  sample thread={} counter={} monotonic_ns={} period={}",
                        x.thread_id, x.counter, x.monotonic_ns, x.period
                    )?;
                }
                for (t, k, n) in &cs.lost {
                    writeln!(out, "  lost samples thread={t} counter={k} count={n}")?;
                }
            }
            Body::Dropped(d) => writeln!(
                out,
                "  dropped thread={} events={} ticks={}..{}",
                d.thread_id, d.events, d.first_ticks, d.last_ticks
            )?,
            Body::Trailer(t) => writeln!(
                out,
                "  trailer events={} lost={} chunks={} end_ticks={} end_monotonic_ns={} end_unix_ns={}",
                t.events, t.lost, t.chunks, t.end_ticks, t.end_monotonic_ns, t.end_unix_ns
            )?,
            Body::Calibration(c) => {
                let costs: Vec<String> = c
                    .costs
                    .iter()
                    .map(|(k, v)| format!("{}={v:.1}", ocular_format::Calibration::cost_name(*k)))
                    .collect();
                writeln!(out, "  calibration ticks per event: {}", costs.join(" "))?
            }
            Body::Ring(r) => writeln!(out, "  ring path={:?}", r.path)?,
            Body::CFunctions(fs) => {
                for f in fs {
                    writeln!(
                        out,
                        "  cfunc id={} qualname={:?} module={:?} kind={}",
                        f.id, f.qualname, f.module, f.kind
                    )?;
                }
            }
            Body::Process(p) => writeln!(
                out,
                "  process run_id={:#x} parent_pid={} started={} executable={:?} argv={:?}",
                p.run_id, p.parent_pid, p.started, p.executable, p.argv
            )?,
            Body::Skipped(why) => writeln!(out, "  skipped: {why}")?,
        }
    }
    let path = r.path().to_owned();
    let warnings = r.report().warnings(&path);
    for w in &warnings {
        writeln!(out, "warning: {w}")?;
    }
    Ok(warnings)
}

fn header(h: &Header, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "header recorder={:?} python={} hexversion=0x{:08x} implementation={} platform={} pid={}",
        h.recorder, h.python_version, h.python_hexversion, h.implementation, h.platform, h.pid
    )?;
    writeln!(
        out,
        "header clock={:?} ticks_per_second={} start_ticks={} start_monotonic_ns={} start_unix_ns={} event_cost_ticks={}",
        h.clock, h.ticks_per_second, h.start_ticks, h.start_monotonic_ns, h.start_unix_ns, h.event_cost_ticks
    )?;
    let o = &h.options;
    writeln!(
        out,
        "header options mode={} deinstrument_threshold={} include_only={:?} exclude={:?} buffer_events={} max_buffers={}",
        o.mode.name(),
        o.deinstrument_threshold,
        o.include_only,
        o.exclude,
        o.buffer_events,
        o.max_buffers
    )?;
    let t = &h.opcodes;
    writeln!(out, "header opcodes have_argument={} extended_arg={}", t.have_argument, t.extended_arg)?;
    for (op, name) in t.names.iter().enumerate() {
        if name.is_empty() {
            continue;
        }
        let base = t.base.get(op).copied().unwrap_or(op as u8);
        let cache = t.cache_entries.get(op).copied().unwrap_or(0);
        writeln!(out, "  opcode {op} {name} base={base} cache={cache}")?;
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
