#!/usr/bin/env bash
# A real single-node Slurm 22.05 (Debian 12 packages) for trying hpcrl against a real scheduler.
#
# Why it exists: hpcrl drives schedulers through their command-line tools (sbatch, squeue, sacct, ...), and
# only a real slurmctld/slurmd shows how dependencies, arrays, requeue and accounting really behave. This script
# installs the packages when they are missing and starts/stops munge, MariaDB + slurmdbd (so `sacct` works),
# slurmctld and slurmd on this one host, as root, without systemd. It is idempotent: `start` on a running
# cluster does nothing, `stop` on a stopped one does nothing.
#
# Usage: bash tests/clusters/slurm.sh start [--nodes N]|stop|status      (root; see tests/clusters/README.md)
#        bash tests/clusters/slurm.sh kill-node|cut-node|heal-node|revive-node NAME
#
# The head (this host, `hostname -s`) runs slurmctld and is the one node of the default partition `debug`.
# `--nodes N` adds N compute nodes slurm-node1..N, each its own network namespace with its own hostname and
# address on a private bridge (tests/clusters/nodes.sh), in partition `multi`: the cluster the multi-node
# tests run on. A later `start` keeps the nodes that exist.
#
# Daemons are stopped only by the PIDs in their pid files, never by name.
set -euo pipefail
# shellcheck source=nodes.sh
source "$(dirname "${BASH_SOURCE[0]}")/nodes.sh"
# shellcheck source=daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"
# shellcheck source=apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

HOST=$(hostname -s)
NODE_PREFIX=slurm-node                 # compute nodes slurm-node1..N at 10.251.0.11..
NODE_OCTET0=10
CLUSTER=hpcrl                          # ClusterName (slurmdbd wants lower case)
MAX_ARRAY_SIZE=1001                    # array indices 0..1000; Slurm's own default is also 1001
STATE_DIR=/var/lib/hpcrl-test          # fake GPU device files, DB password
MARK_DIR=/run/hpcrl-test               # markers: "this script started that daemon"
FAKE_GPUS=("$STATE_DIR/nvidia0" "$STATE_DIR/nvidia1")

SLURM_CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
CONF_MARK="# written by hpcrl tests/clusters/slurm.sh"

MUNGE_PID=/run/munge/munged.pid
MYSQL_PID=/run/mysqld/mysqld.pid
MYSQL_SOCK=/run/mysqld/mysqld.sock
DBD_PID=/run/slurmdbd.pid
CTLD_PID=/run/slurmctld.pid
# One slurmd per node, each with its own pid file, spool and log (slurm.conf's %n: the node's name).
slurmd_pid() { echo "/run/slurmd-$1.pid"; }
SLURMD_PID=$(slurmd_pid "$HOST")

