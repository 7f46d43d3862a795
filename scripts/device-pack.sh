#!/bin/sh
# device-pack.sh - pack the GPU tests, bench/gpu and the meshrun binaries,
# with the shared libraries they need beyond glibc, libstdc++ and CUDA, into
# one folder for a GPU machine that has CUDA but none of our build
# dependencies (no libjansson, libcriterion, libcurl, OpenBLAS).
#
#   scripts/device-pack.sh [BUILD] [OUT]     (defaults: build .devpkg)
#
# On the GPU machine: OUT/run.sh [test|bench|all] runs `make test-gpu` and
# `make bench-gpu`'s programs from the pack, with libnccl and cuBLAS found
# wherever that machine keeps them (the CUDA toolkit or the pip wheels).
set -eu
build=${1:-build}
out=${2:-.devpkg}
rm -rf "$out"
mkdir -p "$out/build/tests/gpu" "$out/build/bench" "$out/lib"

bins="$build/meshrun $build/meshrun-agent $build/meshrun-controller $build/bench/gpu"
for t in "$build"/tests/gpu/test_*; do
	case $t in *.d) ;; *) bins="$bins $t" ;; esac
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
du -sh "$out"
