#!/usr/bin/env bash
# Prints one CPython 3.12+ interpreter per minor version, newest patch first: $PYTHON alone if set, else
# python3.12/python3.13/... on PATH and under pyenv. Prints nothing if there is none.
set -uo pipefail
if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; exit 0; fi
cands=()
for v in 3.12 3.13 3.14; do
    command -v "python$v" >/dev/null 2>&1 && cands+=("$(command -v "python$v")")
done
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for d in $(ls -d "$root"/versions/3.1[2-9].* 2>/dev/null | sort -V -r); do
    [ -x "$d/bin/python3" ] && cands+=("$d/bin/python3")
done
seen=""
for c in "${cands[@]}"; do
    v=$("$c" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}") if sys.version_info >= (3, 12) and sys.implementation.name == "cpython" else None' 2>/dev/null) || continue
    [ "$v" = "None" ] && continue
    case " $seen " in *" $v "*) continue ;; esac
    seen="$seen $v"
    echo "$c"
done