log() { printf '[slurm.sh] %s\n' "$*"; }
die() { printf '[slurm.sh] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------- helpers

port_open() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# write_if_changed FILE MODE OWNER: stdin -> FILE, only touching FILE when the content differs.
# An existing FILE that this script did not write is kept as FILE.hpcrl-backup.
write_if_changed() {
    local file=$1 mode=$2 owner=$3 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [[ -f $file ]] && ! grep -qF "$CONF_MARK" "$file" && [[ ! -e $file.hpcrl-backup ]]; then
        cp -p "$file" "$file.hpcrl-backup"
        log "kept the previous $file as $file.hpcrl-backup"
    fi
    if ! cmp -s "$tmp" "$file" 2>/dev/null; then
        install -m "$mode" -o "${owner%:*}" -g "${owner#*:}" "$tmp" "$file"
        CONF_CHANGED=1
    else
        chmod "$mode" "$file"
        chown "$owner" "$file"
    fi
    rm -f "$tmp"
}

# dbd_ok: slurmdbd is running, or slurm.conf does not use it.
dbd_ok() {
    running "$DBD_PID" slurmdbd || ! grep -qx 'AccountingStorageType=accounting_storage/slurmdbd' "$SLURM_CONF" 2>/dev/null
}

node_state() { sinfo -h -n "${1:-$HOST}" -o %T 2>/dev/null | head -n1; }
node_ready() { [[ $(node_state "${1:-$HOST}") =~ ^(idle|mixed|allocated|completing)$ ]]; }

# nodes_ready: every compute node's slurmd runs and the controller counts the node in.
# node_in_service NAME: its slurmd running and the node ready (slurmctld shows a killed node idle until
# SlurmdTimeout).
node_in_service() { slurmd_in_node "$1" && node_ready "$1"; }
nodes_ready() {
    local name
    for name in $(nodes_in_service slurm); do node_in_service "$name" || return 1; done
}

start_node_slurmd() {
    local name=$1
    install -d -o slurm -g slurm -m 755 "/var/lib/slurm/slurmd-$name"
    slurmd_in_node "$name" || node_run "$name" /usr/sbin/slurmd
}

# slurmd_in_node NAME: a slurmd lives in the node's namespace. Asked of the namespace, not of the pid file: a
# killed node's file names a dead pid, which the kernel may since have given to another node's slurmd.
slurmd_in_node() {
    local pid
    for pid in $(node_pids "$1"); do [[ $(cat "/proc/$pid/comm" 2>/dev/null) == slurmd ]] && return 0; done
    return 1
}

stop_slurmds() {
    local name
    for name in $(nodes_of slurm); do stop_pidfile "$(slurmd_pid "$name")" slurmd; done
    stop_pidfile "$SLURMD_PID" slurmd
}

# ---------------------------------------------------------------------------------------------- install

install_packages() {
    local missing=0 b
    for b in munged slurmctld slurmd sbatch slurmdbd mariadbd; do
        command -v "$b" >/dev/null 2>&1 || [[ -x /usr/sbin/$b ]] || missing=1
    done
    ((missing)) || return 0

    log "installing munge, Slurm and MariaDB from Debian's packages"
    local t0=$SECONDS policy_added=0
    # slurm.sh and sge.sh may be started side by side: one apt/debconf run at a time.
    apt_lock
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
        munge slurmctld slurmd slurm-client slurmdbd mariadb-server mariadb-client >/dev/null
    if ((policy_added)); then
        rm -f /usr/sbin/policy-rc.d
        trap - EXIT
    fi
    apt_unlock
    log "install took $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------------------------------------- munge

start_munge() {
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge /etc/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        head -c 1024 /dev/urandom >/etc/munge/munge.key
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    if ! running "$MUNGE_PID" munged; then
        if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
            log "a munged not started by this script is already answering; using it"
            return 0
        fi
        runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID"
        touch "$MARK_DIR/munged"
    fi
    wait_for 10 "munge" bash -c 'munge -n | unmunge'
}

# ---------------------------------------------------------------------------------------------- accounting

db_password() {
    local f=$STATE_DIR/slurmdbd.dbpass
    if [[ ! -s $f ]]; then
        (umask 077 && head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$f")
    fi
    cat "$f"
}

mysql_ping() { mariadb-admin --socket="$MYSQL_SOCK" ping; }

start_mariadb() {
    install -d -o mysql -g mysql -m 755 /run/mysqld
    install -d -o mysql -g adm -m 2750 /var/log/mysql
    if running "$MYSQL_PID" mariadbd || mysql_ping >/dev/null 2>&1; then
        return 0
    fi
    if [[ ! -d /var/lib/mysql/mysql ]]; then
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    # Local socket only: slurmdbd reaches it as "localhost". The InnoDB values are the ones slurmdbd asks for
    # (it logs "Database settings not recommended values" otherwise); the buffer pool is allocated lazily.
    setsid /usr/sbin/mariadbd --user=mysql --skip-networking --pid-file="$MYSQL_PID" --socket="$MYSQL_SOCK" \
        --innodb-buffer-pool-size=1024M --innodb-lock-wait-timeout=900 \
        </dev/null >>/var/log/mysql/hpcrl-mariadbd.log 2>&1 &
    touch "$MARK_DIR/mariadbd"
    wait_for 30 "MariaDB" mysql_ping
}

write_dbd_conf() {
    write_if_changed "$DBD_CONF" 600 slurm:slurm <<EOF
$CONF_MARK
AuthType=auth/munge
DbdHost=$HOST
DbdPort=6819
SlurmUser=slurm
PidFile=$DBD_PID
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageUser=slurm
StoragePass=$(db_password)
StorageLoc=slurm_acct_db
EOF
}

# Runs in a subshell with its own `set -e`; a non-zero exit makes the caller fall back to jobcomp/filetxt.
setup_accounting() {
    start_mariadb
    local pw
    pw=$(db_password)
    mariadb --socket="$MYSQL_SOCK" <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pw';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pw';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
    write_dbd_conf
    if ! running "$DBD_PID" slurmdbd; then
        /usr/sbin/slurmdbd
    fi
    wait_for 30 "slurmdbd on port 6819" port_open 6819
}

register_cluster() {
    if ! sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
}

# ---------------------------------------------------------------------------------------------- slurm.conf

# node_range: the compute nodes in slurm.conf's range form (slurm-node[1-3]), or nothing.
node_range() {
    local n
    n=$(nodes_of slurm | wc -l)
    ((n > 0)) && echo "$NODE_PREFIX[1-$n]"
    return 0
}

write_slurm_conf() {
    local acct_mode=$1 hw mem_kib real_mem acct_lines node_lines="" name range
    # "CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1" from slurmd -C.
    hw=$(slurmd -C | head -n1 | grep -oE '(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=[0-9]+' | tr '\n' ' ')
    [[ -n $hw ]] || die "slurmd -C printed no hardware description"
    mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
    real_mem=$((mem_kib / 1024 - 1024))
    ((real_mem > 256)) || real_mem=256

    if [[ $acct_mode == slurmdbd ]]; then
        acct_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none"
    else
        acct_lines="AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log"
    fi

    range=$(node_range)
    if [[ -n $range ]]; then
        for name in $(nodes_of slurm); do
            node_lines+="NodeName=$name NodeAddr=$(node_ip "$name") CPUs=1 Boards=1 SocketsPerBoard=1 CoresPerSocket=1 ThreadsPerCore=1 RealMemory=4096 Gres=gpu:2 State=UNKNOWN
"
        done
        # One CPU a node and no oversubscription: a 1-CPU job holds a node, so a run's jobs land on different
        # nodes (a learner and its actors, a study's workers), as on a cluster whose jobs fill their nodes.
        node_lines+="PartitionName=multi Nodes=$range Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO"
    fi

    write_if_changed "$SLURM_CONF" 644 root:root <<EOF
$CONF_MARK
# Test cluster: the head $HOST (partition debug) and $(nodes_of slurm | wc -l) namespace nodes (partition multi);
# see tests/clusters/README.md.
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmUser=slurm
AuthType=auth/munge
AuthInfo=cred_expire=10
CryptoType=crypto/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
KillWait=5
MinJobAge=3600
# Finished jobs stay listed for MinJobAge (the conformance suite reads their times); a 1000-run
# benchmark leaves ~3000 records, so allow many more than the default 10000.
MaxJobCount=200000
MaxArraySize=$MAX_ARRAY_SIZE
InactiveLimit=0
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=/run/slurmd-%n.pid
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd-%n
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
# A node that stops answering is DOWN 10-25 s later (default 300 s); its jobs end NODE_FAIL or are requeued.
SlurmdTimeout=10
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
$acct_lines
GresTypes=gpu
NodeName=$HOST NodeAddr=127.0.0.1 ${hw}RealMemory=$real_mem Gres=gpu:2 State=UNKNOWN
# Each core may hold two jobs: a distributed run needs its learner and its actors running at once,
# 3+ CPUs on a 2-CPU machine (what a site would give with more nodes).
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2
$node_lines
EOF

    write_if_changed "$GRES_CONF" 644 root:root <<EOF
$CONF_MARK
# Fake GPUs: character devices (like /dev/null) so that --gres=gpu:N jobs can run; see slurm.sh.
NodeName=$HOST Name=gpu File=$STATE_DIR/nvidia[0-1]
${range:+NodeName=$range Name=gpu File=$STATE_DIR/nvidia[0-1]}
EOF
}

make_fake_gpus() {
    local dev
    for dev in "${FAKE_GPUS[@]}"; do
        [[ -c $dev ]] || mknod -m 666 "$dev" c 1 3
    done
}

# ---------------------------------------------------------------------------------------------- commands

cmd_start() {
    [[ $EUID -eq 0 ]] || die "run as root"
    local t0_ns want=0 have i name
    t0_ns=$(date +%s%N)
    case ${1:-} in
    --nodes) [[ ${2:-} =~ ^[0-9]+$ ]] && (($2 <= 20)) || die "--nodes expects a number from 0 to 20"; want=$2 ;;
    "") ;;
    *) die "usage: slurm.sh start [--nodes N]" ;;
    esac
    have=$(nodes_of slurm | wc -l)
    ((want > have)) || want=$have

    if ((want == have)) && running "$CTLD_PID" slurmctld && running "$SLURMD_PID" slurmd && dbd_ok && node_ready && nodes_ready; then
        log "already running (node $HOST is $(node_state), $have compute nodes); nothing to do"
        return 0
    fi

    install_packages
    install -d -m 755 "$STATE_DIR" "$MARK_DIR"
    install -d -o slurm -g slurm -m 755 /var/lib/slurm /var/lib/slurm/slurmctld "/var/lib/slurm/slurmd-$HOST" /var/log/slurm
    make_fake_gpus
    nodes_make slurm "$NODE_PREFIX" "$NODE_OCTET0" "$want"
    start_munge
    CONF_CHANGED=0

    # Accounting (sacct): MariaDB + slurmdbd. slurm.conf must exist first: sacctmgr reads it.
    # HPCRL_SLURM_ACCOUNTING=filetxt skips slurmdbd on purpose (no MariaDB started).
    local acct_mode=${HPCRL_SLURM_ACCOUNTING:-slurmdbd} rc
    [[ $acct_mode == slurmdbd || $acct_mode == filetxt ]] || die "HPCRL_SLURM_ACCOUNTING must be slurmdbd or filetxt"
    if [[ $acct_mode == slurmdbd ]]; then
        write_slurm_conf slurmdbd
        # A subshell with its own errexit, not in an `if`/`&&` (where bash would ignore errexit inside).
        set +e
        (set -e; setup_accounting; register_cluster)
        rc=$?
        set -e
        if ((rc != 0)); then
            log "WARNING: slurmdbd accounting could not be set up (see /var/log/slurm/slurmdbd.log); falling back to jobcomp/filetxt, so sacct will not work"
            stop_pidfile "$DBD_PID" slurmdbd
            acct_mode=filetxt
        fi
    fi
    [[ $acct_mode == slurmdbd ]] || write_slurm_conf filetxt
    if ((CONF_CHANGED)) && running "$CTLD_PID" slurmctld; then
        # Nodes added: Slurm 22.05 takes new nodes only at a restart of every daemon (jobs' state is kept).
        log "slurm.conf changed; restarting slurmctld and the slurmds"
        stop_slurmds
        stop_pidfile "$CTLD_PID" slurmctld
    fi

    if ! running "$CTLD_PID" slurmctld; then
        /usr/sbin/slurmctld
    fi
    wait_for 30 "slurmctld" scontrol ping
    if ! running "$SLURMD_PID" slurmd; then
        /usr/sbin/slurmd
    fi
    for name in $(nodes_in_service slurm); do start_node_slurmd "$name"; done
    for name in "$HOST" $(nodes_in_service slurm); do
        if ! wait_for 20 "node $name to become idle" node_ready "$name"; then
            # A node left DOWN/DRAIN by an earlier run: ReturnToService=2 normally clears this, resume as fallback.
            scontrol update nodename="$name" state=resume 2>/dev/null || true
            wait_for 20 "node $name to become idle" node_ready "$name" ||
                die "node $name is '$(node_state "$name")'; see /var/log/slurm/slurmd-$name.log and slurmctld.log"
        fi
    done
    local ms=$((($(date +%s%N) - t0_ns) / 1000000))
    log "ready: node $HOST is $(node_state), $(nodes_of slurm | wc -l) compute nodes, accounting=$acct_mode; start took $((ms / 1000)).$(printf '%03d' $((ms % 1000))) s"
}

