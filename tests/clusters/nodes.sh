# shellcheck shell=bash
# Compute nodes on one machine: each node is a network namespace with its own hostname (a UTS namespace per
# daemon it runs), its own address on a private bridge, and its own /etc/hosts (a mount namespace: `ip netns
# exec` binds /etc/netns/NAME/hosts over /etc/hosts), while the filesystem stays shared, as a cluster's is.
# Sourced by slurm.sh and sge.sh; see tests/clusters/README.md ("Several nodes").
#
# Why namespaces and not a second machine: what breaks only across hosts (an address that is loopback on its
# own host, a name another node cannot resolve, a node that vanishes with everything on it, a link cut while
# the node lives) shows only when each node has its own network stack and name. The kernel, the clock and the
# filesystem stay shared: that is what differs from a real cluster (the README lists it).
#
# The network: bridge $NODES_BRIDGE with the head's address $NODES_HEAD_IP (this host's side, where the
# controllers listen) and one veth per node. No default route, no NAT, no forwarding: traffic goes only
# between the namespaces made here and the head's bridge address. Everything is torn down by nodes_remove.
#
# The caller defines log() and die().

NODES_BRIDGE=hpcrl-br0
NODES_NET=10.251.0
NODES_HEAD_IP=$NODES_NET.1
NODES_DIR=/var/lib/hpcrl-test/nodes      # one file per node: "OWNER IP"
NODES_HEAD_HOSTS=$NODES_DIR/head-hosts   # this host's /etc/hosts plus the nodes, for head daemons that resolve them
NODES_HEAD=$(hostname)
NODES_LOCK=/run/lock/hpcrl-test-nodes.lock

# node_ip NAME: the node's address on the bridge.
node_ip() { awk '{print $2}' "$NODES_DIR/$1"; }

