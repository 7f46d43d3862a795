/*
 * mr_gpt_worker.h - the GPT training workload behind struct mr_worker_ops
 * (mr_worker.h), single rank for now.
 *
 * env->config is a flat JSON object; every key is optional and unknown keys
 * are rejected (the message names them):
 *
 *   model   vocab_size 256, max_seq (= seq_len), n_layer 2, d_model 128,
 *           n_head 4, moe_every 0, n_experts 4, top_k 1,
 *           capacity_factor 1.25, aux_coef 0.01
 *   train   batch_size 8, seq_len 64, steps 100, grad_accum 1, lr 1e-3,
 *           min_lr_frac 0.1, warmup_steps 10, beta1 0.9, beta2 0.95,
 *           eps 1e-8, weight_decay 0.1, grad_clip 1.0, seed 1337
 *   run     threads (0 = CPUs / local_world_size), peak_flops (FLOP/s for
 *           MFU; 0 = measure sgemm at start), eval_every 0 (steps between
 *           validation losses; 0 = never), eval_batches 4
 *
 *   data    train_data, val_data: llm.c token shards (data/mr_shard.h);
 *           without them the synthetic task (data/mr_synth.h): training
 *           rows from stream 0, validation rows from stream 1.
 *
 * Non-goals: parallel modes (they wrap this workload), checkpoints.
 */
#ifndef MR_GPT_WORKER_H
#define MR_GPT_WORKER_H

#include "mr_worker.h"

extern const struct mr_worker_ops mr_gpt_worker;

#endif
