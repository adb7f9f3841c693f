"""The async view (`stats --async`, `Trace.coroutines()`, `Trace.tasks()`) on a program whose truth is known by
construction.

Ten handlers run concurrently (`asyncio.gather`). Each awaits `waiter()`, which awaits `asyncio.sleep(0.05)`,
then `cruncher()`, which computes for 20 ms without awaiting. All ten sleeps end together; the loop then
resumes the handlers one after another, and each computes 20 ms while the others wait. So:
- `waiter` awaits its sleep 50 ms per instance: 0.5 s awaiting in all;
- handler i was ready from the sleeps' end until the i-1 handlers before it had computed: (i-1) x 20 ms,
  45 x 20 ms = 0.9 s of ready time in all, told from awaiting by asyncio's ready queue;
- `cruncher` runs for the compute time the program measures itself, and never awaits.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import ocular

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "debug", "ocular-analyze"))

PROGRAM = textwrap.dedent("""\
    import asyncio, json, sys, time

    COMPUTE = []

    def tiny(i):
        return i + 1

    def busy(n):
        s = 0
        for i in range(n):
            s += tiny(i)
        return s

    POOL = None

    async def waiter():
        if POOL is None:
            await asyncio.sleep(0.05)
        else:
            # The result comes back from a worker thread through call_soon_threadsafe.
            await asyncio.get_running_loop().run_in_executor(POOL, time.sleep, 0.05)

    async def cruncher():
        t0 = time.perf_counter()
        x = 0
        while time.perf_counter() - t0 < 0.02:
            x = tiny(x)
        COMPUTE.append(time.perf_counter() - t0)
        return x

    async def handler(i):
        await waiter()
        await cruncher()

    async def main():
        await asyncio.gather(*(handler(i) for i in range(10)))

    # Sampled, 300,000 calls close the first window (which records every call) before the
    # handlers run: their coroutines are then recorded between windows, as in a long-running service.
    busy(int(sys.argv[1]))
    if sys.argv[2:] == ["executor"]:
        import concurrent.futures
        POOL = concurrent.futures.ThreadPoolExecutor(10)
        POOL.map(time.sleep, [0] * 10)  # start the workers before the handlers
    asyncio.run(main())
    print(json.dumps({"compute_s": sum(COMPUTE), "each": COMPUTE}))
