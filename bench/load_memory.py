"""Memory of ocular.load(...).events(): bytes per event in the DataFrame and at the peak (RSS growth),
with every column and with three, on a gapless recording of a loop (5M events by default). Each
selection runs in a fresh process, so one's peak does not hide another's.

    PYTHON bench/load_memory.py [--iterations N]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile

CHILD = r"""
import resource, sys, json
import ocular
t = ocular.load(sys.argv[1])
cols = json.loads(sys.argv[2])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
df = t.events(columns=cols) if cols else t.events()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps([len(df), df.estimated_size(), peak - before]))
"""


def loop(n: int) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def main() -> None:
    import json

    import ocular

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=2_500_000, help="loop iterations (2 events each)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.ocl")
        with ocular.record(path, deinstrument_threshold=0):
            loop(args.iterations)
        print(f"# Python {platform.python_version()}, {platform.machine()}\n")
        print("| columns | events | DataFrame bytes/event | peak RSS growth bytes/event |")
        print("|---|---:|---:|---:|")
        for cols in (None, ["ts_ns", "event", "function"]):
            r = subprocess.run([sys.executable, "-c", CHILD, path, json.dumps(cols)], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"| {cols} | failed: {r.stderr.strip().splitlines()[-1]} | | |")
                continue
            n, size, peak = json.loads(r.stdout)
            print(f"| {'all' if cols is None else ', '.join(cols)} | {n:,} | {size / n:.1f} | {peak / n:.1f} |")


if __name__ == "__main__":
    main()
