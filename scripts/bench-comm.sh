#!/bin/sh
# bench-comm.sh - meshrun host communicator vs OpenMPI, nccl-tests style.
#
#   scripts/bench-comm.sh [BUILD]     (make bench-comm builds and runs it)
#
# For shm and tcp, 2 and 4 ranks, runs BUILD/bench/comm (meshrun) and
# BUILD/bench/comm_mpi under mpirun (btl self,vader for shared memory,
# self,tcp on loopback for TCP), then prints one table row per op, ranks,
# transport and size with both results side by side and the busbw ratio
# (meshrun / OpenMPI, computed from the times: same bytes, same factor).
# Last line:
#   comm busbw_ratio_vs_openmpi min=<x> (>=1MiB)
# Environment: RANKS (default "2 4"), MAXBYTES (default 67108864), REPS
# (default 3: runs per side and op, alternating, best time per row kept);
# COMM_OPS (e.g. "allreduce,allgather") limits the ops on both sides,
# COMM_BIND=0 stops bench/comm pinning ranks (mpirun binds np <= CPUs).
# Needs mpicc + mpirun (Debian openmpi-bin, libopenmpi-dev) for the
# OpenMPI side; builds BUILD/bench/comm_mpi itself.
set -eu
build=${1:-build}
ranks=${RANKS:-2 4}
maxb=${MAXBYTES:-67108864}
reps=${REPS:-3}
# the OpenMPI side is optional: without mpicc/mpirun only meshrun is measured
have_mpi=0
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
	mpicc -O2 -o "$build/bench/comm_mpi" bench/comm_mpi.c && have_mpi=1
else
	echo "bench-comm: mpicc/mpirun not found - OpenMPI columns left empty" >&2
fi
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT INT TERM
mpi="mpirun --allow-run-as-root --oversubscribe --mca pml ob1"
# each op is its own pair of runs, the two sides back to back: loopback TCP
# and memory bandwidth on a shared VM drift within seconds, and a row
# compares measurements taken as close together as possible
all_ops=${COMM_OPS:-allreduce allgather reduce_scatter alltoall sendrecv}
for tr in shm tcp; do
	if [ "$tr" = shm ]; then btl="self,vader"; else btl="self,tcp --mca btl_tcp_if_include lo"; fi
	for n in $ranks; do
		for rep in $(seq "$reps"); do
			echo "bench-comm: $tr $n ranks (run $rep/$reps)" >&2
			for op in $(echo "$all_ops" | tr ',' ' '); do
				if [ $((rep % 2)) -eq 1 ]; then
					COMM_OPS=$op "$build/bench/comm" -n "$n" -t "$tr" -e "$maxb" >>"$raw"
				fi
				if [ $have_mpi -eq 1 ]; then
					# shellcheck disable=SC2086 # btl holds several arguments
					COMM_OPS=$op $mpi -np "$n" --mca btl $btl "$build/bench/comm_mpi" \
						"$tr" 8 "$maxb" >>"$raw" 2>/dev/null
				fi
				if [ $((rep % 2)) -eq 0 ]; then
					COMM_OPS=$op "$build/bench/comm" -n "$n" -t "$tr" -e "$maxb" >>"$raw"
				fi
			done
		done
	done
done
awk '
$1 == "comm" {
	k = $4 " " $5 " " $3 " " $6
	if (!(k in seen)) { seen[k] = 1; order[++nk] = k }
	if (t[$2, k] == "" || $7 + 0 < t[$2, k] + 0) {
		t[$2, k] = $7; alg[$2, k] = $8; bus[$2, k] = $9
	}
}
END {
	printf "%-15s %5s %4s %10s | %11s %8s %8s | %11s %8s %8s | %6s\n", "op", "ranks", "tr", \
	       "bytes", "mr_time_us", "mr_algbw", "mr_busbw", "mpi_time_us", "mpi_alg", "mpi_bus", "ratio"
	min = -1
	for (i = 1; i <= nk; i++) {
		k = order[i]; split(k, f, " ")
		# same bytes and factor: busbw ratio = time ratio (exact at 8 B too)
		r = (t["meshrun", k] > 0 && t["openmpi", k] > 0) ? t["openmpi", k] / t["meshrun", k] : 0
		printf "%-15s %5s %4s %10s | %11s %8s %8s | %11s %8s %8s | %6.2f\n", f[1], f[2], f[3], \
		       f[4], t["meshrun", k], alg["meshrun", k], bus["meshrun", k], t["openmpi", k], \
		       alg["openmpi", k], bus["openmpi", k], r
		if (f[4] + 0 >= 1048576 && (min < 0 || r < min)) min = r
	}
	printf "comm busbw_ratio_vs_openmpi min=%.2f (>=1MiB)\n", min
}' "$raw"
