#!/usr/bin/env bash
# pods.sh - pods as hosts on one machine: a controller and N pods, each in
# a network namespace of its own (a veth pair to a bridge, an address on a
# test subnet), and each process started in a pod also in an IPC namespace
# with its own /dev/shm - so pods share nothing but TCP, as Kubernetes pods
# on different nodes do. Needs root (CI runs as root).
#
#   scripts/pods.sh check                  exit 0 if namespaces can be made here,
#                                          else 77 with the reason on stderr
#   scripts/pods.sh up NAME N              make pod "c" (the controller) and pods 0..N-1
#   scripts/pods.sh ip NAME POD            the pod's address (POD: c or 0..N-1)
#   scripts/pods.sh exec NAME POD CMD...   run CMD inside the pod (new IPC namespace
#                                          and /dev/shm per call: one per process tree)
#   scripts/pods.sh cut NAME POD           set the pod's link down (a cable pulled)
#   scripts/pods.sh heal NAME POD          and up again
#   scripts/pods.sh block NAME FROM TO     drop what pod FROM sends to pod TO (one way:
#                                          nftables in TO's namespace; exit 77 without nft)
#   scripts/pods.sh unblock NAME FROM TO   and let it through again
#   scripts/pods.sh down NAME              kill what runs in the pods, remove everything
#   scripts/pods.sh list                   the harness's leftovers (names), if any
#
# NAME is 1..6 of [a-z0-9]. Everything is named after it: netns mr-NAME-c,
# mr-NAME-0..; bridge mrbNAME; veths mrhNAME<i> (host side) and eth0 (pod
# side). The subnet is 10.231.X.0/24, X the first one no bridge uses (taken
# under a lock, so parallel tests get different ones); the controller is
# .1, pod i is .(10+i). Traffic never leaves the bridge: no route out,
# no NAT. `down` is safe to call twice and after a failed `up`.
#
# Non-goals: link delay or loss (netem is not available here), DNS.
set -euo pipefail

die() {
	echo "pods: $*" >&2
	exit 1
}

need_name() {
	[[ ${1:-} =~ ^[a-z0-9]{1,6}$ ]] || die "NAME must be 1..6 of [a-z0-9], got '${1:-}'"
}

ns_of() { # NAME POD -> netns name
	echo "mr-$1-$2"
}

hostif_of() { # NAME POD -> host-side veth (15 bytes at most)
	echo "mrh$1$2"
}

subnet_of() { # NAME -> X of 10.231.X.0/24, from the bridge's address
	ip -o -4 addr show dev "mrb$1" 2>/dev/null | sed -n 's/.* 10\.231\.\([0-9]*\)\.254\/24.*/\1/p'
}

ip_of() { # NAME POD
	local x
	x=$(subnet_of "$1")
	[ -n "$x" ] || die "no pods named '$1' (run: pods.sh up $1 N)"
	if [ "$2" = c ]; then echo "10.231.$x.1"; else echo "10.231.$x.$((10 + $2))"; fi
}

check() {
	[ "$(id -u)" -eq 0 ] || { echo "pods: not root: network namespaces need root" >&2; exit 77; }
	command -v ip >/dev/null || { echo "pods: iproute2 (ip) is missing" >&2; exit 77; }
	command -v unshare >/dev/null || { echo "pods: unshare (util-linux) is missing" >&2; exit 77; }
	local t="mrchk$$"
	if ! ip netns add "$t" 2>/dev/null; then
		echo "pods: cannot create a network namespace here" >&2
		exit 77
	fi
	ip netns del "$t"
	if ! ip link add "mrbchk$$" type bridge 2>/dev/null; then
		echo "pods: cannot create a bridge here" >&2
		exit 77
	fi
	ip link del "mrbchk$$"
}

add_pod() { # NAME POD ADDR
	local ns h
	ns=$(ns_of "$1" "$2")
	h=$(hostif_of "$1" "$2")
	ip netns add "$ns"
	ip link add "$h" type veth peer name eth0 netns "$ns"
	ip link set "$h" master "mrb$1" up
	ip -n "$ns" addr add "$3/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n "$ns" link set lo up
}

