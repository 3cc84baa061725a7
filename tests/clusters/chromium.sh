#!/usr/bin/env bash
# Make sure Debian's `chromium` is installed for the report test (headless screenshots); idempotent.
#
# Why Debian's package: tests/results/test_report.py looks at report.html the way a reader's browser does
# (`chromium --headless --screenshot`, `--dump-dom`), and the distribution's build is the one a root
# CI machine can install from the package mirror alone; nothing is downloaded from elsewhere.
#
# Usage: bash tests/clusters/chromium.sh install|start     (root on Debian/Ubuntu; `start` only installs)
set -euo pipefail

log() { printf '[chromium.sh] %s\n' "$*"; }
die() { printf '[chromium.sh] ERROR: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
  install|start)   # `start`: the name tests/conftest.py uses for every cluster script
    if command -v chromium >/dev/null 2>&1; then
      log "$(chromium --version 2>/dev/null | head -n1) already installed"
      exit 0
    fi
    [ "$(id -u)" -eq 0 ] || die "needs root to install chromium"
    [ -f /etc/debian_version ] || die "needs Debian/Ubuntu (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends chromium >/dev/null; }
    log "installed $(chromium --version 2>/dev/null | head -n1)"
    ;;
  *)
    echo "usage: $0 install|start" >&2
    exit 2
    ;;
esac
