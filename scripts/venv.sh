#!/usr/bin/env bash
# Usage: scripts/venv.sh PYTHON
# Makes (or reuses) .venv/X.Y for the interpreter PYTHON, with maturin and pytest from PyPI, builds the
# extension into it (release, with its own cargo target dir so versions do not rebuild each other), and
# prints the venv's directory as its last line.
set -euo pipefail
py="$1"
ver=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv/$ver"
if [ ! -x "$venv/bin/python" ]; then
    echo "== creating $venv with $py" >&2
    "$py" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import maturin, pytest' 2>/dev/null && ! { [ -x "$venv/bin/maturin" ] && "$venv/bin/python" -c 'import pytest' 2>/dev/null; }; then
    echo "== installing maturin and pytest into $venv" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.9,<2" "pytest>=8" >&2
fi
echo "== building the extension for Python $ver" >&2
(cd "$root" && VIRTUAL_ENV="$venv" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}/py$ver" \
    "$venv/bin/maturin" develop --release --quiet >&2)
echo "$venv"
