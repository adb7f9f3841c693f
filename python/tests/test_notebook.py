"""Notebooks: ``%load_ext ocular``, ``%%ocular`` and ``%ocular`` in a real notebook run by a real kernel
(nbclient + ipykernel, on this venv's interpreter), and the inline summary (``Trace._repr_html_``)."""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

import ocular
from ocular._ipython import OptionError, parse_options, trace_html


def _notebook_packages():
    """nbclient, nbformat and ipykernel (scripts/venv.sh installs them from PyPI), or a skip naming the one
    missing: only a missing package skips."""
    mods = []
    for name in ("nbclient", "nbformat", "ipykernel"):
        mods.append(pytest.importorskip(name, reason=f"the notebook test needs {name} (pip install nbclient "
                                                     f"nbformat ipykernel; scripts/venv.sh installs them)"))
    return mods


def _kernel(tmp_path):
    """A kernel manager whose only kernel is this interpreter's ipykernel: a `python3` spec installed
    elsewhere on the machine (another Python, without Ocular) cannot be picked instead."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    kernels = tmp_path / "kernels"
    spec = kernels / "ocular-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Ocular test", "language": "python",
    }))
    ksm = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
    return KernelManager(kernel_name="ocular-test", kernel_spec_manager=ksm)


def _text(outputs, name="stdout"):
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == name)


def _html(outputs):
    for o in outputs:
        if o.get("output_type") == "execute_result":
            return o["data"].get("text/html", "")
    raise AssertionError(f"no result in {outputs!r}")


def _calls_cell(name):
    return f'print("calls of {name}:", *[r["calls"] for r in _.stats() if r["function"] == "{name}"])'


def test_magics_in_a_real_notebook(tmp_path, monkeypatch):
    # GIVEN a notebook using the extension, run by a kernel of this very interpreter
    nbclient, nbformat, _ = _notebook_packages()
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core's warning about its coming paths
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the kernel's temporary files, the default trace's too
    cell_trace = str(tmp_path / "cell.ocl")
    line_trace = str(tmp_path / "line.ocl")
    raised_trace = str(tmp_path / "raised.ocl")
    v4 = nbformat.v4
    cells = [
        v4.new_code_cell("import sys, ocular\nprint(sys.executable)\nprint(ocular.__file__)"),
        v4.new_code_cell("%load_ext ocular"),
        v4.new_code_cell(f"%%ocular --mode calls -o {cell_trace}\n"
                         "def f():\n    return 1\n\nfor i in range(1000):\n    f()"),
        v4.new_code_cell("t = _\n" + _calls_cell("f") + "\nprint(type(t).__name__, t.path)"),
        v4.new_code_cell(f"%ocular --mode calls -o {line_trace} [f() for i in range(7)]"),
        v4.new_code_cell(_calls_cell("f")),
        v4.new_code_cell(f"%%ocular --mode calls -o {raised_trace}\n"
                         "def g():\n    raise ValueError('boom from the cell')\n\nf()\ng()",
                         metadata={"tags": ["raises-exception"]}),
        v4.new_code_cell("%ocular --mode fast f()", metadata={"tags": ["raises-exception"]}),
        v4.new_code_cell("%ocular f()"),  # the default output: a temporary file
        v4.new_code_cell("print(_.path)"),
    ]
    nb = v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "ocular-test", "display_name": "Ocular test", "language": "python"}

    # WHEN it runs
    started = time.monotonic()
    statuses = []
    client = nbclient.NotebookClient(nb, km=_kernel(tmp_path), timeout=120, startup_timeout=60,
                                     resources={"metadata": {"path": str(tmp_path)}},
                                     on_cell_executed=lambda cell, cell_index, execute_reply:
                                     statuses.append(execute_reply["content"]["status"]))
    client.execute()
    took = time.monotonic() - started
    print(f"the notebook ran in {took:.1f} s (kernel start included)")
    out = [c.outputs for c in nb.cells]

    # THEN the kernel is this venv's interpreter, with this Ocular
    executable, package = _text(out[0]).splitlines()
    assert executable == sys.executable
    assert os.path.dirname(package) == os.path.dirname(ocular.__file__)

    # the cell's Trace is shown inline: f with its 1,000 calls, names escaped
    page = _html(out[2])
    assert re.search(r">f</td><td[^>]*>1,000</td>", page), page
    assert "&lt;module&gt;" in page and "<module>" not in page
    assert "mode <b>calls</b>" in page and "lost <b" in page
    assert "<script" not in page
    # and it is `_`, with exactly 1000 calls of f
    assert _text(out[3]).splitlines() == ["calls of f: 1000", f"Trace {cell_trace}"]

    # the line magic records its statement only
    assert re.search(r">f</td><td[^>]*>7</td>", _html(out[4]))
    assert _text(out[5]) == "calls of f: 7\n"

    # an exception in the cell: the trace is written, the exception shows as usual
    errors = [o for o in out[6] if o["output_type"] == "error"]
    assert [(e["ename"], e["evalue"]) for e in errors] == [("ValueError", "boom from the cell")]
    assert f"ocular: the code raised; what ran is in {raised_trace}" in _text(out[6], "stderr")
    assert os.path.exists(raised_trace)
    calls = {r["function"]: r["calls"] for r in ocular.load(raised_trace).stats()}
    assert calls["f"] == 1 and calls["g"] == 1

    # a bad option is one line, not a traceback
    assert out[7] == [{"output_type": "stream", "name": "stderr", "text": (
        "UsageError: %ocular: argument --mode: invalid choice: 'fast' (choose from 'calls', 'adaptive', "
        "'precise') (%ocular --help lists the options)\n")}]
    # both failed as cells fail ("Run all" stops there), and only they
    assert [i for i, status in enumerate(statuses) if status != "ok"] == [6, 7]
    assert statuses[6] == statuses[7] == "error"

    # without -o: cell-N.ocl (N: the cell's execution count) in a temporary directory of the session
    default = _text(out[9]).strip()
    assert os.path.basename(default) == f"cell-{nb.cells[8].execution_count}.ocl"
    assert os.path.basename(os.path.dirname(default)).startswith("ocular-notebook-")
    assert os.path.dirname(os.path.dirname(default)) == str(tmp_path)
    assert os.path.exists(default)
    assert took < 60, f"the notebook took {took:.1f} s"


# -- the summary, without a kernel -----------------------------------------------------------------------------

def test_repr_html_escapes_names(tmp_path):
    # GIVEN a trace of a module's code, a nested function and a function whose name is markup
    source = ("def outer():\n    def inner():\n        return 1\n    return inner()\n"
              "for _ in range(3):\n    outer()\n")
    code = compile(source, str(tmp_path / "prog.py"), "exec")

    def odd():
        return 2

    odd.__code__ = odd.__code__.replace(co_qualname="<b>odd</b> & 'x'")
    path = str(tmp_path / "run.ocl")
    with ocular.record(path, mode="calls"):
        exec(code, {})
        odd()

    # WHEN it is shown in a notebook
    page = ocular.load(path)._repr_html_()

    # THEN every name is text, not markup
    assert "&lt;module&gt;" in page
    assert "outer.&lt;locals&gt;.inner" in page
    assert "&lt;b&gt;odd&lt;/b&gt; &amp; &#x27;x&#x27;" in page
    assert "<module>" not in page and "<locals>" not in page and "<b>odd" not in page
    assert re.search(r">outer</td><td[^>]*>3</td>", page)
    assert "Every call was recorded: calls are exact" in page
    assert "No loops: calls mode" in page


class _Fake:
    """What trace_html reads of a Trace: a lossy, estimated adaptive-mode recording with one loop."""

    path = "/tmp/<x>.ocl"

    def info(self):
        return {"mode": "adaptive", "deinstrument_threshold": 500, "python_version": "3.13.0", "duration_s": 0.5,
                "events": 123456, "threads": [{}, {}], "lost_events": 3692, "dropped_events": 0,
                "warnings": [], "closed_cleanly": True}

    def stats(self):
        return [{"function": "work", "file": "/a/b/app.py", "line": 3, "calls": 40000, "calls_estimated": True,
                 "estimated": True, "exclusive_ms": 12.5, "inclusive_ms": 20.0}]

    def hot(self, top=10):
        return {"loops": [{"function": "work", "file": "/a/b/app.py", "first_line": 4, "last_line": 5,
                           "iterations": 1000, "sampled": True, "ns_per_iteration": 40.0, "total_ns": 4e6,
                           "instructions": [{"base": "FOR_ITER", "specialized": "FOR_ITER_RANGE"},
                                            {"base": "STORE_FAST", "specialized": None}]}]}


def test_repr_html_says_lost_events_and_estimates():
    page = trace_html(_Fake())
    assert 'lost <b style="color:#b5381c;font-weight:600">3,692</b>' in page
    assert "3,692 events were lost" in page and "background:#fff6e5" in page
    assert "~40,000" in page and "~12.500 ms" in page and "Figures marked ~ are estimates" in page
    assert "FOR_ITER -&gt; <span" in page and "FOR_ITER_RANGE" in page and "STORE_FAST" in page
    assert "1,000 iterations (first ones only" in page and "40.0 ns/iteration" in page
    assert "/tmp/&lt;x&gt;.ocl" in page


class _FakeKernel(_Fake):
    """Recorded by %%ocular in a kernel: its IOPub thread (id 2) ran too, and a loop of its own."""

    _background_threads = {2: "IOPub"}

    def info(self):
        return dict(super().info(), lost_events=0, threads=[{"id": 1, "name": "MainThread", "events": 900},
                                                            {"id": 2, "name": "IOPub", "events": 1225}])

    def stats(self, per_thread=False):
        assert per_thread
        row = dict(super().stats()[0], calls_estimated=False, estimated=False)
        select = dict(row, function="EpollSelector.select", file="/usr/lib/selectors.py", exclusive_ms=202.0)
        return [dict(row, thread_id=1, calls=30000), dict(row, thread_id=3, calls=10000),
                dict(select, thread_id=2)]

    def hot(self, top=10):
        loop = super().hot()["loops"][0]
        return {"loops": [dict(loop, function="BaseEventLoop.run_forever", file="/usr/lib/asyncio/base_events.py"),
                          loop]}


def test_repr_html_leaves_the_kernels_threads_out():
    page = trace_html(_FakeKernel())
    assert "left out: the kernel&#x27;s IOPub (1,225 events), in trace.stats()" in page
    assert "EpollSelector" not in page and "run_forever" not in page
    assert re.search(r">work</td><td[^>]*>40,000</td>", page)  # the cell's thread and one it started, summed
    assert "#1 <b>work</b>" in page


# -- options ---------------------------------------------------------------------------------------------------

def test_options_are_runs():
    ns, rest = parse_options("--mode calls --threshold 0 -o 'my trace.ocl' --include app --include lib", "%%ocular")
    assert (ns.mode, ns.deinstrument_threshold, ns.output, ns.include_only, ns.exclude, rest) == (
        "calls", 0, "my trace.ocl", ["app", "lib"], [], "")
    ns, rest = parse_options("--mode=precise --window-period 20 f(x, '-y  z')", "%ocular")
    assert (ns.mode, ns.window_period, rest) == ("precise", 0.02, "f(x, '-y  z')")
    ns, rest = parse_options("-- -x + 1", "%ocular")
    assert (ns.mode, ns.deinstrument_threshold, rest) == ("adaptive", 500, "-x + 1")


@pytest.mark.parametrize("magic,line,message", [
    ("%%ocular", "--mode fast",
     "%%ocular: argument --mode: invalid choice: 'fast' (choose from 'calls', 'adaptive', 'precise') "
     "(%%ocular --help lists the options)"),
    ("%%ocular", "--threshold -1",
     "%%ocular: argument --threshold: invalid int >= 0 value: '-1' "
     "(%%ocular --help lists the options)"),
    ("%%ocular", "--ring 64MB",
     "%%ocular: --ring is not an option here: a cell takes -o, --mode, --threshold, --include, --exclude, "
     "--sampled, --window-period, --window-length and --c-calls"),
    ("%%ocular", "--mode calls f()", "%%ocular: 'f()' is not an option: the code goes in the cell, below the "
                                     "%%ocular line"),
    ("%%ocular", "-o", "%%ocular: -o needs a value"),
    ("%%ocular", "-o 'unclosed", "%%ocular: unbalanced quote in \"'unclosed\""),
    ("%ocular", "--mode calls", "%ocular: give a statement to record (%ocular [options] statement), or use "
                                "%%ocular for a whole cell"),
])
def test_option_errors_are_one_line(magic, line, message):
    with pytest.raises(OptionError) as e:
        parse_options(line, magic)
    assert str(e.value) == message
