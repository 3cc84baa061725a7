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
    if version=$(redis-server --version 2>/dev/null); then
      log "$(cut -d' ' -f1-3 <<<"$version") already installed"
      exit 0
    fi
    [ "$(id -u)" -eq 0 ] || die "needs root to install redis-server"
    [ -f /etc/debian_version ] || die "needs Debian/Ubuntu (apt-get)"
    # Each pytest worker runs this at once on a fresh machine, beside slurm.sh's and sge.sh's installs: one
    # apt run at a time (their lock), and the check again under it. Without the lock a worker found the
    # package half unpacked by another (the link /usr/bin/redis-server before its target), said "installed",
    # and its tests failed at setup with "no redis-server on PATH".
    install -d -m 755 /var/lib/hpcrl-test
    exec 9>/var/lib/hpcrl-test/apt.lock
    flock -w 900 9 || die "timed out waiting for /var/lib/hpcrl-test/apt.lock"
    did=found
    if ! redis-server --version >/dev/null 2>&1; then
      did=installed
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q -o DPkg::Lock::Timeout=300 redis-server >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q -o DPkg::Lock::Timeout=300 redis-server >/dev/null; }
    fi
    version=$(redis-server --version) || die "redis-server was installed but does not run"
    log "$did $(cut -d' ' -f1-3 <<<"$version")"
    ;;
  *)
    echo "usage: $0 install|start" >&2
    exit 2
    ;;
esac
