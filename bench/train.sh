#!/bin/sh
# train.sh - meshrun vs PyTorch training throughput (make bench-train).
#
#   bench/train.sh BUILD
#
# For each config (L2 d128 h4, L4 d256 h4, L6 d512 h8, and a llama L4 d256
# h4 with 2 key/value heads; T256 B8 vocab 256)
# runs build/bench/train (meshrun, its best of 3) and bench/train_torch.py
# (PyTorch 1.13 float32; torch 1 thread + OpenBLAS 2 threads, and torch 2
# threads + OpenBLAS 1 thread; best of 2 each), prints both and the ratio.
# Also measures this machine's sgemm peak (build/bench/sgemm_peak, OpenBLAS,
# 2 threads) at the start and the end, and prints each config's training
# FLOP/s (6N + 6LCT per token, N without the position table, as the
# runtime's MFU counts) as a fraction of the better peak.
# Last line: train ratio_vs_pytorch min=<x>
# Runs are interleaved so background load hits both sides alike; on a busy
# machine the numbers still swing - rerun when it is idle.
set -eu
build=${1:-build}
bin="$build/bench/train"
[ -x "$bin" ] || { echo "bench-train: $bin not built" >&2; exit 1; }
py=/usr/bin/python3
dir=$(dirname "$0")
min=""
peak_bin="$build/bench/sgemm_peak"
peak() { "$peak_bin" 2 | sed -n 's/.*gflops=\([0-9.]*\).*/\1/p'; }
peak0=$(peak)
echo "train sgemm_peak_gflops=$peak0 (2 threads, before)"
fracs=""

best() { # command... -> best tokens_per_s of its output lines
	sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' | sort -g | tail -1
}

for cfg in "2 128 4 10 gpt2" "4 256 4 5 gpt2" "6 512 8 3 gpt2" "4 256 4 5 llama"; do
	# shellcheck disable=SC2086 # split the config into fields
	set -- $cfg
	L=$1 D=$2 H=$3 S=$4 A=$5
	out=$(mktemp)
	for _ in 1 2; do
		"$bin" "$L" "$D" "$H" 256 8 256 "$S" 2 "$A" 2>/dev/null >>"$out" || true
		OPENBLAS_NUM_THREADS=2 "$py" "$dir/train_torch.py" "$L" "$D" "$H" 256 8 256 "$S" 1 \
			"$A" >>"$out.pt" 2>/dev/null || true
		OPENBLAS_NUM_THREADS=1 "$py" "$dir/train_torch.py" "$L" "$D" "$H" 256 8 256 "$S" 2 \
			"$A" >>"$out.pt" 2>/dev/null || true
	done
	"$bin" "$L" "$D" "$H" 256 8 256 "$S" 2 "$A" 2>/dev/null >>"$out" || true
	m=$(best <"$out")
	p=$(best <"$out.pt")
	grep -h "mfu=" "$out" | tail -1
	r=$(awk -v m="${m:-0}" -v p="${p:-0}" 'BEGIN { if (p > 0) printf "%.2f", m / p; else print "0" }')
	echo "train arch=$A L=$L D=$D H=$H meshrun_tokens_per_s=${m:-0} pytorch_tokens_per_s=${p:-0} ratio=$r"
	# the FLOP count below is gpt2's
	[ "$A" = gpt2 ] && fracs="$fracs $L:$D:${m:-0}"
	if [ -z "$min" ] || awk -v a="$r" -v b="$min" 'BEGIN { exit !(a < b) }'; then
		min=$r
	fi
	rm -f "$out" "$out.pt"
done
peak1=$(peak)
echo "train sgemm_peak_gflops=$peak1 (2 threads, after)"
for f in $fracs; do
	echo "$f" | awk -F: -v p0="$peak0" -v p1="$peak1" '{
		L = $1; C = $2; tps = $3; V = 256; T = 256
		n = V * C + L * (12 * C * C + 13 * C) + 2 * C
		gf = tps * (6 * n + 6 * L * C * T) * 1e-9
		pk = (p0 > p1) ? p0 : p1
		fr = (pk > 0) ? gf / pk : 0
		printf "train L=%d D=%d training_gflops=%.1f sgemm_peak_gflops=%.1f fraction_of_peak=%.2f\n", L, C, gf, pk, fr
	}'
done
echo "train ratio_vs_pytorch min=$min"
