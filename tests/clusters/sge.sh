#!/usr/bin/env bash
# A real single-node Son of Grid Engine 8.1.9 (Debian 12 packages) for trying hpcrl against a real scheduler.
#
# Why it exists: hpcrl drives Grid Engine through its command-line tools (qsub, qstat, qacct, ...), and only a
# real sge_qmaster/sge_execd shows how -hold_jid_ad, array tasks, rescheduling and accounting really behave.
# This script installs the packages when they are missing (preseeding debconf), configures the cell with
# qconf and files (never an editor), and starts/stops qmaster and execd on this host, as root, without
# systemd. It is idempotent: `start` on a running cluster does nothing, `stop` on a stopped one does nothing.
#
# Usage: bash tests/clusters/sge.sh start|stop|status       (root; then `source tests/clusters/env.sh`)
#
# Daemons are stopped only by the PIDs in their pid files, never by name (Debian's init script for
# gridengine kills every process of that name, which is why it is not used).
set -euo pipefail

HOST=$(hostname)
# Two slots per core, as Slurm's OverSubscribe=FORCE:2 in slurm.sh: a distributed run needs its learner
# and its actors (AlphaZero: trainer and self-play jobs) running at once, 3+ on a 2-CPU machine.
NSLOTS=$((2 * $(nproc --all)))  # --all: the machine's CPUs, not the calling process's affinity (a test that pinned its worker made it 2)
GPUS=2                                  # consumable `gpu` on the exec host, so `qsub -l gpu=1` is accepted

export SGE_ROOT=/var/lib/gridengine
export SGE_CELL=default
COMMON=$SGE_ROOT/$SGE_CELL/common
SPOOL=/var/spool/gridengine
QMASTER_PID=$SPOOL/qmaster/qmaster.pid
# execd spools under the name its host resolves to, which is not always $HOST (here 127.0.0.1 -> "localhost"),
# so its pid file is found with a glob: $SPOOL/execd/*/execd.pid.

