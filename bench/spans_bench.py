"""What spans cost: one span, a service's throughput, and a thread per request.

    make bench-spans        (or: PYTHON bench/spans_bench.py [--repeats N] [--requests N] [--threads N]
                             [--against DIR])

Table 1: the cost of one span, in a fresh process per cell: `with ocular.span("op"):` around an empty body,
less the same loop without the span, per span; while recording (default mode) and while not. The OpenTelemetry
row is what `ocular.otel.SpanProcessor` adds to a span the SDK starts and ends (the SDK's own cost, with a no-op
processor, taken out). The two loops are timed in turn, 25 times each (20,000 spans; 2,000 SDK spans), and the
least of each taken; the median over repeats.

Table 2: a service's throughput: the standard library's threading HTTP server on loopback, each request in
a span (`ocular.span`), served in a process of its own (recorded or not), under a client in another process
that sends requests one after another for a fixed number; requests per second, each kind of server
alternating with the others, median over repeats, and its ratio to the unrecorded server (of the medians,
and paired: the median of each repeat's ratio to the unrecorded server of the same repeat, and their range);
and the server process's CPU time (all its threads, the recorder's writer included, start-up and stop too)
over the requests it served, the median over repeats: what recording costs a server whose cores are busy,
which a throughput ratio on an idle core does not show.

Table 3: what a thread per request costs: 3,000 threads, each started, running a short loop and joined,
one after another, recorded (default mode, --sampled) or not; microseconds per thread, median over repeats.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, TypeVar

T = TypeVar("T")

SPAN_CHILD = r"""
import json, sys, time
import ocular
N = 200_000

def plain(n):
    for _ in range(n):
        pass

def spanned(n):
    # As a service writes it: the module's attribute looked up at each span.
    for _ in range(n):
        with ocular.span("op"):
            pass

def difference(f, base, n, rounds=25):
    # Timings of the two loops taken in turn, the least of each: a busy machine only ever adds time, and
    # taking each loop's best in a block of its own let a slow spell fall on one of them.
    fs, bs = [], []
    for _ in range(rounds):
        t = time.perf_counter(); base(n); bs.append(time.perf_counter() - t)
        t = time.perf_counter(); f(n); fs.append(time.perf_counter() - t)
    return (min(fs) - min(bs)) / n * 1e9

def measure():
    plain(1000); spanned(1000)
    return difference(spanned, plain, N // 10)

kind = sys.argv[1]
if kind == "recorded":
    with ocular.record(sys.argv[2]):
        ns = measure()
elif kind == "otel":
    from opentelemetry.sdk.trace import TracerProvider, SpanProcessor
    import ocular.otel
    def sdk(with_ocular):
        p = TracerProvider()
        p.add_span_processor(ocular.otel.SpanProcessor() if with_ocular else SpanProcessor())
        t = p.get_tracer("bench")
        def run(n):
            for _ in range(n):
                with t.start_as_current_span("op"):
                    pass
        return run
    base, ours = sdk(False), sdk(True)
    with ocular.record(sys.argv[2]):
        base(1000); ours(1000)
        ns = difference(ours, base, 2000)
else:
    ns = measure()
print(json.dumps(ns))
"""

SERVER_CHILD = r"""
import http.server, sys, threading
import ocular

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        with ocular.span("GET /orders"):
            body = b'{"orders": [1, 2, 3]}'
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)

srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
threading.Thread(target=srv.serve_forever, daemon=True).start()
sys.stdin.readline()  # until the client is done
srv.shutdown()
"""

CLIENT_CHILD = r"""
import http.client, json, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(20):
    c = http.client.HTTPConnection("127.0.0.1", port); c.request("GET", "/orders"); c.getresponse().read(); c.close()
t = time.perf_counter()
for _ in range(n):
    c = http.client.HTTPConnection("127.0.0.1", port); c.request("GET", "/orders"); c.getresponse().read(); c.close()
