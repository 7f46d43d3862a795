#!/bin/sh
# run.sh - what `make run` runs: the embedded default job on this machine.
#
#   scripts/run.sh [BUILD]
#
# `meshrun local` starts a controller and several agents on loopback; with
# no command after `--` the agents train the default model in-process and
# show live progress. The default job uses every parallel mode that has
# landed: 2 agents x 2 ranks = tensor parallel 2 (with sequence parallel)
# inside each agent, data parallel 2 across them with ZeRO-3, on a GPT with
# a MoE MLP every second layer. Extra options come from MESHRUN_RUN_ARGS.
set -eu
build=${1:-build}
config='{"moe_every": 2, "n_experts": 4, "top_k": 2, "steps": 100}'
# shellcheck disable=SC2086
exec "$build/meshrun" local --nodes 2 --nproc-per-node 2 --tp 2 --sequence-parallel \
	--zero 3 --workload-config "$config" ${MESHRUN_RUN_ARGS:-}
