#!/usr/bin/env bash
# A real single-node Son of Grid Engine 8.1.9 (Debian 12 packages) for trying hpcrl against a real scheduler.
#
# Why it exists: hpcrl drives Grid Engine through its command-line tools (qsub, qstat, qacct, ...), and only a
# real sge_qmaster/sge_execd shows how -hold_jid_ad, array tasks, rescheduling and accounting really behave.
# This script installs the packages when they are missing (preseeding debconf), configures the cell with
# qconf and files (never an editor), and starts/stops qmaster and execd on this host, as root, without
# systemd. It is idempotent: `start` on a running cluster does nothing, `stop` on a stopped one does nothing.
#
# Usage: bash tests/clusters/sge.sh start [--hosts N]|stop|status       (root; then `source tests/clusters/env.sh`)
#        bash tests/clusters/sge.sh kill-host|cut-host|heal-host|revive-host NAME
#
# The head (this host, `hostname`) runs sge_qmaster and is the one execution host of queue all.q.
# `--hosts N` adds N execution hosts sge-host1..N, each its own network namespace with its own hostname and
# address on a private bridge (tests/clusters/nodes.sh) running a real sge_execd, in host group @multihosts
# and queue multi.q with the parallel environment `mpi` ($round_robin, control_slaves TRUE: a job spans
# hosts and starts its tasks there with `qrsh -inherit`). multi.q carries the FORCED boolean complex
# `multihost`: only a job that asks `-l multihost=TRUE` runs there, so a job without that request never
# lands on a namespace host. A later `start` keeps the hosts that exist.
#
# Daemons are stopped only by the PIDs in their pid files, never by name (Debian's init script for
# gridengine kills every process of that name, which is why it is not used).
set -euo pipefail
# shellcheck source=nodes.sh
source "$(dirname "${BASH_SOURCE[0]}")/nodes.sh"
# shellcheck source=daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"
# shellcheck source=apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

HOST=$(hostname)
HOST_PREFIX=sge-host                    # execution hosts sge-host1..N at 10.251.0.21..
HOST_OCTET0=20
# Two slots per core, as Slurm's OverSubscribe=FORCE:2 in slurm.sh: a distributed run needs its learner
# and its actors (AlphaZero: trainer and self-play jobs) running at once, 3+ on a 2-CPU machine.
NSLOTS=$((2 * $(nproc --all)))  # --all: the machine's CPUs, not the calling process's affinity (a test that pinned its worker made it 2)
GPUS=2                                  # consumable `gpu` on the exec host, so `qsub -l gpu=1` is accepted

export SGE_ROOT=/var/lib/gridengine
export SGE_CELL=default
COMMON=$SGE_ROOT/$SGE_CELL/common
SPOOL=/var/spool/gridengine
QMASTER_PID=$SPOOL/qmaster/qmaster.pid
# Seconds a stopping sge_qmaster gets before SIGKILL: it logs its "controlled shutdown" 7-15 s after SIGTERM and
# stops in 9-12 s (cmd_stop's nodes_hang_up lets it: it waited on its connections to dead hosts), and 15 s of
# patience killed it once as it began to write its spool.
QMASTER_PATIENCE=60
# execd spools under the name its host resolves to, which is not always $HOST (here 127.0.0.1 -> "localhost"),
# so the head's pid file is found with a glob: $SPOOL/execd/*/execd.pid, less the namespace hosts' own
# ($SPOOL/execd/sge-hostN/execd.pid: each host's execd resolves its own name).
# A host that stops answering is marked unknown (`u`) after MAX_UNHEARD (default 5 min), and its jobs that
# may be rerun (-r y) are rescheduled RESCHEDULE_UNKNOWN later (default never): what sites set to survive a
# dead node (sge_conf(5): max_unheard, reschedule_unknown).
MAX_UNHEARD=00:00:10
RESCHEDULE_UNKNOWN=00:00:10  # not less: at a qmaster start every host is unknown until its execd reports again

