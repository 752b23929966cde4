#!/usr/bin/env bash
# Install what the storage profiles need that pip alone cannot: the FUSE
# tools and libfuse (Debian packages), plus the Python binding if missing.
# Usage: bench/profiles/install_deps.sh [PYTHON]
set -euo pipefail
PY=${1:-python3}

if [ "$(id -u)" != 0 ]; then
    echo "bench: the storage profiles need root (loop devices, blkio cgroups, FUSE, drop_caches); run as root, e.g. sudo make bench" >&2
    exit 2
fi

need_apt=()
command -v fusermount >/dev/null 2>&1 || need_apt+=(fuse)
ldconfig -p | grep -q 'libfuse\.so\.2' || need_apt+=(libfuse2)
command -v losetup >/dev/null 2>&1 || need_apt+=(util-linux)
command -v mkfs.ext4 >/dev/null 2>&1 || need_apt+=(e2fsprogs)
if [ ${#need_apt[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "bench: missing ${need_apt[*]} and no apt-get here; install them with your package manager" >&2
        exit 2
    fi
    echo "bench: installing ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! "$PY" -c 'import mfusepy, matplotlib' >/dev/null 2>&1; then
    echo "bench: installing mfusepy and matplotlib"
    "$PY" -m pip install --quiet 'mfusepy>=3.1' 'matplotlib>=3.8'
fi
"$PY" -c 'import mfusepy' || { echo "bench: mfusepy cannot load libfuse" >&2; exit 2; }
