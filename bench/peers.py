"""Ocular next to its peers, on unmodified programs: slowdown over the untraced run of the same program
for Ocular (calls, adaptive, adaptive with threshold 0, precise), cProfile, VizTracer, pyinstrument and
trace0, plus the events each tracer recorded, its output size and bytes per event.

    make bench-peers     (own virtualenv .venv/peers-X.Y; or: PY bench/peers.py [--quick] [--repeats N]
                          [--programs richards,demo] [--tools untraced,ocular-calls,trace0])

Programs: benchmarks from the `pyperformance` package, run as they ship (its data-files/benchmarks/
bm_*/run_benchmark.py), in one process each: pyperf's worker flags `--worker -l LOOPS -n 1 -w 0` make
pyperf run the benchmark body LOOPS times in the process itself instead of spawning worker processes
that a tracer attached to the parent would not see. LOOPS is fixed per program (see PYPERFORMANCE) so
that an untraced run does about 0.6 s of work. Plus the bundled testdata/workloads/demo.py (a short
program: interpreter and tool start-up weigh much more there), and real packages' work in
bench/programs/: sqlglot transpiling its own test fixture to three dialects (trace0's headline workload),
Python-Markdown rendering a generated document, pycparser parsing generated C. loops.py is not used: it
records itself.

Method: every run is a child process, timed from spawn to exit with perf_counter (wall time, what a
user waits for, including each tool's start-up and its writing of the trace). Runs are interleaved:
each repeat goes through the programs and, for each program, runs every tool in a freshly shuffled
order. Slowdown of a tool on a program = median over repeats of (tool time / untraced time of the
same program in the same repeat); the median row is the median of those over programs. Events and
sizes are taken from the first successful run of each tool on each program, then the trace is deleted.

Events recorded: Ocular from `ocular-analyze info --json` (or the recorder's summary line); VizTracer
the entries in its JSON's traceEvents; trace0 the TrackEvent packets in its Perfetto protobuf (its
"events dropped" marker, if present, is reported as dropped). cProfile writes per-function aggregates
and pyinstrument samples the stack: no per-event trace, so only their output size is shown.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import random
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# pyperformance benchmark -> loops per run (about 0.6 s of untraced work on a 2-core x86-64 VM).
# All need only pyperf (their pyproject.toml lists no other dependency).
PYPERFORMANCE = {
    "richards": 10,
    "nbody": 6,
    "chaos": 9,
    "deltablue": 180,
    "go": 4,
    "raytrace": 1,
    "float": 7,
    "spectral_norm": 4,
}
WORKLOADS = ["demo"]  # testdata/workloads/*.py that run as plain scripts
# Real packages' work, bench/programs/*.py (nobody here wrote the packages), -> the package they need
# (peers-requirements.txt pins it). sqlglot on its own fixture is trace0's headline workload.
PACKAGE_PROGRAMS = {"sqlglot_identity": "sqlglot", "markdown_render": "markdown", "pycparser_parse": "pycparser"}

# tool -> (label, output extension or None)
TOOLS = {
    "untraced": ("untraced", None),
    "ocular-calls": ("Ocular calls", "ocl"),
    "ocular-adaptive": ("Ocular adaptive (the default: every call)", "ocl"),
    "ocular-sampled": ("Ocular adaptive, sampled (calls in windows)", "ocl"),
    "ocular-adaptive-t0": ("Ocular adaptive, threshold 0", "ocl"),
    "ocular-precise": ("Ocular precise", "ocl"),
    "cprofile": ("cProfile", "prof"),
    "viztracer": ("VizTracer", "json"),
    "pyinstrument": ("pyinstrument", "txt"),
    "trace0": ("trace0", "pb"),
}
# Variants of the sampled mode's windows, for measuring them side by side (--tools; not in the default
# list): window period and length in ms ("first": the first window only, no later ones).
WINDOW_VARIANTS = {
    "ocular-adaptive-first": ("Ocular adaptive, first window only", ["--window-period", "1e7"]),
    "ocular-precise-first": ("Ocular precise, first window only", ["--window-period", "1e7"]),
    "ocular-adaptive-w20": ("Ocular adaptive, 1 ms windows every 20 ms", ["--window-period", "20"]),
    "ocular-adaptive-w5": ("Ocular adaptive, 0.5 ms windows every 5 ms", ["--window-period", "5",
                                                                            "--window-length", "0.5"]),
    "ocular-adaptive-w10x2": ("Ocular adaptive, 2 ms windows every 10 ms", ["--window-length", "2"]),
    "ocular-adaptive-w10x0.5": ("Ocular adaptive, 0.5 ms windows every 10 ms", ["--window-length", "0.5"]),
    "ocular-adaptive-w10x1": ("Ocular adaptive, 1 ms windows every 10 ms", ["--window-length", "1"]),
    "ocular-adaptive-w5x0.25": ("Ocular adaptive, 0.25 ms windows every 5 ms", ["--window-period", "5",
                                                                                "--window-length", "0.25"]),
}
for _name, (_label, _) in WINDOW_VARIANTS.items():
    TOOLS.setdefault(_name, (_label, "ocl"))
DEFAULT_TOOLS = [t for t in TOOLS if t not in WINDOW_VARIANTS]
PEERS_WITH_TRACES = ("viztracer", "trace0")
PACKAGES = {"cprofile": None, "viztracer": "viztracer", "pyinstrument": "pyinstrument", "trace0": "trace0"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- programs ----------------------------------------------------------------------------------------


def pyperformance_dir() -> str | None:
    spec = importlib.util.find_spec("pyperformance")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "data-files", "benchmarks")


def programs(names: list[str], scale: float) -> tuple[dict[str, tuple[str, list[str]]], dict[str, str]]:
    """name -> (script, args), and name -> why it cannot run."""
    bm_dir = pyperformance_dir()
    out, missing = {}, {}
    for name in names:
        if name in PYPERFORMANCE:
            if bm_dir is None:
                missing[name] = "pyperformance is not installed"
                continue
            script = os.path.join(bm_dir, f"bm_{name}", "run_benchmark.py")
            if not os.path.exists(script):
                missing[name] = f"{script} does not exist"
                continue
            loops = max(1, round(PYPERFORMANCE[name] * scale))
            out[name] = (script, ["--worker", "-l", str(loops), "-n", "1", "-w", "0"])
        elif name in WORKLOADS:
            out[name] = (os.path.join(ROOT, "testdata", "workloads", f"{name}.py"), [])
        elif name in PACKAGE_PROGRAMS:
            if importlib.util.find_spec(PACKAGE_PROGRAMS[name]) is None:
                missing[name] = f"{PACKAGE_PROGRAMS[name]} is not installed (bench/peers-requirements.txt)"
                continue
            out[name] = (os.path.join(ROOT, "bench", "programs", f"{name}.py"), [])
        else:
            missing[name] = "unknown program"
    return out, missing


def program_label(name: str, args: list[str]) -> str:
    return f"{name} ×{args[2]}" if args[:1] == ["--worker"] else f"{name}.py"


# -- tools -------------------------------------------------------------------------------------------


def command(tool: str, out: str | None, script: str, args: list[str], opts: argparse.Namespace) -> list[str]:
    py = sys.executable
    if tool == "untraced":
        return [py, script, *args]
    if tool.startswith("ocular-"):
        mode = tool.split("-")[1]
        extra = ["--threshold", "0"] if tool.endswith("-t0") else []
        if mode == "sampled" or tool in WINDOW_VARIANTS:
            mode = "adaptive" if mode == "sampled" else mode
            extra += ["--sampled", *WINDOW_VARIANTS.get(tool, (None, []))[1]]
        return [py, "-m", "ocular", "run", "-o", out, "--mode", mode, *extra, script, *args]
    if tool == "cprofile":
        return [py, "-m", "cProfile", "-o", out, script, *args]
    if tool == "viztracer":
        return [py, "-m", "viztracer", "--quiet", "--tracer_entries", str(opts.viztracer_entries), "-o", out,
                script, *args]
    if tool == "pyinstrument":
        return [py, "-m", "pyinstrument", "-o", out, script, *args]
    if tool == "trace0":
        return [py, "-m", "trace0", "run", "-o", out, "--no-trace-subprocesses", script, *args]
    raise ValueError(tool)


def unavailable(tool: str) -> str | None:
    """Why a tool cannot run in this interpreter, or None."""
    if tool.startswith("ocular-"):
        try:
            import ocular._ocular  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return f"ocular does not import: {e}"
        return None
    if tool == "trace0" and sys.version_info < (3, 13):
        return f"trace0 needs Python 3.13+ (this is {platform.python_version()})"
    pkg = PACKAGES.get(tool)
    if pkg and importlib.util.find_spec(pkg) is None:
        return f"{pkg} is not installed"
    return None


def version(tool: str) -> str:
    if tool == "untraced" or tool == "cprofile":
        return f"CPython {platform.python_version()}"
    pkg = "ocular" if tool.startswith("ocular-") else PACKAGES[tool]
    try:
        v = importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        try:
            v = __import__(pkg).__version__
        except Exception:  # noqa: BLE001
            return f"{pkg} ?"
    if pkg == "ocular":
        try:
            rev = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
            v += f" ({rev})" if rev else ""
        except (OSError, subprocess.SubprocessError):
            pass
    return f"{pkg} {v}"


# -- counting events ---------------------------------------------------------------------------------


def ocular_events(path: str, stderr: str, analyze: str) -> tuple[int | None, int | None, str]:
    """(events, lost, source) of an .ocl file."""
    if os.path.exists(analyze):
        try:
            p = subprocess.run([analyze, "info", path, "--json"], capture_output=True, text=True, timeout=300)
            if p.returncode == 0:
                info = json.loads(p.stdout)
                return int(info["events"]), int(info.get("lost_events", 0)), "ocular-analyze info"
        except (OSError, subprocess.SubprocessError, ValueError, KeyError):
            pass
    m = re.search(r"ocular: wrote .*?: ([\d,]+) events .*?, ([\d,]+) lost", stderr)
    if m:
        return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", "")), "recorder summary"
    return None, None, "no event count (no ocular-analyze, no summary line)"


def count_in_file(path: str, needles: list[bytes]) -> list[int]:
    """Occurrences of each needle, reading in chunks (the file may be larger than is nice to hold)."""
    counts = [0] * len(needles)
    keep = max(len(n) for n in needles) - 1
    tail = b""
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 24)
            if not chunk:
                break
            buf = tail + chunk
            for k, n in enumerate(needles):
                # occurrences that end inside the kept tail were counted with the previous chunk
                counts[k] += buf.count(n) - tail.count(n)
            tail = buf[-keep:] if keep else b""
    return counts


def viztracer_events(path: str) -> tuple[int, bool]:
    """(trace entries, whether VizTracer's ring buffer overflowed and overwrote older entries). Its JSON is
    written with ", " and ": " separators; metadata entries ("ph": "M") are not events."""
    ph, meta, overflow = count_in_file(path, [b'"ph": ', b'"ph": "M"', b'"overflow": true'])
    return ph - meta, overflow > 0


def _varint(b: bytes, i: int) -> tuple[int, int]:
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        if c < 0x80:
            return r, i
        s += 7


def perfetto_track_events(path: str) -> tuple[int, int | None]:
    """(TracePackets holding a TrackEvent, events trace0 says it dropped): walks the protobuf wire format
    of a Perfetto trace (Trace.packet = field 1; TracePacket.track_event = field 11)."""
    with open(path, "rb") as f:
        b = f.read()
    n, i, end_all = 0, 0, len(b)
    while i < end_all:
        t = b[i]
        if t < 0x80:
            i += 1
        else:
            t, i = _varint(b, i)
        w = t & 7
        if w == 2:
            ln = b[i]
            if ln < 0x80:
                i += 1
            else:
                ln, i = _varint(b, i)
            end = i + ln
            if t == 0x0A:
                j = i
                while j < end:
                    u = b[j]
                    if u < 0x80:
                        j += 1
                    else:
                        u, j = _varint(b, j)
                    if u == 0x5A:  # field 11, length-delimited
                        n += 1
                        break
                    v = u & 7
                    if v == 0:
                        while b[j] >= 0x80:
                            j += 1
                        j += 1
                    elif v == 2:
                        l2 = b[j]
                        if l2 < 0x80:
                            j += 1
                        else:
                            l2, j = _varint(b, j)
                        j += l2
                    elif v == 1:
                        j += 8
                    elif v == 5:
                        j += 4
                    else:
                        break
            i = end
        elif w == 0:
            _, i = _varint(b, i)
        elif w == 1:
            i += 8
        elif w == 5:
            i += 4
        else:
            raise ValueError(f"{path}: not a protobuf Perfetto trace (wire type {w} at byte {i})")
    m = re.search(rb"trace0: (\d+) events dropped", b)
    dropped = int(m.group(1)) if m else None
    if m:
        n -= 1  # the marker is an instant event itself
    return n, dropped


def measure(tool: str, path: str, stderr: str, analyze: str) -> dict:
    """Size, events and what was dropped, for one output file."""
    r = {"bytes": os.path.getsize(path), "events": None, "dropped": None, "overflow": False}
    if tool.startswith("ocular-"):
        r["events"], r["dropped"], r["source"] = ocular_events(path, stderr, analyze)
    elif tool == "viztracer":
        r["events"], r["overflow"] = viztracer_events(path)
    elif tool == "trace0":
        r["events"], r["dropped"] = perfetto_track_events(path)
    return r


# -- running -----------------------------------------------------------------------------------------


# Every program and tool runs as users run them: with bytecode caching. (Some shells and CI set
# PYTHONDONTWRITEBYTECODE; Ocular's editable install would then be compiled from source in every run,
# while the peers, installed by pip, come with their .pyc files.) The warm-up writes the caches.
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_once(tool, prog, script, args, opts, outdir):
    """(seconds or None, failure reason or None, stderr, output path or None)."""
    ext = TOOLS[tool][1]
    out = os.path.join(outdir, f"{prog}.{tool}.{ext}") if ext else None
    if out and os.path.exists(out):
        os.remove(out)
    argv = command(tool, out, script, args, opts)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, cwd=outdir, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           errors="replace", timeout=opts.timeout, env=CHILD_ENV)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {opts.timeout} s", "", out
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        last = (p.stderr.strip() or p.stdout.strip() or "(no output)").splitlines()[-3:]
        return None, f"exit code {p.returncode}: " + " | ".join(s.strip() for s in last), p.stderr, out
    if out and not os.path.exists(out):
        return None, f"exit code 0 but no {out} written", p.stderr, out
    return dt, None, p.stderr, out


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}x"


def fmt_count(n: float) -> str:
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{suf}".replace(".0" + suf, suf)
    return f"{n:.0f}"


def fmt_bytes(n: float) -> str:
    for div, suf in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= div:
            return f"{n / div:.1f} {suf}"
    return f"{n:.0f} B"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 5; --quick: 1)")
    ap.add_argument("--programs", default=None,
                    help=f"comma-separated (default: all: {','.join([*PYPERFORMANCE, *WORKLOADS, *PACKAGE_PROGRAMS])}; "
                         "--quick: richards,demo)")
    ap.add_argument("--tools", default=",".join(DEFAULT_TOOLS),
                    help="comma-separated (default: all: %(default)s; also: " + ", ".join(WINDOW_VARIANTS) + ")")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: a quarter of the loops, 1 repeat, richards and demo unless told otherwise")
    ap.add_argument("--scale", type=float, default=None, help="multiply every program's loops (default 1)")
    ap.add_argument("--viztracer-entries", type=int, default=1_000_000,
                    help="VizTracer's --tracer_entries, its ring buffer (default: VizTracer's own, 1000000)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds before one run counts as failed")
    ap.add_argument("--seed", type=int, default=1, help="seed of the run order shuffles")
    ap.add_argument("--outdir", default=os.path.join(ROOT, "out", "peers"), help="traces go here (deleted)")
    ap.add_argument("--md", default=os.path.join(ROOT, "out", "bench-peers.md"), help="markdown copy of stdout")
    ap.add_argument("--analyze", default=os.environ.get("OCULAR_ANALYZE")
                    or os.path.join(ROOT, "target", "release", "ocular-analyze"),
                    help="ocular-analyze binary, for the event counts of .ocl files")
    opts = ap.parse_args()
    repeats = opts.repeats if opts.repeats is not None else (1 if opts.quick else 5)
    scale = opts.scale if opts.scale is not None else (0.25 if opts.quick else 1.0)
    prog_names = (opts.programs.split(",") if opts.programs
                  else ["richards", "demo"] if opts.quick else [*PYPERFORMANCE, *WORKLOADS, *PACKAGE_PROGRAMS])
    tools = [t.strip() for t in opts.tools.split(",") if t.strip()]
    for t in tools:
        if t not in TOOLS:
            ap.error(f"unknown tool {t!r}; known: {', '.join(TOOLS)}")
    if "untraced" not in tools:
        tools.insert(0, "untraced")
    if repeats < 1:
        ap.error("--repeats must be at least 1")

    progs, notes = programs([p.strip() for p in prog_names if p.strip()], scale)
    skipped = {t: why for t in tools if (why := unavailable(t))}
    active = [t for t in tools if t not in skipped]
    os.makedirs(opts.outdir, exist_ok=True)
    started = time.perf_counter()

    # Warm-up, not timed: byte-code caches, the page cache, and a first check that every tool runs.
    demo = os.path.join(ROOT, "testdata", "workloads", "demo.py")
    log(f"== warm-up: every tool once on demo.py, each program once untraced ({sys.executable})")
    for t in active:
        dt, err, _, out = run_once(t, "warmup", demo, [], opts, opts.outdir)
        if err:
            log(f"   {t}: FAILED on demo.py: {err}")
        if out and os.path.exists(out):
            os.remove(out)
    for name, (script, args) in progs.items():
        dt, err, _, _ = run_once("untraced", name, script, args, opts, opts.outdir)
        log(f"   {name} untraced: " + (f"{dt:.2f} s" if err is None else f"FAILED: {err}"))

    times: dict[tuple[str, str], dict[int, float]] = {}
    fails: dict[tuple[str, str], list[str]] = {}
    sizes: dict[tuple[str, str], dict] = {}
    rng = random.Random(opts.seed)
    for r in range(repeats):
        order = list(progs)
        rng.shuffle(order)
        for name in order:
            script, args = progs[name]
            run_tools = list(active)
            rng.shuffle(run_tools)
            for t in run_tools:
                dt, err, stderr, out = run_once(t, name, script, args, opts, opts.outdir)
                if err is None:
                    times.setdefault((t, name), {})[r] = dt
                    if out and (t, name) not in sizes:
                        try:
                            sizes[(t, name)] = measure(t, out, stderr, opts.analyze)
                        except Exception as e:  # noqa: BLE001 - a count that fails is reported, not fatal
                            sizes[(t, name)] = {"bytes": os.path.getsize(out), "events": None, "dropped": None,
                                                "overflow": False, "error": str(e)}
                else:
                    fails.setdefault((t, name), []).append(err)
                if out and os.path.exists(out):
                    os.remove(out)
                log(f"   repeat {r + 1}/{repeats} {name:14} {t:20} " + (f"{dt:7.2f} s" if err is None else "FAILED"))

    # -- the table -----------------------------------------------------------------------------------
    names = list(progs)
    slow: dict[tuple[str, str], float] = {}
    for t in active:
        for name in names:
            base = times.get(("untraced", name), {})
            mine = times.get((t, name), {})
            pairs = [mine[r] / base[r] for r in mine if r in base]
            if pairs:
                slow[(t, name)] = statistics.median(pairs)
    tool_median = {t: statistics.median(v) for t in active
                   if (v := [slow[(t, n)] for n in names if (t, n) in slow])}
    # The noise of the headline: the median over the programs taken within each repeat alone.
    spread: dict[str, tuple[float, float]] = {}
    for t in active:
        per_repeat = []
        for r in range(repeats):
            v = [times[(t, n)][r] / times[("untraced", n)][r] for n in names
                 if r in times.get((t, n), {}) and r in times.get(("untraced", n), {})]
            if len(v) == len(names):
                per_repeat.append(statistics.median(v))
        if per_repeat:
            spread[t] = (min(per_repeat), max(per_repeat))

    lines = []
    w = lines.append
    now = datetime.datetime.now().astimezone()
    if os.environ.get("MAKELEVEL"):
        args_given = " ".join(shlex.quote(a) for a in sys.argv[1:] if not a.startswith("--analyze"))
        cmd = "make bench-peers" + (f" PEERS_ARGS={shlex.quote(args_given)}" if args_given else "")
    else:
        cmd = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT), "bench/peers.py",
                                                    *sys.argv[1:]])
    w("## Ocular and its peers on unmodified programs (`make bench-peers`)")
    w("")
    w(f"Command: `{cmd}`, on {now:%Y-%m-%d %H:%M %Z}. Python {platform.python_version()} "
      f"({platform.python_implementation()}), {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs. "
      f"{repeats} interleaved repeat{'s' if repeats > 1 else ''}; each cell is the median over repeats of the "
      f"run's wall time over the untraced run of the same program in the same repeat, so 1.00x is no "
      f"slowdown; the untraced row is its median wall time. Median = median over the programs; "
      f"per repeat = the lowest and highest of that median taken within one repeat alone (the noise). "
      f"Events, output and bytes/event add up the programs (first run of each).")
    w("")
    head = ["tool", *[program_label(n, progs[n][1]) for n in names], "median", "per repeat", "events", "output",
            "bytes/event"]
    w("| " + " | ".join(head) + " |")
    w("|---" + "|---:" * (len(head) - 1) + "|")
    footnotes = []
    for t in tools:
        label = TOOLS[t][0]
        if t in skipped:
            w(f"| {label} | " + " | ".join(["n/a"] * (len(head) - 1)) + " |")
            continue
        cells = []
        for n in names:
            if t == "untraced":
                v = list(times.get((t, n), {}).values())
                cell = f"{statistics.median(v):.2f} s" if v else "fail"
            elif (t, n) in slow:
                cell = fmt_ratio(slow[(t, n)])
            else:
                cell = "fail"
            if (t, n) in fails and cell != "fail":
                cell += "*"
            cells.append(cell)
        med = fmt_ratio(tool_median[t]) if t in tool_median and t != "untraced" else "—"
        if t in spread and t != "untraced":
            med += f" | {spread[t][0]:.2f}-{fmt_ratio(spread[t][1])}"
        else:
            med += " | —"
        ms = [sizes[(t, n)] for n in names if (t, n) in sizes]
        if ms:
            total_b = sum(m["bytes"] for m in ms)
            ev = [m["events"] for m in ms if m["events"] is not None]
            events = fmt_count(sum(ev)) if ev and len(ev) == len(ms) else "—"
            if any(m["overflow"] for m in ms) or any(m["dropped"] for m in ms):
                events += " †"
            bpe = f"{total_b / sum(ev):.2f}" if ev and len(ev) == len(ms) and sum(ev) else "—"
            cells += [med, events, fmt_bytes(total_b), bpe]
        else:
            cells += [med, "—", "—", "—"]
        w(f"| {label} | " + " | ".join(cells) + " |")
    w("")

    # Per program: events kept, dropped, bytes per event.
    traced = [t for t in active if TOOLS[t][1] and any((t, n) in sizes for n in names)]
    if traced:
        w("Output per program: events recorded, bytes per event (cProfile and pyinstrument: output size; "
          "† = the tool dropped events, count or ring overflow after the semicolon):")
        w("")
        w("| tool | " + " | ".join(names) + " |")
        w("|---" + "|---:" * len(names) + "|")
        for t in traced:
            cells = []
            for n in names:
                m = sizes.get((t, n))
                if m is None:
                    cells.append("fail" if (t, n) in fails else "—")
                    continue
                if m["events"] is None:
                    cells.append(fmt_bytes(m["bytes"]))
                    continue
                c = f"{fmt_count(m['events'])} ev, {m['bytes'] / m['events']:.2f} B/ev" if m["events"] else "0 ev"
                if m["dropped"]:
                    c += f"; † {fmt_count(m['dropped'])} dropped"
                elif m["overflow"]:
                    c += "; † ring overflowed"
                cells.append(c)
            w(f"| {TOOLS[t][0]} | " + " | ".join(cells) + " |")
        w("")

    # Targets, as measured.
    def med(t):
        return tool_median.get(t)

    checks = []
    c, t0_, cp, vz, ad = (med(x) for x in ("ocular-calls", "trace0", "cprofile", "viztracer", "ocular-sampled"))
    if c is not None:
        peers = ", ".join(f"{TOOLS[x][0]} {fmt_ratio(v)}" for x, v in
                          (("trace0", t0_), ("cprofile", cp), ("viztracer", vz)) if v is not None)
        # Compared as printed (two decimals): medians that print equal are level, not ahead.
        others = [round(v, 2) for v in (t0_, cp, vz) if v is not None]
        ok = all(round(c, 2) < v for v in others)
        level = not ok and all(round(c, 2) <= v for v in others)
        checks.append(f"Ocular calls median {fmt_ratio(c)} below trace0's, cProfile's and VizTracer's "
                      f"({peers or 'none measured'}): "
                      f"{'met' if ok else 'NOT met (level)' if level else 'NOT met'}")
    if ad is not None:
        band = spread.get("ocular-sampled")
        band = f" (per repeat {band[0]:.2f}-{fmt_ratio(band[1])})" if band else ""
        checks.append(f"Ocular sampled median {fmt_ratio(ad)}{band} at most 1.05x: "
                      f"{'met' if ad <= 1.05 else 'NOT met'}")
    peer_bpe = {}
    ocl_bpe = {}
    for t in active:
        ms = [sizes[(t, n)] for n in names if (t, n) in sizes and sizes[(t, n)]["events"]]
        if ms and len(ms) == sum(1 for n in names if (t, n) in sizes):
            bpe = sum(m["bytes"] for m in ms) / sum(m["events"] for m in ms)
            (peer_bpe if t in PEERS_WITH_TRACES else ocl_bpe if t.startswith("ocular-") else {})[t] = bpe
    if peer_bpe and ocl_bpe:
        # Per mode: a mode that records few events (adaptive with its threshold) carries the same code
        # object snapshots and header as one that records millions, so its bytes per event are mostly those.
        best_peer = min(peer_bpe, key=peer_bpe.get)
        limit = peer_bpe[best_peer] / 10
        for t, bpe in sorted(ocl_bpe.items(), key=lambda kv: kv[1]):
            checks.append(f"{TOOLS[t][0]} bytes/event {bpe:.2f} at most a tenth of the smallest peer's "
                          f"({TOOLS[best_peer][0]}: {peer_bpe[best_peer]:.2f}, so {limit:.2f}): "
                          f"{'met' if bpe <= limit else 'NOT met'}")
    if checks:
        w("Targets, as measured:")
        w("")
        for s in checks:
            w(f"- {s}")
        w("")

    w("Notes:")
    w("")
    w("- Versions: " + "; ".join(sorted({version(t) for t in active})) + ".")
    w("- pyperformance programs run unmodified in one process with pyperf's worker flags "
      "`--worker -l LOOPS -n 1 -w 0` (×LOOPS in the header); demo.py is testdata/workloads/demo.py, a run of "
      "about 0.1 s in which start-up weighs most.")
    w(f"- Flags: Ocular `python -m ocular run -o F --mode M [--threshold 0]` (default threshold 500); cProfile "
      f"`-m cProfile -o F`; VizTracer `--quiet --tracer_entries {opts.viztracer_entries} -o F.json` (its default "
      f"ring of 1,000,000 entries: on call-heavy programs it overwrites older entries and writes the newest "
      f"million, so its events are those it kept, and a full trace would cost it more time and disk); "
      f"pyinstrument `-o F.txt` (sampling, text report); trace0 `run -o F.pb --no-trace-subprocesses` "
      f"(Perfetto protobuf, its default format).")
    w("- Timings include each tool's start-up and its writing of the output; the output files are deleted "
      "after their size and events are taken.")
    for t, why in skipped.items():
        w(f"- {TOOLS[t][0]}: not run: {why}.")
    for n, why in notes.items():
        w(f"- program {n}: not run: {why}.")
    for (t, n), errs in sorted(fails.items()):
        w(f"- {TOOLS[t][0]} on {n}: failed {len(errs)} of {repeats} runs"
          f"{' (* = median of the others)' if (t, n) in times else ''}: {errs[0]}")
    for (t, n), m in sorted(sizes.items()):
        if m.get("error"):
            w(f"- {TOOLS[t][0]} on {n}: counting events failed: {m['error']}")
        elif t.startswith("ocular-") and m.get("source") and m["source"] != "ocular-analyze info":
            w(f"- {TOOLS[t][0]} on {n}: events from the {m['source']}.")
    w(f"- Whole run: {(time.perf_counter() - started) / 60:.1f} min.")

    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    os.makedirs(os.path.dirname(os.path.abspath(opts.md)), exist_ok=True)
    with open(opts.md, "w") as f:
        f.write(text)
    log(f"== wrote {opts.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
