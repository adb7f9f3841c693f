//! Performance counters (FORMAT.md 6.9): the kernel samples software and hardware counters per recorded
//! thread (`perf_event_open`), every `period` events, noting the thread and the time; a thread of the
//! recorder drains the samples while the program runs. Nothing of this is on the hot path: a thread's
//! counters are opened when it is first seen, and the kernel does the counting.

use ocular_format::{CounterInfo, CounterSample, CounterSamples};
use std::sync::Mutex;

/// What a counter counts, for `perf_event_open`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `PERF_TYPE_SOFTWARE` with this config.
    Software(u64),
    /// `PERF_TYPE_HARDWARE` with this config.
    Hardware(u64),
}

/// A counter asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// As asked for (`page-faults`).
    pub name: String,
    /// What one event is.
    pub unit: &'static str,
    /// Events per sample.
    pub period: u64,
    /// What to open.
    pub source: Source,
}

/// The counters Ocular knows: name, unit, default period (events per sample), source.
const KNOWN: &[(&str, &str, u64, Source)] = &[
    // 1 ms of CPU time per sample: 1,000 samples per second of a busy thread. Each sample is a timer
    // interrupt, which a virtual machine pays dearly for (measured here: every 1 ms 1.03x, every 0.1 ms
    // 1.21x, every 0.01 ms 70x; BENCHMARKS.md).
    ("task-clock", "ns", 1_000_000, Source::Software(1)),
    ("page-faults", "faults", 1, Source::Software(2)),
    ("context-switches", "switches", 1, Source::Software(3)),
    ("cpu-migrations", "migrations", 1, Source::Software(4)),
    ("minor-faults", "faults", 1, Source::Software(5)),
    ("major-faults", "faults", 1, Source::Software(6)),
    ("cycles", "cycles", 1_000_000, Source::Hardware(0)),
    ("instructions", "instructions", 1_000_000, Source::Hardware(1)),
    ("cache-references", "references", 100_000, Source::Hardware(2)),
    ("cache-misses", "misses", 10_000, Source::Hardware(3)),
    ("branches", "branches", 1_000_000, Source::Hardware(4)),
    ("branch-misses", "misses", 10_000, Source::Hardware(5)),
];

/// `page-faults` or `page-faults:10` (a sample every 10 events) as a [`Spec`], or why it is not one.
pub fn spec(text: &str) -> Result<Spec, String> {
    let (name, period) = match text.split_once(':') {
        Some((n, p)) => {
            let p: u64 = p
                .parse()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("{text:?}: the period after ':' must be a whole number above 0"))?;
            (n, Some(p))
        }
        None => (text, None),
    };
    let Some(&(n, unit, default, source)) = KNOWN.iter().find(|k| k.0 == name) else {
        let names: Vec<&str> = KNOWN.iter().map(|k| k.0).collect();
        return Err(format!("unknown counter {name:?}: Ocular knows {}", names.join(", ")));
    };
    Ok(Spec { name: n.to_string(), unit, period: period.unwrap_or(default), source })
}

#[cfg(target_os = "linux")]
mod sys {
    use super::{Source, Spec};
    use perf_event::events::{Hardware, Software};
    use perf_event::{Builder, SampleFlag, Sampler};

    /// Opens `spec` for thread `tid`, sampling into a ring of `pages` pages; with `kernel`, samples taken
    /// while the thread is in the kernel count too (a page fault is handled there).
    pub fn open(spec: &Spec, tid: u64, kernel: bool, pages: usize) -> std::io::Result<Sampler> {
        let mut b = match spec.source {
            Source::Software(c) => Builder::new(Software::from(c)),
            Source::Hardware(c) => Builder::new(Hardware::from(c)),
        };
        b.observe_pid(tid as libc::pid_t)
            .any_cpu()
            .sample_period(spec.period)
            .sample(SampleFlag::TID | SampleFlag::TIME | SampleFlag::PERIOD)
            .clockid(perf_event::Clock::MONOTONIC)
            .exclude_kernel(!kernel)
            .exclude_hv(true)
            .enabled(true);
        b.build()?.sampled(pages * 4096)
    }
}

/// Why a counter could not be opened, for a person.
fn why(spec: &Spec, e: &std::io::Error) -> String {
    let hardware = matches!(spec.source, Source::Hardware(_));
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) if hardware => {
            "not available: this machine has no hardware performance counters (no PMU: most virtual machines)".into()
        }
        Some(libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => "not supported by this kernel".into(),
        Some(libc::EACCES | libc::EPERM) => format!(
            "not permitted: /proc/sys/kernel/perf_event_paranoid is {paranoid} (2 or less lets a user sample their \
             own processes), or a container forbids perf_event_open"
        ),
        Some(libc::ENOSYS) => "perf_event_open is not available here (a seccomp filter or a container)".into(),
        Some(libc::EMFILE | libc::ENFILE) => "too many open files (one per counter per thread)".into(),
        _ => e.to_string(),
    }
}

struct Open {
    thread_id: u64,
    counter: u8,
    /// Its thread exited: dropped by the next drain, once that has read its last samples.
    closing: bool,
    #[cfg(target_os = "linux")]
    sampler: perf_event::Sampler,
}

