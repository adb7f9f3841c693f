"""Is Ocular true on real packages' work? Five packages the project had not used before (Pygments, Jinja2,
sqlglot, tomlkit, pyparsing), each doing its ordinary job for a few seconds, recorded in the default mode
(every call), sampled (`--sampled`) and in calls mode (the reference for counts), and sampled by py-spy at
1 kHz (an independent sampler, from PyPI: the reference for time shares).

    make bench-truth     (or: PY bench/truth_packages.py [--programs jinja2,sqlglot] [--repeats N] [--modes default,sampled])

Per program, against each reference: whether the top function by exclusive time is the same; the share
distance (half the L1 distance between exclusive-time shares over the reference's top 10 functions: 0 is
the same shares, 1 nothing in common; target <= 0.08); and for calls mode's 10 most called functions, how
many of the mode's counts are within 10% of the exact count or hold it inside their 95% interval
(target: 10 of 10). A program's figures are the median over repeats.

Functions are matched by name and file (py-spy names a frame by its function's name, not its qualified
name); py-spy's shares are of its samples of running code (idle time is not sampled, and these programs do
not wait).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "release", "ocular-analyze"))

SCRIPTS = {
    "pygments": """
import inspect, importlib
from pygments import highlight
from pygments.lexers import PythonLexer
from pygments.formatters import HtmlFormatter
mods = ["argparse", "json.decoder", "collections", "inspect", "pathlib", "typing", "logging", "dataclasses"]
src = "\\n".join(inspect.getsource(importlib.import_module(m)) for m in mods)
for _ in range(2):
    html = highlight(src, PythonLexer(), HtmlFormatter(linenos=True))
print(len(src), len(html))
""",
    "jinja2": """
from jinja2 import Environment, DictLoader
env = Environment(loader=DictLoader({
    "base": "<html><body>{% block body %}{% endblock %}</body></html>",
    "page": '''{% extends "base" %}{% macro row(u) %}<tr class="{{ loop_class }}"><td>{{ u.name|title }}</td>
<td>{{ u.email|lower }}</td><td>{{ "%.2f"|format(u.score) }}</td><td>{{ u.tags|join(", ") }}</td></tr>{% endmacro %}
{% block body %}<table>{% for u in users if u.active %}{{ row(u) }}{% endfor %}</table>
<p>{{ users|selectattr("active")|list|length }} active of {{ users|length }}</p>{% endblock %}''',
}), autoescape=True)
t = env.get_template("page")
users = [{"name": "user number %d" % i, "email": "User%d@Example.COM" % i, "score": i / 7, "active": i % 3 != 0,
          "tags": ["t%d" % (i % 5), "x", "y"]} for i in range(400)]
n = 0
for _ in range(300):
    n += len(t.render(users=users, loop_class="r"))
print(n)
""",
    "sqlglot": """
import sqlglot
queries = []
for i in range(120):
    queries.append(
        "SELECT a.id, b.name, SUM(c.amount) AS total, COUNT(DISTINCT d.x) FROM accounts AS a "
        "JOIN branches AS b ON a.branch_id = b.id LEFT JOIN charges AS c ON c.account_id = a.id "
        "JOIN (SELECT x, account_id FROM events WHERE kind IN ('a', 'b', 'c') AND ts > %d) AS d ON d.account_id = a.id "
        "WHERE a.created_at BETWEEN '2020-01-01' AND '2021-01-01' AND b.region = 'r%d' "
        "GROUP BY a.id, b.name HAVING SUM(c.amount) > %d ORDER BY total DESC LIMIT 10" % (i, i % 9, i * 10))
n = 0
for q in queries * 3:
    for dialect in ("duckdb", "postgres"):
        n += len(sqlglot.transpile(q, read="mysql", write=dialect)[0])
print(n)
""",
    "tomlkit": """
import tomlkit
doc = tomlkit.document()
for i in range(150):
    t = tomlkit.table()
    t.add("name", "package-%d" % i)
    t.add("version", "1.%d.%d" % (i % 10, i))
    t.add("deps", ["dep-%d>=1.0" % j for j in range(i % 7)])
    t.add("meta", {"owner": "team-%d" % (i % 4), "size": i * 1.5, "ok": i % 2 == 0})
    doc.add("pkg%d" % i, t)
text = tomlkit.dumps(doc)
n = 0
for _ in range(24):
    parsed = tomlkit.parse(text)
    n += len(tomlkit.dumps(parsed))
print(len(text), n)
""",
    "pyparsing": """
import pyparsing as pp
pp.ParserElement.enable_packrat()
integer = pp.pyparsing_common.number
ident = pp.Word(pp.alphas, pp.alphanums + "_")
operand = integer | ident
expr = pp.infix_notation(operand, [
    (pp.one_of("- +"), 1, pp.OpAssoc.RIGHT),
    (pp.one_of("* /"), 2, pp.OpAssoc.LEFT),
    (pp.one_of("+ -"), 2, pp.OpAssoc.LEFT),
    (pp.one_of("< > <= >= == !="), 2, pp.OpAssoc.LEFT),
])
lines = ["(a%d + %d) * (b - %d / c%d) + -x >= y * (%d - z%d)" % (i, i, i % 7, i, i * 3, i) for i in range(300)]
n = 0
for _ in range(8):
    for line in lines:
        n += len(expr.parse_string(line, parse_all=True))
