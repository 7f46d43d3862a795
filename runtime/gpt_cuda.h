/*
 * gpt_cuda.h - the gpt worker's "device": "cuda" path: one rank training
 * a dense GPT on one CUDA device (cuda/mr_cuda_gpt.h) behind the same
 * create / step / eval / weights calls the worker makes on CPU.
 *
 * Built with CUDA (MR_HAVE_CUDA) these wrap the device trainer; without it
 * every call fails with MR_ENOTSUP naming the field "device", so a config
 * asking for a GPU on a CPU-only build fails at create, permanently.
 *
 * Ownership: mr_gpt_cuda_create returns an object freed with
 * mr_gpt_cuda_free (NULL is a no-op). Non-goals: tp/dp on the device
 * (the worker refuses world_size > 1 with device cuda), MoE (refused by
 * the device trainer, naming "moe_every").
 */
#ifndef MR_GPT_CUDA_H
#define MR_GPT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "mr_step.h"

struct mr_gpt_cuda;

/* Scope checks only (no device): the message names the field. */
int mr_gpt_cuda_check(const struct mr_gpt_config *cfg, int B, int T, struct mr_errbuf *eb);
/* Opens device `device`, allocates the model for (B,T) micro-batches and
 * initialises it as mr_gpt_init_params(seed) would. */
int mr_gpt_cuda_create(struct mr_gpt_cuda **out, int device, const struct mr_gpt_config *cfg,
		       int B, int T, const struct mr_adamw_config *ocfg, uint64_t seed,
		       struct mr_errbuf *eb);
void mr_gpt_cuda_free(struct mr_gpt_cuda *g);
/* mr_step_run on the device. */
int mr_gpt_cuda_step(struct mr_gpt_cuda *g, const int *inputs, const int *targets, int accum,
		     struct mr_step_result *r, struct mr_errbuf *eb);
/* Mean loss of one (B,T) batch, no gradients. */
int mr_gpt_cuda_eval(struct mr_gpt_cuda *g, const int *inputs, const int *targets,
		     float *loss, struct mr_errbuf *eb);
/* Writes the model as a weights file (model/mr_weights.h). */
int mr_gpt_cuda_save(struct mr_gpt_cuda *g, const char *path, struct mr_errbuf *eb);
/* Device bytes by category; FLOPs per token for MFU. */
void mr_gpt_cuda_mem(const struct mr_gpt_cuda *g, size_t *bytes);
size_t mr_gpt_cuda_flops_per_token(const struct mr_gpt_cuda *g);

#endif