""")


def record(tmp_path, *options, busy=0, waiter="sleep"):
    script = tmp_path / "handlers.py"
    script.write_text(PROGRAM)
    out = tmp_path / "handlers.ocl"
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "-o", str(out), *options, str(script), str(busy),
                        waiter],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout.strip().splitlines()[-1])


def async_json(path, top=100):
    r = subprocess.run([ANALYZE, "stats", "--async", "--json", "--top", str(top), str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def by_name(report):
    return {f["function"]: f for f in report["functions"]}


def within(got, want, share):
    return abs(got - want) <= share * want


# (mode options, calls before the handlers): calls mode, the default mode, and the sampled one with its first
# window closed.
MODES = [pytest.param(["--mode", "calls"], 0, id="calls"), pytest.param([], 300_000, id="default"),
         pytest.param(["--sampled"], 300_000, id="sampled")]


@pytest.mark.parametrize("options,busy", MODES)
def test_awaiting_ready_and_running_match_the_construction(tmp_path, options, busy):
    # A preempted run moves a few milliseconds from one state to another: retried, not widened.
    failures = []
    for _ in range(3):
        path, truth = record(tmp_path, *options, busy=busy)
        report = async_json(path)
        f = by_name(report)
        assert report["ready_measured"] is True
        waiter, cruncher, handler = f["waiter"], f["cruncher"], f["handler"]
        # Counts are exact: 10 instances each; waiter starts and resumes once; cruncher never suspends.
        assert (waiter["calls"], waiter["steps"], cruncher["calls"], cruncher["steps"]) == (10, 20, 10, 10)
        assert (handler["calls"], handler["tasks"], waiter["tasks"]) == (10, 10, 0)
        assert cruncher["awaiting_ns"] == 0 and cruncher["ready_ns"] == 0
        assert [n for n, _ in waiter["awaited"]] == ["sleep"]
        assert [n for n, _ in f["sleep"]["awaited"]] == ["Future"]
        (chain,) = [c for c in report["chains"] if c["chain"][0] == "handler"]
        assert chain["chain"] == ["handler", "waiter", "sleep", "Future"] and chain["count"] == 10
        handlers = [t for t in report["tasks"] if t["name"].startswith("handler#")]
        assert len(handlers) == 10 and all(t["steps"] == 2 and t["ended_ns"] is not None for t in handlers)
        compute = truth["compute_s"] * 1e9
        checks = {
            "waiter awaiting ~0.5 s": (waiter["awaiting_ns"], 0.5e9, 0.10),
            "cruncher running = its measured compute": (cruncher["running_ns"], compute, 0.10),
            "waiter ready = 45 x one compute": (waiter["ready_ns"], 4.5 * compute, 0.10),
            "the chain's awaiting = waiter's": (chain["awaiting_ns"], waiter["awaiting_ns"], 0.01),
        }
        bad = {k: (round(g / 1e6, 1), round(w / 1e6, 1)) for k, (g, w, s) in checks.items() if not within(g, w, s)}
        if not bad:
            break
        failures.append(bad)
    else:
        pytest.fail(f"every recording missed the construction (got ms, want ms): {failures}")


def test_an_executor_s_result_carried_by_another_thread_is_awaiting_then_ready(tmp_path):
    # The same construction with the 50 ms in a thread pool of 10 workers: each result is appended to the
    # loop's ready queue by a worker thread (call_soon_threadsafe), in another thread's events, and relayed
    # to its Future by a callback on the loop. Read per thread in file order, the loop's delay would be
    # taken for awaiting (1062 ms awaiting, 322 ms ready in a run before the queue was merged by time).
    # The workers need the GIL to hand their results back while the loop thread computes: a result can
    # come up to a few switch intervals (5 ms) after its 50 ms, and that is awaiting (the awaited work was
    # not done): runs read 0.58-0.60 s. So awaiting is bounded, not matched.
    path, truth = record(tmp_path, "--mode", "calls", waiter="executor")
    report = async_json(path)
    waiter = by_name(report)["waiter"]
    assert waiter["calls"] == 10 and [n for n, _ in waiter["awaited"]] == ["Future"]
    assert any("placed in the loop's ready queue by time" in n for n in report["notes"])
    compute = truth["compute_s"] * 1e9
    assert 0.475e9 <= waiter["awaiting_ns"] <= 0.75e9, waiter
    assert 0.6 * 4.5 * compute <= waiter["ready_ns"] <= 1.05 * 4.5 * compute, (waiter, compute)


EAGER = textwrap.dedent("""\
    import asyncio, sys, time

    waited = []

    async def worker(i):
        t = time.perf_counter()
        await asyncio.sleep(0.05)
        waited.append(time.perf_counter() - t)  # its own measure of the wait: awaiting, then ready
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.005:
            pass

    async def main():
        if sys.argv[1] == "factory":
            asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
            await asyncio.gather(*(worker(i) for i in range(10)))
        else:
            loop = asyncio.get_running_loop()
            tasks = [asyncio.Task(worker(i), loop=loop, eager_start=True) for i in range(10)]
            await asyncio.gather(*tasks)

    asyncio.run(main())
    print(sum(waited))