/// The counters of a recording: which could be opened, and every thread's samplers.
pub struct Counters {
    specs: Vec<Spec>,
    /// Per spec: empty if it works, else why not.
    errors: Vec<String>,
    /// Per spec: whether samples in the kernel count (they could be opened so).
    kernel: Vec<bool>,
    open: Mutex<Vec<Open>>,
    threads: Mutex<Vec<u64>>,
    /// Threads whose counters could not be opened (out of file descriptors): said at the stop.
    failed: Mutex<Vec<String>>,
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters").field("specs", &self.specs).field("errors", &self.errors).finish_non_exhaustive()
    }
}

/// Pages of each sampler's ring: 256 KiB, ~6,500 samples (40 bytes each) between two drains (every 10 ms):
/// a thread faulting in fresh memory makes ~400 page faults per ms. Beyond, samples are lost and counted.
const PAGES: usize = 64;

impl Counters {
    /// Tries each counter on the calling thread (`tid`), keeping the ones that open; the others get their
    /// reason in [`Counters::errors`] and are not opened for other threads.
    pub fn new(specs: Vec<Spec>, tid: u64) -> Counters {
        let mut c = Counters {
            errors: vec![String::new(); specs.len()],
            kernel: vec![true; specs.len()],
            specs,
            open: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            failed: Mutex::new(Vec::new()),
        };
        for i in 0..c.specs.len() {
            #[cfg(target_os = "linux")]
            {
                let spec = &c.specs[i];
                let first = sys::open(spec, tid, true, PAGES);
                // Sampling in the kernel is refused to users when perf_event_paranoid is 2: user only then.
                let got = match first {
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
                        c.kernel[i] = false;
                        sys::open(spec, tid, false, PAGES)
                    }
                    other => other,
                };
                match got {
                    Ok(sampler) => c.open.get_mut().expect("new").push(Open {
                        thread_id: tid,
                        counter: i as u8,
                        closing: false,
                        sampler,
                    }),
                    Err(e) => c.errors[i] = why(spec, &e),
                }
            }
            #[cfg(not(target_os = "linux"))]
            {
                c.errors[i] = "performance counters need Linux (perf_event_open)".into();
            }
        }
        c.threads.get_mut().expect("new").push(tid);
        c
    }

    /// `(name, why)` of each counter that could not be opened.
    pub fn errors(&self) -> Vec<(String, String)> {
        self.specs
            .iter()
            .zip(&self.errors)
            .filter(|(_, e)| !e.is_empty())
            .map(|(s, e)| (s.name.clone(), e.clone()))
            .collect()
    }

    /// Whether any counter works.
    pub fn any(&self) -> bool {
        self.errors.iter().any(String::is_empty)
    }

    /// Opens the working counters for thread `tid` (once).
    pub fn open_thread(&self, tid: u64) {
        {
            let mut t = self.threads.lock().unwrap_or_else(|e| e.into_inner());
            if t.contains(&tid) {
                return;
            }
            t.push(tid);
        }
        #[cfg(target_os = "linux")]
        for (i, spec) in self.specs.iter().enumerate() {
            if !self.errors[i].is_empty() {
                continue;
            }
            match sys::open(spec, tid, self.kernel[i], PAGES) {
                Ok(sampler) => self.open.lock().unwrap_or_else(|e| e.into_inner()).push(Open {
                    thread_id: tid,
                    counter: i as u8,
                    closing: false,
                    sampler,
                }),
                Err(e) => self.failed.lock().unwrap_or_else(|e| e.into_inner()).push(format!(
                    "{} of thread {tid}: {}",
                    spec.name,
                    why(spec, &e)
                )),
            }
        }
    }

    /// Thread `tid` exited: its samplers are closed after the next drain reads their last samples, and a
    /// new thread given the same id (Linux reuses them) gets counters of its own. A program that starts a
    /// thread per request otherwise kept a file descriptor and 256 KiB of mapping per counter and thread.
    pub fn close_thread(&self, tid: u64) {
        self.threads.lock().unwrap_or_else(|e| e.into_inner()).retain(|&t| t != tid);
        for o in self.open.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
            if o.thread_id == tid {
                o.closing = true;
            }
        }
    }

    /// Counters that could not be opened for some thread.
    pub fn thread_failures(&self) -> Vec<String> {
        self.failed.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What the counters are, for the file.
    pub fn info(&self) -> Vec<CounterInfo> {
        self.specs
            .iter()
            .zip(&self.errors)
            .map(|(s, e)| CounterInfo { name: s.name.clone(), unit: s.unit.into(), period: s.period, error: e.clone() })
            .collect()
    }

    /// Every sample the kernel wrote since the last drain, and the samples it could not store.
    pub fn drain(&self) -> CounterSamples {
        let mut out = CounterSamples { counters: self.info(), ..CounterSamples::default() };
        #[cfg(target_os = "linux")]
        {
            use perf_event::data::Record;
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            for o in open.iter_mut() {
                let mut lost = 0u64;
                while let Some(r) = o.sampler.next_record() {
                    match r.parse_record() {
                        Ok(Record::Sample(s)) => out.samples.push(CounterSample {
                            thread_id: s.tid().map_or(o.thread_id, u64::from),
                            counter: o.counter,
                            monotonic_ns: s.time().unwrap_or(0),
                            period: s.period().unwrap_or(self.specs[o.counter as usize].period),
                        }),
                        Ok(Record::Lost(l)) => lost += l.lost,
                        _ => {}
                    }
                }
                if lost > 0 {
                    out.lost.push((o.thread_id, o.counter, lost));
                }
            }
            open.retain(|o| !o.closing);
        }
        out
    }
}
