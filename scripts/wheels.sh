#!/usr/bin/env bash
# Usage: scripts/wheels.sh PYTHON...
# Builds a manylinux_2_17 wheel (x86-64 Linux with glibc 2.17 or newer) of Ocular for each PYTHON into
# dist/, then prints auditwheel's verdict on each. PYTHON is an interpreter on this machine (a path, or a
# name on PATH), or a bare version (3.14, 3.15): Debian unstable's interpreter in scripts/pythons.sh's root.
#
# zig links the extension (`maturin build --zig`, zig from PyPI's ziglang package) against glibc 2.17's
# symbols. A plain build links against the glibc it runs on (2.36 here, newer in the root), and
# `auditwheel repair` cannot lower that: the wheel would not install on an older system. The tools live
# in their own venv, .venv/wheels-tools; the builds share one cargo target dir ($CARGO_TARGET_DIR or
# target/, then wheels/), so that only pyo3 and the extension are built again for each Python.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ $# = 0 ]; then echo "usage: scripts/wheels.sh PYTHON..." >&2; exit 2; fi
# Pinned, so that every machine links with the same zig and judges with the same auditwheel.
TOOLS=("maturin>=1.9,<2" "ziglang==0.17.1" "auditwheel==6.8.2")
dist="$root/dist"
target="$(realpath -m "${CARGO_TARGET_DIR:-$root/target}")/wheels"
mkdir -p "$dist" "$target"

# The tools' venv is made by the first interpreter of this machine given (any Python runs them).
host=python3
for py in "$@"; do
    case "$py" in 3.[0-9]*) ;; *) host="$py"; break ;; esac
done
tools="$root/.venv/wheels-tools"
if [ "$(cat "$tools/tools.txt" 2>/dev/null)" != "${TOOLS[*]}" ]; then
    echo "== installing ${TOOLS[*]} into $tools" >&2
    "$host" -m venv "$tools"
    "$tools/bin/python" -m pip install -q --disable-pip-version-check "${TOOLS[@]}" >&2
    echo "${TOOLS[*]}" >"$tools/tools.txt"
fi
zig=$("$tools/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
# The zig binary itself, at the same path inside the Debian root (the checkout is bound at its own path
# there), with zig's caches and maturin's wrapper scripts in the target dir: the same compiler command on
# both sides, so that what one side built the other reuses.
zig_env=(CARGO_ZIGBUILD_ZIG_PATH="$zig" CARGO_ZIGBUILD_CACHE_DIR="$target/zigbuild"
         ZIG_GLOBAL_CACHE_DIR="$target/zig-cache" ZIG_LOCAL_CACHE_DIR="$target/zig-cache"
         CARGO_TARGET_DIR="$target")
build=("$tools/bin/maturin" build --release --locked --zig --compatibility manylinux_2_17 --out "$dist")

wheels=()
for py in "$@"; do
    start=$SECONDS
    case "$py" in
        3.[0-9]*)
            scripts/pythons.sh root
            ver="$py"
            run=(scripts/pythons.sh run "$ver" env "${zig_env[@]}" "${build[@]}" -i "python$ver")
            where="Debian unstable root" ;;
        *)
            ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
            run=(env "${zig_env[@]}" "${build[@]}" -i "$py")
            where="$py" ;;
    esac
    log="$target/build-$ver.log"
    echo "== building the wheel for Python $ver ($where; log: $log)" >&2
    if ! "${run[@]}" >"$log" 2>&1; then tail -n 40 "$log" >&2; echo "wheels.sh: the build for $py failed" >&2; exit 1; fi
    wheel=$(sed -n 's/.*Built wheel for CPython [0-9.]* to //p' "$log" | tail -n 1)
    if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then tail -n 40 "$log" >&2; echo "wheels.sh: no wheel for $py" >&2; exit 1; fi
    echo "   $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB, built in $((SECONDS - start)) s" >&2
    wheels+=("$wheel")
done

# PyPI's auditwheel judges each wheel on its own (not maturin's built-in check): it must be manylinux.
status=0
for w in "${wheels[@]}"; do
    verdict=$("$tools/bin/auditwheel" show "$w" 2>&1 | tr '\n' ' ' | tr -s ' ')
    tag=$(echo "$verdict" | sed -n 's/.*consistent with the following platform tag: "\([^"]*\)".*/\1/p')
    echo "== auditwheel show $(basename "$w"): ${tag:-no manylinux tag}"
    case "$tag" in manylinux_2_17_x86_64) ;; *) echo "$verdict"; status=1 ;; esac
done
exit $status
