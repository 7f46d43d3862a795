#!/bin/bash
# device-run.sh - the GPU lease's one script: run on a GPU machine from the
# repository root, after scripts/device-pack.sh's folder has been carried
# there (it is this script, as .devpkg/run.sh). Each step runs from the
# pack under a time limit, its whole log in $OUT (the lease's folder that
# comes back; default .devpkg/logs; under the device tool, which brings
# back 8 files at most, also all of them in $OUT/logs.tgz); a short table
# is printed last.
#
#   .devpkg/run.sh all                 the lease's check, inside BUDGET s
#                                      (default 450; 8 minutes of one H100
#                                      with the machine's start)
#   .devpkg/run.sh [probe] [kernels] [model] [parity] [bench] [torch]
#                  [memory] [nccl] [sanitize] [NAME ...]
#   EMUL=1 .devpkg/run.sh all          the same steps on the emulated
#                                      device, here (tests/scripts/
#                                      test_device_pack.c): the script's
#                                      own check, not the GPU's
#
# all = probe kernels model parity bench torch (and nccl with two or more
# GPUs):
#   kernels  test_cuda_kernels, test_cudnn_graph, test_cuda_attention,
#            test_device_cuda: every kernel against its CPU twin, at the
#            test shapes and at real ones (T 1024 and 4096, head sizes 64
#            and 128, vocab 50304, rows past 65,535); the layer attention
#            through cuDNN (found through the image's python3: its
#            nvidia-cudnn wheel) must run there
#   model    test_cuda_model: the model on the GPU against the CPU, and
#            GPT-2 124M's shape in bf16 against fp32 on the same GPU (the
#            table's bf16_vs_fp32 row: loss, gradient norm, worst tensor);
#            test_cuda_graphs: steps as CUDA graphs give the bits of eager
#            steps (dense, capacity-routed MoE), a refused capture runs
#            eagerly
#   parity   one parity job per mode and schedule on one GPU (PARITY_SET),
#            fp32 and bf16, each against the single rank on the same GPU
#   bench    bench/gpu (GPT-2 124M and 350M, a 1.1B llama: tokens/s and MFU), and
#            a row per model of where its step goes by kind (kinds_<model>)
#   torch    bench/gpu_torch.py, its PyTorch anchor, and the ratios
# not in all (name them):
#   compile  bench/gpu_torch.py -c, the torch.compile anchor (minutes of
#            compiling), and the ratios gpu_<model>_compile; after bench
#   memory   bench/gpu's 1B llama plain, with full recomputation, with the
#            optimizer offloaded, with optimizer and master offloaded:
#            tokens/s and device/host MiB each (issue 29's GPU half)
# A step's verdict is its exit code; a GPU entry point that cannot load the
# CUDA side fails (the plugin, a library) - never "skipped" where a GPU is.
# NAME: one program of build/tests/gpu (test_cuda_kernels, ...).
set -u
pk=$(cd "$(dirname "$0")" && pwd)
logs=${OUT:-${LOGS:-$pk/logs}}
mkdir -p "$logs"
emul=${EMUL:-0}
budget=${BUDGET:-450}
t0=$(date +%s)
table=$logs/table.txt
: >"$table"
PARITY_SET=${PARITY_SET:-'parity/@(dp2_moe|zero3_dp2_moe|hsdp_2x2_dense|tp2_sp_moe|pp2_1f1b_dense|pp2_gpipe_moe|pp2_interleaved_dense|pp2_zbh1_moe|cp2_dense|cp2_allgather|cp2_ulysses|ep2_capacity|ep2_dropless)'}
libdirs=$pk/lib
# cuDNN's runtime-compiled attention engines load NVRTC themselves
for so in libnccl.so.2 libcublasLt.so.13 libcudart.so.13 libnvrtc.so.13; do
	f=$(find /usr/local/cuda*/ /usr/lib /opt -name "$so" 2>/dev/null | head -1)
	[ -n "$f" ] && libdirs=$libdirs:$(dirname "$f")
done
# the attention's libcudnn.so.9 (opened at run time): the one of the
# image's PyTorch (its nvidia-cudnn wheel), else any on the machine
cudnn=$(python3 -c 'import nvidia.cudnn as c, os; print(os.path.dirname(c.__file__) + "/lib")' \
	2>/dev/null)
