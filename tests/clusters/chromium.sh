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

# shellcheck source=apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

case "${1:-}" in
  install|start)   # `start`: the name tests/conftest.py uses for every cluster script
    apt_install_once chromium chromium
    ;;
  *)
    echo "usage: $0 install|start" >&2
    exit 2
    ;;
esac
