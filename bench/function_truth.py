"""Does the sampled mode's function view agree with a full trace? For each program, the top 3 functions by
exclusive time sampled (adaptive, threshold 500, `--sampled`: calls recorded in windows after the first
50,000, FORMAT.md 5.3) next to `calls` mode's (every call recorded), and the share
distance: half the L1 distance between the two recordings' exclusive-time shares over `calls` mode's top
10 functions (0: the same shares; 1: nothing in common), and the calls the default mode estimates over those
`calls` mode counts (median over its 10 most called functions). Targets: the same top-3 set, distance <=
0.15.

    make bench-truth     (or: PY bench/function_truth.py [--programs richards,markdown] [--repeats N])

Programs: pyperformance benchmarks as they ship (the ones `make bench-peers` runs, with pyperf's worker
flags so that the body runs in the recorded process), and real packages' work: Markdown and docutils
rendering text made of the standard library's own docstrings, and an asyncio program with many tasks
doing JSON work. Each program is recorded once per mode per repeat, modes alternated; a program's
distance is the median over repeats. Which functions are top is a property of the program, so a short
run is enough; what this measures is whether the default mode sees the same thing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "release", "ocular-analyze"))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import PYPERFORMANCE, pyperformance_dir  # noqa: E402

# Real packages' work, as scripts (they need the package installed: see the Makefile's bench-truth).
SCRIPTS = {
    "markdown": """
import markdown, pydoc, importlib, sys
mods = ["json", "argparse", "collections", "inspect", "pathlib", "typing", "email", "http.client",
        "asyncio.events", "unittest", "logging", "subprocess", "tarfile", "zipfile", "datetime"]
parts = []
for m in mods:
    mod = importlib.import_module(m)
    parts.append("# " + m + "\\n\\n" + (mod.__doc__ or ""))
    for name in sorted(dir(mod))[:80]:
        doc = getattr(getattr(mod, name), "__doc__", None)
        if isinstance(doc, str):
            parts.append("## " + name + "\\n\\n" + doc + "\\n\\n- item *one*\\n- item `two`\\n\\n> quoted **text**")
text = "\\n\\n".join(parts)
for _ in range(3):
    html = markdown.markdown(text, extensions=["tables", "fenced_code"])
print(len(text), len(html))
""",
    "docutils": """
import docutils.core, importlib
mods = ["json", "argparse", "collections", "inspect", "pathlib", "typing", "logging", "subprocess"]
parts = []
for m in mods:
    mod = importlib.import_module(m)
    parts.append(m + "\\n" + "=" * len(m) + "\\n\\n" + (mod.__doc__ or ""))
    for name in sorted(dir(mod))[:60]:
        doc = getattr(getattr(mod, name), "__doc__", None)
        if isinstance(doc, str):
            parts.append(name + "\\n" + "-" * len(name) + "\\n\\n" + doc + "\\n\\n* item *one*\\n* item ``two``\\n")
text = "\\n\\n".join(parts)
html = docutils.core.publish_string(text, writer="html", settings_overrides={"report_level": 5, "halt_level": 5})
print(len(text), len(html))
""",
    "asyncio": """
import asyncio, json
DOC = {"users": [{"id": i, "name": "user%d" % i, "tags": ["a", "b", "c"], "score": i * 1.5} for i in range(40)]}
async def handler(i):
    await asyncio.sleep(0)
    s = json.dumps(DOC)
    d = json.loads(s)
    await asyncio.sleep(0)
    return len(d["users"])
async def main():
    total = 0
    for _ in range(5):
        total += sum(await asyncio.gather(*(handler(i) for i in range(2000))))
    print(total)
