"""The IPython extension (``%load_ext ocular``) and the inline summary of a trace (``Trace._repr_html_``).

    %%ocular [--mode M] [--threshold N] [--include P]... [--exclude P]... [-o PATH]
    <the cell's code>

records the cell, runs it in the notebook's namespace, and returns the ``ocular.Trace`` (shown inline, and
in ``_`` afterwards); ``%ocular [options] statement`` does the same for one statement. The options are
``python -m ocular run``'s, with the same names and meaning.

IPython is imported only by ``load_ipython_extension``: the summary works in any front end that asks for
``_repr_html_``, and this module imports without IPython.
"""

from __future__ import annotations

import html
import math
import os
import re
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._analysis import Trace

__all__ = ["load_ipython_extension", "parse_options", "trace_html", "OptionError"]


# -- options -----------------------------------------------------------------------------------------------

class OptionError(ValueError):
    """A bad option of %ocular or %%ocular: its message is the one line the user sees."""


# `python -m ocular run`'s options that make sense for one cell: -o and the recording's (the options
# defined under "Recording", `_options.recording()`). The others (--ring, --live, --counters, -m,
# --no-follow, ...) are about a whole program's process and are refused by name.
def _value_options() -> set[str]:
    from . import _options

    return {"-o", "--output"} | {s["flag"] for s in _options.recording() if s["value_name"]}


def _flags() -> set[str]:
    from . import _options

    return {"-h", "--help"} | {s["flag"] for s in _options.recording() if not s["value_name"]}


# A shell-like word: unquoted characters and quoted stretches, no unquoted whitespace.
_WORD = re.compile(r"""(?:[^\s"']+|"(?:[^"\\]|\\.)*"|'[^']*')+""")
_SPACE = re.compile(r"\s*")


def _split(line: str, magic: str) -> tuple[list[str], str]:
    """The options at the start of `line` as argv words, and the rest of the line untouched (a statement:
    its quotes and spaces are Python's, not the shell's). Options end at the first word that does not start
    with ``-``, or after ``--``."""
    import shlex

    words: list[str] = []
    pos = 0
    wants_value = False
    while True:
        pos = _SPACE.match(line, pos).end()
        if pos == len(line):
            break
        m = _WORD.match(line, pos)
        word = m.group() if m else line[pos:]
        if not wants_value and (not word.startswith("-") or word == "--"):
            if word == "--":
                pos = m.end()
            break
        if m is None or m.end() < len(line) and not line[m.end()].isspace():
            raise OptionError(f"{magic}: unbalanced quote in {line[pos:]!r}")
        try:
            (arg,) = shlex.split(word)
        except ValueError:
            raise OptionError(f"{magic}: unbalanced quote in {word!r}") from None
        words.append(arg)
        pos = m.end()
        if wants_value:
            wants_value = False
        elif "=" not in arg and arg in _value_options():
            wants_value = True
    if wants_value:
        raise OptionError(f"{magic}: {words[-1]} needs a value")
    return words, line[pos:]


def _parser(magic: str):
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # argparse would print usage and exit the kernel's process
            raise OptionError(f"{magic}: {message} ({magic} --help lists the options)")

        def exit(self, status: int = 0, message: str | None = None):  # after --help
            raise _Done

    from . import _options

    p = Parser(prog=magic, allow_abbrev=False,
               usage="%(prog)s [-o PATH] [--mode M] [--threshold N] [--include P]... [--exclude P]..." +
                     (" statement" if magic == "%ocular" else "\n<the cell's code>"),
               description="Record " + ("one statement" if magic == "%ocular" else "the cell") +
                           " with Ocular, run in the notebook's namespace, and return its ocular.Trace. The "
                           "options are those of python -m ocular run.")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="the trace file (default: cell-N.ocl in a temporary directory made for this session, "
                        "N the cell's execution count)")
    for spec in _options.recording():
        p.add_argument(spec["flag"], **_options.argparse_kwargs(spec, spec["name"]))
    return p


