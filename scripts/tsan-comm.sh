#!/bin/sh
# tsan-comm.sh - ThreadSanitizer run of the host communicator backend.
#
#   scripts/tsan-comm.sh [BUILD]      (default build dir: build)
#
# Compiles runtime/comm (host backend) + the error/log helpers with
# clang -fsanitize=thread together with tests/comm/tsan_comm.c (a plain
# driver of the threaded test scenarios: Criterion's arena does not run
# under TSan) and runs it. Exits non-zero on any data race or failure.
set -eu
build=${1:-build}
out="$build/tsan-comm"
mkdir -p "$out"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
srcs=""
for f in runtime/comm/*.c; do
	[ "$f" = runtime/comm/nccl.c ] || srcs="$srcs $f"
done
# shellcheck disable=SC2086
clang -D_GNU_SOURCE -Icommon -Iruntime -std=c11 -g -O1 -fsanitize=thread \
	-Wall -Wextra -Werror -pthread -o "$out/tsan_comm" $srcs common/err.c common/log.c \
	tests/comm/tsan_comm.c
if "$out/tsan_comm"; then
	echo "tsan-comm: ok"
else
	echo "tsan-comm: FAILED"
	exit 1
fi
