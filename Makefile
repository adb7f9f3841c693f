# Ocular: `make demo` runs the main job on a bundled workload, `make test` builds everything and runs
# every test. `make help` lists the targets.

CARGO ?= cargo
OUT   ?= out
# Every CPython 3.12+ found (one per minor version), or just $(PYTHON) if given: make test PYTHON=python3.13
PYTHONS := $(shell scripts/find-pythons.sh)
# CPython 3.14 and 3.15 need a newer C library than this machine's: they run inside a Debian unstable root
# that scripts/pythons.sh makes once (from Debian's archive, ~20 s) and caches outside the checkout.
# make test NEW_PYTHONS= leaves them out; make test NEW_PYTHONS=3.14 runs one.
NEW_PYTHONS ?= 3.14 3.15

.DEFAULT_GOAL := help
.PHONY: help demo report-check test test-rust test-python check-python pythons wheels test-wheel stress lint bench bench-format bench-record bench-truth bench-analyze bench-peers bench-breakdown bench-startup bench-after-stop bench-spans bench-flight bench-live bench-counters bench-follow fuzz clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-16s %s\n", $$1, $$2}'

# The analyzer with Parquet export (polars): the CLI that make demo, test and bench use.
ANALYZE_FEATURES := --features parquet

demo: check-python ## record the bundled workload (testdata/workloads/demo.py), then analyze it
	@mkdir -p $(OUT)
	@# What a user installs: the package in a venv, whose `ocular` command records and analyzes (the
	@# standalone analyzer, and its Parquet export's compile of polars, are not needed for it).
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) demo | tail -n 1); set -e; \
	    run() { echo "== ocular $$*"; $$venv/bin/ocular "$$@"; echo; }; \
	    run run -o $(OUT)/demo.ocl testdata/workloads/demo.py; \
	    run info $(OUT)/demo.ocl; \
	    run hot $(OUT)/demo.ocl --top 3; \
	    run stats $(OUT)/demo.ocl --top 10; \
	    run export --perfetto $(OUT)/demo.ocl -o $(OUT)/demo.json; \
	    run export --parquet $(OUT)/demo.ocl -o $(OUT)/demo.parquet; \
	    run flamegraph $(OUT)/demo.ocl -o $(OUT)/demo.svg; \
	    run report $(OUT)/demo.ocl -o $(OUT)/demo.html; \
	    echo "Open $(OUT)/demo.html in a browser (it needs no network), $(OUT)/demo.json in https://ui.perfetto.dev; in Python:"; \
	    echo "  pl.read_parquet('$(OUT)/demo.parquet/events.parquet')   or   ocular.load('$(OUT)/demo.ocl').events()"; \
	    echo "every event: $$venv/bin/ocular dump $(OUT)/demo.ocl | less"

test: test-rust test-python ## build everything and run every test (Rust, then Python on each 3.12+, 3.14 and 3.15 in a Debian root)

test-rust:
	$(CARGO) test --workspace --exclude ocular-python --locked --features ocular-analyze/parquet

check-python:
	@if [ -z "$(PYTHONS)" ]; then echo "no CPython 3.12+ found: install one (pyenv install 3.12) or pass PYTHON=/path/to/python3.12"; exit 1; fi

# The Python tests run the analyzer too (exports decoded with Perfetto's Python protos).
ANALYZE_BIN := $(or $(CARGO_TARGET_DIR),target)/debug/ocular-analyze

test-python: check-python
	$(CARGO) build --locked -p ocular-analyze $(ANALYZE_FEATURES)
	@set -e; for py in $(PYTHONS); do \
	    venv=$$(scripts/venv.sh $$py | tail -n 1); \
	    echo "== pytest on $$($$venv/bin/python -c 'import sys; print(sys.version.split()[0])')"; \
	    OCULAR_ANALYZE=$(abspath $(ANALYZE_BIN)) $$venv/bin/python -m pytest -q python/tests; \
	done
	@set -e; if [ -n "$(NEW_PYTHONS)" ]; then scripts/pythons.sh root; fi; for v in $(NEW_PYTHONS); do \
	    venv=$$(scripts/pythons.sh run $$v scripts/venv.sh python$$v | tail -n 1); \
	    echo "== pytest on $$(scripts/pythons.sh run $$v $$venv/bin/python -c 'import sys; print(sys.version.split()[0])') (Debian unstable root)"; \
	    scripts/pythons.sh run $$v env OCULAR_ANALYZE=$(abspath $(ANALYZE_BIN)) $$venv/bin/python -m pytest -q python/tests; \
	done

stress: check-python ## ways to lose a trace (threads, signals, exit, exec, fork, one path twice), then the crash campaign (300 random SIGKILLs) and the I/O faults
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); $$venv/bin/python bench/stress.py && \
	    $$venv/bin/python bench/crash_campaign.py --runs 300 && $$venv/bin/python bench/io_faults.py

