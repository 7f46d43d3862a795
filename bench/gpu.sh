#!/bin/sh
# gpu.sh - make bench-gpu: bench/gpu (meshrun's runtime on the GPUs) and its
# PyTorch anchors (bench/gpu_torch.py: the same GPT-2 and llama shapes, bf16
# autocast, flash attention, fused AdamW; eager, then through torch.compile)
# side by side on one GPU, then the ratios: gpu <model> meshrun/pytorch=<r>
# and gpu <model> meshrun/torch.compile=<r>.
#
#   bench/gpu.sh BUILD
#
# Last line, as bench/gpu's own: gpu tokens_per_s=<x> mfu=<y> (350M, one GPU).
# Without a GPU bench/gpu says so and the anchor is not run; its failure
# (a GPU it cannot use, a run that fails) is this script's exit status.
set -eu
b=${1:-build}
log=$(mktemp)
trap 'rm -f "$log" "$log.torch"' EXIT
rc=0
"$b/bench/gpu" >"$log" || rc=$?
cat "$log"
[ "$rc" -eq 0 ] || exit "$rc"
last=$(tail -n 1 "$log")
case $last in "gpu tokens_per_s="*) ;; *) exit 0 ;; esac
py=$(command -v python3 || true)
[ -n "$py" ] || { echo "gpu pytorch: no python3, anchor skipped"; exit 0; }
rc=0
for flag in "" -c; do
	# shellcheck disable=SC2086 # no flag: no argument
	"$py" bench/gpu_torch.py $flag >"$log.torch" || rc=$?
	cat "$log.torch"
	[ "$rc" -eq 0 ] || { echo "gpu pytorch: the anchor failed (exit $rc)"; exit "$rc"; }
	cat "$log.torch" >>"$log"
done
# tokens_per_s= of the first line whose fields 2 and 3 are $1 $2
rate() {
	awk -v a="$1" -v b="$2" '$2 == a && $3 == b { for (i = 4; i <= NF; i++)
		if ($i ~ /^tokens_per_s=/) { sub("tokens_per_s=", "", $i); print $i; exit } }' "$log"
}
for m in 124M 350M 1B; do
	ours=$(rate "$m" bf16)
	for anchor in pytorch:pytorch pytorch-compile:torch.compile; do
		theirs=$(rate "${anchor%%:*}" "$m")
		[ -n "$ours" ] && [ -n "$theirs" ] &&
			awk -v m="$m" -v a="${anchor#*:}" -v o="$ours" -v t="$theirs" \
				'BEGIN { printf "gpu %s meshrun/%s=%.2f\n", m, a, o / t }'
	done
done
echo "$last"