# nodes_of OWNER: the names of OWNER's nodes, in order.
nodes_of() {
    local f
    for f in "$NODES_DIR"/*; do
        [[ -f $f && $f != "$NODES_HEAD_HOSTS" ]] || continue
        [[ $(awk '{print $1}' "$f") == "$1" ]] && basename "$f"
    done | sort -V
    return 0  # no node of this owner is an empty list, not a failure (pipefail)
}

# nodes_in_service OWNER: OWNER's nodes less those whose link is down: a test killed or cut them on purpose
# (kill-node/cut-node, kill-host/cut-host), and only its revive brings them back. `start`, run by another
# test session beside the multi-node tests, neither waits for such a node nor restarts its daemon: an execd
# started in a namespace whose link is down cannot bind its port, and a node brought back under a test that
# is timing its loss would void what that test measures.
nodes_in_service() {
    local name
    for name in $(nodes_of "$1"); do
        [[ $(node_link_state "$name") == cut ]] || echo "$name"
    done
}

all_nodes() {
    local f
    for f in "$NODES_DIR"/*; do
        [[ -f $f && $f != "$NODES_HEAD_HOSTS" ]] && basename "$f"
    done | sort -V
}

# The veth's end on the head: short (IFNAMSIZ) and derived from the address.
node_link() { echo "hpcrl-v$(node_ip "$1" | cut -d. -f4)"; }

# nodes_hosts_refresh: every node resolves every node and the head, as a cluster's DNS does, and names itself
# 127.0.1.1 first, as Debian's installer writes it: on a stock node gethostbyname(gethostname()) is loopback,
# which is what hpcrl must not advertise. Written in place (not renamed over): a daemon's bind mount of the
# file follows its inode, so running nodes see new names.
nodes_hosts_refresh() {
    local lines n name tmp
    lines="$NODES_HEAD_IP $NODES_HEAD"
    for name in $(all_nodes); do
        lines+="
$(node_ip "$name") $name"
    done
    for name in $(all_nodes); do
        install -d "/etc/netns/$name"
        printf '127.0.0.1 localhost\n127.0.1.1 %s\n%s\n' "$name" "$lines" >"/etc/netns/$name/hosts"
    done
    # The head keeps its own names and learns the nodes' (for head daemons started with node_head_run).
    tmp=$(mktemp)
    {
        # The machine's own lines (a caller under node_head_run reads this file in /etc/hosts' place: its node
        # lines, marked, are left out and written anew).
        grep -v ' # hpcrl-node$' /etc/hosts || true
        for n in $(all_nodes); do printf '%s %s # hpcrl-node\n' "$(node_ip "$n")" "$n"; done
    } >"$tmp"
    cat "$tmp" >"$NODES_HEAD_HOSTS"  # in place: a daemon's bind mount follows the inode
    rm -f "$tmp"
}

nodes_bridge_up() {
    if ! ip link show "$NODES_BRIDGE" >/dev/null 2>&1; then
        ip link add "$NODES_BRIDGE" type bridge
        ip addr add "$NODES_HEAD_IP/24" dev "$NODES_BRIDGE"
    fi
    ip link set "$NODES_BRIDGE" up
}

# nodes_make OWNER PREFIX OCTET0 N: OWNER's nodes PREFIX1..PREFIXN at $NODES_NET.(OCTET0+i), and every node's
# hosts file, under NODES_LOCK (idempotent).
nodes_make() {
    local owner=$1 prefix=$2 octet0=$3 want=$4 i
    ((want > 0)) || return 0
    (
        nodes_lock
        for ((i = 1; i <= want; i++)); do node_add "$owner" "$prefix$i" $((octet0 + i)); done
        nodes_hosts_refresh
    )
}

# nodes_lock: hold NODES_LOCK until the (sub)shell that called it ends. What the two clusters share (the bridge,
# every node's hosts file, the head's) is changed under it: the suite starts Slurm's and Grid Engine's nodes at
# once, and two starts that both saw no bridge both added one ("RTNETLINK answers: File exists": a whole
# test file's errors). Only short commands (ip, install) run under it, never a daemon that would keep it.
nodes_lock() {
    exec 8>"$NODES_LOCK"
    flock -w 300 8 || die "timed out waiting for $NODES_LOCK"
}

# node_add OWNER NAME OCTET: the namespace NAME at $NODES_NET.OCTET, linked to the bridge (idempotent).
node_add() {
    local owner=$1 name=$2 ip=$NODES_NET.$3 link
    install -d "$NODES_DIR"
    nodes_bridge_up
    printf '%s %s\n' "$owner" "$ip" >"$NODES_DIR/$name"
    link=$(node_link "$name")
    ip netns list | awk '{print $1}' | grep -qx "$name" || ip netns add "$name"
    if ! ip link show "$link" >/dev/null 2>&1; then
        ip link add "$link" type veth peer name "$link-p"
        ip link set "$link-p" netns "$name"
        ip netns exec "$name" ip link set "$link-p" name eth0
        ip netns exec "$name" ip addr add "$ip/24" dev eth0
        ip link set "$link" master "$NODES_BRIDGE"
    fi
    ip link set "$link" up
    ip netns exec "$name" ip link set lo up
    ip netns exec "$name" ip link set eth0 up
}

# node_run NAME COMMAND...: run COMMAND on node NAME: its network, its /etc/hosts, its hostname. (Not `ip netns
# exec`: it mounts a fresh /sys without the cgroup hierarchies slurmd needs.)
node_run() {
    local name=$1; shift
    nsenter --net="/run/netns/$name" unshare --uts --mount --propagation private \
        bash -c 'mount --bind "/etc/netns/$0/hosts" /etc/hosts && hostname "$0" && exec "$@"' "$name" "$@"
}

# node_head_run COMMAND...: run a head daemon that must resolve the nodes' names (reverse lookups too) with a
# private /etc/hosts, leaving this host's file untouched.
node_head_run() {
    unshare --mount --propagation private bash -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$NODES_HEAD_HOSTS" "$@"
}

node_pids() { ip netns pids "$1" 2>/dev/null; }

# node_kill NAME: the node dies: its link goes down and every process on it is killed at once.
node_kill() {
    local name=$1 pid
    ip link set "$(node_link "$name")" down
    for pid in $(node_pids "$name"); do kill -KILL "$pid" 2>/dev/null || true; done
}

# node_cut NAME / node_heal NAME: a partition: the node's link goes down (or up); its processes live on.
node_cut() { ip link set "$(node_link "$1")" down; }
node_heal() { ip link set "$(node_link "$1")" up; }

node_link_state() {
    local flags
    flags=$(ip -o link show "$(node_link "$1")" 2>/dev/null) || { echo gone; return; }
    [[ $flags == *"<"*UP*">"* && $flags != *NO-CARRIER* ]] && echo up || echo cut
}

# nodes_hang_up OWNER: before the head's daemons stop, every connection between the head and OWNER's nodes ends
# with both ends told: each node back on its link (its namespace still there, so its kernel refuses what the head
# sends), and the head's TCP connections to it aborted (ss -K). A node killed or cut with its link down never
# closed its side, and a daemon whose shutdown waits for its connections to close waited on it: sge_qmaster,
# after the multi-host tier's suites and after `sge.sh kill-host` then `stop` (66 s and a SIGKILL; now ~12 s).
nodes_hang_up() {
    local name
    for name in $(nodes_of "$1"); do
        [[ $(node_link_state "$name") != cut ]] || node_heal "$name"
        ss -K dst "$(node_ip "$name")" >/dev/null 2>&1 || true
    done
}

# nodes_remove OWNER: kill OWNER's nodes' processes and remove their namespaces and links; the bridge goes
# with the last node.
nodes_remove() {
    (
        nodes_lock
        local name pid
        for name in $(nodes_of "$1"); do
            for pid in $(node_pids "$name"); do kill -KILL "$pid" 2>/dev/null || true; done
            ip link del "$(node_link "$name")" 2>/dev/null || true
            ip netns del "$name" 2>/dev/null || true
            rm -rf "/etc/netns/$name"
            rm -f "$NODES_DIR/$name"
        done
        if [[ -z $(all_nodes) ]]; then
            ip link del "$NODES_BRIDGE" 2>/dev/null || true
            rm -f "$NODES_HEAD_HOSTS"
        else
            nodes_hosts_refresh
        fi
    )
}