pythons: ## make (once) the Debian unstable root with CPython 3.14 and 3.15 that make test uses
	scripts/pythons.sh root

# Wheels for pip: manylinux_2_17 (x86-64 Linux, glibc 2.17+), linked by zig from PyPI's ziglang (scripts/wheels.sh
# says why); the builds share $(or $(CARGO_TARGET_DIR),target)/wheels. make wheels NEW_PYTHONS= leaves 3.14 and 3.15 out.
wheels: check-python ## manylinux wheels into dist/, one per Python (NEW_PYTHONS built in the Debian root); auditwheel's verdict on each
	scripts/wheels.sh $(PYTHONS) $(NEW_PYTHONS)

test-wheel: check-python ## the first Python's wheel installed in a fresh venv without Rust: record and analyze with the ocular and ocular-analyze commands
	scripts/test-wheel.sh $(firstword $(PYTHONS))

lint: check-python ## rustfmt, clippy with warnings as errors, docs without warnings, the extension's stub against the extension (stubtest)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --exclude ocular-python --all-targets --locked -- -D warnings
	$(CARGO) clippy -p ocular-analyze --all-targets --locked $(ANALYZE_FEATURES) -- -D warnings
	PYO3_PYTHON=$(firstword $(PYTHONS)) $(CARGO) clippy -p ocular-python --locked -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --exclude ocular-python --no-deps --locked
	@# The typed stub (python/ocular/_ocular.pyi) says what the built extension has: names, signatures, classes.
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); set -e; \
	    $$venv/bin/python -m pip install -q --disable-pip-version-check "mypy>=1.18"; \
	    $$venv/bin/python -m mypy.stubtest ocular._ocular --ignore-disjoint-bases

bench: bench-format bench-record bench-truth bench-analyze bench-startup bench-after-stop bench-spans bench-flight bench-live bench-counters bench-follow ## every benchmark (prints tables; see BENCHMARKS.md)

bench-analyze: check-python ## analyzer throughput: info, stats, hot, exports on a large loop-dense trace, then on a default-mode (every call) one
	$(CARGO) build --release --locked -p ocular-analyze $(ANALYZE_FEATURES)
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); set -e; \
	    $$venv/bin/python bench/analyze_bench.py; $$venv/bin/python bench/analyze_bench.py --default

bench-truth: check-python ## is the default mode true? programs that measure themselves; hot's loops next to their untraced time; top functions next to calls mode's; five packages against calls mode and py-spy
	$(CARGO) build --release --locked -p ocular-analyze $(ANALYZE_FEATURES)
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); \
	    $$venv/bin/python -m pip install -q --disable-pip-version-check -r bench/truth-requirements.txt; \
	    $$venv/bin/python bench/known_truth.py; \
	    $$venv/bin/python bench/truth_bench.py; \
	    $$venv/bin/python bench/function_truth.py $(TRUTH_ARGS); \
	    $$venv/bin/python bench/truth_packages.py

bench-record: check-python ## recorder overhead: ns/event per mode vs the native floor, no-op callbacks, cProfile (each Python)
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); $$venv/bin/python bench/record_bench.py
	@set -e; if [ -n "$(NEW_PYTHONS)" ]; then scripts/pythons.sh root; fi; for v in $(NEW_PYTHONS); do \
	    venv=$$(scripts/pythons.sh run $$v scripts/venv.sh python$$v | tail -n 1); \
	    scripts/pythons.sh run $$v $$venv/bin/python bench/record_bench.py; \
	done

bench-startup: check-python ## fixed costs: an empty script under ocular run (and trace0), a followed Python child, pytest --ocular DIR per test; the phases of recording pyperf's start-up (with bench-peers' venv); a recording's own start and stop
	@venv=$$(ls -d $(CURDIR)/.venv/peers-* 2>/dev/null | tail -n 1); \
	    if [ -z "$$venv" ]; then venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); fi; \
	    $$venv/bin/python bench/startup_bench.py && $$venv/bin/python bench/start_stop.py

bench-after-stop: check-python ## a hot loop after a recording stopped vs never recorded; coverage.py callbacks across one
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); $$venv/bin/python bench/after_stop.py

bench-spans: check-python ## what one span costs (ocular.span, the OpenTelemetry processor), a span-per-request server's throughput recorded and not, and what a thread per request costs
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); $$venv/bin/python bench/spans_bench.py

bench-flight: check-python ## flight recorder: what a dump costs the program (the soak: bench/flight.py soak --minutes 10)
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); $$venv/bin/python bench/flight.py pause

report-check: demo ## render the demo's HTML report in headless Chromium (installed from Debian's packages) and check its flame graph
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	python3 scripts/render_report.py $(OUT)/demo.html $(OUT)/demo-report.png

