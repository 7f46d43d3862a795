#!/bin/sh
# device-pack.sh - pack what the GPU lease runs into one folder for a GPU
# machine that has CUDA but none of our build dependencies (no libjansson,
# libcriterion, libcurl, OpenBLAS): the meshrun binaries and the CUDA
# plugin they load (meshrun-cuda.so), bench/gpu, the GPU tests, the
# emulated device's twins (to check the pack and its script here), and
# every shared library they need beyond glibc, libstdc++ and CUDA's own.
#
#   scripts/device-pack.sh [BUILD] [OUT]     (defaults: build .devpkg)
#
# The folder is ~95 MB, over the 64 MiB a device call carries with the
# repository, so what travels is OUT.tgz (~32 MB: gzip, which every image
# unpacks), named in the call's carry; both are git-ignored. The pack
# fails here when the archive is over PACK_MAX_MB (48: the repository's
# own ~8 MB travels beside it).
#
# On the GPU machine: tar xzf OUT.tgz && OUT/run.sh all (device-run.sh) runs the
# lease's check from the pack, with libnccl and cuBLAS found wherever that
# machine keeps them (the CUDA toolkit or the pip wheels). A build without
# the plugin (no nvcc) cannot make a pack: on a GPU its binaries could not
# use the GPU, so it fails here rather than there.
set -eu
build=${1:-build}
out=${2:-.devpkg}
[ -f "$build/meshrun-cuda.so" ] || {
	echo "device-pack: no $build/meshrun-cuda.so (a build with nvcc: make all)" >&2
	exit 1
}
rm -rf "$out"
mkdir -p "$out/build/tests/gpu" "$out/build/tests/gpu-emul" "$out/build/bench" \
	"$out/build/emul" "$out/lib"

bins="$build/meshrun $build/meshrun-agent $build/meshrun-controller $build/meshrun-cuda.so"
bins="$bins $build/bench/gpu"
# the emulated twins of what run.sh runs (EMUL=1: the script's own check)
for t in "$build"/tests/gpu/test_* "$build"/emul/* \
	"$build"/tests/gpu-emul/test_device_cuda "$build"/tests/gpu-emul/test_cuda_model \
	"$build"/tests/gpu-emul/test_cuda_graphs \
	"$build"/tests/gpu-emul/test_parity_fp32 "$build"/tests/gpu-emul/test_parity_bf16; do
	case $t in *.d) ;; *) [ -f "$t" ] && bins="$bins $t" ;; esac
done
for b in $bins; do
	dst="$out/build/${b#"$build"/}"
	cp "$b" "$dst"
	strip --strip-debug "$dst"
done
# every library one of them loads, except the system's own and CUDA's
for b in $bins; do ldd "$b"; done | awk '$3 ~ /^\// { print $3 }' | sort -u |
while read -r lib; do
	case $lib in
	/usr/local/cuda*|*/libc.so.*|*/libm.so.*|*/libpthread.so.*|*/librt.so.*|\
	*/libdl.so.*|*/libstdc++.so.*|*/libgcc_s.so.*|*/libresolv.so.*) ;;
	*) cp -L "$lib" "$out/lib/" ;;
	esac
done
cp scripts/device-run.sh "$out/run.sh"
rm -f "$out.tgz"
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
mb=$(($(wc -c <"$out.tgz") / 1048576))
echo "device-pack: $out ($(du -sh "$out" | cut -f1)), carried as $out.tgz (${mb} MiB)"
[ "$mb" -le "${PACK_MAX_MB:-48}" ] || {
	echo "device-pack: $out.tgz is ${mb} MiB, over ${PACK_MAX_MB:-48}: it would not travel" >&2
	exit 1
}
