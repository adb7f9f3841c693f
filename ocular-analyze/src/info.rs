//! `info`: what a file holds, in one pass, memory bounded by one chunk plus per-thread counters.

use ocular_format::{kind_name, Body, ReadOptions, Reader};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// A summary of one `.ocl` file.
#[derive(Debug, Serialize)]
pub struct Info {
    /// The file.
    pub path: String,
    /// `major.minor`.
    pub format_version: String,
    /// Who wrote it.
    pub recorder: String,
    /// Python version of the recorded program.
    pub python_version: String,
    /// Platform.
    pub platform: String,
    /// Recorded process id.
    pub pid: u32,
    /// Recording mode.
    pub mode: String,
    /// De-instrumentation threshold (0 = gapless).
    pub deinstrument_threshold: u32,
    /// Include filters.
    pub include_only: Vec<String>,
    /// Exclude filters.
    pub exclude: Vec<String>,
    /// Clock name.
    pub clock: String,
    /// Ticks per second.
    pub ticks_per_second: f64,
    /// Measured recorder cost per event, ns.
    pub event_cost_ns: f64,
    /// The machine's speed at the stop against the start's, which scales the costs measured at the start
    /// (FORMAT.md 6.6, since 2.12): the loop's ticks per iteration at the stop over the start's. `None`
    /// without both.
    pub cost_speed_ratio: Option<f64>,
    /// From the first to the last event, seconds.
    pub duration_s: f64,
    /// Events decoded.
    pub events: u64,
    /// Events by kind name.
    pub events_by_kind: BTreeMap<String, u64>,
    /// Threads.
    pub threads: Vec<ThreadSummary>,
    /// Code objects described.
    pub code_objects: u64,
    /// Code objects with a specialized-bytecode snapshot.
    pub snapshots: u64,
    /// Chunks read.
    pub chunks: u64,
    /// File size in bytes.
    pub file_bytes: u64,
    /// File bytes per event.
    pub bytes_per_event: f64,
    /// Events the recorder dropped.
    pub lost_events: u64,
    /// Whether the file ends with a trailer and nothing was damaged.
    pub closed_cleanly: bool,
    /// Events a flight recorder overwrote before the file was written (FORMAT.md 6.8): the file holds the
    /// newest part of the recording.
    pub dropped_events: u64,
    /// Time the recorder held recording threads up (`PAUSE` events, FORMAT.md 5.6), ms in all: taken out
    /// of every figure.
    pub recorder_pause_ms: f64,
    /// Performance counters asked for (FORMAT.md 6.9), with what was sampled.
    pub counters: Vec<CounterSummary>,
    /// The run of several processes the file belongs to, if it does (FORMAT.md 6.10).
    pub process: Option<ocular_format::ProcessInfo>,
    /// Reader warnings.
    pub warnings: Vec<String>,
}

/// A performance counter of the recording.
#[derive(Debug, Default, Serialize)]
pub struct CounterSummary {
    /// `page-faults`, ...
    pub name: String,
    /// What one event is.
    pub unit: String,
    /// Events per sample.
    pub period: u64,
    /// Why it was not recorded; empty if it was.
    pub error: String,
    /// Samples.
    pub samples: u64,
    /// Events they stand for.
    pub events: u64,
    /// Samples the kernel could not store.
    pub lost_samples: u64,
}

/// One thread's share.
#[derive(Debug, Serialize)]
pub struct ThreadSummary {
    /// Native thread id.
    pub id: u64,
    /// Name, if recorded.
    pub name: String,
    /// Events recorded.
    pub events: u64,
    /// Events the recorder dropped in this thread (it had no free buffer).
    pub lost: u64,
    /// `lost / (lost + events)`.
    pub lost_share: f64,
    /// When they were dropped, in ms after the start: (first, last) of each stretch.
    pub lost_ranges_ms: Vec<(f64, f64)>,
    /// Events a flight recorder recorded in this thread and overwrote before the file was written: all
    /// before the thread's first event in the file.
    pub dropped: u64,
    /// Up to when, in ms after the recording's start.
    pub dropped_until_ms: Option<f64>,
}