bench-follow: check-python ## following child processes: a process pool untraced, with and without following, and trace0
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); \
	    $$venv/bin/python -m pip install -q --disable-pip-version-check "trace0==0.1.16" || echo "(trace0 not installed: its column is left out)"; \
	    $$venv/bin/python bench/follow.py

bench-counters: check-python ## performance counters: the cost of each sampling rate, side by side
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); $$venv/bin/python bench/counters.py

bench-live: check-python ## live reading: the cursor's speed, and a reader (slow, or top) next to none
	$(CARGO) run --release --locked -p ocular-format --example cursor_bench
	$(CARGO) build --release --locked -p ocular-analyze
	@venv=$$(scripts/venv.sh $(firstword $(PYTHONS)) | tail -n 1); \
	    OCULAR_ANALYZE=$(abspath $(or $(CARGO_TARGET_DIR),target))/release/ocular-analyze $$venv/bin/python bench/live.py

bench-format: ## .ocl size and read/write throughput on 10M synthetic events
	$(CARGO) run --release --locked -p ocular-format --example format_bench

# Not part of `make bench`: ~20 min, and it installs the peers from PyPI into its own .venv/peers-X.Y (the
# newest Python found; trace0 needs 3.13+). Pass options with PEERS_ARGS="--quick" (see bench/peers.py -h).
# make bench-peers PEERS_PYTHON=3.14 runs it on Debian unstable's CPython 3.14 (scripts/pythons.sh).
PEERS_PYTHON ?=
# The peers' virtualenv (.venv/peers-X.Y: the pinned peers and programs, Ocular's extension built into it),
# for bench-peers and bench-breakdown; leaves $$run (the command prefix for Debian's Pythons) and $$venv.
PEERS_SETUP = set -e; \
	    if [ -n "$(PEERS_PYTHON)" ]; then \
	        scripts/pythons.sh root; run="scripts/pythons.sh run $(PEERS_PYTHON)"; py=python$(PEERS_PYTHON); \
	    else \
	        run=""; py=$$(for p in $(PYTHONS); do echo "$$($$p -c 'import sys; print("%d.%d" % sys.version_info[:2])') $$p"; done \
	            | sort -V | tail -n 1 | cut -d' ' -f2); \
	    fi; \
	    ver=$$($$run $$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	    if [ "$$ver" = 3.12 ]; then echo "== no Python 3.13+ found: trace0 is left out"; fi; \
	    venv=$(CURDIR)/.venv/peers-$$ver; \
	    if [ ! -x $$venv/bin/python ]; then echo "== creating $$venv with $$py"; $$run $$py -m venv $$venv; fi; \
	    $$run $$venv/bin/python -m pip install -q --disable-pip-version-check -r bench/peers-requirements.txt; \
	    echo "== building the extension into $$venv"; \
	    $$run env VIRTUAL_ENV=$$venv CARGO_TARGET_DIR=$(abspath $(or $(CARGO_TARGET_DIR),target))/py$$ver \
	        $$venv/bin/maturin develop --release --quiet

bench-peers: check-python ## Ocular next to cProfile, VizTracer, pyinstrument, trace0 on pyperformance programs and real packages' work (sqlglot, Markdown, pycparser)
	$(CARGO) build --release --locked -p ocular-analyze $(ANALYZE_FEATURES)
	@$(PEERS_SETUP); \
	    $$run $$venv/bin/python bench/peers.py --analyze=$(abspath $(or $(CARGO_TARGET_DIR),target))/release/ocular-analyze $(PEERS_ARGS)

# make bench-breakdown BREAKDOWN_ARGS='--repeats 9 bench/programs/markdown_render.py' for another program.
bench-breakdown: check-python ## where each nanosecond goes: Ocular calls mode beside trace0 on sqlglot, per event (dispatch, clock and store, Ocular's own, fixed costs)
	@$(PEERS_SETUP); \
	    $$run $$venv/bin/python bench/peer_breakdown.py $(BREAKDOWN_ARGS)

# The corpus (ocular-format/fuzz/corpus/reader) is kept in the repository, minimized (cargo fuzz cmin
# reader): each run starts from what earlier runs found. A crash stops the run and leaves its input in
# ocular-format/fuzz/artifacts/reader; make fuzz then fails.
fuzz: ## fuzz the .ocl reader for FUZZ_SECONDS (default 60) from the kept corpus; installs cargo-fuzz if missing
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	mkdir -p ocular-format/fuzz/corpus/reader
	for f in testdata/v*/*.ocl; do cp "$$f" "ocular-format/fuzz/corpus/reader/$$(basename $$(dirname $$f))-$$(basename $$f)"; done
	cd ocular-format/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run reader -- -max_total_time=$${FUZZ_SECONDS:-60} \
	    -rss_limit_mb=1024 -max_len=16384

clean: ## remove build outputs and demo files
	$(CARGO) clean
	rm -rf $(OUT) .venv
