#!/usr/bin/env bash
# Install Debian's headless-capable Chromium, which tests/preview/test_browser.py
# opens `shardkit show` pages in, when it is missing. Needs root (apt-get).
# `make test` runs it as root, best effort; without Chromium that test skips.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install_chromium.sh: Chromium is missing and installing it needs root (apt-get install chromium)" >&2
    exit 2
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium.sh: no apt-get here; install Chromium with your package manager" >&2
    exit 2
fi
echo "install_chromium.sh: installing chromium"
export DEBIAN_FRONTEND=noninteractive
# The package lists may be old or absent on a fresh machine: refresh them only if the first try fails.
apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
command -v chromium >/dev/null 2>&1
