//! Flame graphs: the analysis pass's call tree (exclusive time per call stack, recorder cost subtracted as
//! in `stats`) folded into `outer;inner;leaf nanoseconds` lines and rendered to SVG by `inferno`, as an
//! icicle (roots on top). Drawing costs the number of distinct stacks; the pass costs what `stats` does.

use ocular_format::ReadOptions;
use std::io::Write;
use std::path::Path;

/// Folded stacks, `("outer;inner;leaf", exclusive nanoseconds)`, sorted.
pub type Folded = Vec<(String, u64)>;

/// Folded stacks, one entry per distinct stack (under a frame per thread when several threads ran), and
/// the reader's warnings; with windows (FORMAT.md 5.3), a warning says that the widths are estimates.
pub fn folded(path: &Path, opts: ReadOptions) -> anyhow::Result<(Folded, Vec<String>)> {
    let (lines, warnings, _) = folded_with_note(path, opts)?;
    Ok((lines, warnings))
}

fn folded_with_note(path: &Path, opts: ReadOptions) -> anyhow::Result<(Folded, Vec<String>, Option<String>)> {
    let a = crate::analysis::analyze(path, opts)?;
    let mut note = a.windows.as_ref().filter(|w| w.estimated()).map(|w| {
        w.describe(a.header.as_ref().map_or(1e9, |h| h.ticks_per_second)).replace("figures marked ~", "widths")
    });
    if !a.losses.is_empty() {
        let lost = format!(
            "{:.1}% of events were lost (the recorder had no free buffer): widths miss those stretches",
            a.lost_share(0) * 100.0
        );
        note = Some(match note {
            Some(n) => format!("{n}; {lost}"),
            None => lost,
        });
    }
    let name = |id: &u32| a.code.get(id).map_or("?".to_string(), |c| c.qualname.replace(';', ":"));
    // With several threads, each one's stacks stand under a frame naming it ("thread MainThread (4242)").
    let stacks = a.tree.thread_stacks();
    let threads: std::collections::BTreeSet<u64> = stacks.iter().map(|s| s.0).collect();
    let thread = |tid: u64| {
        let n = a.threads.get(&tid).map_or(String::new(), |n| format!("{} ", n.replace(';', ":")));
        format!("thread {n}({tid});")
    };
    let mut merged: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for (tid, path, ticks) in stacks {
        let ns = a.ns(ticks).round() as u64;
        if ns > 0 {
            let root = if threads.len() > 1 { thread(tid) } else { String::new() };
            *merged.entry(root + &path.iter().map(name).collect::<Vec<_>>().join(";")).or_default() += ns;
        }
    }
    let lines: Folded = merged.into_iter().collect();
    Ok((lines, a.warnings, note))
}

/// Folded stacks of a run of several processes (FORMAT.md 10): each process's stacks under a root frame
/// naming it ("13200 python job.py"), and the warnings; a single process's as [`folded`].
pub fn folded_run(run: &crate::procs::Run, opts: ReadOptions) -> anyhow::Result<(Folded, Vec<String>, Option<String>)> {
    if run.single() {
        return folded_with_note(&run.processes[0].path, opts);
    }
    let (mut all, mut warnings, mut notes) = (Vec::new(), Vec::new(), Vec::new());
    for p in &run.processes {
        let (lines, w, note) = folded_with_note(&p.path, opts)?;
        let argv = p.info.as_ref().map_or_else(Vec::new, |i| i.argv.clone());
        let root = format!("{} {}", p.pid, crate::procs::command(&argv)).replace(';', ":");
        all.extend(lines.into_iter().map(|(s, v)| (format!("{root};{s}"), v)));
        warnings.extend(w);
        if let Some(n) = note {
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
    }
    all.sort();
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    Ok((all, warnings, note))
}

/// Writes an SVG flame graph of `path` to `out`: of its whole run if it is a run's first file.
pub fn svg(path: &Path, opts: ReadOptions, title: &str, out: &mut dyn Write) -> anyhow::Result<Vec<String>> {
    let (run, mut warnings) = crate::procs::open(path, opts)?;
    let (lines, w, note) = folded_run(&run, opts)?;
    warnings.extend(w);
    if lines.is_empty() {
        anyhow::bail!("{}: no function calls recorded, nothing to draw", path.display());
    }
    let text: Vec<String> = lines.iter().map(|(s, v)| format!("{s} {v}")).collect();
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = "ns".to_string();
    // An icicle: the roots (processes, threads, the outermost calls) on top, in view without scrolling
    // however deep the stacks go.
    options.direction = inferno::flamegraph::Direction::Inverted;
    // Estimated widths say so on the picture itself, not only in a terminal.
    options.subtitle = note;
    inferno::flamegraph::from_lines(&mut options, text.iter().map(String::as_str), out)?;
    Ok(warnings)
}
