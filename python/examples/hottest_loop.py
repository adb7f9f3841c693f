"""Which loop is hottest, and what did CPython specialize it into? A notebook-style walk-through: record a
workload, load the trace, and answer with polars. Run it as a script or paste the cells into Jupyter.

    python python/examples/hottest_loop.py [trace.ocl]

Needs polars (pip install polars).
"""

# %% The workload: two loops, one much hotter than the other.
import os
import sys
import tempfile

import polars as pl

import ocular


def kernel(n):
    total = 0
    for i in range(n):
        total += i * 3 % 7
    return total


def warmup(n):
    names = []
    for i in range(n):
        names.append(str(i))
    return len(names)


# %% Record it (adaptive mode: function boundaries plus jumps and branches, 500 hits per location).
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "hottest.ocl")
with ocular.record(path) as rec:
    warmup(2_000)
    kernel(300_000)
print(f"recorded {rec.events:,} events into {path}")

# %% Load it. Every table is a polars DataFrame built by the Rust analyzer.
trace = ocular.load(path)
events = trace.events()
print(events.group_by("event").len().sort("len", descending=True))

# %% Loops from the raw events: a backward JUMP ends an iteration. (The recorder stops recording a location
# after 500 hits, so these are recorded iterations.)
loops = (
    events.filter((pl.col("event") == "JUMP") & (pl.col("arg") < pl.col("offset")))
    .group_by("function", "arg")
    .agg(recorded_iterations=pl.len(), line=pl.col("line").min())
    .sort("recorded_iterations", descending=True)
)
print(loops)

# %% The analyzer ranks loops by time (recorder cost subtracted) and disassembles the hottest one.
hot = trace.hot(top=1)["loops"][0]
print(f"hottest loop: {hot['function']} at {os.path.basename(hot['file'])}:{hot['first_line']}-{hot['last_line']}, "
      f"{hot['ns_per_iteration']:.1f} ns per iteration")

# %% What it specialized into: the loop body as a DataFrame, base -> specialized opcode.
body = pl.DataFrame(hot["instructions"]).select("offset", "line", "base", "specialized", "ns")
print(body)
specialized = body.filter(pl.col("specialized").is_not_null())
print("specialized: " + ", ".join(f"{b} -> {s}" for b, s in specialized.select("base", "specialized").iter_rows()))
