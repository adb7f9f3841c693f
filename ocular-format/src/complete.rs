//! Making a killed recording's trace whole (RING.md 4): what a reader recovers from the ring file, written
//! into the trace itself, with a trailer, so that it no longer depends on the ring file (which the
//! runtime directory keeps for a bounded time) and reads as any finished trace.

use crate::{Body, Error, ReadOptions, Reader, Result, Trailer, Writer, WriterOptions};
use std::path::Path;

/// What [`complete`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Completed {
    /// Events recovered from the ring file and written into the trace.
    pub recovered: u64,
    /// Events in the trace now.
    pub events: u64,
}

/// Rewrites the trace at `path`, which ends without a trailer and whose process is gone, with what its
/// ring file adds (if anything) and a trailer, then removes the ring file. `None` when there is nothing to
/// do: the trace ended cleanly, or its process still runs.
pub fn complete(path: &Path) -> Result<Option<Completed>> {
    complete_into(path, path)
}

/// As [`complete`], reading `src` (a trace, or a ring file read alone: RING.md 5) and writing the whole
/// trace to `dst` (which may be `src`), never over an existing file but `src`.
pub fn complete_into(src: &Path, dst: &Path) -> Result<Option<Completed>> {
    let mut r = Reader::open_with(src, ReadOptions::default())?;
    let header = r.header().clone();
    let name = dst.display().to_string();
    if src != dst && dst.exists() {
        let error = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "a file is there already");
        return Err(Error::Io { path: name, error });
    }
    let mut tmp = dst.as_os_str().to_owned();
    tmp.push(".completing");
    let tmp = std::path::PathBuf::from(tmp);
    let io = |error| Error::Io { path: name.clone(), error };
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let mut w = Writer::new(std::io::BufWriter::new(file), &name, &header, WriterOptions::default())?;
    let (mut last, mut lost) = (header.start_ticks, 0u64);
    let written = (|| -> Result<()> {
        while let Some(c) = r.next_chunk()? {
            match c.body {
                Body::Events(evs) => {
                    last = last.max(c.info.last_ts);
                    w.events(c.info.thread_id, evs)?
                }
                Body::Code(objs) => w.code_objects(&objs)?,
                Body::Thread(t) => w.thread(&t)?,
                Body::Lost(l) => {
                    lost += l.count;
                    w.lost(&l)?
                }
                Body::Snapshot(s) => w.snapshots(&s)?,
                Body::Calibration(c) => w.calibration(&c)?,
                Body::Dropped(d) => w.dropped(&d)?,
                Body::Counters(c) => w.counters(&c)?,
                Body::Process(p) => w.process(&p)?,
                Body::CFunctions(f) => w.c_functions(&f)?,
                // The trace is whole now: no ring to complete it from.
                Body::Ring(_) | Body::Trailer(_) | Body::Skipped(_) => {}
            }
        }
        Ok(())
    })();
    let report = r.report().clone();
    // Its process gone, a trace without a trailer is completed even when the ring adds nothing (a process
    // killed while idle, its last buffer already written): it then reads as closed.
    let gone = report.recovered.is_some() || !crate::reader::process_alive(header.pid);
    let recovered = match (&written, &report.recovered) {
        (Ok(()), rec) if report.trailer.is_none() && gone => rec.clone().unwrap_or_default(),
        _ => {
            drop(w);
            let _ = std::fs::remove_file(&tmp);
            return written.map(|()| None);
        }
    };
    let events = w.events_written();
    let ns = header.start_monotonic_ns as f64
        + (last as f64 - header.start_ticks as f64) * 1e9 / header.ticks_per_second.max(1.0);
    let trailer =
        Trailer { end_unix_ns: 0, end_monotonic_ns: ns.max(0.0) as u64, end_ticks: last, events, lost, chunks: 0 };
    let done = w.finish(trailer).and_then(|bw| bw.into_inner().map_err(|e| io(e.into_error())).map(drop));
    if let Err(e) = done.and_then(|()| std::fs::rename(&tmp, dst).map_err(io)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if !recovered.path.is_empty() {
        let _ = std::fs::remove_file(&recovered.path);
    }
    Ok(Some(Completed { recovered: recovered.events + recovered.chunk_events, events }))
}

/// Closes the trace at `path` whose writer failed (the disk filled, an I/O error) while its recording went
/// on: cut at its last whole chunk, then `lost` (the events that came after the failure, per thread: LOST
/// chunks, FORMAT.md 6.3) and a trailer, in place. It then reads cleanly, the failure's range counted as
/// lost. The few hundred bytes this writes fit where the cut chunk was. Returns whether it was sealed
/// (`false`: it already had a trailer).
pub fn seal(path: &Path, lost: &[crate::Lost], end_ticks: u64, end_monotonic_ns: u64) -> Result<bool> {
    let mut r = Reader::open_with(path, ReadOptions::default())?;
    while r.next_chunk()?.is_some() {}
    let header = r.header().clone();
    let report = r.report().clone();
    drop(r);
    if report.trailer.is_some() {
        return Ok(false);
    }
    let name = path.display().to_string();
    let io = |error| Error::Io { path: name.clone(), error };
    let file = std::fs::OpenOptions::new().write(true).open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let cut = report.truncated.map_or(len, |(offset, _)| offset);
    file.set_len(cut).map_err(io)?;
    let mut file = file;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(cut)).map_err(io)?;
    let mut w =
        Writer::resume(std::io::BufWriter::new(file), &name, &header, report.chunks, report.events, report.lost)?;
    for l in lost.iter().filter(|l| l.count > 0) {
        w.lost(l)?;
    }
    let trailer = Trailer { end_unix_ns: 0, end_monotonic_ns, end_ticks, events: 0, lost: 0, chunks: 0 };
    let out = w.finish(trailer)?;
    out.into_inner().map_err(|e| io(e.into_error()))?.sync_data().map_err(io)?;
    Ok(true)
}
