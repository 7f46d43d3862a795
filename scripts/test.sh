#!/bin/sh
# test.sh - run every Criterion test binary under BUILD/tests and sum up.
#
#   scripts/test.sh build          normal build
#   scripts/test.sh build/asan     sanitizer build
#
# Each binary gets MESHRUN_BUILD=<its build dir> so integration tests start
# the real meshrun-controller / meshrun-agent / meshrun from the same build.
# Two lanes: tests/agent and tests/pods (whole jobs of processes that
# mostly wait - for heartbeats, restarts, killed pods, cut networks:
# test_chaos spends 0.6 of a core over its two minutes) run in the
# background beside the rest, which is compute. Prints per-binary Criterion output (the agent lane's after the
# other's) and a closing "N passed, N failed" line.
set -u
build=${1:-build}
[ -d "$build/tests" ] || { echo "test: no tests under $build/tests" >&2; exit 1; }
MESHRUN_BUILD=$(cd "$build" && pwd)
export MESHRUN_BUILD
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# tests/gpu run on a real GPU only: without one each test would load the
# CUDA side just to skip (make test-gpu runs them on a GPU machine) - but
# test_cudnn_graph, which needs no GPU (it skips where libcudnn is absent)
gpu_dev=0
ls /dev/nvidia[0-9]* >/dev/null 2>&1 && gpu_dev=1

lanes=$(mktemp -d)
trap 'rm -rf "$lanes"' EXIT

# Runs the binaries named on the command line, one after the other; prints
# a line per binary (the whole output of a failing one) and leaves
# "passed failed names-of-failing" in $lanes/$lane.sum.
run_lane() {
	lane=$1
	shift
	passed=0 failed=0 bad=""
	for t in "$@"; do
		name=${t#"$build/tests/"}
		out="$lanes/$lane.out"
		start=$(date +%s)
		"$t" --jobs 2 --timeout 300 >"$out" 2>&1
		rc=$?
		secs=$(($(date +%s) - start))
		syn=$(grep 'Synthesis:' "$out" | tail -1)
		p=$(echo "$syn" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p')
		f=$(echo "$syn" | sed -n 's/.*Failing: \([0-9]*\).*Crashing: \([0-9]*\).*/\1 \2/p')
		fl=0
		for n in $f; do fl=$((fl + n)); done
		[ -n "$p" ] || p=0
		if [ $rc -ne 0 ] && [ $fl -eq 0 ]; then fl=1; fi
		passed=$((passed + p))
		failed=$((failed + fl))
		if [ $fl -ne 0 ]; then
			bad="$bad $name"
			cat "$out"
			echo "test: FAIL $name (rc=$rc, ${secs}s)"
		else
			echo "test: ok   $name: $p passed (${secs}s)"
		fi
		# summary lines a test prints for the log (e.g. test_chaos)
		grep -E "^(chaos|recovery) kills=" "$out" | sed "s|^|test:      $name: |"
	done
	echo "$passed $failed$bad" >"$lanes/$lane.sum"
}

compute="" waiting=""
for t in $(find "$build/tests" -type f -name 'test_*' -perm -u+x | sort); do
	name=${t#"$build/tests/"}
	case $name in
	gpu/test_cudnn_graph) # host-only: cuDNN's own engines judge the graphs
		compute="$compute $t" ;;
	gpu/*)
		if [ $gpu_dev -eq 0 ]; then
			echo "test: skip $name: no NVIDIA device (/dev/nvidia0)"
		else
			compute="$compute $t"
		fi ;;
	agent/* | pods/*) waiting="$waiting $t" ;;
	*) compute="$compute $t" ;;
	esac
done

# shellcheck disable=SC2086 # the lists are space-separated paths
run_lane agent $waiting >"$lanes/agent.log" 2>&1 &
# shellcheck disable=SC2086
run_lane compute $compute
wait
cat "$lanes/agent.log"

for lane in compute agent; do
	[ -s "$lanes/$lane.sum" ] || echo "0 1 (the $lane lane did not finish)" >"$lanes/$lane.sum"
done
read -r p1 f1 bad1 <"$lanes/compute.sum"
read -r p2 f2 bad2 <"$lanes/agent.sum"
passed=$((p1 + p2))
failed=$((f1 + f2))
bad="$bad1 $bad2"
[ "$failed" -ne 0 ] && echo "test: failing: $bad"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
