#!/bin/sh
# memory.sh - activation recomputation: what it saves and costs
# (make bench-memory).
#
#   bench/memory.sh BUILD
#
# The anchor first: PyTorch 1.13 training the same L6 d512 h8 model (T256
# B8 vocab 256, 2 threads) plain and with every block under
# torch.utils.checkpoint (full recomputation), best of 2 each; its
# slowdown is what full recomputation costs there. Then build/bench/memory
# (see bench/memory.c): meshrun's ledger, the planner's figure and
# tokens/s for recompute none / selective / full on one rank (T 256 and
# T 1024), pp 2 and tp 2 with sp.
# Last line: memory act_ratio_full=<x> act_ratio_selective=<x> slowdown_full=<x>
set -eu
build=${1:-build}
bin="$build/bench/memory"
[ -x "$bin" ] || { echo "bench-memory: $bin not built" >&2; exit 1; }
dir=$(dirname "$0")
best() { sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p' | sort -g | tail -1; }
torch_tps() { # extra args -> best tokens/s of 2 runs
	for _ in 1 2; do
		OPENBLAS_NUM_THREADS=1 /usr/bin/python3 "$dir/train_torch.py" 6 512 8 256 8 256 3 2 \
			gpt2 "$@" 2>/dev/null || true
	done | best
}
plain=$(torch_tps)
ckpt=$(torch_tps recompute)
slow=$(awk -v a="${plain:-0}" -v b="${ckpt:-0}" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "0" }')
echo "memory pytorch L6 d512 tokens_per_s none=${plain:-0} full=${ckpt:-0} slowdown_full=$slow"
"$bin" 2>/dev/null
