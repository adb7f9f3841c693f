//! `python -m ocular`'s own command line (`run`), parsed with clap in the extension. argparse, with the
//! `re`, `gettext`, `locale` and `shutil` it imports, cost about 10 ms at every `python -m ocular run`,
//! a third of Ocular's start-up; the analyzer's commands (`info`, `hot`, ...) go to the analyzer's parser.
//! The same parser serves the `ocular` command that `pip install` makes: its help names it as it was run.

use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::ffi::OsString;

const EXAMPLES: &str = "\
Examples:
  python -m ocular run script.py --its-own-flag        record script.py into ocular.ocl
  python -m ocular run -o run.ocl --mode calls -m http.server 8000
  python -m ocular run --exclude threading --threshold 0 job.py   gapless, without threading.py
then:  python -m ocular hot run.ocl           (or ocular-analyze hot run.ocl)
while it runs:  python -m ocular top PID   (record with --live)";

/// Record what a Python program executes (sys.monitoring, PEP 669) into an .ocl file, and analyze it.
#[derive(Parser, Debug)]
#[command(name = "python -m ocular", after_help = EXAMPLES, disable_help_subcommand = true, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// The analyzer's commands are dispatched before this parser (to the analyzer's own); they are listed here
// so that `python -m ocular --help` names them.
#[derive(Subcommand, Debug)]
enum Command {
    /// Run a script or module under the recorder (python -m ocular run --help)
    #[command(long_about = "Run a script (or -m module) under the recorder; its exit code, sys.argv and \
                            __main__ are kept. The trace holds the program's code only: the script is \
                            compiled before recording starts.")]
    Run(Box<RunArgs>),
    /// Summarize a trace (python -m ocular info --help)
    Info,
    /// The hottest loops, disassembled (python -m ocular hot --help)
    Hot,
    /// Per-function statistics (python -m ocular stats --help)
    Stats,
    /// Export to Perfetto (--perfetto) or Parquet (--parquet) (python -m ocular export --help)
    Export,
    /// SVG flame graph (python -m ocular flamegraph --help)
    Flamegraph,
    /// Every record as text (python -m ocular dump --help)
    Dump,
    /// A live view of a running recording: python -m ocular top PID (python -m ocular top --help)
    Top,
    /// Write one self-contained HTML page of a trace (python -m ocular report --help)
    Report,
    /// What changed between two recordings of one program (python -m ocular diff --help)
    Diff,
    /// The instructions CPython left generic in the hottest code (python -m ocular specialize --help)
    Specialize,
}

/// The parser under the name the command was run by (`python -m ocular`, or `ocular`): its usage lines,
/// and the examples and references in its help, name that command, so that they can be copied as they are.
fn command(prog: &str) -> clap::Command {
    let say = |s: &clap::builder::StyledStr| s.to_string().replace("python -m ocular", prog);
    let rename = |mut c: clap::Command| {
        if let Some(about) = c.get_about().map(say) {
            c = c.about(about);
        }
        if let Some(after) = c.get_after_help().map(say) {
            c = c.after_help(after);
        }
        c.mut_args(|mut a| {
            if let Some(help) = a.get_help().map(say) {
                a = a.help(help);
            }
            if let Some(help) = a.get_long_help().map(say) {
                a = a.long_help(help);
            }
            a
        })
    };
    rename(Cli::command().bin_name(prog)).mut_subcommands(rename)
}

/// The options of `run`: the program to run and the trace's name, and the recording's options.
#[derive(Args, Debug)]
#[command(after_help = EXAMPLES)]
struct RunArgs {
    /// Trace file to write
    #[arg(short, long, default_value = "ocular.ocl")]
    output: OsString,
    /// Do not print the summary line
    #[arg(short, long)]
    quiet: bool,
    #[command(flatten)]
    options: RecordOptions,
    /// Run a library module as a script, like python -m; what follows is the module's arguments
    #[arg(short = 'm', value_name = "MODULE", num_args = 1.., allow_hyphen_values = true, conflicts_with = "target")]
    module: Option<Vec<OsString>>,
    /// The script and its arguments (options after the script are the script's)
    #[arg(value_name = "SCRIPT [ARGS]", trailing_var_arg = true)]
    target: Vec<OsString>,
}