log() { printf '[sge.sh] %s\n' "$*"; }
die() { printf '[sge.sh] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------- helpers

# execd_pid: the PID of the head's live sge_execd, from $SPOOL/execd/*/execd.pid less the namespace hosts'.
execd_pid() {
    local f
    for f in "$SPOOL"/execd/*/execd.pid; do
        [[ $(basename "$(dirname "$f")") == "$HOST_PREFIX"* ]] && continue
        pid_of "$f" sge_execd && return 0
    done
    return 1
}

# sge_hosts: this cluster's namespace hosts, in order.
sge_hosts() { nodes_of sge; }

host_execd_pidfile() { echo "$SPOOL/execd/$1/execd.pid"; }

# qmaster_resolves: the running qmaster sees a hosts file that names every namespace host (started with
# node_head_run); /proc/PID/root shows the file through the process's own mount namespace.
qmaster_resolves() {
    local pid name
    pid=$(pid_of "$QMASTER_PID" sge_qmaster) || return 1
    for name in $(sge_hosts); do
        awk -v n="$name" '{for (i = 2; i <= NF; i++) if ($i == n) found = 1} END {exit !found}' "/proc/$pid/root/etc/hosts" || return 1
    done
}

start_qmaster() {
    if [[ -n $(sge_hosts) ]]; then
        node_head_run /usr/sbin/sge_qmaster
    else
        /usr/sbin/sge_qmaster
    fi
}

start_host_execd() {
    running "$(host_execd_pidfile "$1")" sge_execd || node_run "$1" /usr/sbin/sge_execd
}

# qconf resolves the host names it is given on this side ("can't resolve hostname"): with namespace hosts it
# runs with the head's hosts file that names them, as qmaster does.
qconf() {
    if [[ -s $NODES_HEAD_HOSTS && -n $(sge_hosts) ]]; then
        node_head_run qconf "$@"
    else
        command qconf "$@"
    fi
}

# qc ARGS...: qconf, quiet unless it fails.
qc() {
    local out
    out=$(qconf "$@" 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}

# stop_execds FILE...: stop_pidfile for several execds at once (each takes seconds to exit after SIGTERM).
stop_execds() {
    local f pids=()
    for f in "$@"; do stop_pidfile "$f" sge_execd & pids+=($!); done
    for f in "${pids[@]}"; do wait "$f" || true; done
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

# The multi.q@NAME line of `qstat -f` for a namespace host, and whether it is ready like queue_ready.
host_line() { qstat -f -q multi.q 2>/dev/null | awk -v q="multi.q@$1" '$1 == q'; }
host_ready() {
    local line
    line=$(host_line "$1")
    [[ -n $line ]] || return 1
    awk '{ exit !($4 != "-NA-" && NF == 5) }' <<<"$line"
}
host_in_service() { running "$(host_execd_pidfile "$1")" sge_execd && host_ready "$1"; }
hosts_ready() {
    local name
    for name in $(nodes_in_service sge); do host_in_service "$name" || return 1; done
}

# ---------------------------------------------------------------------------------------------- install

install_packages() {
    local missing=0 b
    for b in sge_qmaster sge_execd; do [[ -x /usr/sbin/$b ]] || missing=1; done
    for b in qsub qstat qconf qacct; do command -v "$b" >/dev/null 2>&1 || missing=1; done
    ((missing)) || return 0

    log "installing Grid Engine from Debian's packages"
    local t0=$SECONDS policy_added=0 pkg
    # slurm.sh and sge.sh may be started side by side: one apt/debconf run at a time.
    apt_lock
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
    apt_unlock
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

    load_exechost "$HOST" "$d"

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
    [[ -z $(sge_hosts) ]] || configure_hosts
    # Last: qmaster copies reschedule_unknown into each exec host only when a load changes the global
    # configuration: a host added after the last change never rescheduled its jobs (nor after a load of the
    # same configuration again), so with hosts it is loaded once without the value and once with it.
    # Global configuration: root may run jobs; accounting flushed every second so qacct sees jobs soon;
    # execd reports every 2 s: a task that exits 99 is rescheduled only once its host has reported the
    # previous run cleaned up ("cannot run on host ... until clean up of a previous run has finished"),
    # which took 52-67 s at the default 00:00:40 and takes 5-6 s at 00:00:02. sge_execd reads it at start.
    qconf -sconf global | sed -E \
        -e 's/^(min_uid[[:space:]]+).*/\10/' \
        -e 's/^(min_gid[[:space:]]+).*/\10/' \
        -e 's/^(load_report_time[[:space:]]+).*/\100:00:02/' \
        -e "s/^(max_unheard[[:space:]]+).*/\\1$MAX_UNHEARD/" \
        -e "s/^(reschedule_unknown[[:space:]]+).*/\\1$RESCHEDULE_UNKNOWN/" \
        -e 's/flush_time=[0-9:]+/flush_time=00:00:01/' >"$d/global"
    if [[ -n $(sge_hosts) ]]; then
        mkdir "$d/unset"  # qconf -Mconf names the configuration after the file
        sed -E 's/^(reschedule_unknown[[:space:]]+).*/\100:00:00/' "$d/global" >"$d/unset/global"
        qc -Mconf "$d/unset/global"
    fi
    qc -Mconf "$d/global"
    rm -rf "$d"
}

# qc_load SHOW ADD MODIFY NAME FILE: add the object NAME from FILE, or modify it when `qconf SHOW NAME` knows it.
qc_load() {
    if qconf "$1" "$4" >/dev/null 2>&1; then qc "$3" "$5"; else qc "$2" "$5"; fi
}

# load_exechost NAME DIR: the execution host NAME, with the fake GPUs (the consumable `gpu`), added or modified
# from a file written in DIR.
load_exechost() {
    cat >"$2/$1" <<EOF
hostname              $1
load_scaling          NONE
complex_values        gpu=$GPUS
user_lists            NONE
xuser_lists           NONE
projects              NONE
xprojects             NONE
usage_scaling         NONE
report_variables      NONE
EOF
    qc_load -se -Ae -Me "$1" "$2/$1"
}

# The namespace hosts: exec, submit and admin hosts with fake GPUs, in @multihosts, queue multi.q with the
# spanning parallel environment `mpi`, fenced off by the FORCED complex `multihost`.
configure_hosts() {
    local d name hosts
    d=$(mktemp -d)
    hosts=$(sge_hosts | tr '\n' ' ')

    if ! qconf -sc | awk '$1 == "multihost" && $5 == "FORCED" {found=1} END {exit !found}'; then
        qconf -sc | awk '$1 != "multihost"' >"$d/complex"
        printf 'multihost           mh         BOOL        ==    FORCED      NO         FALSE    0\n' >>"$d/complex"
        qc -Mc "$d/complex"
    fi
    for name in $hosts; do
        qconf -sh 2>/dev/null | grep -qx "$name" || qc -ah "$name"
        qconf -ss 2>/dev/null | grep -qx "$name" || qc -as "$name"
        load_exechost "$name" "$d"
    done
    printf 'group_name @multihosts\nhostlist %s\n' "$hosts" >"$d/multihosts"
    qc_load -shgrp -Ahgrp -Mhgrp @multihosts "$d/multihosts"

    # One slot per host in turn: a 2-slot job spans two idle hosts. control_slaves: the job's tasks on
    # the other hosts are started by their execds (`qrsh -inherit`), counted and killed with the job;
    # job_is_first_task FALSE: the job script itself takes no slot, so each host runs one task per slot.
    cat >"$d/mpi" <<'EOF'
pe_name            mpi
slots              9999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $round_robin
control_slaves     TRUE
job_is_first_task  FALSE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
EOF
    qc_load -sp -Ap -Mp mpi "$d/mpi"

    qconf -sq all.q | sed -E \
        -e 's/^(qname[[:space:]]+).*/\1multi.q/' \
        -e 's/^(hostlist[[:space:]]+).*/\1@multihosts/' \
        -e 's/^(pe_list[[:space:]]+).*/\1smp mpi/' \
        -e 's/^(complex_values[[:space:]]+).*/\1multihost=TRUE/' >"$d/multi.q"
    qc_load -sq -Aq -Mq multi.q "$d/multi.q"
    rm -rf "$d"
}

# unconfigure_hosts: the namespace hosts leave the cell's configuration (stop), so that a later single-host
# start lists no dead hosts.
unconfigure_hosts() {
    local name
    if qconf -sq multi.q >/dev/null 2>&1; then qc -dq multi.q || true; fi
    if qconf -shgrp @multihosts >/dev/null 2>&1; then qc -dhgrp @multihosts || true; fi
    for name in $(qconf -sel 2>/dev/null | grep "^$HOST_PREFIX" || true); do
        qc -de "$name" || true
        qc -ds "$name" || true
        qc -dh "$name" || true
    done
    return 0
}

# ---------------------------------------------------------------------------------------------- commands

cmd_start() {
    [[ $EUID -eq 0 ]] || die "run as root"
    local t0_ns want=0 have i name
    t0_ns=$(date +%s%N)
    case ${1:-} in
    --hosts) [[ ${2:-} =~ ^[0-9]+$ ]] && (($2 <= 20)) || die "--hosts expects a number from 0 to 20"; want=$2 ;;
    "") ;;
    *) die "usage: sge.sh start [--hosts N]" ;;
    esac
    have=$(sge_hosts | wc -l)
    ((want > have)) || want=$have

    if ((want == have)) && running "$QMASTER_PID" sge_qmaster && execd_pid >/dev/null && queue_ready && hosts_ready &&
        { ((have == 0)) || qmaster_resolves; }; then
        if [[ $(qconf -sq all.q | awk '$1 == "slots" { print $2 }') != "$NSLOTS" ]]; then
            configure_cluster  # a cluster started by an older version of this script: its queue, as configured now
            log "already running; all.q reconfigured to $NSLOTS slots"
        else
            log "already running (all.q@$HOST ready, $have execution hosts); nothing to do"
        fi
        return 0
    fi

    install_packages
    prepare_cell
    nodes_make sge "$HOST_PREFIX" "$HOST_OCTET0" "$want"

    # qmaster resolves the hosts' names (forward and reverse) only through a hosts file that lists them:
    # one started before the hosts existed (or without node_head_run) is restarted; jobs survive in its spool.
    if ((want > 0)) && running "$QMASTER_PID" sge_qmaster && ! qmaster_resolves; then
        log "restarting sge_qmaster so that it resolves the execution hosts"
        stop_pidfile "$QMASTER_PID" sge_qmaster "$QMASTER_PATIENCE"
    fi
    if ! running "$QMASTER_PID" sge_qmaster; then
        start_qmaster
    fi
    wait_for 30 "sge_qmaster to answer" qmaster_answers ||
        die "sge_qmaster does not answer; see $SPOOL/qmaster/messages"
    configure_cluster

    if ! execd_pid >/dev/null; then
        /usr/sbin/sge_execd
    fi
    for name in $(nodes_in_service sge); do start_host_execd "$name"; done
    wait_for 60 "all.q@$HOST to show a load value and no state flags" queue_ready ||
        die "queue instance not ready: '$(queue_line)'; see $SPOOL/execd/*/messages"
    for name in $(nodes_in_service sge); do
        wait_for 60 "multi.q@$name to show a load value and no state flags" host_ready "$name" ||
            die "queue instance not ready: '$(host_line "$name")'; see $SPOOL/execd/$name/messages"
    done

    local ms=$((($(date +%s%N) - t0_ns) / 1000000))
    log "ready: $(queue_line | tr -s ' ' | sed 's/ *$//'), $(sge_hosts | wc -l) execution hosts; start took $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s"
}

