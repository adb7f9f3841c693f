"""The flight recorder: a recording that keeps only its newest events (ring=), dumps them on demand, and
leaves them readable after a kill."""

import collections
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import ocular
from ocular import _ocular
from ocular._recorder import parse_size

HERE = os.path.dirname(os.path.abspath(__file__))
ANALYZE = os.environ.get("OCULAR_ANALYZE")


def _python(args, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, **kw)


def _by_thread(f):
    """(thread -> [(ticks, kind, qualname)]) of a file read with _ocular.read."""
    out = collections.defaultdict(list)
    for tid, ticks, kind, cid, _off, _arg in f["events"]:
        out[tid].append((ticks, kind, f["code"][cid][0] if cid in f["code"] else "?"))
    return out


def _dropped(f):
    return {tid: events for tid, events, _first, _last in f["dropped"]}


def _program_events(kept, dropped, buffer_events):
    """The range of how many of the program's events a thread recorded, from the events a file kept and
    the count it says were overwritten: the recorder's pauses (FORMAT.md 5.6, one at most per buffer) are
    not the program's; those kept are known, those overwritten only bounded."""
    n = sum(1 for _, k, _ in kept if k != "PAUSE") + dropped
    return range(n - (dropped + buffer_events - 1) // buffer_events, n + 1)


def leaf():
    return 1


def test_dumps_while_a_thread_records_hold_exactly_its_events_up_to_them(tmp_path):
    # A worker calls leaf() under a lock; the main thread takes the lock, so the worker is between two
    # calls, and dumps. Up to the dump the worker recorded exactly 1 + 2 n events (its own start, then a
    # start and a return per call), of which the dump holds the newest and says how many it overwrote.
    # The ring holds ~3 buffers of 1,024 events: it wraps many times between dumps.
    gate = threading.Lock()
    done = threading.Event()
    calls = [0]

    def work():
        while not done.is_set():
            with gate:
                leaf()
                calls[0] += 1

    rec = ocular.record(str(tmp_path / "run.ocl"), mode="calls", include_only=__file__, ring="48KB",
                        buffer_events=1024, on_full="wait")
    dumps = []
    with rec:
        worker = threading.Thread(target=work)
        worker.start()
        for k in range(8):
            # Enough calls between dumps that the ring wraps many times over, however fast the machine:
            # 100,000 calls are 200,000 events, about twice what the ring holds.
            start, deadline = calls[0], time.monotonic() + 60
            while calls[0] - start < 100_000 and time.monotonic() < deadline:
                time.sleep(0.01)
            with gate:
                n = calls[0]
                path = rec.dump(str(tmp_path / f"d{k}.ocl"), wait=True)
            dumps.append((path, n))
        done.set()
        worker.join()
    wid = worker.native_id
    for path, n in dumps:
        f = _ocular.read(path, False)
        assert f["trailer"] is not None, path
        mine = _by_thread(f)[wid]
        assert [t for t, _, _ in mine] == sorted(t for t, _, _ in mine), "events in time order"
        assert 1 + 2 * n in _program_events(mine, _dropped(f).get(wid, 0), 1024), (path, n)
        # The newest events, whole: leaf's calls alternate start and return up to the last one.
        kinds = [k for _, k, q in mine if q == "leaf"]
        assert kinds[-1] == "PY_RETURN"
        assert all(a != b for a, b in zip(kinds, kinds[1:]))
    last = _ocular.read(dumps[-1][0], False)
    assert _dropped(last)[wid] > 10 * len(_by_thread(last)[wid]), "the ring wrapped many times"
    assert rec.dropped > 0 and rec.lost == 0
    final = _ocular.read(rec.path, False)
    # And work's return.
    assert 1 + 2 * calls[0] + 1 in _program_events(_by_thread(final)[wid], _dropped(final)[wid], 1024)


def test_a_dump_of_the_default_mode_reads_as_a_trace_with_its_functions(tmp_path):
    import workloads

    with ocular.record(str(tmp_path / "run.ocl"), ring="8MB") as rec:
        workloads.loop(20000)
        path = rec.dump(wait=True)
        workloads.loop(100)
    assert path == str(tmp_path / "run.1.ocl")
    calls = ocular.load(path).calls()
    assert "loop" in set(calls["function"].to_list())
    assert ocular.load(rec.path).calls().height >= calls.height


def test_a_signal_dumps_a_running_program_beside_its_output(tmp_path):
    script = tmp_path / "serve.py"
    stop = tmp_path / "stop"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        def handle():
            return sum(range(20))
        print("ready", flush=True)
        while not os.path.exists({str(stop)!r}):
            handle()
    """))
    out = tmp_path / "svc.ocl"
    env = {**os.environ}
    p = subprocess.Popen([sys.executable, "-m", "ocular", "run", "--mode", "calls", "--ring", "4MB",
                          "--dump-on", "SIGUSR2", "-o", str(out), str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert p.stdout.readline() == "ready\n"
        time.sleep(0.2)
        p.send_signal(signal.SIGUSR2)
        dump = tmp_path / "svc.1.ocl"
        deadline = time.time() + 20
        f = None
        while time.time() < deadline:
            try:
                f = _ocular.read(str(dump), False)
                if f["trailer"] is not None:
                    break
            except Exception:  # noqa: BLE001 - not written yet
                pass
            time.sleep(0.05)
        assert f is not None and f["trailer"] is not None, "the dump was written while the program ran"
        assert p.poll() is None, "and the program goes on"
    finally:
        stop.write_text("")
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert f"ocular: signal {int(signal.SIGUSR2)}: writing the flight recorder's ring into {dump}" in err
    handles = sum(1 for _, _, k, cid, _, _ in f["events"] if k == "PY_START" and cid in f["code"] and f["code"][cid][0] == "handle")
    assert handles > 100
    final = _ocular.read(str(out), False)
    assert final["trailer"] is not None
    assert "flight recorder of 4 MiB" in err


def _killed(tmp_path, name, *opts):
    script = tmp_path / "k.py"
    script.write_text(textwrap.dedent("""
        import os, signal
        def f():
            return 1
        def main():
            for _ in range(300_000):
                f()
        main()
        os.kill(os.getpid(), signal.SIGKILL)
    """))
    out = tmp_path / name
    r = _python(["-m", "ocular", "run", "-q", "--mode", "calls", "-o", str(out), *opts, str(script)], tmp_path)
    assert r.returncode == -signal.SIGKILL, r.stderr
    f = _ocular.read(str(out), False)
    assert f.get("trailer") is None, "completed from the ring file, without a trailer"
    return f


def test_a_killed_flight_recorder_keeps_its_newest_events_up_to_the_kill(tmp_path):
    # The same program killed twice: recorded whole (its ring file completes the trace), and with a ring
    # of 64 KiB that wrapped. The flight recorder's file holds the newest events up to the
    # kill, and says exactly how many came before them.
    whole = _killed(tmp_path, "whole.ocl")
    # Small buffers keep the writer busy: waiting for it rather than dropping keeps the count exact.
    ring = _killed(tmp_path, "ring.ocl", "--ring", "64KB", "--buffer-events", "1024", "--on-full", "wait")
    assert whole["lost"] == ring["lost"] == []
    (tid_w, ev_w), = _by_thread(whole).items()
    (tid_r, ev_r), = _by_thread(ring).items()
    assert sum(1 for _, k, q in ev_w if (k, q) == ("PY_START", "f")) == 300_000
    assert sum(1 for _, k, _ in ev_w if k != "PAUSE") in _program_events(ev_r, _dropped(ring)[tid_r], 1024)
    # The program's events, without the recorder's pauses (FORMAT.md 5.6), which differ between runs.
    ev_w, ev_r = ([e for e in ev if e[1] != "PAUSE"] for ev in (ev_w, ev_r))
    # The ring wrapped: 64 KiB holds 100,000-180,000 events (0.36-0.65 bytes an event, as the timings
    # compress) of the 600,000.
    assert len(ev_r) < len(ev_w) / 2, "the ring wrapped"
    # Up to the kill: the same last events (the 300,000th call of f, main's return).
    assert [(k, q) for _, k, q in ev_r[-100:]] == [(k, q) for _, k, q in ev_w[-100:]]
    assert [(k, q) for _, k, q in ev_r[-3:]] == [("PY_START", "f"), ("PY_RETURN", "f"), ("PY_RETURN", "main")]


def test_the_ring_file_alone_is_the_trace_after_a_kill(tmp_path):
    ring = _killed(tmp_path, "r.ocl", "--ring", "64KB", "--buffer-events", "1024")
    import glob

    from test_reliability import _ring_dir

    (path,) = [p for p in glob.glob(os.path.join(_ring_dir(), "r.ocl.*.ring"))
               if os.path.getmtime(p) >= time.time() - 60]
    alone = _ocular.read(path, False)
    assert _by_thread(alone) == _by_thread(ring)
    assert alone["dropped"] == ring["dropped"]
    os.remove(path)


def test_a_ring_smaller_than_one_chunk_is_refused_by_name():
    with pytest.raises(ValueError, match=r"a ring of 1 KiB is smaller than one chunk of 65536 events \(up to "
                                         r"2\.6 MiB\): give at least that, or fewer buffer_events"):
        ocular.record(os.devnull, ring="1KB").start()
    assert not ocular._recorder._native().is_recording()


def test_run_refuses_a_ring_too_small_and_dump_on_without_a_ring(tmp_path):
    script = tmp_path / "x.py"
    script.write_text("pass\n")
    r = _python(["-m", "ocular", "run", "--ring", "1KB", "-o", str(tmp_path / "x.ocl"), str(script)], tmp_path)
    assert r.returncode == 2 and "a ring of 1 KiB is smaller than one chunk" in r.stderr, r.stderr
    r = _python(["-m", "ocular", "run", "--dump-on", "USR2", "-o", str(tmp_path / "x.ocl"), str(script)], tmp_path)
    assert r.returncode == 2 and "--ring" in r.stderr, r.stderr
    r = _python(["-m", "ocular", "run", "--ring", "lots", "-o", str(tmp_path / "x.ocl"), str(script)], tmp_path)
    assert r.returncode == 2 and "not a size: 'lots'" in r.stderr, r.stderr


def test_an_unwritable_dump_is_an_error_and_the_recording_goes_on(tmp_path):
    with ocular.record(str(tmp_path / "run.ocl"), mode="calls", ring="4MB") as rec:
        leaf()
        with pytest.raises(OSError, match=r"cannot write the dump /nonexistent/d\.ocl: No such file"):
            rec.dump("/nonexistent/d.ocl")
        leaf()
        assert rec.dump(str(tmp_path / "d.ocl"), wait=True) == str(tmp_path / "d.ocl")
    assert _ocular.read(str(tmp_path / "d.ocl"), False)["trailer"] is not None
    assert rec.events > 0 and rec.error is None


def test_only_a_flight_recorder_dumps(tmp_path):
    with ocular.record(str(tmp_path / "run.ocl"), mode="calls") as rec:
        with pytest.raises(RuntimeError, match=r"only a flight recorder dumps: record with a ring budget"):
            rec.dump(str(tmp_path / "d.ocl"))
    with pytest.raises(RuntimeError, match="not running"):
        rec.dump(str(tmp_path / "d.ocl"))
    with pytest.raises(ValueError, match="dump_on needs a flight recorder"):
        ocular.record(str(tmp_path / "x.ocl"), dump_on="SIGUSR2")
    with pytest.raises(ValueError, match="unknown signal 'SIGNOPE'"):
        ocular.record(str(tmp_path / "x.ocl"), ring="4MB", dump_on="SIGNOPE")


@pytest.mark.parametrize("text,n", [("64MB", 64 << 20), ("64M", 64 << 20), ("64MiB", 64 << 20),
                                    ("1.5 GB", 3 << 29), ("512kb", 512 << 10), (4096, 4096), ("100", 100)])
def test_sizes_are_powers_of_1024(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "MB", "-1MB", "0", "12XB", 0])
def test_a_size_that_is_not_one_is_said(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_a_flight_recorder_without_a_ring_file_records_in_memory(tmp_path):
    with ocular.record(str(tmp_path / "run.ocl"), mode="calls", ring="4MB", ring_file=False) as rec:
        for _ in range(1000):
            leaf()
        d = rec.dump(wait=True)
    assert rec.notes == []
    f = _ocular.read(d, False)
    assert sum(1 for e in f["events"] if e[3] in f["code"] and f["code"][e[3]][0] == "leaf") == 2000
