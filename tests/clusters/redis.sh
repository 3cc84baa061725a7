#!/usr/bin/env bash
# Make sure `redis-server` is installed for the distributed tests (Debian's package); idempotent.
#
# Why only install: the tests and every learner job start their own private redis-server (free port,
# random password, config on stdin) through hpcrl.distributed.redis_server, so there is no daemon to
# manage here. Debian's package may try to start its own service on port 6379; in a container without
# systemd that does nothing, and the tests never use it.
#
# Usage: bash tests/clusters/redis.sh install|start     (root on Debian/Ubuntu; `start` only installs)
set -euo pipefail

log() { printf '[redis.sh] %s\n' "$*"; }
die() { printf '[redis.sh] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

case "${1:-}" in
  install|start)   # `start`: the name tests/conftest.py uses for every cluster script
    apt_install_once redis-server redis-server
    ;;
  *)
    echo "usage: $0 install|start" >&2
    exit 2
    ;;
esac
