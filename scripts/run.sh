#!/bin/sh
# run.sh - what `make run` runs: the embedded default job on this machine.
#
#   scripts/run.sh [BUILD]
#
# `meshrun local` starts a controller and several agents on loopback; with
# no command after `--` the agents train the default model in-process and
# show live progress. The default job uses every parallel mode that has
# landed: 2 agents x 4 ranks = tensor parallel 2 (with sequence parallel)
# x pipeline parallel 2 (zero-bubble schedule, 4 micro-batches a step)
# x data parallel 2 across the agents, on a 4-layer GPT with a MoE MLP
# every second layer whose 4 experts are split over the 2 data-parallel
# ranks (expert parallel 2). Expert parallelism runs with DDP so far, so
# the default shows no ZeRO (`MESHRUN_RUN_ARGS="--ep 1 --zero 1"` does).
# Extra options come from MESHRUN_RUN_ARGS.
set -eu
build=${1:-build}
config='{"n_layer": 4, "moe_every": 2, "n_experts": 4, "top_k": 2, "steps": 100,
 "grad_accum": 4, "pp_schedule": "zb-h1"}'
# shellcheck disable=SC2086
exec "$build/meshrun" local --nodes 2 --nproc-per-node 4 --tp 2 --pp 2 --sequence-parallel \
	--ep 2 --workload-config "$config" ${MESHRUN_RUN_ARGS:-}