asyncio.run(main())
""",
}


def programs(names: list[str], tmp: str) -> dict[str, list[str]]:
    bm = pyperformance_dir()
    out = {}
    for name in names:
        if name in PYPERFORMANCE:
            if bm is None:
                print(f"  {name}: skipped (pyperformance is not installed)")
                continue
            loops = max(1, PYPERFORMANCE[name] // 2)
            out[name] = [os.path.join(bm, f"bm_{name}", "run_benchmark.py"), "--worker", "-l", str(loops), "-n", "1",
                         "-w", "0"]
        elif name in SCRIPTS:
            module = name if name != "asyncio" else None
            if module and subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode:
                print(f"  {name}: skipped ({module} is not installed)")
                continue
            path = os.path.join(tmp, f"{name}_work.py")
            with open(path, "w") as f:
                f.write(textwrap.dedent(SCRIPTS[name]))
            out[name] = [path]
        else:
            raise SystemExit(f"unknown program {name!r}")
    return out


def exclusive(path: str, analyze: str = ANALYZE) -> dict[str, float]:
    """function (qualname file:line) -> exclusive ms, threads merged; the calls under the same keys in
    CALLS[path]."""
    res = subprocess.run([analyze, "stats", path, "--json", "--top", "100000"], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"ocular-analyze stats {path} failed: {res.stderr.strip()}")
    out: dict[str, float] = {}
    calls: dict[str, float] = {}
    for r in json.loads(res.stdout):
        key = f"{r['function']} {os.path.basename(r['file'])}:{r['line']}"
        out[key] = out.get(key, 0.0) + max(r["exclusive_ms"], 0.0)
        calls[key] = calls.get(key, 0.0) + r["calls"]
    CALLS[(path, analyze)] = calls
    return out


CALLS: dict[tuple[str, str], dict[str, float]] = {}


def calls_ratio(default: dict[str, float], full: dict[str, float]) -> float:
    """Median over calls mode's 10 most called functions of the default mode's estimate over the count."""
    return statistics.median(default.get(k, 0.0) / full[k] for k in top(full, 10) if full[k] > 0)


def shares(x: dict[str, float]) -> dict[str, float]:
    total = sum(x.values()) or 1.0
    return {k: v / total for k, v in x.items()}


def top(x: dict[str, float], n: int) -> list[str]:
    return [k for k, _ in sorted(x.items(), key=lambda kv: -kv[1])[:n]]


def distance(default: dict[str, float], full: dict[str, float]) -> float:
    d, f = shares(default), shares(full)
    return 0.5 * sum(abs(d.get(k, 0.0) - f[k]) for k in top(full, 10))


def record(mode: str, cmd: list[str], out: str, extra: list[str]) -> None:
    res = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "-o", out, "--mode", mode,
                          *(extra if mode != "calls" else []), *cmd],
                         capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"recording {cmd[0]} in {mode} mode failed: {res.stderr.strip()[-500:]}")


def short(name: str) -> str:
    return name.split(" ")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", default=",".join([*PYPERFORMANCE, *SCRIPTS]))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window-period", type=float, help="ms, passed to the default mode's recordings")
    ap.add_argument("--window-length", type=float, help="ms, likewise")
    ap.add_argument("--baseline-analyzer", metavar="PATH",
                    help="another ocular-analyze (an earlier build): its distance on the same default-mode "
                         "recordings is shown next to this one's, which isolates a change to the analysis")
    opts = ap.parse_args()
    extra = ["--sampled"]
    if opts.window_period:
        extra += ["--window-period", str(opts.window_period)]
    if opts.window_length:
        extra += ["--window-length", str(opts.window_length)]
    if not os.path.exists(ANALYZE):
        raise SystemExit(f"{ANALYZE} not found: cargo build --release -p ocular-analyze")
    with tempfile.TemporaryDirectory() as tmp:
        progs = programs(opts.programs.split(","), tmp)
        rows = []
        for name, cmd in progs.items():
            dists, noise, same_noise, last, base, ratios, base_ratios = [], [], [], None, [], [], []
            for _ in range(opts.repeats):
                views = {}
                # Two full traces: how far calls mode is from itself, run to run, is the floor of the
                # default mode's distance.
                for mode in ("adaptive", "calls", "calls-again"):
                    out = os.path.join(tmp, f"{name}-{mode}.ocl")
                    record(mode.split("-")[0], cmd, out, extra)
                    views[mode] = exclusive(out)
                    views[mode + " calls"] = CALLS.pop((out, ANALYZE))
                    if mode == "adaptive" and opts.baseline_analyzer:
                        views["baseline"] = exclusive(out, opts.baseline_analyzer)
                        views["baseline calls"] = CALLS.pop((out, opts.baseline_analyzer))
                    os.unlink(out)
                ratios.append(calls_ratio(views["adaptive calls"], views["calls calls"]))
                if opts.baseline_analyzer:
                    base_ratios.append(calls_ratio(views["baseline calls"], views["calls calls"]))
                dists.append(distance(views["adaptive"], views["calls"]))
                if opts.baseline_analyzer:
                    base.append(distance(views["baseline"], views["calls"]))
                noise.append(distance(views["calls-again"], views["calls"]))
                same_noise.append(set(top(views["calls-again"], 3)) == set(top(views["calls"], 3)))
                last = views
            d3, c3 = top(last["adaptive"], 3), top(last["calls"], 3)
            rows.append((name, d3, c3, set(d3) == set(c3), statistics.median(dists), min(dists), max(dists),
                         statistics.median(noise), all(same_noise), statistics.median(base) if base else None,
                         statistics.median(ratios), statistics.median(base_ratios) if base_ratios else None))
            print(f"  {name}: distance {statistics.median(dists):.3f}", file=sys.stderr)
    windows = " ".join(extra[1:]) or "default windows"
    print(f"\nSampled mode (adaptive, threshold 500, {windows}) against calls mode, {opts.repeats} repeats, "
          f"Python {sys.version.split()[0]}")
    b = opts.baseline_analyzer
    print("| program | sampled mode top 3 | calls mode top 3 | same set | distance, median (min-max) "
          "| calls vs calls: distance, same set | calls: estimate / count |"
          f"{' baseline analyzer: distance, calls |' if b else ''}")
    print(f"|---|---|---|---|---:|---:|---:|{'---:|' if b else ''}")
    for name, d3, c3, same, med, lo, hi, nd, nsame, bd, ratio, bratio in rows:
        print(f"| {name} | {', '.join(map(short, d3))} | {', '.join(map(short, c3))} | {'yes' if same else 'no'} "
              f"| {med:.3f} ({lo:.3f}-{hi:.3f}) | {nd:.3f}, {'yes' if nsame else 'no'} | {ratio:.2f} |"
              + (f" {bd:.3f}, {bratio:.2f} |" if b else ""))
    if rows:
        print(f"\nsame top-3 set: {sum(r[3] for r in rows)} of {len(rows)}; median distance "
              f"{statistics.median(r[4] for r in rows):.3f}, worst {max(r[4] for r in rows):.3f} (target: <= 0.15); "
              f"calls estimated / counted: median {statistics.median(r[10] for r in rows):.2f}, "
              f"{min(r[10] for r in rows):.2f}-{max(r[10] for r in rows):.2f}")
        if b:
            print(f"baseline analyzer ({b}): median distance {statistics.median(r[9] for r in rows):.3f}, "
                  f"worst {max(r[9] for r in rows):.3f}; calls estimated / counted: median "
                  f"{statistics.median(r[11] for r in rows):.2f}, "
                  f"{min(r[11] for r in rows):.2f}-{max(r[11] for r in rows):.2f}")


if __name__ == "__main__":
    main()