print(json.dumps(n / (time.perf_counter() - t)))
"""


THREADS_CHILD = r"""
import json, sys, threading, time

def work():
    s = 0
    for i in range(50):
        s += i

n = int(sys.argv[1])
t = time.perf_counter()
for _ in range(n):
    th = threading.Thread(target=work)
    th.start()
    th.join()
print(json.dumps((time.perf_counter() - t) / n * 1e6))
"""


def command(kind: str, trace: str) -> list[str]:
    """Python, under `ocular run` (default mode or --sampled) unless `kind` is "untraced"; a kind ending in
    "-against" runs another build's `ocular` ([`env`])."""
    cmd = [sys.executable]
    if kind != "untraced":
        cmd += ["-m", "ocular", "run", "-q", "-o", trace]
        if kind.startswith("sampled"):
            cmd += ["--sampled"]
    return cmd


def env(kind: str) -> dict[str, str] | None:
    """The environment of a run of `kind`: `--against DIR`'s build first on the path for a kind ending in
    "-against"."""
    if not kind.endswith("-against"):
        return None
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (AGAINST, os.environ.get("PYTHONPATH")))))


def thread_cost(kind: str, tmp: str, n: int) -> float:
    path = os.path.join(tmp, "threads.py")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(THREADS_CHILD)
    out = subprocess.run(command(kind, os.path.join(tmp, f"threads-{kind}.ocl")) + [path, str(n)], check=True,
                         capture_output=True, text=True, timeout=600, env=env(kind))
    return float(out.stdout.strip().splitlines()[-1])