print(n)
""",
}


def key(function: str, file: str) -> str:
    return f"{function.rsplit('.', 1)[-1]} ({os.path.basename(file)})"


def ocular_figures(path: str) -> dict[str, dict]:
    out = subprocess.run([ANALYZE, "stats", path, "--json", "--top", "100000"], capture_output=True, text=True,
                         check=True)
    rows: dict[str, dict] = {}
    for r in json.loads(out.stdout):
        k = key(r["function"], r["file"])
        if k in rows:  # same name in one file: sum
            for f in ("exclusive_ms", "calls", "calls_ci95"):
                rows[k][f] = rows[k].get(f, 0) + (r.get(f) or 0)
        else:
            rows[k] = dict(r)
    return rows


def pyspy_exclusive(raw: str) -> dict[str, float]:
    """Samples per function at the top of the stack, from py-spy's raw (collapsed) output with --function."""
    out: dict[str, float] = collections.Counter()
    with open(raw) as fh:
        for line in fh:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack or not n.isdigit():
                continue
            leaf = stack.split(";")[-1]
            # "function (path/file.py)" or "function (path/file.py:line)"
            name, _, where = leaf.partition(" (")
            where = where.rstrip(")").split(":")[0]
            out[f"{name.rsplit('.', 1)[-1]} ({os.path.basename(where)})"] += int(n)
    return out


def shares(x: dict[str, float]) -> dict[str, float]:
    total = sum(v for v in x.values() if v > 0) or 1.0
    return {k: max(v, 0.0) / total for k, v in x.items()}


def distance(est: dict[str, float], ref: dict[str, float]) -> float:
    a, b = shares(est), shares(ref)
    tops = sorted(b, key=b.get, reverse=True)[:10]
    return 0.5 * sum(abs(a.get(k, 0.0) - b[k]) for k in tops)


def top1(x: dict[str, float]) -> str:
    return max(x, key=x.get) if x else ""


def counts_ok(default: dict[str, dict], full: dict[str, dict]) -> tuple[int, list[str]]:
    """Of calls mode's 10 most called functions: how many of the mode's counts are within 10% or
    hold the exact count inside their interval; and the ones that are not."""
    tops = sorted(full, key=lambda k: full[k]["calls"], reverse=True)[:10]
    good, bad = 0, []
    for k in tops:
        exact = full[k]["calls"]
        d = default.get(k, {"calls": 0, "calls_ci95": 0})
        est, ci = d["calls"], d.get("calls_ci95") or 0
        if abs(est - exact) <= 0.10 * exact or (abs(est - exact) <= ci and not d.get("calls_lower_bound")):
            good += 1
        elif d.get("calls_lower_bound"):
            bad.append(f"{k}: >={est:,} (said: a lower bound, no window saw it) for {exact:,}")
        else:
            bad.append(f"{k}: {est:,} +-{ci:,.0f} for {exact:,}")
    return good, bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", default=",".join(SCRIPTS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="default,sampled", help="default (every call), sampled (--sampled)")
    args = ap.parse_args()
    modes = args.modes.split(",")
    pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(pyspy):
        pyspy = None
    print(f"# Ocular on real packages' work: Python {sys.version.split()[0]}, {args.repeats} repeats "
          f"(medians), py-spy {'at 1 kHz' if pyspy else 'not installed'}\n")
    print("| program | mode | top function (calls mode / py-spy / this mode) | same top | distance to calls mode | "
          "distance to py-spy | counts within 10% or their interval |")
    print("|---|---|---|---|---:|---:|---:|")
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.programs.split(","):
            script = os.path.join(tmp, f"work_{name}.py")  # not {name}.py: it would shadow the package
            with open(script, "w") as fh:
                fh.write(SCRIPTS[name])
            d_calls = {m: [] for m in modes}
            d_spy = {m: [] for m in modes}
            goods = {m: [] for m in modes}
            same = {m: [] for m in modes}
            tops = {}
            for rep in range(args.repeats):
                figs = {}
                for mode in ["calls", *modes]:
                    out = os.path.join(tmp, f"{name}-{mode}-{rep}.ocl")
                    flags = ["--mode", "calls"] if mode == "calls" else ["--sampled"] if mode == "sampled" else []
                    subprocess.run([sys.executable, "-m", "ocular", "run", "-q", *flags, "-o", out, script],
                                   check=True, capture_output=True)
                    figs[mode] = ocular_figures(out)
                full = figs["calls"]
                ex_full = {k: v["exclusive_ms"] for k, v in full.items()}
                ex_spy: dict[str, float] = {}
                if pyspy:
                    raw = os.path.join(tmp, f"{name}-{rep}.txt")
                    subprocess.run([pyspy, "record", "--rate", "1000", "--format", "raw", "--function", "-o", raw,
                                    "--", sys.executable, script], check=True, capture_output=True)
                    ex_spy = pyspy_exclusive(raw)
                for mode in modes:
                    this = figs[mode]
                    ex_this = {k: v["exclusive_ms"] for k, v in this.items()}
                    if ex_spy:
                        d_spy[mode].append(distance(ex_this, ex_spy))
                    d_calls[mode].append(distance(ex_this, ex_full))
                    good, bad = counts_ok(this, full)
                    goods[mode].append(good)
                    notes += [f"{name}, {mode} (repeat {rep + 1}): {b}" for b in bad]
                    tops[mode] = (top1(ex_full), top1(ex_spy) if ex_spy else "-", top1(ex_this))
                    same[mode].append(tops[mode][2] == tops[mode][0] and (not ex_spy or tops[mode][2] == tops[mode][1]))
            for mode in modes:
                spy = f"{statistics.median(d_spy[mode]):.3f}" if d_spy[mode] else "-"
                print(f"| {name} | {mode} | {' / '.join(tops[mode])} | {sum(same[mode])} of {len(same[mode])} | "
                      f"{statistics.median(d_calls[mode]):.3f} | {spy} | {int(statistics.median(goods[mode]))} of 10 |")
    if notes:
        print("\nCounts outside 10% and outside their interval:")
        for n in notes:
            print(f"- {n}")


if __name__ == "__main__":
    main()