if [ -z "$cudnn" ] || [ ! -e "$cudnn/libcudnn.so.9" ]; then
	f=$(find /opt /usr/local/cuda*/ /usr/lib -name libcudnn.so.9 2>/dev/null | head -1)
	cudnn=${f:+$(dirname "$f")}
fi
[ -n "$cudnn" ] && libdirs=$libdirs:$cudnn
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MESHRUN_BUILD=$pk/build
# the emulated device's twins where they exist (its tests/gpu-emul)
tests=$pk/build/tests/gpu
[ "$emul" = 1 ] && tests=$pk/build/tests/gpu-emul

# row NAME RC SECONDS WHAT: one line of the table
row() { printf '%-22s %-5s %5ss  %s\n' "$1" "$2" "$3" "$4" >>"$table"; }

# one LIMIT NAME COMMAND...: runs it under the smaller of LIMIT and the
# budget left, logs it, adds its row (what: the Criterion synthesis, or
# the log's last line)
one() {
	limit=$1 name=$2
	shift 2
	left=$((budget - ($(date +%s) - t0)))
	if [ "$left" -lt 10 ]; then
		row "$name" skip 0 "the budget of ${budget}s is spent"
		return
	fi
	[ "$limit" -gt "$left" ] && limit=$left
	start=$(date +%s)
	timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
	rc=$?
	secs=$(($(date +%s) - start))
	what=$(grep 'Synthesis:' "$logs/$name.log" | tail -1 | sed 's/.*Synthesis: //')
	[ -n "$what" ] || what=$(tail -n 1 "$logs/$name.log")
	[ "$rc" = 124 ] && what="timed out after ${limit}s"
	row "$name" "$rc" "$secs" "$what"
	echo "device-run: $name rc=$rc seconds=$secs"
}

# test PROGRAM LIMIT [CRITERION ARGS]: one program of $tests, if it is there
crit() {
	prog=$1 limit=$2
	shift 2
	if [ ! -x "$tests/$prog" ]; then
		row "$prog" n/a 0 "not in this pack (no emulated twin)"
		return
	fi
	one "$limit" "$prog" "$tests/$prog" --jobs 1 --verbose "$@"
}

gpus=0
if [ "$emul" != 1 ] && command -v nvidia-smi >/dev/null; then
	gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
fi

# rate LOG NAME MODEL: tokens_per_s= of LOG's first line "gpu NAME MODEL ..."
rate() {
	awk -v n="$2" -v m="$3" '$2 == n && $3 == m { for (i = 4; i <= NF; i++)
		if ($i ~ /^tokens_per_s=/) { sub("tokens_per_s=", "", $i); print $i; exit } }' \
		"$logs/$1.log" 2>/dev/null
}

# ratio_rows ANCHOR LOG SUFFIX: a row gpu_<model>SUFFIX per model with
# meshrun's tokens/s (bench_gpu.log) over the anchor's (LOG.log)
ratio_rows() {
	for m in 124M 350M 1B; do
		ours=$(rate bench_gpu "$m" bf16)
		theirs=$(rate "$2" "$1" "$m")
		[ -n "$ours" ] && [ -n "$theirs" ] &&
			row "gpu_$m$3" - 0 "$(awk -v o="$ours" -v a="$1" -v t="$theirs" \
				'BEGIN { printf "meshrun %s / %s %s = %.2f", o, a, t, o / t }')"
	done
}

steps=${*:-all}
if [ "$steps" = all ]; then
	steps="probe kernels model parity bench torch"
	[ "$gpus" -ge 2 ] && steps="$steps nccl"
