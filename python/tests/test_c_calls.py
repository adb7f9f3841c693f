"""Calls of C functions (`c_calls`, FORMAT.md 5.4): built-ins, method descriptors and types called from
Python are their own functions, counted exactly in calls mode, and agree with a plain sys.monitoring tool
listening to the same events."""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

import ocular
from ocular._recorder import event_names

from conftest import read_ocl

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "debug", "ocular-analyze"))

# The program: each count is known by construction. `sorted` of a big list is the heaviest thing `work`
# does itself; `int("x")` raises (C_RAISE); `sorted(key=...)` and `map` consumed by `list` call back into
# Python.
PROGRAM = textwrap.dedent("""
    def neg(x):
        s = 0
        for i in range(20):
            s += i
        return -x

    # Made at import: its making (a comprehension, inlined into its function) is not work's time.
    BIG = [(i * 7919) % 1_000_003 for i in range(300_000)]

    def work():
        n = 0
        for i in range(10_000):
            if isinstance(i, int):
                n += 1
        xs = []
        for i in range(5_000):
            n += len(xs)
            xs.append(i)
        sorted(BIG)
        for _ in range(100):
            try:
                int("x")
            except ValueError:
                pass
        sorted(range(1_000), key=neg)
        list(map(neg, range(500)))
        return n
""")


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "cprog.py"
    path.write_text(PROGRAM)
    spec = importlib.util.spec_from_file_location("cprog", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class CReference:
    """What a plain-Python sys.monitoring tool sees of the program's C calls: CALL of a callable that is not
    a Python function (nor a method of one), C_RETURN and C_RAISE, counted by the callable's name."""

    def __init__(self, filename, tool=4):
        self.filename, self.tool = filename, tool
        self.calls = collections.Counter()
        self.returns = collections.Counter()
        self.raises = collections.Counter()

    def _name(self, callable_):
        if isinstance(callable_, type):
            return callable_.__qualname__
        return getattr(callable_, "__qualname__", type(callable_).__qualname__ + ".__call__")

    def __enter__(self):
        mon = sys.monitoring
        ev = mon.events
        python = (type(self.__enter__.__func__), )

        def call(code, offset, callable_, arg0):
            if code.co_filename != self.filename:
                return None
            if isinstance(callable_, python) or (hasattr(callable_, "__func__")
                                                 and isinstance(callable_.__func__, python)):
                return None
            self.calls[self._name(callable_)] += 1

        def c_return(code, offset, callable_, arg0):
            if code.co_filename == self.filename:
                self.returns[self._name(callable_)] += 1

        def c_raise(code, offset, callable_, arg0):
            if code.co_filename == self.filename:
                self.raises[self._name(callable_)] += 1

        mon.use_tool_id(self.tool, "c-reference")
        mon.register_callback(self.tool, ev.CALL, call)
        mon.register_callback(self.tool, ev.C_RETURN, c_return)
        mon.register_callback(self.tool, ev.C_RAISE, c_raise)
        mon.set_events(self.tool, ev.CALL | ev.C_RETURN | ev.C_RAISE)
        return self

    def __exit__(self, *exc):
        mon = sys.monitoring
        mon.set_events(self.tool, 0)
        for e in (mon.events.CALL, mon.events.C_RETURN, mon.events.C_RAISE):
            mon.register_callback(self.tool, e, None)
        mon.free_tool_id(self.tool)


def stats(path):
    r = subprocess.run([ANALYZE, "stats", "--json", "--top", "1000", path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return {row["function"]: row for row in json.loads(r.stdout)}


EXPECTED = {"builtins.isinstance": 10_000, "builtins.len": 5_000, "builtins.list.append": 5_000,
            "builtins.int": 100, "builtins.map": 1}


def test_c_calls_are_functions_counted_exactly_in_calls_mode(program, ocl):
    # GIVEN a program whose C calls are known, recorded in calls mode with c_calls, and a reference tool
    with ocular.record(ocl, mode="calls", c_calls=True) as rec:
        with CReference(program.__file__) as ref:
            program.work()
    assert rec.lost == 0
    rows = stats(ocl)
    # THEN every C callable is a row with exactly its calls
    for name, n in EXPECTED.items():
        assert rows[name]["calls"] == n, name
        assert rows[name]["file"] == "~" and rows[name]["line"] == 0
    # sorted: the big list, the key one; list(): the map consumed (range and the comprehension are not calls
    # of list)
    assert rows["builtins.sorted"]["calls"] == 2
    assert rows["builtins.list"]["calls"] == 1
    assert rows["cprog.neg" if "cprog.neg" in rows else "neg"]["calls"] == 1_500
    # AND the counts agree with the reference, which names callables by their qualified names
    for name, n in ref.calls.items():
        assert rows[f"builtins.{name}"]["calls"] == n, name
    assert ref.raises == {"int": 100}
    assert sum(ref.returns.values()) + sum(ref.raises.values()) == sum(ref.calls.values())
    # AND the file says which was called: the type int raised 100 times
    f = read_ocl(ocl)
    kinds = collections.Counter(k for _, _, k, cid, *_ in f["events"] if cid in f["code"] and f["code"][cid][1] == program.__file__)
    assert kinds["C_RAISE"] == 100
    assert kinds["CALL"] == kinds["C_RETURN"] + kinds["C_RAISE"]
    names = {q for q, m, k in f["cfuncs"].values()}
    assert {"isinstance", "len", "list.append", "sorted", "int", "map"} <= names


def test_times_c_functions_out_of_their_caller(program, ocl):
    # A preemption inside one of neg's 0.3 us calls (4 ms once, beside two busy loops), or inside map()'s
    # making of its iterator (4.2 ms once), outweighs all the others and breaks the splits below: such a run
    # is retried, not the bounds widened.
    def preempted(rows):
        srt, neg = rows["builtins.sorted"], rows["neg"]
        # sorted's inclusive time contains its key function's (1,000 of neg's 1,500 calls; map's 500 are
        # list's: two thirds of neg's time by count, not exactly by time, which read 6 us short of 0.9 of it
        # once); list's holds map's iterator's work, map's own call only makes the iterator.
        return (srt["inclusive_ms"] < srt["exclusive_ms"] + neg["inclusive_ms"] * 1000 / 1500 * 0.8
                or rows["builtins.list"]["inclusive_ms"] < rows["builtins.map"]["inclusive_ms"])

    for attempt in range(4):
        with ocular.record(ocl, mode="calls", c_calls=True):
            program.work()
        rows = stats(ocl)
        if not preempted(rows):
            break
    work, srt, neg = rows["work"], rows["builtins.sorted"], rows["neg"]
    assert srt["inclusive_ms"] >= srt["exclusive_ms"] + neg["inclusive_ms"] * 1000 / 1500 * 0.8, (srt, neg)
    # sorted of 300,000 items dominates work's own time, and is no longer in it
    assert srt["exclusive_ms"] > work["exclusive_ms"]
    # work's other callees (~20,000 C calls) hold what is left of their time once the recorder's cost is
    # taken out, which can sum slightly below zero when the cost measured at the start read high on a busy
    # machine (-0.05 ms once, where it is +0.3-0.5 ms): held within the interval the analyzer gives work's time.
    assert work["inclusive_ms"] + work["inclusive_ci95_ms"] >= srt["inclusive_ms"] + work["exclusive_ms"]
    assert rows["builtins.list"]["inclusive_ms"] >= rows["builtins.map"]["inclusive_ms"]
    # AND without c_calls, work's exclusive time holds sorted's
    with ocular.record(ocl, mode="calls"):
        program.work()
    plain = stats(ocl)
    assert not any(r["file"] == "~" for r in plain.values())
    assert plain["work"]["exclusive_ms"] > work["exclusive_ms"] * 2


@pytest.mark.parametrize("mode", ["calls", "adaptive", "precise"])
def test_without_c_calls_the_events_are_as_before(program, ocl, mode):
    # GIVEN recordings with and without the option
    with ocular.record(ocl, mode=mode, deinstrument_threshold=0) as rec:
        program.work()
    plain = read_ocl(ocl)
    assert "CALL" not in rec._events
    kinds = {k for _, _, k, *_ in plain["events"]}
    assert not kinds & {"CALL", "C_RETURN", "C_RAISE"}
    assert plain["cfuncs"] == {}
    # WITH it, every mode records the same Python events plus the C ones
    with ocular.record(ocl, mode=mode, deinstrument_threshold=0, c_calls=True):
        program.work()
    withc = read_ocl(ocl)
    strip = lambda f: [(k, q, o) for evs in f["workload"].values() for k, q, o, _ in evs  # noqa: E731
                       if k not in ("CALL", "C_RETURN", "C_RAISE")]
    assert strip(withc) == strip(plain)
    assert {k for _, _, k, *_ in withc["events"]} >= {"CALL", "C_RETURN", "C_RAISE"}


def test_event_names_and_cli_option():
    assert event_names("calls", c_calls=True)[-3:] == ["CALL", "C_RETURN", "C_RAISE"]
    from ocular import _ocular

    assert _ocular.parse_run(["run", "--c-calls", "x.py"])["options"]["c_calls"] is True
    assert _ocular.parse_run(["run", "x.py"])["options"]["c_calls"] is False


@pytest.mark.parametrize("sampled", [False, True], ids=["default", "sampled"])
def test_adaptive_records_every_c_call_by_default_and_in_the_first_window_sampled(program, ocl, sampled):
    # C calls are function boundaries: the default records every one; sampled, they are recorded in windows,
    # and a short program is all first window (fewer than 50,000 Python calls), so its counts are exact.
    with ocular.record(ocl, c_calls=True, sampled=sampled):
        program.work()
    rows = stats(ocl)
    assert rows["builtins.isinstance"]["calls"] == 10_000
    assert rows["builtins.int"]["calls"] == 100


def test_run_cli_and_start_tracing(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("xs = []\nfor i in range(300):\n    xs.append(len(xs))\n")
    out = tmp_path / "s.ocl"
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-q", "--mode", "calls", "--c-calls", "-o",
                        str(out), str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = stats(str(out))
    assert rows["builtins.len"]["calls"] == 300 and rows["builtins.list.append"]["calls"] == 300
    rec = ocular.start_tracing(mode="calls", output=str(tmp_path / "t.ocl"), c_calls=True)
    assert rec.c_calls
    sum([1, 2])
    ocular.stop_tracing(report=False)
    assert stats(str(tmp_path / "t.ocl"))["builtins.sum"]["calls"] == 1


def test_unbalanced_c_calls_do_not_corrupt_the_stack(tmp_path, ocl):
    # A C function whose Python callback raises through it, a generator consumed by a C function, a C call
    # already running when the recording starts (in another thread), and a recording started inside a
    # C call (the key function of sorted starts it).
    started = threading.Event()
    release = threading.Event()

    def blocked():
        started.set()
        release.wait()  # a C call (lock acquire) open across the start
        abs(-7)

    def raising(x):
        raise KeyError(x)

    def gen():
        for i in range(3):
            yield abs(-i)

    t = threading.Thread(target=blocked)
    t.start()
    started.wait()
    rec = ocular.record(ocl, mode="calls", c_calls=True)

    def key(x):
        if x == 5 and not rec.running:
            rec.start()
        return x

    sorted(range(10), key=key)
    try:
        sorted([3, 1, 2], key=raising)
    except KeyError:
        pass
    list(gen())
    release.set()
    t.join()
    rec.stop()
    rows = stats(ocl)
    # abs: no code of the standard library calls it here (threading calls len)
    assert rows["builtins.abs"]["calls"] == 4
    assert rows["builtins.sorted"]["calls"] == 1
    assert rows["builtins.list"]["calls"] == 1
    assert rows["builtins.list"]["inclusive_ms"] >= rows["test_unbalanced_c_calls_do_not_corrupt_the_stack.<locals>.gen"]["inclusive_ms"]
