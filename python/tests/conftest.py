"""Shared test helpers: a reference tracer written with plain sys.monitoring, and a reader of .ocl files."""

from __future__ import annotations

import collections
import os
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import workloads  # noqa: E402

WORKLOADS_FILE = workloads.__file__
LOCATION_EVENTS = {"JUMP", "BRANCH", "BRANCH_LEFT", "BRANCH_RIGHT", "INSTRUCTION"}
NO_DISABLE = {"PY_UNWIND", "PY_THROW"}
BOUNDARIES = {"PY_START", "PY_RESUME", "PY_YIELD", "PY_RETURN", "PY_UNWIND", "PY_THROW"}
# Code whose boundaries Ocular tags with the coroutine instance (FORMAT.md 5.5): CO_COROUTINE,
# CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR.
COROUTINE_FLAGS = 0x80 | 0x100 | 0x200
# Ocular's own event kinds (FORMAT.md 5.3), not sys.monitoring events.
WINDOW_MARKERS = {"WINDOW", "WINDOW_END", "STACK", "DUE", "DUE_STACK"}


class Reference:
    """What a plain-Python sys.monitoring tool sees: the same events Ocular asks for, with the same
    de-instrumentation rule (return DISABLE at the N-th hit of a jump/branch/instruction location), and,
    sampled with a threshold, function boundaries recorded only in the recording's first window: until
    100 x N calls were recorded (FORMAT.md 5.3; the tests that use it make the later windows never come)."""

    def __init__(self, event_names, threshold=0, tool=4, sampled=False):
        self.names = event_names
        self.threshold = threshold
        self.sampled = sampled
        self.tool = tool
        self.events = collections.defaultdict(list)  # native thread id -> [(kind, qualname, offset, dest)]
        self.hits = collections.Counter()
        self.calls_seen = 0  # PY_START events
        self.window_open = True

    def _cb(self, name):
        mon = sys.monitoring
        location = name in LOCATION_EVENTS
        has_dest = name in {"JUMP", "BRANCH", "BRANCH_LEFT", "BRANCH_RIGHT"}

        def cb(code, offset, *rest):
            if code.co_filename != WORKLOADS_FILE:
                return None if name in NO_DISABLE else mon.DISABLE
            if self.threshold and self.sampled and not location:
                # Every function boundary until the recording's 100 x N-th call (recorded), none after it.
                if not self.window_open:
                    return None if name in NO_DISABLE else mon.DISABLE
                if name == "PY_START":
                    self.calls_seen += 1
                    self.window_open = self.calls_seen < 100 * self.threshold
            dest = rest[0] if has_dest else 0
            if name in BOUNDARIES and code.co_flags & COROUTINE_FLAGS:
                # The coroutine instance: its frame, the callback's caller. Ids are compared up to renaming
                # (instances() below), so the reference's id need not be Ocular's.
                dest = id(sys._getframe(1))
            if location and self.threshold and name == "JUMP" and dest < offset:
                # Backward jumps: twice the threshold, counted per loop head; past it, off unrecorded.
                key = (code, "head", dest)
                if self.hits[key] >= 2 * self.threshold:
                    return mon.DISABLE
                self.hits[key] += 1
                self.events[threading.get_native_id()].append((name, code.co_qualname, offset, dest))
                return mon.DISABLE if self.hits[key] >= 2 * self.threshold else None
            if location and self.threshold and self.hits[(code, offset)] >= self.threshold:
                # Counted per location, not per kind: from 3.14 a branch's BRANCH_LEFT and BRANCH_RIGHT
                # share its N hits, so the first N say which way it went, in proportion; then both are off.
                return mon.DISABLE
            self.events[threading.get_native_id()].append((name, code.co_qualname, offset, dest))
            if location and self.threshold:
                self.hits[(code, offset)] += 1
                if self.hits[(code, offset)] >= self.threshold:
                    return mon.DISABLE
            return None

        return cb

    def __enter__(self):
        mon = sys.monitoring
        mon.use_tool_id(self.tool, "reference")
        mask = 0
        for n in self.names:
            ev = getattr(mon.events, n)
            mon.register_callback(self.tool, ev, self._cb(n))
            mask |= ev
        mon.set_events(self.tool, mask)
        return self

    def __exit__(self, *exc):
        mon = sys.monitoring
        mon.set_events(self.tool, 0)
        for n in self.names:
            mon.register_callback(self.tool, getattr(mon.events, n), None)
        mon.free_tool_id(self.tool)


def read_ocl(path, salvage=False):
    """The file as Python objects, with events of workload code grouped by thread."""
    from ocular import _ocular

    f = _ocular.read(path, salvage)
    code = f["code"]
    per_thread = collections.defaultdict(list)
    markers = collections.defaultdict(list)
    counted = collections.defaultdict(list)
    for tid, ticks, kind, cid, off, arg in f["events"]:
        if kind in WINDOW_MARKERS:
            markers[tid].append((kind, ticks, cid, off, arg))
            continue
        if kind == "COUNT":  # a call counted outside windows (FORMAT.md 5.8): (function, last counted)
            counted[tid].append((code[cid][0], arg))
            continue
        if kind == "PAUSE":  # the recorder's own (FORMAT.md 5.6): no code object
            continue
        qual, filename, _, _ = code[cid]
        if filename == WORKLOADS_FILE:
            per_thread[tid].append((kind, qual, off, arg))
    f["workload"] = per_thread
    f["markers"] = markers
    f["counted"] = counted
    return f


def instances(per_thread):
    """The events with each coroutine instance id renamed to its instance's ordinal in the thread, a new
    instance at every PY_START (an id can be reused once its coroutine is gone); 0 (not a coroutine) stays 0.
    Two tools that tell instances apart alike give equal results, whatever ids they use."""
    out = {}
    for tid, evs in per_thread.items():
        current, n, renamed = {}, 0, []
        for kind, qual, off, arg in evs:
            if kind in BOUNDARIES and arg:
                if kind == "PY_START" or arg not in current:
                    n += 1
                    current[arg] = n
                arg = current[arg]
            renamed.append((kind, qual, off, arg))
        out[tid] = renamed
    return out


def counts(per_thread):
    c = collections.Counter()
    for evs in per_thread.values():
        for kind, qual, _, _ in evs:
            c[(qual, kind)] += 1
    return c


@pytest.fixture
def ocl(tmp_path):
    return str(tmp_path / "run.ocl")


@pytest.fixture(autouse=True)
def figures_are_possible(request):
    """Every trace a test leaves in its temporary directory must not break the figures' invariants
    (`invariants.py`), whatever the test asserted of it."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    # Asked for before the test runs, so that it is torn down after this fixture.
    root = request.getfixturevalue("tmp_path")
    yield
    import invariants

    bad, context = [], []
    for path in sorted(root.rglob("*.ocl")):
        found = [f"{path.name}: {v}" for v in invariants.violations(str(path))]
        bad += found
        if found:
            # What the trace holds (its threads, losses, pauses, calibration), so that a failure seen only
            # in CI, on a trace that is gone with its machine, can still be read.
            context.append(invariants.describe(str(path)))
    assert not bad, "impossible figures:\n" + "\n".join(bad + context)