/// Reads `path` once and summarizes it.
pub fn summarize(path: impl AsRef<Path>, opts: ReadOptions) -> ocular_format::Result<Info> {
    let path = path.as_ref();
    let mut r = Reader::open_with(path, opts)?;
    let h = r.header().clone();
    let mut by_kind = [0u64; 256];
    let mut threads: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    let (mut code, mut snaps, mut lost, mut pause_ticks) = (0u64, 0u64, 0u64, 0u64);
    let (mut first, mut last) = (u64::MAX, 0u64);
    let mut counters: Vec<CounterSummary> = Vec::new();
    let mut process = None;
    let (mut start_cal, mut stop_cal) = (None, None);
    while let Some(c) = r.next_chunk()? {
        match c.body {
            Body::Process(p) => process = Some(p),
            Body::Events(ev) => {
                for e in ev {
                    by_kind[e.kind as usize] += 1;
                    pause_ticks += e.pause_ticks();
                }
                threads.entry(c.info.thread_id).or_default().1 += ev.len() as u64;
                if !ev.is_empty() {
                    first = first.min(c.info.first_ts);
                    last = last.max(c.info.last_ts);
                }
            }
            Body::Thread(t) => threads.entry(t.thread_id).or_default().0 = t.name,
            Body::Code(c) => code += c.len() as u64,
            Body::Snapshot(s) => snaps += s.len() as u64,
            Body::Lost(l) => lost += l.count,
            Body::Counters(cs) => {
                if counters.is_empty() {
                    counters = cs
                        .counters
                        .iter()
                        .map(|c| CounterSummary {
                            name: c.name.clone(),
                            unit: c.unit.clone(),
                            period: c.period,
                            error: c.error.clone(),
                            ..CounterSummary::default()
                        })
                        .collect();
                }
                for x in &cs.samples {
                    if let Some(c) = counters.get_mut(x.counter as usize) {
                        c.samples += 1;
                        c.events += x.period;
                    }
                }
                for (_, k, n) in &cs.lost {
                    if let Some(c) = counters.get_mut(*k as usize) {
                        c.lost_samples += n;
                    }
                }
            }
            Body::Calibration(c) => {
                if c.is_stop() {
                    stop_cal = Some(c);
                } else {
                    start_cal = Some(c);
                }
            }
            Body::Trailer(_) | Body::Skipped(_) | Body::Ring(_) | Body::Dropped(_) | Body::CFunctions(_) => {}
        }
    }
    let report = r.report().clone();
    let file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(report.bytes);
    let events = report.events;
    let tps = h.ticks_per_second;
    let duration_s = if last > first && tps > 0.0 { (last - first) as f64 / tps } else { 0.0 };
    let (major, minor) = r.version();
    Ok(Info {
        path: path.display().to_string(),
        format_version: format!("{major}.{minor}"),
        recorder: h.recorder,
        python_version: h.python_version,
        platform: h.platform,
        pid: h.pid,
        mode: h.options.mode.name().into(),
        deinstrument_threshold: h.options.deinstrument_threshold,
        include_only: h.options.include_only,
        exclude: h.options.exclude,
        clock: format!("{:?}", h.clock),
        ticks_per_second: tps,
        event_cost_ns: if tps > 0.0 { h.event_cost_ticks * 1e9 / tps } else { 0.0 },
        cost_speed_ratio: start_cal.zip(stop_cal).and_then(|(a, b)| a.speed_ratio(&b)),
        duration_s,
        events,
        events_by_kind: by_kind
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(k, &n)| (kind_name(k as u8).into_owned(), n))
            .collect(),
        threads: {
            let losses = crate::analysis::losses(&report);
            for l in &losses {
                threads.entry(l.thread_id).or_default();
            }
            for &id in report.dropped.keys() {
                threads.entry(id).or_default();
            }
            threads
                .into_iter()
                .map(|(id, (name, events))| {
                    let l = losses.iter().find(|l| l.thread_id == id).cloned().unwrap_or_default();
                    let d = report.dropped.get(&id);
                    ThreadSummary {
                        id,
                        name,
                        events,
                        lost: l.lost,
                        lost_share: l.share,
                        lost_ranges_ms: l.ranges_ms,
                        dropped: d.map_or(0, |d| d.events),
                        dropped_until_ms: d.and_then(|d| report.ms_after_start(d.last_ticks)),
                    }
                })
                .collect()
        },
        code_objects: code,
        snapshots: snaps,
        chunks: report.chunks,
        file_bytes,
        bytes_per_event: if events > 0 { file_bytes as f64 / events as f64 } else { 0.0 },
        lost_events: lost,
        dropped_events: report.dropped.values().map(|d| d.events).sum(),
        recorder_pause_ms: if tps > 0.0 { pause_ticks as f64 * 1e3 / tps } else { 0.0 },
        counters,
        process,
        closed_cleanly: report.clean(),
        warnings: report.warnings(&path.display().to_string()),
    })
}

