//! The `ocular-analyze` command line, as a library function so that the Python package can offer the same
//! commands (`python -m ocular hot run.ocl`) without a second parser.

use anyhow::Context;
use clap::{Parser, Subcommand};
use ocular_format::ReadOptions;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

/// Analyze Ocular traces (.ocl files) recorded from Python programs.
///
/// Record with `python -m ocular run script.py` (writes ocular.ocl), then:
///
///   ocular-analyze info ocular.ocl
///   ocular-analyze hot ocular.ocl
///   ocular-analyze report ocular.ocl -o ocular.html      # everything on one page
///   ocular-analyze stats ocular.ocl --sort inclusive
///   ocular-analyze stats --lines ocular.ocl
///   ocular-analyze export --perfetto ocular.ocl -o ocular.json
///   ocular-analyze export --pprof ocular.ocl -o ocular.pb.gz
///   ocular-analyze flamegraph ocular.ocl -o flame.svg
///   ocular-analyze specialize ocular.ocl
///   ocular-analyze diff before.ocl after.ocl
///   ocular-analyze dump ocular.ocl | less
///
/// And while a program records:
///
///   ocular-analyze top PID
#[derive(Parser, Debug)]
#[command(name = "ocular-analyze", version, about, long_about, propagate_version = true, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Summarize a trace: Python version, mode, duration, threads, events by kind, size, lost events.
    ///
    /// Example: ocular-analyze info run.ocl --json | jq .events_by_kind
    Info {
        /// The .ocl file.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// Show the hottest loops: iterations, time per iteration (recorder cost subtracted), and the loop body
    /// disassembled as base -> specialized opcode with its average cost per instruction.
    ///
    /// Example: ocular-analyze hot run.ocl --top 3
    Hot {
        /// The .ocl file.
        file: PathBuf,
        /// How many loops to show.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// Per-function statistics: calls, inclusive and exclusive time, mean time per call, file:line.
    ///
    /// Threads merged, a function's times are summed over the threads that ran it, so they can exceed the
    /// wall time: the report starts with the wall time (first to last event) and the number of threads,
    /// and "incl %" is the inclusive time as a share of the wall time times the threads summed.
    ///
    /// Example: ocular-analyze stats run.ocl --sort inclusive --top 20
    Stats {
        /// The .ocl file.
        file: PathBuf,
        /// Order of the rows.
        #[arg(long, value_enum, default_value_t = crate::stats::SortBy::Exclusive)]
        sort: crate::stats::SortBy,
        /// How many functions to show, per thread with --per-thread (text and JSON).
        #[arg(long, default_value_t = 25)]
        top: usize,
        /// One table per thread instead of merged: a heading with the thread's id and name, then its
        /// functions, with shares of the wall time.
        #[arg(long)]
        per_thread: bool,
        /// A run of several processes (recorded with python -m ocular run, which follows child
        /// processes): one table per process instead of one of every process merged.
        #[arg(long)]
        per_process: bool,
        /// Per source line instead of per function: the hottest lines by own time (file:line, function,
        /// hits, own ms, share, time with callees, the source text), from the jump and branch (adaptive)
        /// or instruction (precise) events; calls mode records no lines. Processes of a run are summed.
        /// JSON: an array of rows (pid, file, line, function, hits, own_ms, with_callees_ms, share,
        /// estimated, source).
        #[arg(long, conflicts_with_all = ["per_thread", "per_process"])]
        lines: bool,
        /// The async view: per coroutine function its time running (inclusive), awaiting (what it awaited
        /// was not done) and ready (done, waiting for the event loop), and what it awaited; where tasks
        /// waited, as await chains rooted at the task's coroutine; and the tasks, longest first. Needs a
        /// recording by Ocular 0.8+ (format 2.8, coroutine frames); every mode records it. Processes of a
        /// run are merged. JSON: {functions, chains, tasks, more, tasks_total, ready_measured, notes}.
        #[arg(long = "async", conflicts_with_all = ["per_thread", "per_process", "lines"])]
        awaits: bool,
        /// Only the time inside spans of this name (ocular.span, or OpenTelemetry's through
        /// ocular.otel.SpanProcessor): per function its calls begun inside them and its time inside them
        /// (a function that began a span holds only the span's part), with incl % of the program's time
        /// inside them. Needs every call recorded (not --sampled). JSON: {name, spans, open, spans_ms,
        /// program_ms, program_ci_ms, rows
        /// (function, location, calls, exclusive_ms, exclusive_ci_ms, inclusive_ms, inclusive_ci_ms, share),
        /// more, names, notes}.
        #[arg(long, value_name = "NAME", conflicts_with_all = ["per_thread", "per_process", "lines", "awaits"])]
        span: Option<String>,
        /// Print JSON instead of text: an array of rows (thread_id, thread_name, function, file, line, calls,
        /// inclusive_ms, exclusive_ms, mean_us, wall_ms, threads, wall_share = inclusive_ms / (wall_ms x
        /// threads)).
        #[arg(long)]
        json: bool,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// Spans (marked with ocular.span, or OpenTelemetry's through ocular.otel.SpanProcessor): per name,
    /// how many and how long (p50, p95, p99, max: exact); the slowest spans, each with its time by
    /// function; and per name, where its slow spans (at or above its 95th percentile) spent time the
    /// others did not. Times by function need every call recorded (not --sampled).
    ///
    /// Example: ocular-analyze spans run.ocl --top 3
    Spans {
        /// The .ocl file.
        file: PathBuf,
        /// How many of the slowest spans to break down.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// How many functions per table.
        #[arg(long, default_value_t = 10)]
        functions: usize,
        /// Print JSON instead of text: {names, slowest, differences, by_function, cut_by_ring, notes}.
        #[arg(long)]
        json: bool,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// Export for other tools.
    ///
    /// --perfetto writes Chrome Trace Event JSON or the native Perfetto protobuf (function slices per
    /// thread, "loop" instants with uops and cycles), which ui.perfetto.dev opens.
    ///
    /// --parquet writes a directory with events.parquet (one row per event: thread_id, ts_ns, tsc, event,
    /// function, file, line, offset, opcode, specialized, ...), calls.parquet (one row per function call:
    /// start_ns, end_ns, depth, parent, ...), code.parquet, lost.parquet (one row per stretch of events
    /// the recorder dropped; empty when none were), counter_samples.parquet, lines.parquet,
    /// functions.parquet (per function, as stats: calls, inclusive_ns, exclusive_ns, and the 95% intervals
    /// of estimates), coroutines.parquet (per coroutine function: running_ns, awaiting_ns, ready_ns, as stats --async)
    /// and tasks.parquet (one row per asyncio task), for polars or pandas:
    /// pl.read_parquet("run.parquet/events.parquet"). (Needs a build with `--features parquet`.)
    ///
    /// --pprof writes a gzipped pprof profile (profile.proto) for go tool pprof, Pyroscope, Parca and
    /// Grafana: one sample per call stack with self values (calls, wall nanoseconds, performance
    /// counters), labels pid, thread_id and thread; functions with their file and first line.
    ///
    /// Examples:
    ///   ocular-analyze export --perfetto run.ocl -o run.json
    ///   ocular-analyze export --perfetto run.ocl -o run.pftrace
    ///   ocular-analyze export --parquet run.ocl -o run.parquet
    ///   ocular-analyze export --pprof run.ocl -o run.pb.gz
    #[command(group(clap::ArgGroup::new("to").required(true).args(["perfetto", "parquet", "pprof"])))]
    Export {
        /// The .ocl file.
        file: PathBuf,
        /// Perfetto / Chrome trace.
        #[arg(long)]
        perfetto: bool,
        /// Parquet tables (a directory).
        #[arg(long)]
        parquet: bool,
        /// pprof profile, gzipped (.pb.gz or .pprof).
        #[arg(long)]
        pprof: bool,
        /// Output file, or directory for --parquet (default: the input with .json, .pftrace, .parquet or
        /// .pb.gz).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// json (Chrome Trace Event format) or pftrace (native Perfetto protobuf); an output ending in
        /// .pftrace chooses pftrace.
        #[arg(long, default_value = "json")]
        format: String,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// Draw an SVG flame graph of the call tree: stacks by exclusive time, recorder cost subtracted.
    ///
    /// Example: ocular-analyze flamegraph run.ocl -o flame.svg
    Flamegraph {
        /// The .ocl file.
        file: PathBuf,
        /// Output SVG (default: the input with .svg).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Print the folded stacks ("a;b;c nanoseconds") instead of drawing.
        #[arg(long)]
        folded: bool,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// A live view of a running recording: its hottest functions (calls/s, share of exclusive time) and
    /// loops over the last seconds, per thread or merged, refreshed every second; q or Ctrl-C quits.
    ///
    /// It follows the recording's ring file in the user's runtime directory, from another process,
    /// without slowing it: events it cannot read in time are counted as missed. Record with `--live`
    /// (python -m ocular run --live ...) so that it misses nothing; a flight recorder (--ring) can be
    /// watched too. --sampled recordings record calls in windows: calls/s are scaled up, marked ~, and
    /// given the range the windows allow (from recording costing them nothing to three times its cost).
    /// Times include the recorder's own cost (~25 ns per event). A function in a long call or a sleep
    /// holds its time as it goes, from when top opened if it began before: top reads each thread's last
    /// events in the ring when it opens, to know the calls it is in.
    /// Loops are read from their recorded iterations: with a threshold (the default) a loop's first
    /// 2 x threshold only, so the rates are lower bounds (>=); --threshold 0 records every one.
    ///
    /// Examples:
    ///   ocular-analyze top 12345
    ///   ocular-analyze top 12345 --once --seconds 2
    ///   ocular-analyze top 12345 --json | jq '.functions[0]'
    #[command(verbatim_doc_comment)]
    Top {
        /// The recording process's pid, or its ring file.
        target: String,
        /// Print one snapshot of SECONDS and exit, instead of the live view.
        #[arg(long)]
        once: bool,
        /// Print one snapshot as JSON and exit.
        #[arg(long)]
        json: bool,
        /// The span the figures cover (and, with --once/--json, how long to follow).
        #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
        seconds: f64,
        /// Redraw every SECONDS.
        #[arg(long, default_value_t = 1.0, value_name = "SECONDS")]
        interval: f64,
        /// One row per function and thread instead of merged (t toggles it in the live view).
        #[arg(long)]
        per_thread: bool,
        /// Rows per table.
        #[arg(long, default_value_t = 15)]
        top: usize,
    },
    /// What changed between two recordings of one program: functions, hot loops, specialization.
    ///
    /// Per function (matched by file and qualified name): calls and time per call before and after, sorted
    /// by the change of exclusive time; functions new and vanished; hot loops' time per iteration (matched
    /// by function and first line); the instructions whose specialization at stop changed
    /// (BINARY_OP_ADD_INT before, BINARY_OP after).
    ///
    /// Recordings of different Python versions are refused (--force compares them anyway); different
    /// modes, thresholds or machines are compared with a warning. Estimates (windows) are marked ~.
    /// --json prints one object: before, after, warnings, notes, functions, new_functions,
    /// vanished_functions, loops, new_loops, vanished_loops, specializations, left_out (rows --top left out).
    ///
    /// Examples:
    ///   ocular-analyze diff before.ocl after.ocl
    ///   ocular-analyze diff before.ocl after.ocl --json | jq '.functions[0].factor'
    #[command(verbatim_doc_comment)]
    Diff {
        /// The earlier recording.
        before: PathBuf,
        /// The later recording.
        after: PathBuf,
        /// Rows per list.
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Compare recordings of different Python versions.
        #[arg(long)]
        force: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// Write one self-contained HTML page of a trace: its facts, a flame graph / icicle per thread and
    /// merged (zoom, search), the functions (sortable), the hot loops with their specialized opcodes, and
    /// the source of the hottest functions. It opens offline, in any browser; its size grows with the
    /// number of distinct stacks and functions, not with the trace's length.
    ///
    /// Example: ocular-analyze report run.ocl -o run.html && xdg-open run.html
    Report {
        /// The .ocl file (a run's first file reports the whole run).
        file: PathBuf,
        /// The page to write (default: the trace's name with .html).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// How many functions the table holds (the most exclusive time first).
        #[arg(long, default_value_t = 500)]
        functions: usize,
        /// How many hot loops to show.
        #[arg(long, default_value_t = 20)]
        loops: usize,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// The instructions CPython left generic in the hottest loops and functions: their base opcode still
    /// held when recording stopped although this Python has specialized forms for it (BINARY_OP instead of
    /// BINARY_OP_ADD_INT, LOAD_ATTR instead of LOAD_ATTR_INSTANCE_VALUE, ...), weighted by the time spent
    /// there, with the likely cause the opcode tells (BINARY_OP: operand types vary or are not both int,
    /// float or str, e.g. mixed int and float; LOAD_ATTR: __getattr__, descriptors, varying shapes; ...).
    ///
    /// It walks the --top hottest loops (hot's ranking) and the --top functions with the most exclusive
    /// time, comparing each instruction's base opcode with the bytecode snapshot taken at stop; families
    /// come from the file's own opcode table, so every Python version is named as it names itself.
    /// "Generic at stop" cannot tell never specialized from de-specialized (the snapshot keeps opcodes, not
    /// adaptive counters). Instructions that ran fewer than 2 times (cold), still instrumented at stop
    /// (hidden), or without specialized forms (a BINARY_OP `**`) are counted, not listed.
    ///
    /// Weights are estimates: in a loop, the instruction's share of the loop's recorded time (each block
    /// between two events spread evenly over its instructions, callees excluded), scaled up by the time
    /// the loop ran after the threshold stopped recording it; outside loops, the function's exclusive time
    /// left after its loops, shared evenly over its other instructions.
    ///
    /// --json prints one object: file, python, mode, weighting, notes, and blocks (kind "loop" or
    /// "function", function, file, first_line, last_line, offsets, iterations, total_ns, instructions,
    /// specialized, generic_count, instrumented, unspecializable, unknown, cold, listed_elsewhere, and
    /// generic: function, file, line, offset, base, operator, at_stop, status, weight_ns, weight_kind,
    /// share, executions, cause, forms).
    ///
    /// Examples:
    ///   python -m ocular run -o run.ocl script.py
    ///   ocular-analyze specialize run.ocl --top 3
    ///   ocular-analyze specialize run.ocl --json | jq '.blocks[].generic[] | [.base, .line, .cause]'
    #[command(verbatim_doc_comment)]
    Specialize {
        /// The .ocl file.
        file: PathBuf,
        /// How many loops, and how many functions, to walk.
        #[arg(long, default_value_t = 5)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// Print every record of a trace as text, one line per event (the golden format of the tests).
    ///
    /// Example: ocular-analyze dump run.ocl | grep PY_START | head
    Dump {
        /// The .ocl file.
        file: PathBuf,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info { file, json, salvage } => {
            let opts = ReadOptions::with_salvage(salvage);
            // `info` says what any file holds, an empty or cut off one too.
            let (run, warnings) = crate::procs::open(&file, opts)?;
            warn(&warnings);
            if run.single() {
                let info = crate::info::summarize(&file, opts)?;
                warn(&info.warnings);
                print_report(json, &info, |out| writeln!(out, "{info}"))?;
            } else {
                let info = crate::info::summarize_run(&run, opts)?;
                warn(&info.first.warnings);
                print_report(json, &info, |out| writeln!(out, "{info}"))?;
            }
        }
        Command::Spans { file, top, functions, json, salvage } => {
            let report = crate::spans::analyze(&file, ReadOptions::with_salvage(salvage), top, functions)?;
            print_report(json, &report, |out| write!(out, "{report}"))?;
            warn(&report.warnings);
        }
        Command::Hot { file, top, json, salvage } => {
            let opts = ReadOptions::with_salvage(salvage);
            let run = open_run(&file, opts)?;
            let analyses = analyze_run(&run, opts)?;
            let report = hot_report(&run, &analyses, top);
            print_report(json, &report, |out| write!(out, "{report}"))?;
        }
        Command::Stats { file, span: Some(name), sort, top, json, salvage, .. } => {
            let report = crate::spans::within(&file, ReadOptions::with_salvage(salvage), &name, sort, top)?;
            print_report(json, &report, |out| write!(out, "{report}"))?;
            warn(&report.warnings);
        }
        Command::Stats { file, awaits: true, top, json, salvage, .. } => {
            let opts = ReadOptions::with_salvage(salvage);
            let report = async_report(&file, opts, top)?;
            print_report(json, &report, |out| write!(out, "{report}"))?;
        }
        Command::Stats { file, lines: true, top, json, salvage, .. } => {
            let opts = ReadOptions::with_salvage(salvage);
            let report = lines_report(&file, opts, top)?;
            print_report(json, &report, |out| write!(out, "{report}"))?;
        }
        Command::Stats { file, sort, top, per_thread, per_process, json, salvage, .. } => {
            let opts = ReadOptions::with_salvage(salvage);
            let run = open_run(&file, opts)?;
            let analyses = analyze_run(&run, opts)?;
            let report = stats_report(&run, &analyses, per_process, per_thread, sort, top)?;
            print_report(json, &report, |out| write!(out, "{report}"))?;
        }
        Command::Export { file, parquet: true, output, salvage, .. } => {
            let dir = output.unwrap_or_else(|| file.with_extension("parquet"));
            export_parquet(&file, ReadOptions::with_salvage(salvage), &dir)?;
        }
        Command::Export { file, pprof: true, output, salvage, .. } => {
            let out_path = output.unwrap_or_else(|| file.with_extension("pb.gz"));
            let name = out_path.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
            anyhow::ensure!(
                name.ends_with(".pb.gz") || name.ends_with(".pprof"),
                "{}: a pprof profile's name ends in .pb.gz or .pprof (it is a gzipped protobuf)",
                out_path.display()
            );
            crate::output::refuse_input(&file, &out_path)?;
            let opts = ReadOptions::with_salvage(salvage);
            let run = open_run(&file, opts)?;
            let analyses = analyze_run(&run, opts)?;
            let s =
                crate::output::write(&file, &out_path, |w| crate::export::pprof::export_run(&run, &analyses, opts, w))
                    .with_context(|| format!("cannot export {}", file.display()))?;
            eprintln!(
                "wrote {}: {} samples (distinct stacks), {} functions; sample types {}",
                out_path.display(),
                s.samples,
                s.functions,
                s.sample_types.join(", ")
            );
        }
        Command::Export { file, output, format, salvage, .. } => {
            let fmt = match (format.as_str(), output.as_ref().and_then(|o| o.extension()).and_then(|e| e.to_str())) {
                (_, Some("pftrace")) | ("pftrace", _) => "pftrace",
                ("json", _) => "json",
                (other, _) => anyhow::bail!("unknown --format {other:?}: use json or pftrace"),
            };
            let out_path = output.unwrap_or_else(|| file.with_extension(fmt));
            crate::output::refuse_input(&file, &out_path)?;
            let opts = ReadOptions::with_salvage(salvage);
            let run = open_run(&file, opts)?;
            let (written, read, warnings) = crate::output::write(&file, &out_path, |w| {
                Ok(match (fmt == "pftrace", run.single()) {
                    (true, true) => {
                        let ((p, r), w) = crate::export::pftrace::export(&file, opts, w)?;
                        (p, r, w)
                    }
                    (true, false) => {
                        let ((p, r), w) = crate::export::pftrace::export_run(&run, opts, w)?;
                        (p, r, w)
                    }
                    (false, true) => {
                        let (c, w) = crate::export::chrome::export(&file, opts, w)?;
                        (c.events, c.read, w)
                    }
                    (false, false) => {
                        let (c, w) = crate::export::chrome::export_run(&run, opts, w)?;
                        (c.events, c.read, w)
                    }
                })
            })
            .with_context(|| format!("cannot export {}", file.display()))?;
            warn(&warnings);
            eprintln!(
                "wrote {}: {written} {} from {read} recorded events",
                out_path.display(),
                if fmt == "pftrace" { "packets" } else { "trace events" }
            );
        }
        Command::Flamegraph { file, output, folded, salvage } => {
            let opts = ReadOptions::with_salvage(salvage);
            if folded {
                let run = open_run(&file, opts)?;
                let (lines, warnings, _) = crate::export::flame::folded_run(&run, opts)?;
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                for (s, v) in lines {
                    writeln!(out, "{s} {v}")?;
                }
                out.flush()?;
                warn(&warnings);
                return Ok(());
            }
            let out_path = output.unwrap_or_else(|| file.with_extension("svg"));
            crate::output::refuse_input(&file, &out_path)?;
            let title = format!("{} (exclusive time)", file.display());
            let warnings =
                crate::output::write(&file, &out_path, |w| crate::export::flame::svg(&file, opts, &title, w))?;
            warn(&warnings);
            eprintln!("wrote {}", out_path.display());
        }
        Command::Top { target, once, json, seconds, interval, per_thread, top } => {
            anyhow::ensure!(seconds > 0.0 && interval > 0.0, "--seconds and --interval must be above 0");
            if once || json {
                let snap = crate::top::once(&target, seconds, per_thread, top)?;
                print_report(json, &snap, |out| write!(out, "{snap}"))?;
            } else {
                use std::io::IsTerminal;
                anyhow::ensure!(
                    std::io::stdout().is_terminal(),
                    "top's live view needs a terminal; use --once (text) or --json for one snapshot"
                );
                crate::top::interactive(&target, interval, seconds, per_thread, top)?;
            }
        }
        Command::Diff { before, after, top, force, json, salvage } => {
            let opts = ReadOptions::with_salvage(salvage);
            let mut sides = Vec::new();
            for file in [&before, &after] {
                let run = open_run(file, opts)?;
                let analyses = analyze_run(&run, opts)?;
                sides.push(crate::diff::Side::new(file, &run, &analyses)?);
            }
            let after_side = sides.pop().expect("two sides");
            let report = crate::diff::diff(sides.pop().expect("two sides"), after_side, top, force)?;
            warn(&report.warnings);
            print_report(json, &report, |out| write!(out, "{report}"))?;
        }
        Command::Report { file, output, functions, loops, salvage } => {
            let opts = ReadOptions::with_salvage(salvage);
            let out_path = output.unwrap_or_else(|| file.with_extension("html"));
            crate::output::refuse_input(&file, &out_path)?;
            let run = open_run(&file, opts)?;
            let analyses = analyze_run(&run, opts)?;
            let info = if run.single() {
                serde_json::to_value(crate::info::summarize(&file, opts)?)?
            } else {
                serde_json::to_value(crate::info::summarize_run(&run, opts)?)?
            };
            let sort = crate::stats::SortBy::Exclusive;
            let stats = stats_report(&run, &analyses, false, false, sort, functions)?;
            let inputs = crate::report::Inputs {
                title: file.display().to_string(),
                run: &run,
                analyses: &analyses,
                info,
                stats: serde_json::to_value(&stats)?,
                hot: serde_json::to_value(hot_report(&run, &analyses, loops))?,
                lines: lines_of_run(&run, &analyses, opts)?,
                awaits: async_of_run(&run, &analyses, opts)?,
                specialize: serde_json::to_value(specialize_report(&run, &analyses, &file, loops))?,
                spans: run
                    .processes
                    .iter()
                    .map(|p| Ok(crate::spans::for_report(&p.path, opts)?.map(|s| (p.pid, s))))
                    .filter_map(Result::transpose)
                    .collect::<anyhow::Result<_>>()?,
            };
            crate::output::write(&file, &out_path, |w| crate::report::write(&inputs, w))?;
            let bytes = std::fs::metadata(&out_path).map_or(0, |m| m.len());
            eprintln!("wrote {} ({bytes} bytes)", out_path.display());
        }
        Command::Specialize { file, top, json, salvage } => {
            let opts = ReadOptions::with_salvage(salvage);
            let run = open_run(&file, opts)?;
            let analyses = analyze_run(&run, opts)?;
            let report = specialize_report(&run, &analyses, &file, top);
            print_report(json, &report, |out| write!(out, "{report}"))?;
        }
        Command::Dump { file, salvage } => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let warnings = crate::dump::dump(&file, ReadOptions::with_salvage(salvage), &mut out)
                .with_context(|| format!("cannot dump {}", file.display()))?;
            out.flush()?;
            warn(&warnings);
        }
    }
    Ok(())
}

/// The run `file` begins (FORMAT.md 10): itself alone unless it is a run's first file with children.
fn open_run(file: &std::path::Path, opts: ReadOptions) -> anyhow::Result<crate::procs::Run> {
    let (run, warnings) = crate::procs::open(file, opts)?;
    warn(&warnings);
    for p in &run.processes {
        has_events(&p.path, opts)?;
    }
    Ok(run)
}

/// A trace that holds no event and did not end (cut off inside its first chunk of events, or killed
/// before it wrote one, its ring gone) is an error that says what is missing, not an empty run: an empty
/// table looks like a program that did nothing. A recording that still runs, and one that ended having
/// recorded nothing, are not.
fn has_events(path: &std::path::Path, opts: ReadOptions) -> anyhow::Result<()> {
    use ocular_format::{Body, Reader};
    let mut r = Reader::open_with(path, ReadOptions { skip_events: true, ..opts })?;
    let mut events = 0u64;
    while let Some(c) = r.next_chunk()? {
        if matches!(c.body, Body::Events(_)) {
            events += u64::from(c.info.count);
        }
    }
    let h = r.header();
    let rep = r.report();
    if events > 0 || rep.trailer.is_some() || ocular_format::recording_alive(h.pid, h.start_ticks, h.ticks_per_second) {
        return Ok(());
    }
    let why = if let Some((offset, bytes)) = rep.truncated {
        format!(
            "it is cut off at offset {offset}, inside a chunk of {bytes} bytes (the writer stopped mid-chunk: \
             the disk filled, the recording was killed, or the file was copied while it was written)"
        )
    } else if let Some(d) = rep.damage.first() {
        format!("{} bytes at offset {} are damaged: {}", d.len, d.offset, d.reason)
    } else if let Some(ring) = &rep.ring_gone {
        format!("the recording did not end, and its ring file {ring}, which held its events, is gone")
    } else {
        "the recording did not end before it wrote any (killed or crashed)".into()
    };
    anyhow::bail!(
        "{} holds no events: {why}; nothing to show (`ocular-analyze info` says what it holds)",
        path.display()
    )
}

/// Each process of `run` analyzed, its reader's warnings said (named by process in a run of several).
fn analyze_run(run: &crate::procs::Run, opts: ReadOptions) -> anyhow::Result<Vec<crate::analysis::Analysis>> {
    let mut out = Vec::new();
    for p in &run.processes {
        let a = crate::analysis::analyze(&p.path, opts).with_context(|| format!("cannot read {}", p.path.display()))?;
        warn(&a.warnings);
        out.push(a);
    }
    Ok(out)
}

/// `hot`'s report of a run's analyses: one process's, or the run's loops with their processes.
fn hot_report(run: &crate::procs::Run, analyses: &[crate::analysis::Analysis], top: usize) -> crate::hot::HotReport {
    if run.single() {
        crate::hot::report(&analyses[0], top)
    } else {
        crate::hot::report_run(&analyses.iter().collect::<Vec<_>>(), top)
    }
}

/// `stats`' report of a run's analyses: one process's, or the run's functions merged over its processes.
fn stats_report(
    run: &crate::procs::Run,
    analyses: &[crate::analysis::Analysis],
    per_process: bool,
    per_thread: bool,
    sort: crate::stats::SortBy,
    top: usize,
) -> anyhow::Result<crate::stats::Report> {
    let spans: Vec<_> = analyses.iter().map(|a| a.span.to_the_stop(a)).collect();
    Ok(if run.single() {
        crate::stats::report(
            &analyses[0],
            spans.into_iter().next().expect("a run has a process"),
            per_thread,
            sort,
            top,
        )
    } else {
        let parts: Vec<crate::stats::Part<'_>> = run
            .processes
            .iter()
            .zip(analyses)
            .zip(spans)
            .map(|((process, analysis), span)| crate::stats::Part { process, analysis, span })
            .collect();
        crate::stats::report_run(&parts, run.unrecorded.len(), per_process, per_thread, sort, top)
    })
}

/// `specialize`'s report of a run's analyses (`file` names it).
fn specialize_report(
    run: &crate::procs::Run,
    analyses: &[crate::analysis::Analysis],
    file: &std::path::Path,
    top: usize,
) -> crate::specialize::SpecializeReport {
    let name = file.display().to_string();
    if run.single() {
        crate::specialize::report(&analyses[0], &name, top)
    } else {
        crate::specialize::report_run(&analyses.iter().collect::<Vec<_>>(), &name, top)
    }
}

/// The lines of the processes of `run` recorded in a mode that records them, every line, merged; `None`
/// when none was (the pass is skipped for calls mode).
fn lines_of_run(
    run: &crate::procs::Run,
    analyses: &[crate::analysis::Analysis],
    opts: ReadOptions,
) -> anyhow::Result<Option<crate::lines::Report>> {
    let mut parts = Vec::new();
    for (p, a) in run.processes.iter().zip(analyses) {
        if a.header.as_ref().is_some_and(|h| h.options.mode != ocular_format::Mode::Calls) {
            parts.push(
                crate::lines::analyze(&p.path, opts).with_context(|| format!("cannot read {}", p.path.display()))?,
            );
        }
    }
    Ok((!parts.is_empty()).then(|| crate::lines::report(&parts, usize::MAX)))
}

/// `stats --lines`: the lines of every process of the run `file` begins, summed; refused when no process
/// was recorded in a mode that records lines.
pub fn lines_report(file: &std::path::Path, opts: ReadOptions, top: usize) -> anyhow::Result<crate::lines::Report> {
    let run = open_run(file, opts)?;
    let mut parts = Vec::new();
    for p in &run.processes {
        let l = crate::lines::analyze(&p.path, opts).with_context(|| format!("cannot read {}", p.path.display()))?;
        warn(&l.warnings);
        parts.push(l);
    }
    if !parts.iter().any(crate::lines::Lines::has_lines) {
        anyhow::bail!(
            "{} was recorded in calls mode, which records function boundaries only: no line ran between two \
             recorded events. Per-line figures need adaptive mode (the default: jumps and branches) or precise \
             mode (every instruction); `stats` without --lines gives the per-function figures",
            file.display()
        );
    }
    Ok(crate::lines::report(&parts, top))
}

/// `stats --async`: the async view of every process of the run `file` begins, merged; refused when no
/// coroutine ran with its frame recorded.
pub fn async_report(file: &std::path::Path, opts: ReadOptions, top: usize) -> anyhow::Result<crate::awaits::Report> {
    let run = open_run(file, opts)?;
    let parts = async_parts(&run, opts, true)?;
    let report = crate::awaits::report(&parts, top);
    if report.is_empty() {
        let old = parts.iter().any(|p| p.version < (2, 8));
        anyhow::bail!(
            "{}: no coroutine ran with its frame recorded{}",
            file.display(),
            if old {
                ": the file was written before format 2.8, which added coroutine frames; record it again with                  this version"
            } else {
                " (the program ran no async def code, or a filter left it out)"
            }
        );
    }
    Ok(report)
}

/// The async view of each process of `run` (the reader's warnings printed if `warnings`).
fn async_parts(
    run: &crate::procs::Run,
    opts: ReadOptions,
    warnings: bool,
) -> anyhow::Result<Vec<crate::awaits::Awaits>> {
    let mut parts = Vec::new();
    for p in &run.processes {
        let a = crate::awaits::analyze(&p.path, opts).with_context(|| format!("cannot read {}", p.path.display()))?;
        if warnings {
            warn(&a.warnings);
        }
        parts.push(a);
    }
    Ok(parts)
}

/// The async view of `run` for the report: `None` when no process ran coroutine code (its pass is skipped
/// then) or none had its frames recorded.
fn async_of_run(
    run: &crate::procs::Run,
    analyses: &[crate::analysis::Analysis],
    opts: ReadOptions,
) -> anyhow::Result<Option<crate::awaits::Report>> {
    const COROUTINE_FLAGS: u32 = 0x80 | 0x100 | 0x200;
    if !analyses.iter().any(|a| a.code.values().any(|c| c.flags & COROUTINE_FLAGS != 0)) {
        return Ok(None);
    }
    let r = crate::awaits::report(&async_parts(run, opts, false)?, crate::report::ASYNC_ROWS);
    Ok((!r.is_empty()).then_some(r))
}

/// Reader warnings go to stderr, one line each.
fn warn(warnings: &[String]) {
    for w in warnings {
        eprintln!("warning: {w}");
    }
}

/// A report on stdout: pretty JSON with `--json`, else its text form.
fn print_report<T: serde::Serialize>(
    json: bool,
    report: &T,
    text: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, report)?;
        writeln!(out)?;
    } else {
        text(&mut out)?;
    }
    Ok(())
}

#[cfg(feature = "parquet")]
fn export_parquet(file: &std::path::Path, opts: ReadOptions, dir: &std::path::Path) -> anyhow::Result<()> {
    let summary =
        crate::export::parquet::export(file, opts, dir).with_context(|| format!("cannot export {}", file.display()))?;
    warn(&summary.warnings);
    let rows = |t: &str| summary.rows.get(t).copied().unwrap_or(0);
    eprintln!(
        "wrote {}: events.parquet ({} rows), calls.parquet ({} rows), code.parquet ({} rows), lost.parquet ({} rows), \
         counter_samples.parquet ({} rows), lines.parquet ({} rows), functions.parquet ({} rows), coroutines.parquet \
         ({} rows), tasks.parquet ({} rows), spans.parquet ({} rows) from {} recorded events",
        dir.display(),
        rows("events"),
        rows("calls"),
        rows("code"),
        rows("lost"),
        rows("counter_samples"),
        rows("lines"),
        rows("functions"),
        rows("coroutines"),
        rows("tasks"),
        rows("spans"),
        summary.events_read
    );
    Ok(())
}

#[cfg(not(feature = "parquet"))]
fn export_parquet(_: &std::path::Path, _: ReadOptions, _: &std::path::Path) -> anyhow::Result<()> {
    anyhow::bail!(
        "this ocular-analyze was built without Parquet support; build it with \
         `cargo build --release -p ocular-analyze --features parquet`"
    )
}

/// Runs the command line on `args` (the first is the program name) and returns the exit code: 0, 2 for
/// errors (bad input, unreadable or damaged files), or clap's code for usage errors. Never exits the
/// process, so it can run inside a Python interpreter.
pub fn run_from<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // Errors say which command failed as it was run: `ocular top`, `python -m ocular stats`, or this
    // binary by its file name.
    let prog = args.first().map_or_else(
        || "ocular-analyze".to_string(),
        |a| {
            let a = a.to_string_lossy();
            if a.contains('/') {
                a.rsplit('/').next().unwrap_or_default().to_string()
            } else {
                a.into_owned()
            }
        },
    );
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" that print to stdout and exit 0.
            let _ = e.print();
            return e.exit_code();
        }
    };
    match run(cli) {
        Ok(()) => 0,
        // A closed pipe (`| head`) is not an error worth a message.
        Err(e) if closed_pipe(&e) => 0,
        Err(e) => {
            eprintln!("{prog}: error: {e:#}");
            2
        }
    }
}

/// Whether `e` comes from writing to a closed pipe, for every command: as an `io::Error` (text output)
/// or inside a `serde_json::Error` (JSON output), with or without context around it.
fn closed_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == BrokenPipe)
            || c.downcast_ref::<serde_json::Error>().and_then(|j| j.io_error_kind()) == Some(BrokenPipe)
    })
}