fi
for w in $steps; do
	case $w in
	probe)
		{
			nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
			echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
			for b in "$pk"/build/meshrun "$pk"/build/meshrun-cuda.so; do
				[ -e "$b" ] && ldd "$b" | grep "not found"
			done
			echo "cudnn: ${cudnn:-none found}"
			ls "${cudnn:-/nonexistent}"/libcudnn.so.9* 2>&1
		} >"$logs/probe.log" 2>&1
		row probe - 0 "$(head -2 "$logs/probe.log" | tail -1) ($gpus GPU(s))" ;;
	kernels)
		crit test_cuda_kernels 150
		crit test_cudnn_graph 30
		crit test_cuda_attention 240
		crit test_device_cuda 90 ;;
	model)
		crit test_cuda_model 150
		crit test_cuda_graphs 90
		line=$(grep -ho 'bf16 vs fp32: .*' "$logs/test_cuda_model.log" 2>/dev/null)
		[ -n "$line" ] && row bf16_vs_fp32 - 0 "${line#bf16 vs fp32: }" ;;
	parity)
		for p in fp32 bf16; do
			if [ "$emul" = 1 ]; then
				prog=$pk/build/tests/gpu-emul/test_parity_$p
			else
				prog=$pk/build/tests/gpu/test_parity_$p
			fi
			one 150 "parity_$p" "$prog" --jobs 1 --filter "$PARITY_SET"
			# a filter that runs nothing would pass: it fails
			grep -q 'Tested: [1-9]' "$logs/parity_$p.log" ||
				row "parity_$p" 1 0 "PARITY_SET ran no test"
		done ;;
	bench)
		if [ "$emul" = 1 ]; then
			one 120 bench_gpu "$pk/build/emul/bench-gpu" -t
		else
			one 240 bench_gpu "$pk/build/bench/gpu"
		fi
		# where each model's step goes on one GPU (its first kinds line)
		grep '^gpu .* kinds:' "$logs/bench_gpu.log" 2>/dev/null | awk '!seen[$2]++' |
			while read -r _ m _ rest; do row "kinds_$m" - 0 "$rest"; done ;;
	torch)
		if [ "$emul" = 1 ]; then
			row bench_gpu_torch n/a 0 "no GPU for the PyTorch anchor"
			continue
		fi
		one 150 bench_gpu_torch python3 bench/gpu_torch.py
		ratio_rows pytorch bench_gpu_torch "" ;;
	compile)
		# torch.compile's anchor: its compiling warm-up is minutes
		if [ "$emul" = 1 ]; then
			row bench_gpu_compile n/a 0 "no GPU for the torch.compile anchor"
			continue
		fi
		one 400 bench_gpu_compile python3 bench/gpu_torch.py -c
		ratio_rows pytorch-compile bench_gpu_compile _compile ;;
	memory)
		# issue 29's GPU half: the 1B llama (emulated: the tiny one)
		# plain, under full recomputation, with the optimizer and with
		# optimizer + master offloaded; a row each: tokens/s and memory
		for v in none:none full:none none:optimizer none:optimizer+master; do
			rec=${v%%:*} off=${v#*:}
			name="memory_${rec}_$off"
			if [ "$emul" = 1 ]; then
				one 120 "$name" "$pk/build/emul/bench-gpu" -t -m 1b -r "$rec" -o "$off"
			else
				one 120 "$name" "$pk/build/bench/gpu" -m 1b -r "$rec" -o "$off"
			fi
			line=$(grep '^gpu .* recompute=' "$logs/$name.log" | tail -1)
			[ -n "$line" ] && row "${name}_figures" - 0 \
				"$(echo "$line" | grep -o 'tokens_per_s=[0-9]*\|dev_MiB=[0-9.]*\|host_MiB=[0-9.]*' |
					tr '\n' ' ')"
		done ;;
	nccl)	crit test_nccl_ops 120 ;;
	sanitize)
		for t in test_cuda_kernels test_device_cuda; do
			one 300 "sanitize_$t" compute-sanitizer --target-processes all \
				"$pk/build/tests/gpu/$t" --jobs 1
		done ;;
	test_*)	crit "$w" 300 ;;
	*)	echo "device-run: unknown '$w'" >&2; exit 2 ;;
	esac
done
echo "device-run: $(($(date +%s) - t0))s of ${budget}s; logs in $logs"
# the device tool brings back 8 files of \$OUT at most: every log in one
if [ -n "${OUT:-}" ]; then
	tar czf "$OUT/logs.tgz" -C "$logs" --exclude logs.tgz . 2>/dev/null &&
		echo "device-run: every log in $OUT/logs.tgz"
fi
printf '%-22s %-5s %6s  %s\n' step rc time result
cat "$table"
# the verdict: any step that failed (a skip for want of budget is not one)
! awk '$2 != "-" && $2 != "0" && $2 != "n/a" && $2 != "skip" { bad = 1 } END { exit !bad }' \
	"$table"
