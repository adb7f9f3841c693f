#!/usr/bin/env bash
# Usage: scripts/pythons.sh [root|run VERSION CMD...|list]
# Pythons newer than the machine's C library: Debian unstable's python3.14 and python3.15 (with -dev and
# -venv), in a Debian unstable root made by mmdebstrap from Debian's package archive and cached outside
# the checkout ($OCULAR_SID, default ~/.cache/ocular/sid). The project and the Rust toolchain are bound
# into the root at their own paths, so a venv under .venv/ and cargo work the same inside and out.
#   root            make the root if it is missing (needs root and mmdebstrap; installs mmdebstrap by apt)
#   list            print the versions the root has, one per line (nothing if there is no root)
#   run VER CMD...  run CMD inside the root, in the current directory, with python$VER on PATH as python
set -euo pipefail
SID="${OCULAR_SID:-${XDG_CACHE_HOME:-$HOME/.cache}/ocular/sid}"
VERSIONS="3.14 3.15"
PACKAGES="ca-certificates,gcc,libc6-dev"
for v in $VERSIONS; do PACKAGES="$PACKAGES,python$v,python$v-dev,python$v-venv"; done

make_root() {
    if [ -x "$SID/usr/bin/python3.15" ] && [ -x "$SID/usr/bin/python3.14" ]; then return 0; fi
    if [ "$(id -u)" != 0 ]; then echo "pythons.sh: making the Debian unstable root needs root" >&2; return 1; fi
    if ! command -v mmdebstrap >/dev/null; then
        echo "== installing mmdebstrap (apt)" >&2
        apt-get install -y -q mmdebstrap >&2
    fi
    echo "== making a Debian unstable root with Python $VERSIONS in $SID (once; ~20 s)" >&2
    mkdir -p "$(dirname "$SID")"
    rm -rf "$SID.partial"
    # The archive served here is a snapshot whose Release file may be past its Valid-Until date.
    mmdebstrap --quiet --variant=minbase --include="$PACKAGES" \
        --aptopt='Acquire::Check-Valid-Until "false"' unstable "$SID.partial" \
        http://deb.debian.org/debian >&2
    rm -rf "$SID"
    mv "$SID.partial" "$SID"
}

# Bind what a command inside needs: the kernel's file systems, name resolution, the machine's certificate
# authorities (the package registries may sit behind a proxy with its own), the project, the Rust toolchain
# and cargo's registry, and /tmp (tests make files there). Mounts live in a private mount
# namespace (unshare), so they go away with the command, whatever way it ends.
run_in() {
    local ver="$1"; shift
    local py="/usr/bin/python$ver"
    if [ ! -x "$SID$py" ]; then echo "pythons.sh: no python$ver in $SID (run scripts/pythons.sh root)" >&2; return 1; fi
    local root_dir; root_dir="$(cd "$(dirname "$0")/.." && pwd)"
    local binds=("$root_dir" /tmp /proc /dev /sys /etc/ssl/certs)
    for d in "${RUSTUP_HOME:-$HOME/.rustup}" "${CARGO_HOME:-$HOME/.cargo}" "${CARGO_TARGET_DIR:-}"; do
        [ -n "$d" ] && [ -d "$d" ] && binds+=("$d")
    done
    local script="set -e"
    for b in "${binds[@]}"; do
        script="$script; mkdir -p '$SID$b'; mount --rbind '$b' '$SID$b'"
    done
    cp -f /etc/resolv.conf "$SID/etc/resolv.conf" 2>/dev/null || true
    if [ -f /etc/pip.conf ]; then cp -f /etc/pip.conf "$SID/etc/pip.conf"; fi
    mkdir -p "$SID/usr/local/bin"
    ln -sf "$py" "$SID/usr/local/bin/python"
    local cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
    # shellcheck disable=SC2016
    # The machine may point pip at a local wheel directory that the root does not have.
    if [ -n "${PIP_FIND_LINKS:-}" ] && [ ! -e "$PIP_FIND_LINKS" ]; then unset PIP_FIND_LINKS; fi
    script="$script; exec chroot '$SID' /usr/bin/env -C \"\$PWD\" PATH='$cargo_bin:/usr/local/bin:/usr/bin:/bin' \"\$@\""
    unshare --mount --propagation private -- bash -c "$script" run-in "$@"
}

case "${1:-root}" in
    root) make_root ;;
    list) for v in $VERSIONS; do [ -x "$SID/usr/bin/python$v" ] && echo "$v"; done; true ;;
    run) shift; run_in "$@" ;;
    *) echo "usage: scripts/pythons.sh [root|list|run VERSION CMD...]" >&2; exit 2 ;;
esac
