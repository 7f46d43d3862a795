#!/bin/sh
# train.sh - meshrun vs PyTorch training throughput (make bench-train).
#
#   bench/train.sh BUILD
#
# For each config (L2 d128 h4, L4 d256 h4, L6 d512 h8; T256 B8 vocab 256)
# runs build/bench/train (meshrun, its best of 3) and bench/train_torch.py
# (PyTorch 1.13 float32; torch 1 thread + OpenBLAS 2 threads, and torch 2
# threads + OpenBLAS 1 thread; best of 2 each), prints both and the ratio.
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

best() { # command... -> best tokens_per_s of its output lines
	sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' | sort -g | tail -1
}

for cfg in "2 128 4 10" "4 256 4 5" "6 512 8 3"; do
	# shellcheck disable=SC2086 # split the config into fields
	set -- $cfg
	L=$1 D=$2 H=$3 S=$4
	out=$(mktemp)
	for _ in 1 2; do
		"$bin" "$L" "$D" "$H" 256 8 256 "$S" 2 2>/dev/null >>"$out" || true
		OPENBLAS_NUM_THREADS=2 "$py" "$dir/train_torch.py" "$L" "$D" "$H" 256 8 256 "$S" 1 \
			>>"$out.pt" 2>/dev/null || true
		OPENBLAS_NUM_THREADS=1 "$py" "$dir/train_torch.py" "$L" "$D" "$H" 256 8 256 "$S" 2 \
			>>"$out.pt" 2>/dev/null || true
	done
	"$bin" "$L" "$D" "$H" 256 8 256 "$S" 2 2>/dev/null >>"$out" || true
	m=$(best <"$out")
	p=$(best <"$out.pt")
	grep -h "mfu=" "$out" | tail -1
	r=$(awk -v m="${m:-0}" -v p="${p:-0}" 'BEGIN { if (p > 0) printf "%.2f", m / p; else print "0" }')
	echo "train L=$L D=$D H=$H meshrun_tokens_per_s=${m:-0} pytorch_tokens_per_s=${p:-0} ratio=$r"
	if [ -z "$min" ] || awk -v a="$r" -v b="$min" 'BEGIN { exit !(a < b) }'; then
		min=$r
	fi
	rm -f "$out" "$out.pt"
done
echo "train ratio_vs_pytorch min=$min"
