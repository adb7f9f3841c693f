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
    let gone = report.recovered.is_some()
        || !crate::reader::recording_alive(header.pid, header.start_ticks, header.ticks_per_second);
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
/// lost. The few hundred bytes this writes usually fit where the cut chunk was; where they do not (the
/// last whole chunk ended just below a file size limit), the trace is cut one events chunk earlier, its
/// events counted as lost too, and so on (at most [`SEAL_RETREATS`] chunks): a trace that says what it
/// lost is worth more than one more chunk of events. Returns the LOST records written (those given, and
/// any chunks given up), or `None` if it already had a trailer.
pub fn seal(
    path: &Path,
    lost: &[crate::Lost],
    end_ticks: u64,
    end_monotonic_ns: u64,
) -> Result<Option<Vec<crate::Lost>>> {
    let mut r = Reader::open_with(path, ReadOptions::default())?;
    // Where the trace could be cut: each events chunk's start, with what came before it (chunks, events,
    // lost events) and what it holds.
    let mut cuts: Vec<(u64, [u64; 3], crate::Lost)> = Vec::new();
    // The LOST records already in it, by offset: a cut before one keeps its count.
    let mut recorded_lost: Vec<(u64, crate::Lost)> = Vec::new();
    let (mut chunks, mut events, mut lost_before) = (r.report().chunks, 0u64, 0u64);
    while let Some(c) = r.next_chunk()? {
        match c.body {
            Body::Events(_) => {
                let l = crate::Lost {
                    thread_id: c.info.thread_id,
                    count: u64::from(c.info.count),
                    first_ticks: c.info.first_ts,
                    last_ticks: c.info.last_ts,
                };
                cuts.push((c.info.offset, [chunks, events, lost_before], l));
                events += u64::from(c.info.count);
            }
            Body::Lost(ref l) => {
                lost_before += l.count;
                recorded_lost.push((c.info.offset, l.clone()));
            }
            _ => {}
        }
        chunks += 1;
    }
    let header = r.header().clone();
    let report = r.report().clone();
    drop(r);
    if report.trailer.is_some() {
        return Ok(None);
    }
    if (chunks, events, lost_before) != (report.chunks, report.events, report.lost) {
        // A chunk counted but not handed out: the counts at a cut would be wrong, so no cut but the last.
        cuts.clear();
    }
    let name = path.display().to_string();
    let io = |error| Error::Io { path: name.clone(), error };
    let len = std::fs::metadata(path).map_err(io)?.len();
    let mut cut = (report.truncated.map_or(len, |(offset, _)| offset), [report.chunks, report.events, report.lost]);
    let mut lost: Vec<crate::Lost> = lost.iter().filter(|l| l.count > 0).cloned().collect();
    let mut retreats = 0;
    loop {
        let attempt = (|| -> Result<()> {
            let file = std::fs::OpenOptions::new().write(true).open(path).map_err(io)?;
            file.set_len(cut.0).map_err(io)?;
            let mut file = file;
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(cut.0)).map_err(io)?;
            let [chunks, events, lost_events] = cut.1;
            let mut w = Writer::resume(std::io::BufWriter::new(file), &name, &header, chunks, events, lost_events)?;
            for l in &lost {
                w.lost(l)?;
            }
            let trailer = Trailer { end_unix_ns: 0, end_monotonic_ns, end_ticks, events: 0, lost: 0, chunks: 0 };
            let out = w.finish(trailer)?;
            out.into_inner().map_err(|e| io(e.into_error()))?.sync_data().map_err(io)
        })();
        match attempt {
            Ok(()) => return Ok(Some(lost)),
            Err(e) => {
                // One events chunk back, if there is one before the cut: its events join the lost.
                let Some(i) = cuts.iter().rposition(|c| c.0 < cut.0) else { return Err(e) };
                if retreats == SEAL_RETREATS {
                    return Err(e);
                }
                retreats += 1;
                let (offset, before, chunk) = cuts[i].clone();
                cuts.truncate(i);
                let dropped =
                    recorded_lost.iter().filter(|(at, _)| *at >= offset && *at < cut.0).map(|(_, l)| l.clone());
                for gone in std::iter::once(chunk).chain(dropped.collect::<Vec<_>>()) {
                    match lost.iter_mut().find(|l| l.thread_id == gone.thread_id) {
                        Some(l) => {
                            l.count += gone.count;
                            l.first_ticks = l.first_ticks.min(gone.first_ticks);
                            l.last_ticks = l.last_ticks.max(gone.last_ticks);
                        }
                        None => lost.push(gone),
                    }
                }
                cut = (offset, before);
            }
        }
    }
}

/// How many events chunks [`seal`] gives up, at most, to make room for the records that close a trace.
pub const SEAL_RETREATS: usize = 16;