def span_cost(kind: str, tmp: str) -> float:
    out = subprocess.run([sys.executable, "-c", SPAN_CHILD, kind, os.path.join(tmp, f"{kind}.ocl")], check=True,
                         capture_output=True, text=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def throughput(kind: str, tmp: str, requests: int) -> tuple[float, float]:
    """Requests per second, and the server process's CPU microseconds per request it served."""
    server = subprocess.Popen(command(kind, os.path.join(tmp, f"server-{kind}.ocl")) + [_script(tmp)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env(kind))
    rps = float("nan")
    try:
        port = int(server.stdout.readline())
        out = subprocess.run([sys.executable, "-c", CLIENT_CHILD, str(port), str(requests)], check=True,
                             capture_output=True, text=True, timeout=600)
        rps = float(out.stdout)
    finally:
        server.stdin.write("\n")
        server.stdin.flush()
        # The server's own resource use, reaped here (Popen.wait would reap it without it).
        _, status, usage = os.wait4(server.pid, 0)
        server.returncode = os.waitstatus_to_exitcode(status)
    # The client's 20 warm-up requests are served too.
    return rps, (usage.ru_utime + usage.ru_stime) / (requests + 20) * 1e6


def _script(tmp: str) -> str:
    path = os.path.join(tmp, "server.py")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(SERVER_CHILD)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=3000)
    ap.add_argument("--against", metavar="DIR", help="another build's python/ directory (its ocular package with "
                    "its extension): its default mode is run too, beside this build's, in tables 2 and 3")
    args = ap.parse_args()
    global AGAINST
    if args.against:
        AGAINST = os.path.abspath(args.against)
        KINDS.append(("default-against", "recorded, default mode, --against"))
    print(f"CPython {platform.python_version()}, {os.cpu_count()} CPUs; {args.repeats} repeats")
    with tempfile.TemporaryDirectory() as tmp:
        costs: dict[str, list[float]] = {"recorded": [], "not recording": [], "otel": []}
        have_otel = subprocess.run([sys.executable, "-c", "import opentelemetry.sdk"], capture_output=True).returncode == 0
        for _ in range(args.repeats):
            costs["recorded"].append(span_cost("recorded", tmp))
            costs["not recording"].append(span_cost("plain", tmp))
            if have_otel:
                costs["otel"].append(span_cost("otel", tmp))
        print("\nTable 1: one span, ns (median of repeats; each the least of 25 timings, taken in turn with the loop without)")
        print(f"{'what':<48} {'ns/span':>8}")
        print(f"{'ocular.span, recording (default mode)':<48} {statistics.median(costs['recorded']):>8.0f}")
        print(f"{'ocular.span, nothing recording':<48} {statistics.median(costs['not recording']):>8.0f}")
        if have_otel:
            print(f"{'ocular.otel.SpanProcessor on an SDK span':<48} {statistics.median(costs['otel']):>8.0f}")

        both, lost = by_kind(args.repeats, lambda k: throughput(k, tmp, args.requests),
                             lambda k: os.path.join(tmp, f"server-{k}.ocl"))
        rps = {k: [r for r, _ in v] for k, v in both.items()}
        cpu = {k: [c for _, c in v] for k, v in both.items()}
        print(f"\nTable 2: a threading HTTP server, a span per request; {args.requests} requests one after another")
        print_by_kind("server", "req/s", rps, lost, extra=("CPU us/req", cpu))
        us, lost = by_kind(args.repeats, lambda k: thread_cost(k, tmp, args.threads),
                           lambda k: os.path.join(tmp, f"threads-{k}.ocl"))
        print(f"\nTable 3: a thread per request: {args.threads:,} short threads started and joined one after another")
        print_by_kind("program", "us/thread", us, lost)


KINDS = [("untraced", "not recorded"), ("default", "recorded, default mode"), ("sampled", "recorded, --sampled")]
# `--against DIR`: the other build's python/ directory.
AGAINST: str | None = None


def by_kind(repeats: int, measure: Callable[[str], T],
            trace: Callable[[str], str]) -> tuple[dict[str, list[T]], dict[str, list[int]]]:
    """`measure` of each kind of run, the kinds alternating (in turn one way, then the other: none always
    follows another), `repeats` times; and the events each recorded run lost (read from its trace,
    `trace(kind)`): a recorder that drops events is cheaper than one that keeps them, so a ratio means nothing
    without it."""
    out: dict[str, list[T]] = {k: [] for k, _ in KINDS}
    lost: dict[str, list[int]] = {k: [] for k, _ in KINDS}
    for r in range(repeats):
        for k, _ in KINDS if r % 2 == 0 else KINDS[::-1]:
            out[k].append(measure(k))
            if k != "untraced":
                lost[k].append(lost_events(trace(k)))
    return out, lost


def lost_events(trace: str) -> int:
    import ocular

    return int(ocular.load(trace).info()["lost_events"])


def print_by_kind(what: str, unit: str, values: dict[str, list[float]], lost: dict[str, list[int]],
                  extra: tuple[str, dict[str, list[float]]] | None = None) -> None:
    """Each kind's median and its ratio to the unrecorded run's median; the ratio paired instead, each repeat's
    run over the unrecorded one of the same repeat, as its median and range over the repeats (the host's speed
    drifts within a run: a pair is taken a few seconds apart); `extra`'s median (a column of its own); and how
    many runs lost events."""
    base = statistics.median(values["untraced"])
    more = f" {extra[0]:>11}" if extra else ""
    print(f"{what:<40} {unit:>9} {'ratio':>7} {'paired':>7} {'range':>12}{more}  {'runs that lost events'}")
    for k, label in KINDS:
        m = statistics.median(values[k])
        pairs = [v / u for v, u in zip(values[k], values["untraced"])]
        spread = f"{min(pairs):.2f}-{max(pairs):.2f}x"
        n = [x for x in lost[k] if x]
        said = "" if k == "untraced" else f"{len(n)} of {len(lost[k])}" + (f" ({sum(n):,} events)" if n else "")
        more = f" {statistics.median(extra[1][k]):>11.0f}" if extra else ""
        print(f"{label:<40} {m:>9.0f} {m / base:>6.2f}x {statistics.median(pairs):>6.2f}x {spread:>12}{more}  {said}")

if __name__ == "__main__":
    t = time.perf_counter()
    main()
    print(f"\n({time.perf_counter() - t:.0f} s)")
