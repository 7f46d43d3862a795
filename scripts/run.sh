#!/bin/sh
# run.sh - what `make run` runs: the embedded default job on this machine.
#
#   scripts/run.sh [BUILD]
#
# `meshrun local` starts a controller and several agents on loopback; with
# no command after `--` the agents train the default model in-process and
# show live progress. The default job uses all five parallel modes at
# once: 4 agents x 4 ranks = tensor parallel 2 (with sequence parallel)
# x context parallel 2 (each sequence split in 4 chunks over 2 ranks)
# x pipeline parallel 2 (zero-bubble schedule, 4 micro-batches a step)
# x data parallel 2 across the agents, on a 4-layer GPT with a MoE MLP
# every second layer whose 4 experts are split over 2 ranks (expert
# parallel 2, carved from dp x cp; dropless routing), the optimizer
# state sharded ZeRO-1 (the dense tensors' over dp x cp, the experts' over
# the expert-data-parallel ranks). About 30 s on 2 cores. Extra options
# come from MESHRUN_RUN_ARGS.
set -eu
build=${1:-build}
config='{"n_layer": 4, "moe_every": 2, "n_experts": 4, "top_k": 2, "steps": 100,
 "grad_accum": 4, "pp_schedule": "zb-h1", "moe_policy": "dropless"}'
# shellcheck disable=SC2086
exec "$build/meshrun" local --nodes 4 --nproc-per-node 4 --tp 2 --cp 2 --pp 2 \
	--sequence-parallel --ep 2 --zero 1 --workload-config "$config" ${MESHRUN_RUN_ARGS:-}