impl Info {
    /// Whether the file's version has windows (2.2 on), so that one without any recorded every call.
    fn windows_known(&self) -> bool {
        let mut v = self.format_version.split('.').map(|x| x.parse::<u16>().unwrap_or(0));
        (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (2, 2)
    }
}

impl std::fmt::Display for Info {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "file          {} (.ocl {}, {} bytes)", self.path, self.format_version, self.file_bytes)?;
        writeln!(
            f,
            "recorded by   {} on Python {} ({}), pid {}",
            self.recorder, self.python_version, self.platform, self.pid
        )?;
        let threshold = match self.deinstrument_threshold {
            0 => "gapless".to_string(),
            n => format!("de-instrument after {n} hits"),
        };
        writeln!(f, "mode          {}, {threshold}", self.mode)?;
        if !self.include_only.is_empty() || !self.exclude.is_empty() {
            writeln!(f, "filters       include_only={:?} exclude={:?}", self.include_only, self.exclude)?;
        }
        writeln!(
            f,
            "clock         {} at {:.3} GHz, recorder cost {:.1} ns/event (measured at start){}",
            self.clock,
            self.ticks_per_second / 1e9,
            self.event_cost_ns,
            match self.cost_speed_ratio {
                Some(r) if (r - 1.0).abs() >= 0.005 => format!(
                    "; the machine ran {:.2}x as fast at the stop, so {:.1} ns/event is taken out",
                    1.0 / r,
                    self.event_cost_ns * r
                ),
                Some(_) => "; as fast at the stop".into(),
                None => String::new(),
            }
        )?;
        writeln!(f, "duration      {:.6} s", self.duration_s)?;
        writeln!(
            f,
            "events        {} in {} chunks, {:.3} bytes/event on disk",
            self.events, self.chunks, self.bytes_per_event
        )?;
        for (k, n) in &self.events_by_kind {
            writeln!(f, "  {k:<18} {n}")?;
        }
        if let Some(n) = self.events_by_kind.get("PAUSE") {
            writeln!(
                f,
                "recorder      held its threads up {n} time{} for {:.3} ms in all (a full buffer's next one was slow \
                 to get): taken out of every figure",
                if *n == 1 { "" } else { "s" },
                self.recorder_pause_ms
            )?;
        }
        if self.events_by_kind.contains_key("WINDOW") {
            // FORMAT.md 5.3: the first window is the run's first 100 x threshold calls.
            let first = u64::from(self.deinstrument_threshold) * 100;
            match self.events_by_kind.get("WINDOW_END") {
                None => writeln!(f, "calls         all recorded (the run made fewer than the first window's {first})")?,
                Some(_) => writeln!(
                    f,
                    "calls         the first {first} recorded, then in windows: function figures are estimates \
                     (stats marks them ~)"
                )?,
            }
        } else if self.deinstrument_threshold > 0 && self.mode != "calls" && self.windows_known() {
            // Not sampled (FORMAT.md 5.3): the threshold thinned out locations only.
            writeln!(f, "calls         every one recorded: counts are exact")?;
        }
        writeln!(f, "threads       {}", self.threads.len())?;
        for t in &self.threads {
            let name = if t.name.is_empty() { "(unnamed)" } else { &t.name };
            if t.lost > 0 {
                writeln!(
                    f,
                    "  {:<10} {name:<24} {} events, {} lost ({:.1}%)",
                    t.id,
                    t.events,
                    t.lost,
                    t.lost_share * 100.0
                )?;
            } else {
                writeln!(f, "  {:<10} {name:<24} {} events", t.id, t.events)?;
            }
            if t.dropped > 0 {
                let until = t.dropped_until_ms.map_or(String::new(), |ms| format!(" (up to {ms:.1} ms)"));
                writeln!(f, "  {:<10} {:<24} {} earlier events overwritten by the ring{until}", "", "", t.dropped)?;
            }
        }
        writeln!(f, "code objects  {} ({} with a specialized snapshot)", self.code_objects, self.snapshots)?;
        writeln!(f, "lost events   {}", self.lost_events)?;
        for c in &self.counters {
            if c.error.is_empty() {
                let lost =
                    if c.lost_samples > 0 { format!(", {} samples lost", c.lost_samples) } else { String::new() };
                writeln!(
                    f,
                    "counter       {}: {} {} in {} samples (one every {}){lost}",
                    c.name, c.events, c.unit, c.samples, c.period
                )?;
            } else {
                writeln!(f, "counter       {}: {}", c.name, c.error)?;
            }
        }
        if self.dropped_events > 0 {
            writeln!(
                f,
                "flight rec.   the newest part of the recording: {} earlier events were overwritten by its ring",
                self.dropped_events
            )?;
        }
        write!(f, "closed        {}", if self.closed_cleanly { "cleanly" } else { "NOT cleanly (see warnings)" })?;
        Ok(())
    }
}