/// Options of what is recorded, which a notebook cell (`%%ocular`) and a test (`pytest --ocular-...`) take too.
const RECORDING: &str = "Recording";
/// Options of the program's process: its memory, what outlives it, what follows it.
const PROCESS: &str = "Process";

/// The recording's options, defined once: each field's name is `ocular.record()`'s keyword argument (the
/// argument's id here), its flag and help are `run`'s, its default the command line's. `record()`, `run`,
/// `%%ocular`, the pytest plugin and the children a run follows all take theirs from here
/// ([`record_options`], [`record_option_specs`]): the options under [`RECORDING`] are the ones a cell and a
/// test take.
#[derive(Args, Debug, IntoPyObject)]
struct RecordOptions {
    /// calls: function boundaries; adaptive: plus jumps and branches; precise: plus every instruction
    #[arg(long, default_value = "adaptive", value_parser = ["calls", "adaptive", "precise"], help_heading = RECORDING)]
    mode: String,
    /// Stop recording a jump, branch or instruction after N hits (0 = gapless); function boundaries are
    /// recorded every time, so every call count is exact
    #[arg(id = "deinstrument_threshold", long = "threshold", value_name = "N", default_value_t = 500,
          allow_negative_numbers = true, help_heading = RECORDING)]
    deinstrument_threshold: u32,
    /// Record only code whose file or qualified name contains P (repeatable)
    #[arg(id = "include_only", long = "include", value_name = "P", help_heading = RECORDING)]
    include_only: Vec<String>,
    /// Do not record code whose file or qualified name contains P (repeatable)
    #[arg(long, value_name = "P", help_heading = RECORDING)]
    exclude: Vec<String>,
    /// Record function boundaries only in windows (after the first 100 x N calls), from which the
    /// analysis estimates every function's calls and time, each with its interval: cheaper on call-dense
    /// programs (1.08x against the default's 1.36x median on BENCHMARKS.md's peers), but estimates where
    /// every call is counted otherwise. Needs --mode adaptive or precise and a threshold
    #[arg(long, help_heading = RECORDING)]
    sampled: bool,
    /// With --sampled: open a window in which every call is recorded every MS milliseconds on average
    /// (jittered); more windows make estimates closer and cost more
    /// [default: 10, or 50 in precise mode]
    #[arg(long, value_name = "MS", value_parser = seconds_from_ms, help_heading = RECORDING)]
    window_period: Option<f64>,
    /// With --sampled: how long each window lasts, in milliseconds (at most half the period)
    /// [default: 0.5]
    #[arg(long, value_name = "MS", value_parser = seconds_from_ms, help_heading = RECORDING)]
    window_length: Option<f64>,
    /// Record calls of C functions too (built-ins such as len, isinstance, list.append, types called,
    /// C extensions): each its own function in stats and the flame graph, its time out of its caller's
    #[arg(long, help_heading = RECORDING)]
    c_calls: bool,
    /// Events per buffer: each recording thread fills one (24 bytes an event), then hands it to the
    /// writer thread
    #[arg(long, value_name = "N", default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..),
          help_heading = PROCESS)]
    buffer_events: u32,
    /// Full buffers that may wait for the writer thread, besides each thread's own: memory stays under
    /// (N + threads) x buffer-events x 24 bytes
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..),
          help_heading = PROCESS)]
    max_buffers: u32,
    /// When the writer falls max-buffers behind: drop events (counted, and located in the file) or make
    /// the program wait for the writer
    #[arg(long, default_value = "drop", value_parser = ["drop", "wait"], help_heading = PROCESS)]
    on_full: String,
    /// Keep the buffers in memory instead of in OUTPUT.ring beside the trace: a program killed (SIGKILL,
    /// the OOM killer, a crash) then loses each thread's last buffer of events
    #[arg(id = "ring_file", long = "no-ring-file", action = ArgAction::SetFalse, help_heading = PROCESS)]
    ring_file: bool,
    /// A flight recorder: keep only the newest SIZE of compressed events (64MB, 512KiB, 1GB; powers of
    /// 1024), however long the program runs. OUTPUT gets them at the end; after a kill, every command reads
    /// them from the ring file. At least one compressed buffer: 2.7 MiB at the default --buffer-events
    #[arg(long, value_name = "SIZE", help_heading = PROCESS)]
    ring: Option<String>,
    /// With --ring: on this signal (SIGUSR2, USR2, 12), write the ring into a trace beside OUTPUT
    /// (run.1.ocl, run.2.ocl, ...) while the program goes on: `kill -USR2 PID`
    #[arg(long, value_name = "SIGNAL", requires = "ring", help_heading = PROCESS)]
    dump_on: Option<String>,
    /// With --ring: write the ring into a trace beside OUTPUT when a span (ocular.span, or OpenTelemetry's
    /// through ocular.otel) ends slower than RULE says: NAME>SECONDS ("GET /orders>0.2"), or NAME>pP
    /// (slower than the P-th percentile of that name's last 1000 spans, once there are 100); repeatable. At
    /// most one dump a second per rule
    #[arg(long, value_name = "RULE", requires = "ring", help_heading = PROCESS)]
    dump_when: Vec<String>,
    /// Another process will follow the recording (python -m ocular top PID, ocular.attach(PID)): keeps 16
    /// spare buffers instead of 3 (24 MiB), so a reader polling every few ms misses nothing
    #[arg(long, conflicts_with = "ring_file", help_heading = PROCESS)]
    live: bool,
    /// Performance counters, sampled by the kernel and attributed to the Python functions running
    /// (stats shows them): page-faults, task-clock, context-switches, cpu-migrations, and where the machine
    /// has a PMU instructions, cycles, cache-misses, branch-misses; NAME:N samples every N events
    #[arg(long, value_name = "NAME[:N],...", value_delimiter = ',', help_heading = PROCESS)]
    counters: Vec<String>,
    /// Make CPython's perf trampoline active while recording, so that `perf record` of the same process
    /// shows Python function names (perf record -g -- python -m ocular run --perf script.py)
    #[arg(long, help_heading = PROCESS)]
    perf: bool,
    /// Record the program's process only. By default every Python child it starts is recorded too
    /// (os.fork, multiprocessing, concurrent.futures process pools, subprocess and os.exec* of CPython
    /// 3.12+), each into OUTPUT.children/PID.ocl, and the analyzer reads OUTPUT as the whole run
    #[arg(id = "follow", long = "no-follow", action = ArgAction::SetFalse, help_heading = PROCESS)]
    follow: bool,
}