class _Done(Exception):
    """--help was printed: nothing to run."""


def parse_options(line: str, magic: str = "%%ocular"):
    """The options of ``%%ocular LINE`` (``magic="%%ocular"``: the line holds options only) or ``%ocular
    LINE`` (``magic="%ocular"``: options, then the statement): ``(namespace, statement)``, or ``None`` after
    ``--help`` printed the options. A bad option raises :class:`OptionError` with one line to show."""
    words, rest = _split(line, magic)
    value = False
    for w in words:
        name = w.split("=", 1)[0]
        if value:
            value = False
        elif name in _value_options():
            value = "=" not in w
        elif name not in _flags():
            from . import _options

            flags = ["-o"] + [s["flag"] for s in _options.recording()]
            raise OptionError(f"{magic}: {name} is not an option here: a cell takes {', '.join(flags[:-1])} "
                              f"and {flags[-1]}")
    try:
        ns = _parser(magic).parse_args(words)
    except _Done:
        return None
    rest = rest.strip()
    if magic == "%%ocular" and rest:
        raise OptionError(f"%%ocular: {rest.split()[0]!r} is not an option: the code goes in the cell, below "
                          f"the %%ocular line")
    if magic == "%ocular" and not rest:
        raise OptionError("%ocular: give a statement to record (%ocular [options] statement), or use %%ocular "
                          "for a whole cell")
    return ns, rest


# -- the magics ----------------------------------------------------------------------------------------------

_session_dir: str | None = None


def _default_path(ip: Any) -> str:
    """cell-N.ocl in a temporary directory of this session (N: the cell's execution count; -2, -3, ... for
    more recordings in one cell). Kept after the kernel stops, so the path shown stays valid for
    ``ocular-analyze``; the system's cleaning of temporary files removes it."""
    global _session_dir
    import tempfile

    if _session_dir is None:
        _session_dir = tempfile.mkdtemp(prefix="ocular-notebook-")
    n = _cell_number(ip)
    path = os.path.join(_session_dir, f"cell-{n}.ocl")
    k = 2
    while os.path.exists(path):
        path = os.path.join(_session_dir, f"cell-{n}-{k}.ocl")
        k += 1
    return path


def _cell_number(ip: Any) -> int:
    """The N of the running cell's In[N]. IPython 9 counts ``execution_count`` on before the cell runs, 8
    after: the history, which holds the running cell already in both, says it either way."""
    hist = getattr(getattr(ip, "history_manager", None), "input_hist_raw", None)
    return len(hist) - 1 if hist else getattr(ip, "execution_count", 0)


