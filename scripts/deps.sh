#!/bin/sh
# deps.sh - install the Debian packages meshrun needs to build, test and bench.
#
# Idempotent: packages already installed are skipped. As root it runs
# apt-get; otherwise it prints the exact command to run and exits 1.
#
#   scripts/deps.sh            build + test dependencies
#   scripts/deps.sh build      build dependencies only (the image build:
#                              `make DEPS=build install`)
#   scripts/deps.sh bench      also the benchmark anchors (wrk, nginx, ...)
#   scripts/deps.sh k8s        also the Kubernetes packaging tests: node + npm
#                              (Debian's, unless a node with npm is there),
#                              unzip, then the pinned npm tools and helm
#                              (scripts/k8s-tools.sh, npm ci from a lockfile)
#
# Non-goals: CUDA. nvcc/cuBLAS/NCCL are found under /usr/local/cuda when the
# machine has them; the build detects and reports them, never installs them.
set -eu

BUILD="build-essential pkg-config libcurl4-openssl-dev libjansson-dev \
libmicrohttpd-dev libgnutls28-dev libcriterion-dev libopenblas-dev libpcre2-dev"
TEST="clang libclang-rt-14-dev cppcheck shellcheck yamllint valgrind \
prometheus python3-torch python3-regex curl openssl nftables openmpi-bin libopenmpi-dev"
BENCH="wrk hyperfine nginx-light"

K8S="unzip"
# a NodeSource node ships its own npm (Debian's npm package would conflict)
command -v npm >/dev/null 2>&1 || K8S="$K8S nodejs npm"

want="$BUILD $TEST"
[ "${1:-}" = build ] && want="$BUILD"
[ "${1:-}" = bench ] && want="$want $BENCH"
[ "${1:-}" = k8s ] && want="$want $K8S"

missing=""
for p in $want; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
k8s_tools() {
	[ "${1:-}" = k8s ] || return 0
	exec "$(dirname "$0")/k8s-tools.sh"
}
[ -z "$missing" ] && k8s_tools "${1:-}" && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing packages:$missing" >&2
	echo "deps: run: sudo apt-get update && sudo apt-get install -y --no-install-recommends$missing" >&2
	exit 1
fi

echo "deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "deps: done" >&2
k8s_tools "${1:-}"
