#!/bin/sh
# test.sh - run every Criterion test binary under BUILD/tests and sum up.
#
#   scripts/test.sh build          normal build
#   scripts/test.sh build/asan     sanitizer build
#
# Each binary gets MESHRUN_BUILD=<its build dir> so integration tests start
# the real meshrun-controller / meshrun-agent / meshrun from the same build.
# Prints per-binary Criterion output and a closing "N passed, N failed" line.
set -u
build=${1:-build}
[ -d "$build/tests" ] || { echo "test: no tests under $build/tests" >&2; exit 1; }
MESHRUN_BUILD=$(cd "$build" && pwd)
export MESHRUN_BUILD
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

passed=0 failed=0 bad=""
for t in $(find "$build/tests" -type f -name 'test_*' -perm -u+x | sort); do
	name=${t#"$build/tests/"}
	out=$(mktemp)
	start=$(date +%s)
	"$t" --jobs 2 --timeout 300 >"$out" 2>&1
	rc=$?
	secs=$(( $(date +%s) - start ))
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
	rm -f "$out"
done
[ -n "$bad" ] && echo "test: failing:$bad"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