log() { printf '[sge.sh] %s\n' "$*"; }
die() { printf '[sge.sh] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------- helpers

# pid_of FILE COMM: print the PID in FILE if that process is alive and is COMM (guards against reused PIDs).
pid_of() {
    local file=$1 comm=$2 pid
    [[ -s $file ]] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
    echo "$pid"
}

running() { pid_of "$1" "$2" >/dev/null; }

# execd_pid: the PID of a live sge_execd from any $SPOOL/execd/*/execd.pid.
execd_pid() {
    local f
    for f in "$SPOOL"/execd/*/execd.pid; do
        pid_of "$f" sge_execd && return 0
    done
    return 1
}

# qc ARGS...: qconf, quiet unless it fails.
qc() {
    local out
    out=$(qconf "$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.1 s until it succeeds.
wait_for() {
    local limit=$1 what=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { log "timed out after ${limit}s waiting for $what"; return 1; }
        sleep 0.1
    done
}

# stop_pidfile FILE COMM: SIGTERM the PID in FILE, SIGKILL after 15 s; quiet when not running.
stop_pidfile() {
    local file=$1 comm=$2 pid i
    pid=$(pid_of "$file" "$comm") || return 0
    log "stopping $comm (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 150; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$comm (pid $pid) ignored SIGTERM for 15 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

# The all.q@HOST line of `qstat -f`: "all.q@vm  BIP  0/0/2  0.01  lx-amd64  [states]".
queue_line() { qstat -f -q all.q 2>/dev/null | awk -v q="all.q@$HOST" '$1 == q'; }

# Ready: the queue instance has a load value (execd reported) and no state flags (a, u, E, d, ...).
queue_ready() {
    local line
    line=$(queue_line)
    [[ -n $line ]] || return 1
    awk '{ exit !($4 != "-NA-" && NF == 5) }' <<<"$line"
}

qmaster_answers() { qstat >/dev/null 2>&1; }

# ---------------------------------------------------------------------------------------------- install

install_packages() {
    local missing=0 b
    for b in sge_qmaster sge_execd; do [[ -x /usr/sbin/$b ]] || missing=1; done
    for b in qsub qstat qconf qacct; do command -v "$b" >/dev/null 2>&1 || missing=1; done
    ((missing)) || return 0

    log "installing Grid Engine from Debian's packages"
    local t0=$SECONDS policy_added=0 pkg
    # slurm.sh and sge.sh may be started side by side: one apt/debconf run at a time.
    install -d -m 755 /var/lib/hpcrl-test
    exec 9>/var/lib/hpcrl-test/apt.lock
    flock -w 900 9 || die "timed out waiting for /var/lib/hpcrl-test/apt.lock"
    # Answer the packages' questions so that the master package's postinst creates the cell.
    for pkg in gridengine-common gridengine-client gridengine-master gridengine-exec; do
        debconf-set-selections <<EOF
$pkg shared/gridengineconfig boolean true
$pkg shared/gridenginecell string $SGE_CELL
$pkg shared/gridenginemaster string $HOST
EOF
    done
    # Keep the packages' init scripts from starting daemons during the install (this script starts them itself).
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy_added=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 \
        gridengine-master gridengine-exec gridengine-client >/dev/null
    if ((policy_added)); then
        rm -f /usr/sbin/policy-rc.d
        trap - EXIT
    fi
    flock -u 9
    exec 9>&-
    log "install took $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------- cell

# Make sure the cell exists and that qmaster accepts this host's clients.
prepare_cell() {
    install -d -o sgeadmin -g sgeadmin -m 755 "$SGE_ROOT" "$SGE_ROOT/$SGE_CELL" "$COMMON" \
        "$SPOOL" "$SPOOL/qmaster" "$SPOOL/qmaster/job_scripts" "$SPOOL/spooldb" "$SPOOL/execd"
    if [[ ! -s $COMMON/bootstrap ]]; then
        install -m 644 -o sgeadmin -g sgeadmin /usr/share/gridengine/default-bootstrap "$COMMON/bootstrap"
    fi
    if [[ ! -e $SPOOL/spooldb/sge ]]; then
        # The master package's postinst does this only on a first install with gridengineconfig=true.
        log "initialising the cell (init_cluster)"
        runuser -u sgeadmin -- /usr/share/gridengine/scripts/init_cluster \
            "$SGE_ROOT" "$SGE_CELL" "$SPOOL/spooldb" sgeadmin >/dev/null
    fi
    # The pitfall: HOST resolves to 127.0.0.1, whose name may be "localhost"; qmaster then rejects clients
    # ("client IP resolved to host name localhost. This is not identical to clients host name"). An alias
    # fixes it without touching /etc/hosts.
    printf '%s\n' "$HOST" >"$COMMON/act_qmaster"
    printf '%s localhost\n' "$HOST" >"$COMMON/host_aliases"
    chown sgeadmin:sgeadmin "$COMMON/act_qmaster" "$COMMON/host_aliases"
    chmod 644 "$COMMON/act_qmaster" "$COMMON/host_aliases"
}

# ---------------------------------------------------------------------------------------------- qconf

# Each step writes a file and loads it with qconf; re-running them on every start is harmless.
configure_cluster() {
    local d
    d=$(mktemp -d)

    # Global configuration: root may run jobs; accounting flushed every second so qacct sees jobs soon;
    # execd reports every 2 s: a task that exits 99 is rescheduled only once its host has reported the
    # previous run cleaned up ("cannot run on host ... until clean up of a previous run has finished"),
    # which took 52-67 s at the default 00:00:40 and takes 5-6 s at 00:00:02. sge_execd reads it at start.
    qconf -sconf global | sed -E \
        -e 's/^(min_uid[[:space:]]+).*/\10/' \
        -e 's/^(min_gid[[:space:]]+).*/\10/' \
        -e 's/^(load_report_time[[:space:]]+).*/\100:00:02/' \
        -e 's/flush_time=[0-9:]+/flush_time=00:00:01/' >"$d/global"
    qc -Mconf "$d/global"

    # Scheduler: run every second, no artificial load adjustments.
    qconf -ssconf | sed -E \
        -e 's/^(schedule_interval[[:space:]]+).*/\10:0:1/' \
        -e 's/^(flush_submit_sec[[:space:]]+).*/\11/' \
        -e 's/^(flush_finish_sec[[:space:]]+).*/\11/' \
        -e 's/^(job_load_adjustments[[:space:]]+).*/\1NONE/' \
        -e 's/^(load_adjustment_decay_time[[:space:]]+).*/\10:0:0/' >"$d/sconf"
    qc -Msconf "$d/sconf"

    # Consumable complex `gpu` (fake GPUs for tests), counted per JOB: a per-slot (YES) consumable
    # would turn `-pe smp 8 -l gpu=1` into a request for 8 GPUs.
    if ! qconf -sc | awk '$1 == "gpu" && $6 == "JOB" {found=1} END {exit !found}'; then
        qconf -sc | awk '$1 != "gpu"' >"$d/complex"
        printf 'gpu                 gpu        INT         <=    YES         JOB        0        0\n' >>"$d/complex"
        qc -Mc "$d/complex"
    fi

    qconf -ss 2>/dev/null | grep -qx "$HOST" || qc -as "$HOST"

    cat >"$d/exechost" <<EOF
hostname              $HOST
load_scaling          NONE
complex_values        gpu=$GPUS
user_lists            NONE
xuser_lists           NONE
projects              NONE
xprojects             NONE
usage_scaling         NONE
report_variables      NONE
EOF
    if qconf -se "$HOST" >/dev/null 2>&1; then
        qc -Me "$d/exechost"
    else
        qc -Ae "$d/exechost"
    fi

    cat >"$d/allhosts" <<EOF
group_name @allhosts
hostlist $HOST
EOF
    if qconf -shgrp @allhosts >/dev/null 2>&1; then
        qc -Mhgrp "$d/allhosts"
    else
        qc -Ahgrp "$d/allhosts"
    fi

    cat >"$d/smp" <<'EOF'
pe_name            smp
slots              9999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $pe_slots
control_slaves     FALSE
job_is_first_task  TRUE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
EOF
    if qconf -sp smp >/dev/null 2>&1; then
        qc -Mp "$d/smp"
    else
        qc -Ap "$d/smp"
    fi

    # Queue all.q from qconf's template.
    qconf -sq | sed -E \
        -e 's/^(qname[[:space:]]+).*/\1all.q/' \
        -e 's/^(hostlist[[:space:]]+).*/\1@allhosts/' \
        -e "s/^(slots[[:space:]]+).*/\1$NSLOTS/" \
        -e 's/^(pe_list[[:space:]]+).*/\1smp/' \
        -e 's/^(load_thresholds[[:space:]]+).*/\1NONE/' \
        -e 's|^(shell[[:space:]]+).*|\1/bin/bash|' \
        -e 's/^(shell_start_mode[[:space:]]+).*/\1unix_behavior/' >"$d/all.q"
    if qconf -sq all.q >/dev/null 2>&1; then
        qc -Mq "$d/all.q"
    else
        qc -Aq "$d/all.q"
    fi
    rm -rf "$d"
}

# ---------------------------------------------------------------------------------------------- commands

cmd_start() {
    [[ $EUID -eq 0 ]] || die "run as root"
    local t0_ns
    t0_ns=$(date +%s%N)

    if running "$QMASTER_PID" sge_qmaster && execd_pid >/dev/null && queue_ready; then
        if [[ $(qconf -sq all.q | awk '$1 == "slots" { print $2 }') != "$NSLOTS" ]]; then
            configure_cluster  # a cluster started by an older version of this script: its queue, as configured now
            log "already running; all.q reconfigured to $NSLOTS slots"
        else
            log "already running (all.q@$HOST ready); nothing to do"
        fi
        return 0
    fi

    install_packages
    prepare_cell

    if ! running "$QMASTER_PID" sge_qmaster; then
        /usr/sbin/sge_qmaster
    fi
    wait_for 30 "sge_qmaster to answer" qmaster_answers ||
        die "sge_qmaster does not answer; see $SPOOL/qmaster/messages"
    configure_cluster

    if ! execd_pid >/dev/null; then
        /usr/sbin/sge_execd
    fi
    wait_for 60 "all.q@$HOST to show a load value and no state flags" queue_ready ||
        die "queue instance not ready: '$(queue_line)'; see $SPOOL/execd/*/messages"

    local ms=$((($(date +%s%N) - t0_ns) / 1000000))
    log "ready: $(queue_line | tr -s ' ' | sed 's/ *$//'); start took $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s"
}

cmd_stop() {
    [[ $EUID -eq 0 ]] || die "run as root"
    local f
    for f in "$SPOOL"/execd/*/execd.pid; do
        stop_pidfile "$f" sge_execd
    done
    stop_pidfile "$QMASTER_PID" sge_qmaster
    log "stopped"
}

cmd_status() {
    local pid rc=0
    if pid=$(pid_of "$QMASTER_PID" sge_qmaster); then
        printf '%-12s running (pid %s)\n' sge_qmaster "$pid"
    else
        printf '%-12s stopped\n' sge_qmaster; rc=1
    fi
    if pid=$(execd_pid); then
        printf '%-12s running (pid %s)\n' sge_execd "$pid"
    else
        printf '%-12s stopped\n' sge_execd; rc=1
    fi
    if running "$QMASTER_PID" sge_qmaster; then
        printf 'queue        %s\n' "$(queue_line | tr -s ' ')"
        qconf -sconf global | awk '$1 == "max_aj_tasks" || $1 == "max_aj_instances" {printf "%-16s %s\n", $1, $2}'
    fi
    return "$rc"
}

case ${1:-} in
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