# The execution hosts' failures, as a cluster has them (tests/clusters/nodes.sh).
known_host() { [[ -n ${1:-} && -f $NODES_DIR/$1 && $(awk '{print $1}' "$NODES_DIR/$1") == sge ]] || die "no execution host '${1:-}' (see sge.sh status)"; }
cmd_kill_host() { known_host "${1:-}"; node_kill "$1"; log "host $1: link cut, every process on it killed"; }
cmd_cut_host() { known_host "${1:-}"; node_cut "$1"; log "host $1: link cut (its processes live on)"; }
cmd_heal_host() { known_host "${1:-}"; node_heal "$1"; log "host $1: link up"; }
# head_reachable NAME: qmaster's port answers from host NAME (a freshly healed link takes a moment; an execd
# started before that backgrounds and retries its registration only much later).
head_reachable() { node_run "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/6444" 2>/dev/null; }

cmd_revive_host() {
    known_host "${1:-}"
    node_heal "$1"
    wait_for 20 "qmaster's port from $1" head_reachable "$1" || true
    start_host_execd "$1"
    # Its execd running too: qmaster shows a killed host's last load report, as if ready, until max_unheard.
    wait_for 120 "multi.q@$1 to return to service" host_in_service "$1" || die "multi.q@$1 is '$(host_line "$1")'"
    log "host $1: $(host_line "$1" | tr -s ' ' | sed 's/ *$//')"
}

