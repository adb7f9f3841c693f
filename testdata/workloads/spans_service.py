"""A service whose slow requests are known: the standard library's threading HTTP server on loopback,
instrumented with OpenTelemetry (opentelemetry-sdk, its in-memory exporter, and Ocular's span processor),
under a bounded load of sequential requests. One request in fifty (i % 50 == 7) takes a slow path through
`slow_lookup`, which spins for 5 ms; the others do `fast_lookup` only. Each request's span also holds an
`ocular.span("render")`.

Usage: spans_service.py OUT.json [REQUESTS]. Writes to OUT.json what it knows: every trace id the exporter
recorded, the slow requests' numbers, and each request's duration measured in the handler with
perf_counter around its span and inside it, in ms: the span's own duration lies between the two.
"""

import http.server
import json
import sys
import threading
import time
import urllib.request

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import ocular
import ocular.otel

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(ocular.otel.SpanProcessor())
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("spans_service")
durations: dict[int, tuple[float, float]] = {}


def slow_lookup():
    t = time.perf_counter()
    while time.perf_counter() - t < 0.005:
        pass


def fast_lookup():
    return [{"id": i, "total": i * 3} for i in range(40)]


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        i = int(self.path.partition("i=")[2] or 0)
        outer = time.perf_counter()
        with tracer.start_as_current_span("GET /orders", attributes={"i": i}):
            inner = time.perf_counter()
            rows = fast_lookup()
            if i % 50 == 7:
                slow_lookup()
            with ocular.span("render", rows=len(rows)):
                body = json.dumps(rows).encode()
            inner = time.perf_counter() - inner
        durations[i] = (inner * 1e3, (time.perf_counter() - outer) * 1e3)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main():
    out, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for i in range(n):
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/orders?i={i}", timeout=60) as r:
            r.read()
    server.shutdown()
    spans = exporter.get_finished_spans()
    with open(out, "w") as f:
        json.dump({
            "trace_ids": sorted({format(s.context.trace_id, "032x") for s in spans}),
            "slow": [i for i in range(n) if i % 50 == 7],
            "durations_ms": {str(k): list(v) for k, v in durations.items()},
        }, f)


if __name__ == "__main__":
    main()
