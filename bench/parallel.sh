#!/bin/sh
# parallel.sh - data/tensor-parallel scaling against PyTorch DDP
# (make bench-parallel).
#
#   bench/parallel.sh BUILD
#
# Runs bench/parallel_torch.py (PyTorch DDP, gloo, one torch thread per
# process, the same GPT and config) when /usr/bin/python3 has torch, then
# build/bench/parallel (meshrun ranks, one compute thread each), and prints
# the two dp2 throughputs side by side. Last line is build/bench/parallel's:
#   parallel dp2_efficiency=<x> overlap_hidden=<y>
# Run it on an idle machine: the two ranks need both cores.
set -eu
build=${1:-build}
bin="$build/bench/parallel"
[ -x "$bin" ] || { echo "bench-parallel: $bin not built" >&2; exit 1; }
py=/usr/bin/python3
echo "parallel loadavg_at_start=$(cut -d' ' -f1 /proc/loadavg)"
torch2=""
if "$py" -c 'import torch' 2>/dev/null; then
	tout=$("$py" "$(dirname "$0")/parallel_torch.py" 4 256 4 256 8 8)
	echo "$tout"
	torch2=$(echo "$tout" | sed -n 's/.*ddp2 *tokens\/s *\([0-9.]*\).*/\1/p')
else
	echo "parallel pytorch: /usr/bin/python3 has no torch (apt-get install python3-torch); anchor skipped"
fi
out=$("$bin" -s 8)
echo "$out" | sed '$d'
ours=$(echo "$out" | sed -n 's/.*dp2 overlap *tokens\/s *\([0-9.]*\).*/\1/p')
if [ -n "$torch2" ]; then
	echo "parallel dp2 tokens/s meshrun $ours pytorch_ddp $torch2 ratio $(awk -v a="$ours" -v b="$torch2" 'BEGIN { printf "%.2f", a / b }')"
fi
echo "$out" | tail -1