/// A window's milliseconds on the command line, in seconds as `record()` takes them.
fn seconds_from_ms(s: &str) -> Result<f64, String> {
    s.parse::<f64>().map(|ms| ms / 1e3).map_err(|e| format!("{e}: a number of milliseconds"))
}

/// `record_options(prog="python -m ocular") -> dict`: every recording option's name and its default on the
/// command line (`follow` is on there; `record()` keeps it off).
#[pyfunction]
#[pyo3(signature = (prog="python -m ocular"))]
pub(super) fn record_options<'py>(py: Python<'py>, prog: &str) -> PyResult<Bound<'py, PyAny>> {
    let m = command(prog).try_get_matches_from([prog, "run"]).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let run = match Cli::from_arg_matches(&m).map_err(|e| PyValueError::new_err(e.to_string()))? {
        Cli { command: Command::Run(run) } => run,
        _ => unreachable!("parsed as run"),
    };
    Ok(run.options.into_pyobject(py)?.into_any())
}

/// `record_option_specs(prog="python -m ocular") -> list[dict]`: each recording option as `run` takes it:
/// `name` (record()'s keyword), `flag` (`--threshold`), `help`, `heading` (`Recording` or `Process`),
/// `value_name` (None for a switch), `repeat` (given more than once), `choices`, and `negates` (a switch
/// that turns the option off, `--no-follow`). Other front ends (`%%ocular`, pytest) build their options
/// from it.
#[pyfunction]
#[pyo3(signature = (prog="python -m ocular"))]
pub(super) fn record_option_specs<'py>(py: Python<'py>, prog: &str) -> PyResult<Bound<'py, PyList>> {
    let cmd = command(prog);
    let run = cmd.find_subcommand("run").expect("run is a subcommand");
    let out = PyList::empty(py);
    for a in run.get_arguments() {
        let heading = a.get_help_heading();
        if heading != Some(RECORDING) && heading != Some(PROCESS) {
            continue;
        }
        let d = PyDict::new(py);
        let switch = matches!(a.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        d.set_item("name", a.get_id().as_str())?;
        d.set_item("flag", format!("--{}", a.get_long().expect("a long flag")))?;
        d.set_item("help", a.get_help().map(|h| h.to_string()).unwrap_or_default())?;
        d.set_item("heading", heading)?;
        let value_name = a.get_value_names().and_then(|v| v.first()).map(|v| v.to_string());
        d.set_item(
            "value_name",
            if switch { None } else { value_name.or_else(|| Some(a.get_id().as_str().to_uppercase())) },
        )?;
        d.set_item("repeat", matches!(a.get_action(), ArgAction::Append))?;
        let choices: Vec<String> = a.get_possible_values().iter().map(|v| v.get_name().to_string()).collect();
        d.set_item("choices", if switch || choices.is_empty() { None } else { Some(choices) })?;
        d.set_item("negates", matches!(a.get_action(), ArgAction::SetFalse))?;
        out.append(d)?;
    }
    Ok(out)
}

