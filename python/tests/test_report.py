"""`ocular-analyze report`: the HTML page embeds what `info`, `stats` and `hot` print, and call trees per
thread whose widths add up to the functions' exclusive times, on a program whose shape is known."""

import html
import json
import os
import re
import subprocess
import sys
import threading

import pytest

import ocular

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANALYZE = os.environ.get("OCULAR_ANALYZE", os.path.join(ROOT, "target", "debug", "ocular-analyze"))


def spin(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def leaf_a():
    return spin(3000)


def leaf_b():
    return spin(1000)


def worker_only():
    for _ in range(200):
        leaf_b()


def main_work():
    for _ in range(200):
        leaf_a()


def analyze(*args):
    assert os.path.exists(ANALYZE), f"{ANALYZE} missing: make test builds it (cargo build -p ocular-analyze)"
    r = subprocess.run([ANALYZE, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def embedded(page):
    m = re.search(r'<script type="application/json" id="ocular-data">(.*?)</script>', page, re.S)
    assert m, "no embedded data"
    return json.loads(m.group(1))


@pytest.fixture(scope="module", params=["calls", "adaptive"])
def recorded(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / f"{request.param}.ocl"
    with ocular.record(str(path), mode=request.param, include_only=[__file__]):
        # One after the other: a thread waiting for the GIL would add its wait to what it ran.
        t = threading.Thread(target=worker_only, name="side-worker")
        t.start()
        t.join()
        main_work()
    out = path.with_suffix(".html")
    r = analyze("report", path, "-o", out)
    assert r.stderr.strip().startswith(f"wrote {out} ("), r.stderr
    return path, out.read_text()


def test_the_page_embeds_info_stats_and_hot_as_their_commands_print_them(recorded):
    path, page = recorded
    data = embedded(page)
    assert data["stats"] == json.loads(analyze("stats", path, "--json", "--top", "500").stdout)
    assert data["hot"] == json.loads(analyze("hot", path, "--json", "--top", "20").stdout)
    assert data["specialize"] == json.loads(analyze("specialize", path, "--json", "--top", "20").stdout)
    info = json.loads(analyze("info", path, "--json").stdout)
    assert data["info"] == info
    assert f"<title>Ocular report: {html.escape(str(path))}</title>" in page


def test_each_thread_has_its_own_tree_and_widths_add_up_to_stats(recorded):
    path, page = recorded
    data = embedded(page)
    frames = data["frames"]
    by_label = {t["label"].split(" (")[0]: t for t in data["trees"]}
    assert set(by_label) == {"MainThread", "side-worker"}, list(by_label)

    def exclusive_ms(tree, name):
        return sum(ns for _, f, ns in tree["nodes"] if frames[f]["name"] == name) / 1e6

    main, side = by_label["MainThread"], by_label["side-worker"]
    # Each thread's tree holds its own leaf only: known by construction.
    assert exclusive_ms(main, "leaf_a") > 0 and exclusive_ms(main, "leaf_b") == 0
    assert exclusive_ms(side, "leaf_b") > 0 and exclusive_ms(side, "leaf_a") == 0
    # The trees' widths are stats' exclusive times (the same pass), per function over both threads.
    rows = {r["function"]: r for r in data["stats"]}
    for name in ("spin", "leaf_a", "leaf_b", "main_work", "worker_only"):
        widths = exclusive_ms(main, name) + exclusive_ms(side, name)
        assert widths == pytest.approx(rows[name]["exclusive_ms"], rel=1e-6, abs=1e-6), name
    # spin is called under both leaves, each in its thread, 3x the iterations under leaf_a (its time is not
    # compared closer than that: a preemption on a busy machine moves a few ms).
    under = {}
    for tree in (main, side):
        for parent, f, ns in tree["nodes"]:
            if frames[f]["name"] == "spin":
                under[frames[tree["nodes"][parent][1]]["name"]] = ns
    assert under["leaf_a"] > under["leaf_b"] > 0


def test_the_source_of_the_hottest_functions_is_embedded(recorded):
    _, page = recorded
    data = embedded(page)
    frames = data["frames"]
    names = {frames[s["frame"]]["name"]: s for s in data["sources"]}
    spin_src = names["spin"]
    first = spin_src["first_line"]
    assert first == spin.__code__.co_firstlineno
    assert spin_src["lines"][0].startswith("def spin(n):")
    assert any("total += i * i" in line for line in spin_src["lines"])


def test_the_page_needs_no_network(recorded):
    _, page = recorded
    # Every script and style is inline: nothing is fetched from anywhere.
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert page.count("<script") == 4  # d3, d3-flame-graph, the data, the page's own


def test_report_refuses_to_overwrite_its_input_and_bad_input(tmp_path):
    trace = tmp_path / "t.ocl"
    trace.write_bytes(b"not a trace at all")
    r = subprocess.run([ANALYZE, "report", str(trace)], capture_output=True, text=True)
    assert r.returncode != 0 and "t.ocl" in r.stderr and not (tmp_path / "t.html").exists()
    r = subprocess.run([ANALYZE, "report", str(trace), "-o", str(trace)], capture_output=True, text=True)
    assert r.returncode != 0 and "t.ocl" in r.stderr
    assert trace.read_bytes() == b"not a trace at all"


def test_python_m_ocular_report(tmp_path, recorded):
    path, _ = recorded
    out = tmp_path / "via-python.html"
    r = subprocess.run([sys.executable, "-m", "ocular", "report", str(path), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert embedded(out.read_text())["stats"] == embedded(path.with_suffix(".html").read_text())["stats"]


def test_the_flame_graph_roots_each_thread_and_draws_an_icicle(recorded, tmp_path):
    path, _ = recorded
    folded = analyze("flamegraph", "--folded", path).stdout.splitlines()
    roots = {line.split(";", 1)[0] for line in folded}
    assert {r.split(" (")[0] for r in roots} == {"thread MainThread", "thread side-worker"}, roots
    side = [line for line in folded if line.startswith("thread side-worker")]
    assert side and all("leaf_a" not in line for line in side)
    svg = tmp_path / "f.svg"
    analyze("flamegraph", path, "-o", svg)
    text = svg.read_text()
    # An icicle: the root ("all") is the top row of frames, the threads right under it.
    ys = [float(y) for y in re.findall(r'<rect x="[0-9.]+%" y="([0-9.]+)"', text)]
    root_y = float(re.search(r'<title>all [^<]*</title><rect x="[0-9.]+%" y="([0-9.]+)"', text)[1])
    thread_y = float(re.search(r'<title>thread side-worker [^<]*</title><rect x="[0-9.]+%" y="([0-9.]+)"', text)[1])
    assert root_y == min(ys) and thread_y > root_y and thread_y <= sorted(set(ys))[1], (root_y, thread_y)
    assert "thread side-worker" in text


def test_the_lines_are_stats_lines_and_annotate_the_source(recorded):
    path, page = recorded
    data = embedded(page)
    if "calls" in path.name:
        assert data["lines"] is None  # calls mode records no lines; the page says so
        return
    assert data["lines"]["rows"] == json.loads(analyze("stats", "--lines", "--json", "--top", "100", path).stdout)
    frames = data["frames"]
    (spin_src,) = [s for s in data["sources"] if frames[s["frame"]]["name"] == "spin"]
    by_line = {f[0]: f for f in spin_src["figures"]}
    first = spin.__code__.co_firstlineno
    # spin's loop (its for and += lines) holds nearly all of its time.
    loop = by_line[first + 2][2] + by_line[first + 3][2]
    assert loop > 0.9 * sum(f[2] for f in spin_src["figures"])
