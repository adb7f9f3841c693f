#!/usr/bin/env bash
# Usage: scripts/venv.sh PYTHON [demo]
# Makes (or reuses) .venv/X.Y for the interpreter PYTHON, with maturin and pytest from PyPI, builds the
# extension into it (release, with its own cargo target dir so versions do not rebuild each other), and
# prints the venv's directory as its last line. With `demo`, only what `make demo` runs is installed
# (maturin, and polars for the Parquet export): the test dependencies come with the first `make test`.
set -euo pipefail
py="$1"
only_demo="${2:-}"
ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv/$ver"
if [ ! -x "$venv/bin/python" ]; then
    echo "== creating $venv with $py" >&2
    "$py" -m venv "$venv"
fi
# maturin builds the extension; pytest runs the tests; perfetto (with protobuf) decodes exported traces in
# the tests with Perfetto's own Python protos; polars, pandas and pyarrow read the Parquet export and the
# DataFrames of ocular.load() (optional dependencies for users, required by the tests); coverage runs
# across a recording in the tests and bench/after_stop.py (another sys.monitoring tool in the process);
# nbclient, ipykernel and nbformat run a real notebook (the %%ocular magic) in python/tests/test_notebook.py;
# opentelemetry-sdk instruments the service of python/tests/test_spans.py (ocular.otel).
if [ "$only_demo" = demo ]; then
    needs=(polars) packages=("maturin>=1.9,<2" polars)
else
    needs=(pytest polars pandas pyarrow perfetto.protos.perfetto.trace.perfetto_trace_pb2 coverage nbclient ipykernel
           nbformat opentelemetry.sdk)
    packages=("maturin>=1.9,<2" "pytest>=8" perfetto protobuf polars pandas pyarrow coverage nbclient ipykernel nbformat
              opentelemetry-sdk)
fi
if ! [ -x "$venv/bin/maturin" ] || ! "$venv/bin/python" -c "import $(IFS=,; echo "${needs[*]}")" 2>/dev/null; then
    echo "== installing ${packages[*]} into $venv" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}" >&2
fi
# The distribution was named `ocular` before (PyPI's `ocular` is another project): a venv made then still
# has it, and two distributions would both claim the package and its commands.
if "$venv/bin/python" -m pip show -q ocular >/dev/null 2>&1; then
    "$venv/bin/python" -m pip uninstall -y -q --disable-pip-version-check ocular >&2
fi
echo "== building the extension for Python $ver" >&2
(cd "$root" && VIRTUAL_ENV="$venv" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/py$ver" \
    "$venv/bin/maturin" develop --release --quiet >&2)
echo "$venv"
