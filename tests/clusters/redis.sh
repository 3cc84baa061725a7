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

case "${1:-}" in
  install|start)   # `start`: the name tests/conftest.py uses for every cluster script
    if command -v redis-server >/dev/null 2>&1; then
      log "$(redis-server --version | cut -d' ' -f1-3) already installed"
      exit 0
    fi
    [ "$(id -u)" -eq 0 ] || die "needs root to install redis-server"
    [ -f /etc/debian_version ] || die "needs Debian/Ubuntu (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q redis-server >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }
    log "installed $(redis-server --version | cut -d' ' -f1-3)"
    ;;
  *)
    echo "usage: $0 install|start" >&2
    exit 2
    ;;
esac
