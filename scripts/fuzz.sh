#!/bin/sh
# fuzz.sh - run every libFuzzer harness under BUILD/fuzzers for a bounded time.
#
#   scripts/fuzz.sh build/fuzz          (FUZZ_SECONDS=20 by default)
#
# Each harness tests/fuzz/fuzz_<name>.c starts from its committed seed corpus
# tests/fuzz/corpus/<name>/ (copied, so the committed corpus only changes by
# hand). The harnesses run side by side (each is one process on one core),
# so the whole run takes FUZZ_SECONDS. A crash fails the run and leaves the
# reproducer in the work dir.
set -u
build=${1:-build/fuzz}
secs=${FUZZ_SECONDS:-20}
[ -d "$build/fuzzers" ] || { echo "fuzz: no harnesses under $build/fuzzers"; echo "0 passed, 0 failed"; exit 0; }
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd)

# Runs harness $1 in work dir $2; leaves its exit code in $2/rc.
fuzz_one() {
	(cd "$2" && "$1" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 corpus >log 2>&1)
	echo $? >"$2/rc"
}

works=""
for f in "$build"/fuzzers/fuzz_*; do
	[ -x "$f" ] || continue
	name=$(basename "$f" | sed 's/^fuzz_//')
	work=$(mktemp -d)
	mkdir -p "$work/corpus"
	if [ -d "$root/tests/fuzz/corpus/$name" ]; then
		cp "$root/tests/fuzz/corpus/$name"/* "$work/corpus/" 2>/dev/null
	fi
	echo "$name" >"$work/name"
	fuzz_one "$f" "$work" &
	works="$works $work"
done
wait

passed=0 failed=0
for work in $works; do
	name=$(cat "$work/name")
	if [ "$(cat "$work/rc" 2>/dev/null)" = 0 ]; then
		echo "fuzz: ok   $name ($(find "$work/corpus" -type f | wc -l) corpus files, ${secs}s)"
		passed=$((passed + 1))
		rm -rf "$work"
	else
		tail -40 "$work/log"
		echo "fuzz: FAIL $name (reproducer and log in $work)"
		failed=$((failed + 1))
	fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
