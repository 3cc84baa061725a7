# shellcheck shell=bash
# Daemons by their pid files, as slurm.sh and sge.sh start, watch and stop them (sourced by both: one rule
# for what "running" means, and one for which of their commands take turns). The caller defines log().
#
# A daemon is running when the PID in its file is alive, is the named command (a PID reused by another
# process is not it), and is not a zombie. A killed daemon has no parent but init, and init reaps when it
# gets to it: on these VMs PID 1 (process_api) reaps orphans every ~2 s, and for that long `kill -0` and
# /proc/PID/comm still show the dead daemon. A revive right after a kill then started nothing and waited
# for a node whose daemon was gone (slurm.sh once; sge.sh in a CI run of 2026-12-06, before this file).

# pid_alive PID: PID is a process that runs or can (not a zombie, not gone). The command name in
# /proc/PID/stat may hold spaces and parentheses: the state is the first field after its last ')'.
pid_alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ -n $stat && ${stat%% *} != [ZX] ]]
}

# pid_of FILE COMM: print the PID in FILE if that process is alive and is COMM.
pid_of() {
    local file=$1 comm=$2 pid
    [[ -s $file ]] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [[ -n $pid ]] && pid_alive "$pid" || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
    echo "$pid"
}

running() { pid_of "$1" "$2" >/dev/null; }

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.1 s until it succeeds.
wait_for() {
    local limit=$1 what=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { log "timed out after ${limit}s waiting for $what"; return 1; }
        sleep 0.1
    done
}

# stop_pidfile FILE COMM [SECONDS]: SIGTERM the PID in FILE, SIGKILL after SECONDS (15); quiet when not
# running. The file goes with it, so that a later start never reads a stale PID.
stop_pidfile() {
    local file=$1 comm=$2 patience=${3:-15} pid i
    if ! pid=$(pid_of "$file" "$comm"); then
        rm -f "$file"
        return 0
    fi
    log "stopping $comm (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < patience * 10; i++)); do
        pid_alive "$pid" || break
        sleep 0.1
    done
    if pid_alive "$pid"; then
        log "$comm (pid $pid) ignored SIGTERM for $patience s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

# take_turns LOCK FLAG ARGS...: run the script again holding LOCK when ARGS is a command that starts or stops
# daemons (start, stop, revive-*), so that such commands take turns across processes: the suite's session start
# and a multi-node test's revive, run beside each other, would otherwise both start one node's daemon, and the
# second cannot bind its port. FLAG, set in the environment of the run under the lock, says it is held;
# flock -o holds the lock itself, so no daemon the script starts inherits it.
take_turns() {
    local lock=$1 flag=$2; shift 2
    case ${1:-} in
    start | stop | revive-*)
        [[ -n ${!flag:-} ]] || exec env "$flag=1" flock -o "$lock" bash "$0" "$@" ;;
    esac
}