""")


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks came with 3.12")
@pytest.mark.parametrize("how", ["factory", "direct"])
def test_eager_tasks_are_tasks_of_their_own(tmp_path, how):
    # An eager task's first step runs inside create_task, on top of the coroutine that made it (aiohttp starts
    # its handlers so): the ten workers are ten tasks, each waiting at worker > sleep > Future, and main waits
    # at its gather, not at "main > worker > sleep".
    script = tmp_path / "eager.py"
    script.write_text(EAGER)
    out = tmp_path / "eager.ocl"
    r = subprocess.run([sys.executable, "-m", "ocular", "run", "--mode", "calls", "-o", str(out), str(script), how],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = async_json(out)
    f = by_name(report)
    assert (f["worker"]["calls"], f["worker"]["tasks"], f["main"]["tasks"]) == (10, 10, 1)
    chains = {" > ".join(c["chain"]): c for c in report["chains"]}
    assert chains["worker > sleep > Future"]["count"] == 10, list(chains)
    assert "main > Future" in chains and not [c for c in chains if c.startswith("main > worker")], list(chains)
    # The workers' waits as they measured them, against awaiting and ready: on a busy machine the timers
    # fire late and the loop runs late, so the truth is the program's, not the sleeps' 10 x 50 ms.
    waited = chains["worker > sleep > Future"]
    assert within(waited["awaiting_ns"] + waited["ready_ns"], float(r.stdout.split()[-1]) * 1e9, 0.1), (chains, r.stdout)
    assert waited["awaiting_ns"] >= 0.49e9, chains
    workers = [t for t in report["tasks"] if t["name"].startswith("worker#")]
    assert len(workers) == 10 and all(t["steps"] == 2 and t["ended_ns"] is not None for t in workers)


def test_the_sampled_mode_recorded_the_handlers_between_windows(tmp_path):
    # The premise of the sampled case above: without the always-recorded coroutine boundaries, the
    # handlers (after the first window) would be seen only in the windows that happened to cover them.
    path, _ = record(tmp_path, "--sampled", busy=300_000)
    r = subprocess.run([ANALYZE, "dump", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    first_end = next(i for i, l in enumerate(lines) if " WINDOW_END " in l)
    code_ids = {l.split("qualname=")[1].split('"')[1]: l.split("code id=")[1].split()[0]
                for l in lines if "code id=" in l}
    after = [l for l in lines[first_end:] if f" PY_START code={code_ids['handler']} " in l]
    assert len(after) == 10


def test_load_gives_coroutines_and_tasks_tables(tmp_path):
    pl = pytest.importorskip("polars")
    path, _ = record(tmp_path, "--mode", "calls")
    t = ocular.load(str(path))
    co = t.coroutines()
    assert isinstance(co, pl.DataFrame)
    row = co.filter(pl.col("function") == "waiter").row(0, named=True)
    assert (row["calls"], row["steps"]) == (10, 20)
    assert row["awaiting_ns"] > 0.45e9
    tasks = t.tasks()
    handlers = tasks.filter(pl.col("function") == "handler")
    assert sorted(handlers["ordinal"].to_list()) == list(range(1, 11))
    assert handlers["ended_ns"].null_count() == 0
    assert (handlers["ended_ns"] > handlers["started_ns"]).all()


def test_text_report_names_the_chain_and_the_columns(tmp_path):
    path, _ = record(tmp_path, "--mode", "calls")
    r = subprocess.run([ANALYZE, "stats", "--async", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "handler > waiter > sleep > Future" in r.stdout
    for col in ("running ms", "awaiting ms", "ready ms", "Tasks (13 in all)"):
        assert col in r.stdout


def test_the_running_frame_is_read_from_the_thread_state():
    # Where the thread state holds the running frame is found at import on every supported CPython; if it
    # were not, frame ids would come from PyEval_GetFrame, which makes a frame object per coroutine.
    from ocular import _ocular
    assert _ocular.FRAME_FIELD in (56, 72), _ocular.FRAME_FIELD


def test_a_trace_without_coroutines_is_refused_by_name(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("def f():\n    return 1\nf()\n")
    out = tmp_path / "plain.ocl"
    subprocess.run([sys.executable, "-m", "ocular", "run", "-o", str(out), str(script)], check=True,
                   capture_output=True)
    r = subprocess.run([ANALYZE, "stats", "--async", str(out)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "no coroutine ran with its frame recorded (the program ran no async def code" in r.stderr
    old = os.path.join(ROOT, "testdata", "v2.7", "synthetic.ocl")
    r = subprocess.run([ANALYZE, "stats", "--async", old], capture_output=True, text=True)
    assert "written before format 2.8" in r.stderr


def test_perfetto_json_has_a_track_per_task_with_its_awaits(tmp_path):
    path, _ = record(tmp_path, "--mode", "calls")
    report = async_json(path)
    out = tmp_path / "h.json"
    r = subprocess.run([ANALYZE, "export", "--perfetto", "-o", str(out), str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    tasks = {tid: n for tid, n in names.items() if n.startswith("task handler#")}
    assert len(tasks) == 10
    awaiting = sum(e["dur"] for e in events
                   if e.get("cat") == "asyncio" and e["tid"] in tasks and e["name"] == "awaiting waiter > sleep > Future")
    (chain,) = [c for c in report["chains"] if c["chain"][0] == "handler"]
    # The slices are the report's spans: their durations (us) add up to the chain's awaiting time.
    assert abs(awaiting * 1e3 - chain["awaiting_ns"]) < 0.001 * chain["awaiting_ns"]
    for tid in tasks:
        mine = sorted((e["ts"], e["name"]) for e in events if e.get("cat") == "asyncio" and e["tid"] == tid)
        assert [n for _, n in mine] == ["ready (waiting for the loop)", "running", "awaiting waiter > sleep > Future",
                                        "ready (waiting for the loop)", "running"][-len(mine):]


def test_perfetto_protobuf_describes_task_tracks_and_balances_their_slices(tmp_path):
    pytest.importorskip("perfetto")
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as P

    path, _ = record(tmp_path, "--mode", "calls")
    out = tmp_path / "h.pftrace"
    r = subprocess.run([ANALYZE, "export", "--perfetto", "-o", str(out), str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    t = P.Trace.FromString(out.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor.name for p in t.packet
              if p.HasField("track_descriptor") and p.track_descriptor.name.startswith("task ")}
    assert sum(n.startswith("task handler#") for n in tracks.values()) == 10
    depth = {u: 0 for u in tracks}
    running = 0
    for p in t.packet:
        te = p.track_event
        if not p.HasField("track_event") or te.track_uuid not in tracks:
            continue
        assert p.timestamp_clock_id == 6  # BOOTTIME, absolute
        if te.type == P.TrackEvent.TYPE_SLICE_BEGIN:
            depth[te.track_uuid] += 1
            running += te.name == "running"
        elif te.type == P.TrackEvent.TYPE_SLICE_END:
            depth[te.track_uuid] -= 1
            assert depth[te.track_uuid] >= 0
    assert all(d == 0 for d in depth.values())
    assert running >= 20  # two turns of each handler


def test_the_html_report_embeds_the_async_view_as_stats_async_prints_it(tmp_path):
    import re
    path, _ = record(tmp_path, "--mode", "calls")
    page = tmp_path / "h.html"
    r = subprocess.run([ANALYZE, "report", str(path), "-o", str(page)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = re.search(r'<script type="application/json" id="ocular-data">(.*?)</script>', page.read_text(), re.S)
    data = json.loads(m.group(1))
    assert data["awaits"] == async_json(path, top=50)
    assert 'data-tab="async"' in page.read_text()
    # A trace without coroutines has no async view, and the page hides the tab.
    plain = tmp_path / "plain.py"
    plain.write_text("def f():\n    return 1\nf()\n")
    out = tmp_path / "plain.ocl"
    subprocess.run([sys.executable, "-m", "ocular", "run", "-o", str(out), str(plain)], check=True, capture_output=True)
    r = subprocess.run([ANALYZE, "report", str(out), "-o", str(tmp_path / "p.html")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = re.search(r'<script type="application/json" id="ocular-data">(.*?)</script>', (tmp_path / "p.html").read_text(), re.S)
    assert json.loads(m.group(1))["awaits"] is None


GENERATOR = textwrap.dedent("""\
    import json, time

    spun = {"produce": 0.0, "consume": 0.0}

    def spin(s):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < s:
            pass
        return time.perf_counter() - t0

    def produce(n):
        for i in range(n):
            spun["produce"] += spin(0.002)
            yield i

    def consume(n):
        for x in produce(n):
            spun["consume"] += spin(0.001)

    consume(50)
    print(json.dumps(spun))
