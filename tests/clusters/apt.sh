# shellcheck shell=bash
# One apt/debconf run at a time on this machine, and the one-package installs of the test tools (redis, chromium).
# Sourced by slurm.sh, sge.sh, redis.sh and chromium.sh; the caller defines log() and die().
#
# Why a lock of our own: the suite starts Slurm's and Grid Engine's installs at once, and every pytest worker runs
# the same session fixture, so on a fresh machine up to four `redis.sh start` run together. Without it a worker
# found a package half unpacked by another (the link /usr/bin/redis-server before its target), said "already
# installed", and 37 tests failed at setup with "no redis-server on PATH".

APT_LOCK=/var/lib/hpcrl-test/apt.lock

# apt_lock: hold APT_LOCK (descriptor 9) until apt_unlock or the caller exits.
apt_lock() {
    install -d -m 755 "$(dirname "$APT_LOCK")"
    exec 9>"$APT_LOCK"
    flock -w 900 9 || die "timed out waiting for $APT_LOCK"
}

# apt_unlock: let the next install run (and keep descriptor 9 from the daemons the caller starts next).
apt_unlock() {
    flock -u 9
    exec 9>&-
}

# apt_install_once BINARY PACKAGE: PACKAGE from Debian's mirror unless `BINARY --version` already runs; checked
# again under APT_LOCK, and the installed binary must run. Logs "found" or "installed" with its version.
apt_install_once() {
    local binary=$1 package=$2 version did=found
    if version=$("$binary" --version 2>/dev/null); then
        log "$(head -n1 <<<"$version") already installed"
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || die "needs root to install $package"
    [ -f /etc/debian_version ] || die "needs Debian/Ubuntu (apt-get)"
    apt_lock
    if ! "$binary" --version >/dev/null 2>&1; then
        did=installed
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 "$package" >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 "$package" >/dev/null; }
    fi
    version=$("$binary" --version 2>/dev/null) || die "$package was installed but \`$binary --version\` does not run"
    apt_unlock
    log "$did $(head -n1 <<<"$version")"
}