/// `parse_run(argv, prog="python -m ocular") -> dict | int`: `python -m ocular`'s arguments (without the
/// program name; `prog` is the name help gives it) as a `run`: `output`, `quiet`, `options` (the
/// recording's, as [`record_options`] names them), `module` (None or the module's name) and `argv` (what
/// the program sees as sys.argv); or the exit code after clap printed help, or a usage error. Arguments are OS strings, as Python holds them (undecodable bytes included).
#[pyfunction]
#[pyo3(signature = (argv, prog="python -m ocular"))]
pub(super) fn parse_run<'py>(py: Python<'py>, argv: Vec<OsString>, prog: &str) -> PyResult<Bound<'py, PyAny>> {
    let argv = std::iter::once(OsString::from(prog)).chain(ocular_record::argv::split_attached_module(argv));
    let parsed = command(prog).try_get_matches_from(argv).and_then(|m| Cli::from_arg_matches(&m));
    let run = match parsed {
        Ok(Cli { command: Command::Run(run) }) => *run,
        Ok(_) => {
            // An analyzer command would have gone to the analyzer; reached only without its arguments.
            let _ = command(prog).print_help();
            return Ok(2i32.into_pyobject(py)?.into_any());
        }
        Err(e) => {
            // --help prints to stdout and exits 0; usage errors go to stderr with clap's exit code.
            let _ = e.print();
            return Ok(e.exit_code().into_pyobject(py)?.into_any());
        }
    };
    let d = PyDict::new(py);
    d.set_item("output", run.output)?;
    d.set_item("quiet", run.quiet)?;
    d.set_item("options", run.options.into_pyobject(py)?)?;
    match run.module {
        Some(mut m) => {
            let name = m.remove(0);
            d.set_item("module", &name)?;
            d.set_item("argv", std::iter::once(name).chain(m).collect::<Vec<_>>())?;
        }
        None => {
            d.set_item("module", py.None())?;
            d.set_item("argv", run.target)?;
        }
    }
    Ok(d.into_any())
}
