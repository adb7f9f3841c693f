//! A run of several processes (FORMAT.md 10): the first process's file, and its children's files and
//! notes in the directory beside it. Every command given the first file reads the run as one trace.

use ocular_format::{Body, ProcessInfo, ReadOptions, Reader};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One recorded process of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Process {
    /// Its trace.
    pub path: PathBuf,
    /// Its process id (the header's).
    pub pid: u32,
    /// How it belongs to the run; `None` for a file that is not part of one.
    pub info: Option<ProcessInfo>,
}

impl Process {
    /// "12258 (fork of 12250): python pool.py fork".
    pub fn title(&self) -> String {
        match &self.info {
            Some(p) if p.parent_pid != 0 => {
                let how = if p.started == "fork" { "fork" } else { "child" };
                format!("{} ({how} of {}): {}", self.pid, p.parent_pid, command(&p.argv))
            }
            Some(p) => format!("{} (the run's first process): {}", self.pid, command(&p.argv)),
            None => self.pid.to_string(),
        }
    }
}

impl Process {
    /// How it relates to its parent, for the exports: "forked by 12250" or "started by 12250"; `None` for
    /// a run's first process or a file alone.
    pub fn parent_label(&self) -> Option<String> {
        let p = self.info.as_ref().filter(|p| p.parent_pid != 0)?;
        let how = if p.started == "fork" { "forked" } else { "started" };
        Some(format!("{how} by {}", p.parent_pid))
    }
}

/// A command line for a person: its words, shortened past 80 characters.
pub fn command(argv: &[String]) -> String {
    let s = argv.join(" ").replace('\n', "\\n");
    if s.chars().count() > 80 {
        format!("{}...", s.chars().take(77).collect::<String>())
    } else {
        s
    }
}

/// A Python child that ran unrecorded, from its `PID.unrecorded.json` (FORMAT.md 10).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Unrecorded {
    /// Its process id.
    pub pid: u32,
    /// The process that started it.
    #[serde(default)]
    pub parent_pid: u32,
    /// The run it belongs to.
    #[serde(default)]
    pub run_id: Option<u64>,
    /// Its interpreter.
    #[serde(default)]
    pub executable: String,
    /// Its command line.
    #[serde(default)]
    pub argv: Vec<String>,
    /// Its Python version.
    #[serde(default)]
    pub python: String,
    /// Why it was not recorded.
    #[serde(default)]
    pub reason: String,
}

/// The processes of a run: the first one first, then its children by start order (pid, file name).
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    /// The recorded processes.
    pub processes: Vec<Process>,
    /// Python children that ran unrecorded.
    pub unrecorded: Vec<Unrecorded>,
}

impl Run {
    /// Whether the run is one process (a file without children, or not part of a run).
    pub fn single(&self) -> bool {
        self.processes.len() == 1 && self.unrecorded.is_empty()
    }
}

/// The directory where the children of the run recorded into `path` write.
pub fn children_dir(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".children");
    PathBuf::from(s)
}

/// The process record and pid of a trace: read from its first chunks (the recorder writes `PROCESS` before
/// any `EVENTS` chunk), no event decompressed.
pub fn process_of(path: &Path, opts: ReadOptions) -> ocular_format::Result<(u32, Option<ProcessInfo>)> {
    let mut r = Reader::open_with(path, ReadOptions { skip_events: true, skip_code: true, ..opts })?;
    let pid = r.header().pid;
    while let Some(c) = r.next_chunk()? {
        match c.body {
            Body::Process(p) => return Ok((pid, Some(p))),
            Body::Events(_) | Body::Trailer(_) => break,
            _ => {}
        }
    }
    Ok((pid, None))
}

/// The run `path` begins: itself, and if it is a run's first file, the files and notes of the same run in
/// its children's directory. Files there that cannot be read, or belong to another run, are left out with
/// a warning each.
pub fn open(path: &Path, opts: ReadOptions) -> ocular_format::Result<(Run, Vec<String>)> {
    let (pid, info) = process_of(path, opts)?;
    let run_id = info.as_ref().filter(|p| p.parent_pid == 0).map(|p| p.run_id);
    let mut run = Run { processes: vec![Process { path: path.to_owned(), pid, info }], unrecorded: Vec::new() };
    let mut warnings = Vec::new();
    let dir = children_dir(path);
    let (Some(run_id), Ok(entries)) = (run_id, std::fs::read_dir(&dir)) else { return Ok((run, warnings)) };
    let mut names: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    // By pid, then by file name: PID.ocl before PID.2.ocl (an exec keeps the pid).
    let key = |p: &PathBuf| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let pid: u64 = name.split('.').next().and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
        (pid, name.len(), name)
    };
    names.sort_by_key(key);
    for p in names {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.ends_with(".unrecorded.json") {
            match std::fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Unrecorded>(&b).map_err(|e| e.to_string()))
            {
                Ok(u) if u.run_id == Some(run_id) => run.unrecorded.push(u),
                Ok(_) => {}
                Err(e) => warnings.push(format!("{}: not read: {e}", p.display())),
            }
        } else if name.ends_with(".ocl") {
            match process_of(&p, opts) {
                Ok((pid, Some(info))) if info.run_id == run_id => {
                    run.processes.push(Process { path: p, pid, info: Some(info) })
                }
                Ok(_) => warnings.push(format!("{}: not part of this run, left out", p.display())),
                Err(e) => warnings.push(format!("{}: left out: {e}", p.display())),
            }
        }
    }
    warnings.extend(wait_for_children(&run, opts, LATE_CHILDREN));
    Ok((run, warnings))
}

/// How long a run whose first process has ended waits for children still recording.
const LATE_CHILDREN: std::time::Duration = std::time::Duration::from_secs(3);

/// A run whose first process has ended can have children that still record: CPython 3.14's
/// multiprocessing forkserver outlives the parent and writes its trace's last chunks after `ocular run`
/// returned, and a trace read meanwhile was read in part. Waits up to `patience` for them to end, so that
/// the run is read whole; a child still recording then is read as it stands, and said so. A run read while
/// its first process records is read as it stands at once.
fn wait_for_children(run: &Run, opts: ReadOptions, patience: std::time::Duration) -> Vec<String> {
    let recording = |p: &Process| {
        Reader::open_with(&p.path, ReadOptions { skip_events: true, skip_code: true, ..opts }).is_ok_and(|r| {
            let h = r.header();
            ocular_format::recording_alive(h.pid, h.start_ticks, h.ticks_per_second)
        })
    };
    let Some((first, children)) = run.processes.split_first() else { return Vec::new() };
    if children.is_empty() || recording(first) {
        return Vec::new();
    }
    let deadline = std::time::Instant::now() + patience;
    let mut left: Vec<&Process> = children.iter().filter(|p| recording(p)).collect();
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        left.retain(|p| recording(p));
    }
    left.iter()
        .map(|p| {
            format!(
                "{}: process {} still records {:.0} s after the run's first process ended: its trace is read as \
                 it stands",
                p.path.display(),
                p.pid,
                patience.as_secs_f64()
            )
        })
        .collect()
}