# The compute nodes' failures, as a cluster has them (tests/clusters/nodes.sh).
known_node() { [[ -n ${1:-} && -f $NODES_DIR/$1 && $(awk '{print $1}' "$NODES_DIR/$1") == slurm ]] || die "no compute node '${1:-}' (see slurm.sh status)"; }
cmd_kill_node() { known_node "${1:-}"; node_kill "$1"; log "node $1: link cut, every process on it killed"; }
cmd_cut_node() { known_node "${1:-}"; node_cut "$1"; log "node $1: link cut (its processes live on)"; }
cmd_heal_node() { known_node "${1:-}"; node_heal "$1"; log "node $1: link up"; }
cmd_revive_node() {
    known_node "${1:-}"
    node_heal "$1"
    start_node_slurmd "$1"
    # ReturnToService=2: the controller takes the node back once its slurmd registers.
    wait_for 150 "node $1 to return to service" node_in_service "$1" || die "node $1 is '$(node_state "$1")'"
    log "node $1 is $(node_state "$1")"
}

cmd_stop() {
    [[ $EUID -eq 0 ]] || die "run as root"
    stop_slurmds
    nodes_hang_up slurm  # as sge.sh does for qmaster: the controller's connections to the nodes end before it stops
    stop_pidfile "$CTLD_PID" slurmctld
    stop_pidfile "$DBD_PID" slurmdbd
    nodes_remove slurm
    if [[ -e $MARK_DIR/mariadbd ]]; then
        stop_pidfile "$MYSQL_PID" mariadbd
        rm -f "$MARK_DIR/mariadbd"
    fi
    if [[ -e $MARK_DIR/munged ]]; then
        stop_pidfile "$MUNGE_PID" munged
        rm -f "$MARK_DIR/munged"
    fi
    log "stopped"
}