cmd_stop() {
    [[ $EUID -eq 0 ]] || die "run as root"
    local name files=()
    for name in $(sge_hosts); do files+=("$(host_execd_pidfile "$name")"); done
    stop_execds "${files[@]}"
    # While the hosts' names still resolve (qconf checks them).
    if running "$QMASTER_PID" sge_qmaster; then unconfigure_hosts; fi
    stop_execds "$SPOOL"/execd/*/execd.pid
    nodes_hang_up sge  # qmaster's shutdown waits for its connections to the hosts to close
    stop_pidfile "$QMASTER_PID" sge_qmaster "$QMASTER_PATIENCE"
    nodes_remove sge
    log "stopped"
}

cmd_status() {
    local pid rc=0 name line
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
        for name in $(sge_hosts); do
            line=$(host_line "$name" | tr -s ' ' | sed 's/ *$//')
            printf 'host         %s %s execd %s link %s: %s\n' "$name" "$(node_ip "$name")" \
                "$(running "$(host_execd_pidfile "$name")" sge_execd && echo running || echo stopped)" \
                "$(node_link_state "$name")" "${line:-not in qstat -f}"
        done
        qconf -sconf global | awk '$1 == "max_aj_tasks" || $1 == "max_aj_instances" {printf "%-16s %s\n", $1, $2}'
    fi
    return "$rc"
}

take_turns /run/lock/hpcrl-sge-cluster.lock HPCRL_SGE_LOCKED "$@"

case ${1:-} in
start) shift; cmd_start "$@" ;;
stop) cmd_stop ;;
status) cmd_status ;;
kill-host) cmd_kill_host "${2:-}" ;;
cut-host) cmd_cut_host "${2:-}" ;;
heal-host) cmd_heal_host "${2:-}" ;;
revive-host) cmd_revive_host "${2:-}" ;;
*) echo "usage: $0 start [--hosts N]|stop|status|kill-host|cut-host|heal-host|revive-host NAME" >&2; exit 2 ;;
esac
