/*
 * mr_gpt_worker.h - the GPT training workload behind struct mr_worker_ops
 * (mr_worker.h): one rank of a job, placed in the mesh by env (tp and pp
 * from the mesh, dp = world / (tp * pp)).
 *
 * env->config is a flat JSON object; every key is optional and unknown keys
 * are rejected (the message names them):
 *
 *   model   vocab_size 256, max_seq (= seq_len), n_layer 2, d_model 128,
 *           n_head 4, moe_every 0, n_experts 4, top_k 1,
 *           capacity_factor 1.25, aux_coef 0.01, moe_policy "capacity"
 *           (each expert takes ceil(capacity_factor * N * top_k / E) of a
 *           micro-batch's N tokens, the rest dropped) or "dropless"
 *           (model/mr_moe.h)
 *   context (cp > 1) cp_algo "ring" (K/V passed around the cp ring while
 *           each block computes), "allgather" or "ulysses" (heads
 *           exchanged all-to-all; n_head / tp divisible by cp)
 *           (parallel/mr_cp.h)
 *   train   batch_size 8, seq_len 64, steps 100, grad_accum 1, lr 1e-3,
 *           min_lr_frac 0.1, warmup_steps 10, beta1 0.9, beta2 0.95,
 *           eps 1e-8, weight_decay 0.1, grad_clip 1.0, seed 1337
 *   run     device "cpu" or "cuda" (GPU local_rank; device/mr_device.h),
 *           precision (cpu: "fp32"; cuda: "bf16" - bf16 activations, fp32
 *           master weights, gradients and AdamW state - or "fp32"),
 *           comm_backend "auto" ("nccl" on GPUs NCCL reaches when every
 *           local rank has its own, else "host", which stages device
 *           buffers through host memory), "host" or "nccl";
 *           threads (0 = CPUs / local_world_size),
 *           peak_flops (FLOP/s for MFU; 0 = one thread's sgemm FLOP/s,
 *           measured once per machine (cpu/mr_peak.h), x threads),
 *           eval_every 0 (steps between validation losses; 0 = never:
 *           stats carry val_loss NaN and nothing prints it),
 *           eval_batches 4
 *
 *   data    train_data, val_data: llm.c token shards (data/mr_shard.h);
 *           without them the synthetic task (data/mr_synth.h): training
 *           rows from stream 0, validation rows from stream 1. Step s of
 *           a job with dp data-parallel ranks uses micro-batches
 *           j = (s*dp + dp_rank)*grad_accum + a, rows j*batch_size..: the
 *           same rows one rank reads with grad_accum*dp.
 *   parallel sequence_parallel false (needs tp > 1), zero 0 (0 DDP, 1, 2,
 *           3 = FSDP; under a pipeline 2 and 3 run as 1, see
 *           parallel/mr_pp.h), hsdp_shard 0 (shard ZeRO state within
 *           groups of this many dp ranks, replicate across them),
 *           comm_timeout_ms 60000 (every collective and pipeline transfer)
 *   pipeline (pp > 1) pp_schedule "1f1b", "gpipe", "interleaved" or
 *           "zb-h1" (parallel/mr_pp_sched.h); pp_virtual (model chunks per
 *           stage: 2 for interleaved, else 1); pp_layers: blocks per
 *           virtual stage, in order (default: balanced by cost,
 *           parallel/mr_pp_split.h); grad_accum is the micro-batch count;
 *           pp_p2p "auto" (= "paired" on NCCL, else "ahead"): receives
 *           posted as early as their buffers allow, or each posted at its
 *           pass, grouped with the send before it (parallel/mr_pp.h)
 *   output  loss_log: rank 0 writes "step loss aux_loss grad_norm lr" per
 *           step; save_weights: the gathered model at the end, as a
 *           weights file (model/mr_weights.h)
 *   debug   for testing hang diagnosis and straggler detection on purpose
 *           (docs/DIAGNOSIS.md); never set them in a real job:
 *           debug_stall_rank -1, debug_stall_step 0: that rank stops at
 *           the start of that step - no collective, no progress - until
 *           the worker is aborted, as a hung rank would (a "debug_stall"
 *           warning is logged); debug_slow_rank -1, debug_slow_ms 0: that
 *           rank sleeps so long in every step (a straggler);
 *           debug_ckpt_fail_rank -1, debug_ckpt_fail_step 0: that rank's
 *           part of the checkpoint at that step fails as on a full disk,
 *           leaving no marker for rank 0 with debug_ckpt_fail_unmarked
 *           (docs/CHECKPOINTS.md "When a write fails")
 *
 * Every device and mode runs one code path: the model on the rank's
 * device, placed in the mesh, under the step driver (gpt_worker_setup.c).
 *
 * Bad input (unknown key, out-of-range value, tp not dividing the heads,
 * sequence parallel with a seq_len tp does not divide, hsdp_shard not
 * dividing dp) fails create() before any communication, naming the field.
 * A vocabulary tp does not divide is padded, not rejected.
 *
 * Non-goals: checkpoints with optimizer state.
 */
#ifndef MR_GPT_WORKER_H
#define MR_GPT_WORKER_H

#include "mr_worker.h"

extern const struct mr_worker_ops mr_gpt_worker;

/* Checks what create() checks before it knows the mesh: every key known,
 * of its type and in its bounds (the message names the key). 0 or an
 * MR_E* code; config may be NULL (all defaults). For the agent, so a bad
 * workload config exits 2 before the job starts. */
int mr_gpt_worker_check_config(const json_t *config, struct mr_errbuf *eb);

/* Ranks first .. first + n - 1 of a job of `world` ranks in the mesh
 * tp x pp x cp x ep (dp derived): those of one machine. */
struct mr_gpt_worker_ranks {
	int world, tp, pp, cp, ep;
	int first, n;
};

/* Whether ranks r of config's job fit this machine's host memory
 * (MemAvailable, within the memory cgroup's limit) by the planner's
 * ledger, before anything is allocated: 0 (also when it cannot tell: a
 * cuda device, a fixed pp_layers split), or MR_ELIMIT naming what they
 * need, what the machine has and what to change (gpt_worker_fit.c). */
int mr_gpt_worker_fits(const json_t *config, const struct mr_gpt_worker_ranks *r,
		       struct mr_errbuf *eb);
/* What ranks r need and the machine has, for people, into buf: 1 when it
 * does not fit, 0 when it does, -1 when the planner cannot tell. */
int mr_gpt_worker_need(const json_t *config, const struct mr_gpt_worker_ranks *r, char *buf,
		       size_t cap);

struct mr_place;
/*
 * Where create() would place env->rank, without a device, a model or any
 * communication: config read as create() reads it (defaults, bounds), the
 * rank's coordinates in the mesh of env's sizes (rank, world_size, tp,
 * pp, cp, ep; nothing else of env is read) and the pipeline split (the
 * balanced one, or "pp_layers"), checked against the model and the
 * schedule as create() checks them. *where gets the blocks the rank
 * holds: where->chunks ranges [layer_lo, layer_hi), or chunks 0 for the
 * whole model; *n_layer (may be NULL) the model's block count. Errors
 * name the field. For `meshrun mesh`.
 */
int mr_gpt_worker_place(const json_t *config, const struct mr_worker_env *env,
			struct mr_place *where, int *n_layer, struct mr_errbuf *eb);

#endif
