#!/bin/sh
# bench-comm-ab.sh - compare builds or settings of the host communicator,
# interleaved, on a noisy machine.
#
#   scripts/bench-comm-ab.sh REPS "BIN [VAR=value ...]" "BIN [VAR=value ...]" ...
#
# Runs each configuration (a bench/comm binary and environment settings,
# e.g. "build/bench/comm MR_COMM_CHUNK=131072") once per round, REPS rounds,
# the order of the configurations rotating every round, and prints per op
# and size the best time (us) of each configuration, in argument order.
# Memory bandwidth and loopback TCP on a shared VM drift by 2x within
# minutes: only configurations measured side by side like this compare.
# Environment: N (ranks, 2), TR (shm|tcp, shm), B and E (smallest and
# largest bytes, 1 MiB and 64 MiB), OPS (COMM_OPS of bench/comm, all).
set -eu
if [ $# -lt 2 ]; then
	echo "usage: $0 REPS \"BIN [VAR=value ...]\" ..." >&2
	exit 2
fi
reps=$1
shift
ncfg=0
# shellcheck disable=SC2034 # read back through eval
for c in "$@"; do
	ncfg=$((ncfg + 1))
	eval "cfg_$ncfg=\$c"
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT INT TERM
for r in $(seq "$reps"); do
	for j in $(seq "$ncfg"); do
		# rotate: round r starts with configuration r
		idx=$(((j + r - 2) % ncfg + 1))
		eval "cfg=\$cfg_$idx"
		# shellcheck disable=SC2086,SC2154
		set -- $cfg
		bin=$1
		shift
		env "$@" ${OPS:+COMM_OPS="$OPS"} "$bin" -n "${N:-2}" -t "${TR:-shm}" \
			-b "${B:-1048576}" -e "${E:-67108864}" |
			awk -v c="$idx" '{ print c, $4, $6, $7 }' >>"$out"
	done
done
awk -v n="$ncfg" '
{
	k = $2 " " $3
	if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
	if (!((k, $1) in best) || $4 < best[k, $1]) best[k, $1] = $4
}
END {
	for (i = 1; i <= nk; i++) {
		printf "%-28s", order[i]
		for (c = 1; c <= n; c++) printf " %11.1f", best[order[i], c]
		printf "\n"
	}
}' "$out"
