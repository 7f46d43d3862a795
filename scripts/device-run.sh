#!/bin/bash
# device-run.sh - run on a GPU machine from the repository root, after
# scripts/device-pack.sh's folder has been unpacked there: `make test-gpu`'s
# programs and `make bench-gpu` from the pack, each under a time limit,
# each log into $LOGS (default: .devpkg/logs).
#
#   .devpkg/run.sh [probe] [test] [bench] [torch] [parity] [sanitize]
#                  [NAME ...]
#
# torch: bench/gpu_torch.py, bench-gpu's PyTorch anchor. sanitize: the
# kernel tests under compute-sanitizer. NAME: one test program of
# build/tests/gpu (test_cuda_kernels, ...).
set -u
pk=$(cd "$(dirname "$0")" && pwd)
logs=${LOGS:-$pk/logs}
mkdir -p "$logs"
libdirs=$pk/lib
for so in libnccl.so.2 libcublasLt.so.13 libcudart.so.13; do
	f=$(find /usr/local/cuda*/ /usr/lib /opt -name "$so" 2>/dev/null | head -1)
	[ -n "$f" ] && libdirs=$libdirs:$(dirname "$f")
done
export LD_LIBRARY_PATH=$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export MESHRUN_BUILD=$pk/build

one() {	# one() LIMIT NAME COMMAND... : run, log, print the verdict
	limit=$1 name=$2; shift 2
	start=$(date +%s)
	timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
	rc=$?
	echo "device-run: $name rc=$rc seconds=$(( $(date +%s) - start ))"
	tail -n 4 "$logs/$name.log"
}

for what in "${@:-probe test bench}"; do
	for w in $what; do
		case $w in
		probe)
			nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
			echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
			ldd "$pk/build/meshrun" | grep "not found" ;;
		test)
			for t in test_device_cuda test_cuda_kernels test_cuda_attention \
				 test_cuda_model test_nccl_ops; do
				one 300 "$t" "$pk/build/tests/gpu/$t" --jobs 1 --verbose
			done ;;
		parity)
			for p in fp32 bf16; do
				one 400 "parity_$p" "$pk/build/tests/gpu/test_parity_$p" --jobs 1 --verbose
			done ;;
		bench)	one 300 bench_gpu "$pk/build/bench/gpu" ;;
		torch)	one 300 bench_gpu_torch python3 bench/gpu_torch.py ;;
		sanitize)
			for t in test_cuda_kernels test_device_cuda; do
				one 300 "sanitize_$t" compute-sanitizer --target-processes all \
					"$pk/build/tests/gpu/$t" --jobs 1
			done ;;
		test_*)	one 300 "$w" "$pk/build/tests/gpu/$w" --jobs 1 --verbose ;;
		*)	echo "device-run: unknown '$w'" >&2; exit 2 ;;
		esac
	done
done