/// One process of a run (FORMAT.md 10), as `info` lists it.
#[derive(Debug, Serialize)]
pub struct ProcessSummary {
    /// Process id.
    pub pid: u32,
    /// The process that started it (0 for the run's first).
    pub parent_pid: u32,
    /// `run`, `fork` or `exec`.
    pub started: String,
    /// Its command line.
    pub argv: Vec<String>,
    /// Its trace.
    pub file: String,
    /// Events recorded.
    pub events: u64,
    /// Events the recorder dropped.
    pub lost_events: u64,
    /// First to last event.
    pub duration_s: f64,
    /// Threads with events.
    pub threads: usize,
    /// Whether its file ends with a trailer and nothing was damaged.
    pub closed_cleanly: bool,
}

/// `info` of a run of several processes: the first process's file in full, then every process.
#[derive(Debug, Serialize)]
pub struct RunInfo {
    /// The first process's file.
    #[serde(flatten)]
    pub first: Info,
    /// Every recorded process, the first one first.
    pub processes: Vec<ProcessSummary>,
    /// Python children that ran unrecorded, and why.
    pub unrecorded: Vec<crate::procs::Unrecorded>,
}

/// Summarizes every process of `run`; the warnings of the children's files are in each's reading.
pub fn summarize_run(run: &crate::procs::Run, opts: ReadOptions) -> ocular_format::Result<RunInfo> {
    let mut infos = Vec::new();
    for p in &run.processes {
        infos.push(summarize(&p.path, opts)?);
    }
    let processes = run
        .processes
        .iter()
        .zip(&infos)
        .map(|(p, i)| ProcessSummary {
            pid: p.pid,
            parent_pid: p.info.as_ref().map_or(0, |x| x.parent_pid),
            started: p.info.as_ref().map_or_else(String::new, |x| x.started.clone()),
            argv: p.info.as_ref().map_or_else(Vec::new, |x| x.argv.clone()),
            file: p.path.display().to_string(),
            events: i.events,
            lost_events: i.lost_events,
            duration_s: i.duration_s,
            threads: i.threads.len(),
            closed_cleanly: i.closed_cleanly,
        })
        .collect();
    let mut infos = infos.into_iter();
    let mut first = infos.next().expect("a run has its first process");
    for i in infos {
        first.warnings.extend(i.warnings);
    }
    Ok(RunInfo { first, processes, unrecorded: run.unrecorded.clone() })
}

impl std::fmt::Display for RunInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.first)?;
        let events: u64 = self.processes.iter().map(|p| p.events).sum();
        writeln!(f, "\nrun of {} processes, {events} events in all:", self.processes.len())?;
        writeln!(
            f,
            "  {:>8} {:>8}  {:<5} {:>12} {:>10} {:>7}  command",
            "pid", "parent", "how", "events", "seconds", "threads"
        )?;
        for p in &self.processes {
            let parent = if p.parent_pid == 0 { "-".to_string() } else { p.parent_pid.to_string() };
            let unclean = if p.closed_cleanly { "" } else { "  (not closed cleanly: killed, or still running)" };
            writeln!(
                f,
                "  {:>8} {parent:>8}  {:<5} {:>12} {:>10.3} {:>7}  {}{unclean}",
                p.pid,
                p.started,
                p.events,
                p.duration_s,
                p.threads,
                crate::procs::command(&p.argv)
            )?;
        }
        for u in &self.unrecorded {
            writeln!(
                f,
                "  not recorded: pid {} (child of {}), {} (Python {}): {}",
                u.pid,
                u.parent_pid,
                crate::procs::command(&u.argv),
                u.python,
                u.reason
            )?;
        }
        Ok(())
    }
}