def _record(ip: Any, magic: str, line: str, cell: str | None) -> "Trace | None":
    from IPython.core.error import UsageError

    from . import _options
    from ._analysis import load
    from ._recorder import Recording
    from .errors import OcularError

    try:
        parsed = parse_options(line, magic)
    except OptionError as e:
        raise UsageError(str(e)) from None
    if parsed is None:
        return None
    opts, statement = parsed
    raw = cell if cell is not None else statement
    # Compiled as IPython compiles a cell (its transforms: magics and !commands inside it; its AST
    # transformers), under a name whose source IPython caches, so that tracebacks show the lines; all of it
    # before the recording starts. A syntax error raises here, and no trace is written.
    source = ip.transform_cell(raw)
    filename = ip.compile.cache(source, _cell_number(ip), raw_code=raw)
    tree = ip.transform_ast(ip.compile.ast_parse(source, filename=filename))
    code = ip.compile(tree, filename, "exec")
    path = os.path.expanduser(opts.output) if opts.output else _default_path(ip)
    namespace = ip.user_ns  # a property of IPython's: read before the recording starts
    # The process is recorded whole, and a kernel's own threads (IOPub, Control, history) run Python code
    # while the cell does (every print wakes IOPub): the summary leaves out the threads that were there
    # before the cell, other than its own; threads the cell starts stay.
    me = threading.get_native_id()
    kernel_threads = {t.native_id: t.name for t in threading.enumerate() if t.native_id not in (None, me)}
    try:
        rec = Recording(path, **{s["name"]: getattr(opts, s["name"]) for s in _options.recording()})
        rec.start()
    except (OcularError, ValueError, OSError) as e:
        raise UsageError(f"{magic}: cannot record: {e}") from None
    __tracebackhide__ = True  # IPython leaves this frame out of the cell's traceback
    try:
        exec(code, namespace)
    except BaseException:
        rec.stop()
        print(f"ocular: the code raised; what ran is in {path}: ocular.load({path!r})", file=sys.stderr)
        raise
    rec.stop()
    trace = load(path)
    trace._background_threads = kernel_threads
    return trace


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext ocular``: registers ``%ocular`` (one statement) and ``%%ocular`` (a cell)."""

    def ocular(line: str = "", cell: str | None = None):
        """Record a cell (%%ocular) or a statement (%ocular) with Ocular and return its ocular.Trace.

            %%ocular [-o PATH] [--mode calls|adaptive|precise] [--threshold N] [--include P]... [--exclude P]...
            <code>

            %ocular [options] statement

        The options are those of ``python -m ocular run`` (``--window-period MS`` and ``--window-length MS``
        too); ``--`` ends them, before a statement that starts with ``-``. The code runs in the notebook's
        namespace; the Trace is shown inline and is ``_`` afterwards (``_.stats()``, ``_.calls()``, ...).
        Without ``-o``, the trace goes to ``cell-N.ocl`` in a temporary directory of the session. If the
        code raises, the trace is still written (its path is printed) and the exception shows as usual.
        Everything the process runs while the code runs is recorded, the kernel's other threads included;
        the inline summary leaves out the threads that were running before the code (IOPub, Control, ...),
        other than its own, and says so.
        """
        __tracebackhide__ = True
        return _record(ip, "%ocular" if cell is None else "%%ocular", line, cell)

    ip.register_magic_function(ocular, magic_kind="line_cell", magic_name="ocular")


# -- the inline summary ------------------------------------------------------------------------------------

_TOP_FUNCTIONS = 10
_TOP_LOOPS = 3
_OPCODES_SHOWN = 16

# Inline styles only: a notebook's sanitizer may drop a <style> element, and one would leak into the page.
_MUTED = "color:#5d6875"
_WARN = "background:#fff6e5;border-left:3px solid #e0a030;padding:2px 8px;margin:2px 0"
_TD = "padding:1px 8px;text-align:right;white-space:nowrap;border-bottom:1px solid #dde2e8"
_TDL = _TD.replace("text-align:right", "text-align:left")


def _ns(ns: float) -> str:
    a = abs(ns)
    if a >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if a >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if a >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.1f} ns"


def _short(path: str) -> str:
    return "/".join(path.split("/")[-2:])


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _merge_threads(rows: Any) -> list[dict[str, Any]]:
    """Per-thread rows of ``stats(per_thread=True)`` summed per function, as ``stats()`` sums them all."""
    merged: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (r.get("pid"), r["function"], r["file"], r["line"])
        m = merged.get(key)
        if m is None:
            merged[key] = dict(r, thread_id=0)
            continue
        for k in ("calls", "exclusive_ms", "inclusive_ms"):
            m[k] += r[k]
        # Each thread's windows vary on their own: their intervals add in quadrature, as stats() adds them.
        for k in ("calls_ci95", "inclusive_ci95_ms", "exclusive_ci95_ms"):
            m[k] = math.hypot(m.get(k) or 0.0, r.get(k) or 0.0)
        for k in ("estimated", "calls_estimated", "calls_lower_bound", "times_lower_bound"):
            m[k] = m.get(k) or r.get(k)
    return list(merged.values())


def trace_html(trace: "Trace") -> str:
    """The essentials of a trace as a small self-contained HTML fragment (no script): the run's facts, which
    figures are estimates, the top functions by exclusive time and the hottest loops."""
    info = trace.info()
    background = getattr(trace, "_background_threads", None) or {}
    left_out = [t for t in info["threads"] if t["id"] in background and t["events"]] if background else []
    if left_out:
        rows = _merge_threads(r for r in trace.stats(per_thread=True) if r["thread_id"] not in background)
    else:
        rows = trace.stats()
    rows.sort(key=lambda r: r["exclusive_ms"], reverse=True)
    loops = []
    if info["mode"] != "calls":
        loops = trace.hot(2 * _TOP_LOOPS if left_out else _TOP_LOOPS).get("loops") or []
        if left_out:
            # A loop has no thread: one in a function that ran in the kernel's threads only is theirs.
            mine = {(r["function"], r["file"]) for r in rows}
            loops = [lp for lp in loops if (lp["function"], lp["file"]) in mine][:_TOP_LOOPS]
    out = [f'<div class="ocular-trace" style="font-size:13px;line-height:1.4">']
    out.append(f'<div><b>Ocular trace</b> <code title="{_e(trace.path)}">{_e(trace.path)}</code></div>')

    mode = info["mode"]
    if mode != "calls":
        t = info.get("deinstrument_threshold")
        mode += f", threshold {t}" if t else ", threshold 0 (every event)"
    lost = info.get("lost_events", 0)
    facts = [("mode", mode), ("Python", info["python_version"]), ("duration", _ns(info["duration_s"] * 1e9)),
             ("events", f"{info['events']:,}"), ("threads", str(len(info["threads"])))]
    spans = [f'<span style="margin-right:18px">{_e(k)} <b>{_e(v)}</b></span>' for k, v in facts]
    lost_style = "color:#b5381c;font-weight:600" if lost else ""
    spans.append(f'<span style="margin-right:18px">lost <b style="{lost_style}">{lost:,}</b></span>')
    out.append(f'<div style="{_MUTED}">{"".join(spans)}</div>')

    notes = []
    if lost:
        notes.append(f"{lost:,} events were lost (the recorder had no free buffer): times miss those stretches "
                     f"(trace.lost() says when).")
    if info.get("dropped_events"):
        notes.append(f"A flight recorder's newest part: {info['dropped_events']:,} earlier events were "
                     f"overwritten.")
    notes.extend(info.get("warnings") or [])
    if not info.get("closed_cleanly", True):
        notes.append("The recording did not end cleanly: it holds what was written or recovered.")
    for n in notes:
        out.append(f'<div style="{_WARN}">{_e(n)}</div>')

    estimated = any(r.get("estimated") or r.get("calls_estimated") for r in rows)
    if estimated:
        exact = ("Figures marked ~ are estimates: calls were recorded whole at first, then in windows, "
                 "and the rest is scaled from them (record without --sampled for exact counts).")
    else:
        exact = ("Every call was recorded: calls are exact; a time marked ~ had the recorder's cost taken out, "
                 "with the interval that cost leaves.")
    if loops and any(lp.get("sampled") for lp in loops):
        exact += (" Loops: only their first iterations are recorded (then the threshold de-instruments "
                  "them); their total time runs to the first sign that the frame left the loop.")
    out.append(f'<div style="{_MUTED};margin:4px 0">{_e(exact)}</div>')

    shown = rows[:_TOP_FUNCTIONS]
    if shown:
        head = "".join(f'<th style="{style}">{h}</th>' for h, style in
                       (("function", _TDL), ("calls", _TD), ("exclusive", _TD), ("inclusive", _TD),
                        ("file:line", _TDL)))
        body = []
        def pm(ci: float, text: str) -> str:
            # An estimate's 95% interval beside it, muted.
            return f' <span style="{_MUTED}">±{_e(text)}</span>' if ci else ""

        for r in shown:
            calls_est = ">=" if r.get("calls_lower_bound") else "~" if r.get("calls_estimated") else ""
            est = ">=" if r.get("times_lower_bound") else "~" if r.get("estimated") else ""
            calls_ci = r.get("calls_ci95") or 0.0
            excl_ci, incl_ci = r.get("exclusive_ci95_ms") or 0.0, r.get("inclusive_ci95_ms") or 0.0
            body.append(
                f'<tr><td style="{_TDL}">{_e(r["function"])}</td>'
                f'<td style="{_TD}">{calls_est}{r["calls"]:,}{pm(calls_ci, f"{calls_ci:,.0f}")}</td>'
                f'<td style="{_TD}">{est}{_e(_ns(r["exclusive_ms"] * 1e6))}{pm(excl_ci, _ns(excl_ci * 1e6))}</td>'
                f'<td style="{_TD}">{est}{_e(_ns(r["inclusive_ms"] * 1e6))}{pm(incl_ci, _ns(incl_ci * 1e6))}</td>'
                f'<td style="{_TDL};{_MUTED}" title="{_e(r["file"])}:{r["line"]}">'
                f'{_e(_short(r["file"]))}:{r["line"]}</td></tr>')
        more = len(rows) - len(shown)
        caption = (f"Top {len(shown)} of {len(rows)} functions by exclusive time" if more else
                   f"{len(rows)} function{'s' if len(rows) != 1 else ''} by exclusive time")
        threads = "threads merged"
        if left_out:
            threads = ("the cell's threads; left out: the kernel's " + ", ".join(
                f"{t['name']} ({t['events']:,} events)" for t in left_out) + ", in trace.stats()")
        out.append(f'<div style="margin-top:6px"><b>{_e(caption)}</b> <span style="{_MUTED}">({_e(threads)})'
                   f'</span></div>')
        out.append(f'<table style="border-collapse:collapse;font-size:12px"><thead><tr>{head}</tr></thead>'
                   f'<tbody>{"".join(body)}</tbody></table>')
    else:
        out.append("<div>No function calls recorded.</div>")

    if loops:
        out.append(f'<div style="margin-top:6px"><b>Hottest loop{"s" if len(loops) > 1 else ""}</b></div>')
        for i, lp in enumerate(loops, 1):
            first = " (first ones only)" if lp.get("sampled") else ""
            per = ("no time per iteration measured" if lp.get("ns_per_iteration") is None
                   else f'{_e(_ns(lp["ns_per_iteration"]))}/iteration')
            out.append(
                f'<div style="margin:2px 0">#{i} <b>{_e(lp["function"])}</b> '
                f'<span style="{_MUTED}" title="{_e(lp["file"])}">{_e(_short(lp["file"]))}:{lp["first_line"]}-'
                f'{lp["last_line"]}</span>: {lp["iterations"]:,} iterations{first}, '
                f'{per}, {_e(_ns(lp["total_ns"]))} in total</div>')
            ops = []
            for ins in (lp.get("instructions") or [])[:_OPCODES_SHOWN]:
                op = _e(ins["base"])
                if ins.get("specialized"):
                    op += f' -&gt; <span style="color:#1b6e2a">{_e(ins["specialized"])}</span>'
                ops.append(op)
            extra = len(lp.get("instructions") or []) - len(ops)
            if extra > 0:
                ops.append(f"... {extra} more")
            if ops:
                out.append(f'<div style="font:11px/1.4 ui-monospace,monospace;{_MUTED};margin:0 0 4px 18px">'
                           f'{" &middot; ".join(ops)}</div>')
    elif info["mode"] == "calls":
        out.append(f'<div style="{_MUTED};margin-top:4px">No loops: calls mode records function boundaries '
                   f'only.</div>')
    out.append(f'<div style="{_MUTED};margin-top:6px">trace.stats(), trace.hot(), trace.calls(), '
               f'trace.events(); the full page: python -m ocular report {_e(trace.path)}</div>')
    out.append("</div>")
    return "\n".join(out)
