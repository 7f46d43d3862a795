#!/bin/sh
# run.sh - what `make run` runs: the embedded default job on this machine.
#
#   scripts/run.sh [BUILD]
#
# `meshrun local` starts a controller and several agents on loopback; with
# no command after `--` the agents train the default model in-process and
# show live progress. Extra options come from MESHRUN_RUN_ARGS.
set -eu
build=${1:-build}
# shellcheck disable=SC2086
exec "$build/meshrun" local --nodes 2 --nproc-per-node 2 ${MESHRUN_RUN_ARGS:-}