up() {
	local name=$1 n=$2 x
	need_name "$name"
	if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt 1 ] || [ "$n" -gt 200 ]; then die "N must be 1..200"; fi
	[ -z "$(subnet_of "$name")" ] || die "pods '$name' exist already (pods.sh down $name)"
	exec 9>/run/meshrun-pods.lock
	flock 9
	for x in $(seq 1 250); do
		ip -o -4 addr show | grep -q " 10\.231\.$x\." || break
	done
	ip link add "mrb$name" type bridge
	ip addr add "10.231.$x.254/24" dev "mrb$name"
	ip link set "mrb$name" up
	flock -u 9
	add_pod "$name" c "10.231.$x.1"
	for i in $(seq 0 $((n - 1))); do
		add_pod "$name" "$i" "10.231.$x.$((10 + i))"
	done
}

run_in() { # NAME POD CMD...
	local ns
	ns=$(ns_of "$1" "$2")
	shift 2
	[ -e "/run/netns/$ns" ] || die "no pod '$ns'"
	# a private mount namespace for a /dev/shm of its own, a new IPC namespace
	exec ip netns exec "$ns" unshare --ipc --mount --propagation private -- \
		sh -c 'mount -t tmpfs -o size=2g,mode=1777 tmpfs /dev/shm && exec "$@"' sh "$@"
}

link() { # NAME POD up|down
	ip link set "$(hostif_of "$1" "$2")" "$3"
}

block() { # NAME FROM TO
	local ns from
	command -v nft >/dev/null || { echo "pods: nftables (nft) is missing" >&2; exit 77; }
	ns=$(ns_of "$1" "$3")
	from=$(ip_of "$1" "$2")
	ip netns exec "$ns" nft add table inet meshrun
	ip netns exec "$ns" nft add chain inet meshrun input \
		'{ type filter hook input priority 0; policy accept; }'
	ip netns exec "$ns" nft add rule inet meshrun input ip saddr "$from" drop
}

unblock() { # NAME FROM TO
	local ns from h
	ns=$(ns_of "$1" "$3")
	from=$(ip_of "$1" "$2")
	for h in $(ip netns exec "$ns" nft -a list chain inet meshrun input 2>/dev/null |
		sed -n "s/.*ip saddr $from drop # handle \([0-9]*\).*/\1/p"); do
		ip netns exec "$ns" nft delete rule inet meshrun input handle "$h"
	done
}

down() {
	local name=$1 ns
	need_name "$name"
	for ns in $(ip netns list | awk '{print $1}' | grep "^mr-$name-" || true); do
		# every process of the pod: its tree lives in the namespace
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
		ip netns del "$ns" 2>/dev/null || true
	done
	for h in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^mrh$name" || true); do
		ip link del "$h" 2>/dev/null || true
	done
	ip link del "mrb$name" 2>/dev/null || true
}

list() {
	{
		ip netns list | awk '{print $1}' | sed -n 's/^mr-\([a-z0-9]*\)-.*/\1/p'
		ip -o link show type bridge | awk -F': ' '{print $2}' | sed -n 's/^mrb\([a-z0-9]*\)$/\1/p'
	} | sort -u
}

cmd=${1:-}
shift || true
case $cmd in
check) check ;;
up) up "${1:-}" "${2:-}" ;;
ip) need_name "${1:-}"; ip_of "$1" "${2:-}" ;;
exec) need_name "${1:-}"; [ $# -ge 3 ] || die "exec NAME POD CMD..."; run_in "$@" ;;
cut) need_name "${1:-}"; link "$1" "${2:-}" down ;;
heal) need_name "${1:-}"; link "$1" "${2:-}" up ;;
block) need_name "${1:-}"; block "$1" "${2:-}" "${3:-}" ;;
unblock) need_name "${1:-}"; unblock "$1" "${2:-}" "${3:-}" ;;
down) down "${1:-}" ;;
list) list ;;
*) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; [ -z "$cmd" ] || exit 2 ;;
esac
