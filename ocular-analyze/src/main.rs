//! `ocular-analyze`: the command line over the `ocular_analyze` library.

use anyhow::Context;
use clap::{Parser, Subcommand};
use ocular_format::ReadOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Analyze Ocular traces (.ocl files) recorded from Python programs.
///
/// Record with `python -m ocular run script.py` (writes ocular.ocl), then:
///
///   ocular-analyze info ocular.ocl
///   ocular-analyze hot ocular.ocl
///   ocular-analyze stats ocular.ocl --sort inclusive
///   ocular-analyze export --perfetto ocular.ocl -o ocular.json
///   ocular-analyze flamegraph ocular.ocl -o flame.svg
///   ocular-analyze dump ocular.ocl | less
#[derive(Parser, Debug)]
#[command(version, about, long_about, propagate_version = true)]
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
    /// Example: ocular-analyze stats run.ocl --sort inclusive --top 20
    Stats {
        /// The .ocl file.
        file: PathBuf,
        /// Order of the rows.
        #[arg(long, value_enum, default_value_t = ocular_analyze::stats::SortBy::Exclusive)]
        sort: ocular_analyze::stats::SortBy,
        /// How many rows to show.
        #[arg(long, default_value_t = 25)]
        top: usize,
        /// One table per thread instead of merged.
        #[arg(long)]
        per_thread: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Skip damaged chunks instead of stopping at the first one.
        #[arg(long)]
        salvage: bool,
    },
    /// Export for other tools: --perfetto writes Chrome Trace Event JSON or the native Perfetto protobuf
    /// (function slices per thread, "loop" instants with uops and cycles), which ui.perfetto.dev opens.
    ///
    /// Example: ocular-analyze export --perfetto run.ocl -o run.json
    Export {
        /// The .ocl file.
        file: PathBuf,
        /// Perfetto / Chrome trace.
        #[arg(long, required = true)]
        perfetto: bool,
        /// Output file (default: the input with .json).
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
            let info = ocular_analyze::info::summarize(&file, ReadOptions { salvage })?;
            for w in &info.warnings {
                eprintln!("warning: {w}");
            }
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &info)?;
                writeln!(out)?;
            } else {
                writeln!(out, "{info}")?;
            }
        }
        Command::Hot { file, top, json, salvage } => {
            let a = ocular_analyze::analysis::analyze(&file, ReadOptions { salvage })?;
            for w in &a.warnings {
                eprintln!("warning: {w}");
            }
            let report = ocular_analyze::hot::report(&a, top);
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &report)?;
                writeln!(out)?;
            } else {
                write!(out, "{report}")?;
            }
        }
        Command::Stats { file, sort, top, per_thread, json, salvage } => {
            let a = ocular_analyze::analysis::analyze(&file, ReadOptions { salvage })?;
            for w in &a.warnings {
                eprintln!("warning: {w}");
            }
            let rows = ocular_analyze::stats::rows(&a, per_thread, sort);
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &rows)?;
                writeln!(out)?;
            } else {
                ocular_analyze::stats::render(&a, &rows, top, &mut out)?;
            }
        }
        Command::Export { file, perfetto: _, output, format, salvage } => {
            let fmt = match (format.as_str(), output.as_ref().and_then(|o| o.extension()).and_then(|e| e.to_str())) {
                (_, Some("pftrace")) | ("pftrace", _) => "pftrace",
                ("json", _) => "json",
                (other, _) => anyhow::bail!("unknown --format {other:?}: use json or pftrace"),
            };
            let out_path = output.unwrap_or_else(|| file.with_extension(fmt));
            let f =
                std::fs::File::create(&out_path).with_context(|| format!("cannot create {}", out_path.display()))?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            let opts = ReadOptions { salvage };
            let (written, read, warnings) = if fmt == "pftrace" {
                let ((p, r), w) = ocular_analyze::export::pftrace::export(&file, opts, &mut w)
                    .with_context(|| format!("cannot export {}", file.display()))?;
                (p, r, w)
            } else {
                let (c, w) = ocular_analyze::export::chrome::export(&file, opts, &mut w)
                    .with_context(|| format!("cannot export {}", file.display()))?;
                (c.events, c.read, w)
            };
            w.flush()?;
            for w in warnings {
                eprintln!("warning: {w}");
            }
            eprintln!(
                "wrote {}: {written} {} from {read} recorded events",
                out_path.display(),
                if fmt == "pftrace" { "packets" } else { "trace events" }
            );
        }
        Command::Flamegraph { file, output, folded, salvage } => {
            let opts = ReadOptions { salvage };
            if folded {
                let (lines, warnings) = ocular_analyze::export::flame::folded(&file, opts)?;
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                for (s, v) in lines {
                    writeln!(out, "{s} {v}")?;
                }
                out.flush()?;
                for w in warnings {
                    eprintln!("warning: {w}");
                }
                return Ok(());
            }
            let out_path = output.unwrap_or_else(|| file.with_extension("svg"));
            let f =
                std::fs::File::create(&out_path).with_context(|| format!("cannot create {}", out_path.display()))?;
            let mut w = std::io::BufWriter::new(f);
            let title = format!("{} (exclusive time)", file.display());
            let warnings = ocular_analyze::export::flame::svg(&file, opts, &title, &mut w)?;
            w.flush()?;
            for w in warnings {
                eprintln!("warning: {w}");
            }
            eprintln!("wrote {}", out_path.display());
        }
        Command::Dump { file, salvage } => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let warnings = ocular_analyze::dump::dump(&file, ReadOptions { salvage }, &mut out)
                .with_context(|| format!("cannot dump {}", file.display()))?;
            out.flush()?;
            for w in warnings {
                eprintln!("warning: {w}");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    ocular_analyze::progress::enable();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`| head`) is not an error worth a message.
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("ocular-analyze: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