""")


def test_a_generator_s_time_is_its_own_while_it_runs_under_whoever_resumed_it(tmp_path):
    # What docs/costs-and-figures.md says of generators: between a resumption and its yield the time is the generator's (and
    # its callees'), on the stack of the frame that called next(); while suspended it is nobody's. Here
    # produce runs 50 x 2 ms of its own, consume 50 x 1 ms, consume's loop resumes produce: produce has
    # 1 call and ~100 ms, consume ~150 ms inclusive, and produce's spin is under consume;produce. The
    # program measures its spins itself: a preemption of the machine inside one lengthens it (beside two
    # busy processes, consume's 50 ms spun 86), so the figures are compared with what it measured.
    script = tmp_path / "gen.py"
    script.write_text(GENERATOR)
    out = tmp_path / "gen.ocl"
    run = subprocess.run([sys.executable, "-m", "ocular", "run", "-o", str(out), "--mode", "calls", str(script)],
                         check=True, capture_output=True, text=True)
    spun = {k: v * 1e3 for k, v in json.loads(run.stdout).items()}
    # Spins end when their time is up: never shorter, longer by whatever preempted them.
    assert spun["produce"] >= 100 and spun["consume"] >= 50, spun
    # Every row: the script's `import json` is recorded (Ocular imports no json of its own), and its import
    # functions outrank produce's and consume's few microseconds of exclusive time.
    r = subprocess.run([ANALYZE, "stats", "--json", "--top", "100000", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {x["function"]: x for x in json.loads(r.stdout) if x["file"] == str(script)}
    assert (rows["produce"]["calls"], rows["spin"]["calls"]) == (1, 100)
    assert within(rows["produce"]["inclusive_ms"], spun["produce"], 0.10), (rows["produce"], spun)
    assert within(rows["consume"]["inclusive_ms"], spun["produce"] + spun["consume"], 0.10), (rows["consume"], spun)
    r = subprocess.run([ANALYZE, "flamegraph", "--folded", str(out)], capture_output=True, text=True)
    stacks = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    assert within(int(stacks["<module>;consume;produce;spin"]) / 1e6, spun["produce"], 0.10), (stacks, spun)
    assert within(int(stacks["<module>;consume;spin"]) / 1e6, spun["consume"], 0.10), (stacks, spun)
