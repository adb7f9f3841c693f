"""The default mode's cost, side by side with another build of Ocular (an earlier commit's, built into its
own virtualenv): each bench/peers.py pyperformance program (one process, pyperf's worker flags) runs
untraced, under NEW's default mode and under OLD's, in a freshly shuffled order per repeat; the table has
the median over repeats of each run's time over the untraced one.

    PY bench/default_cost.py NEW_PYTHON OLD_PYTHON [REPEATS]

Both Pythons need pyperformance and pyperf (bench/peers-requirements.txt) and their Ocular installed.
"""
import os, random, statistics, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import PYPERFORMANCE, pyperformance_dir
NEW = sys.argv[1]; OLD = sys.argv[2]; repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
bm = pyperformance_dir()
OUT = tempfile.mkdtemp(prefix="ocular-cost-")
progs = {n: (os.path.join(bm, f"bm_{n}", "run_benchmark.py"), ["--worker", "-l", str(l), "-n", "1", "-w", "0"]) for n, l in PYPERFORMANCE.items()}
tools = {"untraced": lambda s, a: [NEW, s, *a],
         "new": lambda s, a: [NEW, "-m", "ocular", "run", "-o", os.path.join(OUT, "new.ocl"), s, *a],
         "old": lambda s, a: [OLD, "-m", "ocular", "run", "-o", os.path.join(OUT, "old.ocl"), s, *a]}
t = {(p, k): [] for p in progs for k in tools}
random.seed(1)
for r in range(repeats):
    for p, (s, a) in progs.items():
        order = list(tools); random.shuffle(order)
        for k in order:
            t0 = time.perf_counter()
            subprocess.run(tools[k](s, a), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            t[(p, k)].append(time.perf_counter() - t0)
print(f"| program | untraced s | previous default | this default | this / previous |")
print("|---|---:|---:|---:|---:|")
rn, ro = [], []
for p in progs:
    u = t[(p, "untraced")]
    new = statistics.median(x / y for x, y in zip(t[(p, "new")], u))
    old = statistics.median(x / y for x, y in zip(t[(p, "old")], u))
    rn.append(new); ro.append(old)
    print(f"| {p} | {statistics.median(u):.3f} | {old:.2f}x | {new:.2f}x | {new/old:.3f} |")
print(f"| median | | {statistics.median(ro):.2f}x | {statistics.median(rn):.2f}x | {statistics.median(rn)/statistics.median(ro):.3f} |")
