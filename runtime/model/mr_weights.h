/*
 * mr_weights.h - the meshrun weights file: a model config and every fp32
 * parameter, the exchange format with tests/reference/gen_reference.py.
 *
 * Layout (little-endian):
 *   header: 256 x int32
 *     [0] magic 20261121   [1] version 1
 *     [2] vocab  [3] max_seq  [4] n_layer  [5] d_model  [6] n_head
 *     [7] moe_every  [8] n_experts  [9] top_k
 *     [10] capacity_factor (float32 bits)  [11] aux_coef (float32 bits)
 *     [12] tensor count  [13] parameter count, low 32 bits  [14] high 32 bits
 *     rest 0
 *   body: parameter count x float32, in the order of the model's tensor
 *   table (mr_gpt.tensors; names and shapes in gpt_params.c).
 *
 * Non-goals: sharded checkpoints with optimizer state (the checkpoint
 * module), safetensors export.
 */
#ifndef MR_WEIGHTS_H
#define MR_WEIGHTS_H

#include <stdint.h>

#include "model/mr_gpt.h"

#define MR_WEIGHTS_MAGIC 20261121
#define MR_WEIGHTS_VERSION 1
#define MR_WEIGHTS_HEADER_INTS 256

/* Config slots 2..11 of a header <-> struct (shared with the reference file). */
void mr_weights_pack_config(int32_t *hdr, const struct mr_gpt_config *c);
void mr_weights_unpack_config(const int32_t *hdr, struct mr_gpt_config *c);

/* Writes m's parameters (one rank, whole model). */
int mr_weights_write(const struct mr_gpt *m, const char *path, struct mr_errbuf *eb);
/* Writes nparams floats in table order (e.g. gathered from tp slices). */
int mr_weights_write_buf(const struct mr_gpt_config *cfg, int ntensors, const float *params,
			 size_t nparams, const char *path, struct mr_errbuf *eb);
/* Reads only the config (checked with mr_gpt_config_check). */
int mr_weights_read_config(const char *path, struct mr_gpt_config *c, struct mr_errbuf *eb);
/* Loads the parameters into m (uploaded to its device, compute copy
 * refreshed); the file's config must equal m->cfg. A file that does not
 * fit (config, size, trailing bytes) leaves m as it was. */
int mr_weights_load(struct mr_gpt *m, const char *path, struct mr_errbuf *eb);

#endif