cmd_status() {
    local name file comm pid rc=0
    for name in munged:$MUNGE_PID mariadbd:$MYSQL_PID slurmdbd:$DBD_PID slurmctld:$CTLD_PID slurmd:$SLURMD_PID; do
        comm=${name%%:*} file=${name#*:}
        if pid=$(pid_of "$file" "$comm"); then
            printf '%-10s running (pid %s)\n' "$comm" "$pid"
        else
            printf '%-10s stopped\n' "$comm"
            [[ $comm == slurmctld || $comm == slurmd ]] && rc=1
        fi
    done
    if ((rc == 0)); then
        printf 'node       %s %s (head)\n' "$HOST" "$(node_state)"
        for name in $(nodes_of slurm); do
            printf 'node       %s %s %s link %s\n' "$name" "$(node_ip "$name")" "$(node_state "$name")" "$(node_link_state "$name")"
        done
        printf 'accounting %s\n' "$(scontrol show config 2>/dev/null | awk -F'= ' '/^AccountingStorageType/ {print $2}')"
        printf 'MaxArraySize %s\n' "$(scontrol show config 2>/dev/null | awk -F'= ' '/^MaxArraySize/ {print $2}')"
    fi
    return "$rc"
}

take_turns /run/lock/hpcrl-slurm-cluster.lock HPCRL_SLURM_LOCKED "$@"

case ${1:-} in
start) shift; cmd_start "$@" ;;
stop) cmd_stop ;;
status) cmd_status ;;
kill-node) cmd_kill_node "${2:-}" ;;
cut-node) cmd_cut_node "${2:-}" ;;
heal-node) cmd_heal_node "${2:-}" ;;
revive-node) cmd_revive_node "${2:-}" ;;
*) echo "usage: $0 start [--nodes N]|stop|status|kill-node|cut-node|heal-node|revive-node NAME" >&2; exit 2 ;;
esac
