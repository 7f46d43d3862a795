/*
 * mr_gpt.h - the GPT-2 model (llm.c layout) with optional MoE MLP layers:
 * parameters, activations, hand-written forward and backward, fp32, CPU.
 *
 * Architecture: token + learned position embedding, n_layer pre-LayerNorm
 * blocks (causal multi-head attention, then a GELU(tanh) 4x MLP, or a MoE
 * MLP on every moe_every-th layer: layers moe_every-1, 2*moe_every-1, ...),
 * a final LayerNorm, and an LM head tied to the token embedding. Loss is the
 * mean token cross-entropy plus aux_coef times the sum over MoE layers of
 * their load-balancing loss (see mr_moe.h).
 *
 * Memory: ONE allocation holds every parameter, one every gradient (same
 * layout), one every activation; struct mr_gpt_weights gives pointer views
 * into them. The parameter order is a fixed table (mr_gpt.tensors) -
 * embeddings, then each layer contiguously, then the final LayerNorm - used
 * by the weights file, the optimizer and the reference test alike, so a
 * pipeline stage owns a contiguous range and any tensor can be sharded by
 * offset.
 *
 * Ownership: the caller owns struct mr_gpt (mr_gpt_create / mr_gpt_release)
 * and the pool it passes (borrowed until release).
 *
 * Non-goals: dropout, generation/sampling, tensor parallel splits (they
 * slot in by giving mr_gpt_create a shard spec; not done here).
 */
#ifndef MR_GPT_H
#define MR_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "cpu/mr_pool.h"
#include "mr_err.h"
#include "mr_mem.h"
#include "model/mr_moe.h"

struct mr_gpt_config {
	int vocab;        /* V, vocabulary size */
	int max_seq;      /* maxT, rows of the position embedding */
	int n_layer;      /* L */
	int d_model;      /* C */
	int n_head;       /* NH, divides C */
	int moe_every;    /* 0: dense; k: layers k-1, 2k-1, ... are MoE */
	int n_experts;    /* E (MoE only) */
	int top_k;        /* 1 or 2 (MoE only) */
	float capacity_factor; /* > 0 (MoE only) */
	float aux_coef;   /* load-balancing loss coefficient (MoE only) */
};

/* Checks the config; the message names the offending field. */
int mr_gpt_config_check(const struct mr_gpt_config *c, struct mr_errbuf *eb);
/* 1 if layer l has a MoE MLP. */
int mr_gpt_layer_is_moe(const struct mr_gpt_config *c, int l);

enum mr_gpt_init { MR_INIT_ZERO, MR_INIT_ONE, MR_INIT_NORMAL };

struct mr_gpt_tensor {
	char name[32];     /* "h.0.attn.qkv.w" */
	int ndim, shape[3];
	size_t off, n;     /* offset into params/grads, element count */
	int decay;         /* 1: weight decay applies (matrices, embeddings) */
	enum mr_gpt_init init;
	float std;         /* MR_INIT_NORMAL only */
};

/* Pointer views; for MoE layers fcw..fcprojb hold E experts. */
struct mr_gpt_layer_w {
	float *ln1w, *ln1b;     /* (C) */
	float *qkvw, *qkvb;     /* (3C, C), (3C) */
	float *attprojw, *attprojb; /* (C, C), (C) */
	float *ln2w, *ln2b;     /* (C) */
	float *routerw;         /* (E, C), MoE only */
	float *fcw, *fcb;       /* ([E,] 4C, C), ([E,] 4C) */
	float *fcprojw, *fcprojb; /* ([E,] C, 4C), ([E,] C) */
};

struct mr_gpt_weights {
	float *wte;             /* (V, C) also the LM head */
	float *wpe;             /* (maxT, C) */
	struct mr_gpt_layer_w *layer; /* (L) */
	float *lnfw, *lnfb;     /* (C) */
};

struct mr_gpt_layer_acts {
	float *ln1, *ln1_mean, *ln1_rstd; /* (N,C), (N), (N) */
	float *qkv;             /* (N,3C) */
	float *atty;            /* (N,C) attention output before projection */
	float *att_lse;         /* (B,NH,T) per-row logsumexp */
	float *res2;            /* (N,C) residual after attention */
	float *ln2, *ln2_mean, *ln2_rstd;
	float *fch, *fch_gelu;  /* (N,4C) dense MLP only */
	struct mr_moe_acts moe; /* MoE only */
	float *res3;            /* (N,C) residual after the MLP */
};

struct mr_gpt {
	struct mr_gpt_config cfg;
	int B, T;               /* micro-batch shape the activations hold */
	struct mr_pool *pool;   /* borrowed */
	struct mr_mem mem;      /* accounting of everything below */

	int ntensors;
	struct mr_gpt_tensor *tensors;
	size_t nparams;
	float *params, *grads;
	struct mr_gpt_weights w, g;

	size_t nacts, nws;
	float *acts, *ws;
	struct mr_gpt_layer_acts *la;
	int *inputs, *targets;  /* (N) copies of the current batch */
	float *encoded;         /* (N,C) */
	float *lnf, *lnf_mean, *lnf_rstd;
	float *logits;          /* (N,V); dlogits in place after backward */
	float *ce_lse, *losses; /* (N) */
	/* workspace */
	float *ones;            /* (N) all 1, for bias gradients */
	float *dres, *dln, *datty, *dqkv, *dfch, *dtmp; /* backward scratch */
	float *k_ws;            /* kernel workspace (attention, layernorm) */

	float loss;             /* mean cross-entropy of the last forward */
	float aux_loss;         /* sum over MoE layers (before aux_coef) */
	struct mr_moe_xchg xchg; /* dispatch/combine exchange (identity) */
};

int mr_gpt_create(struct mr_gpt *m, const struct mr_gpt_config *cfg, int B, int T,
		  struct mr_pool *pool, struct mr_errbuf *eb);
void mr_gpt_release(struct mr_gpt *m);
/* GPT-2 init from (seed, tensor index) streams; see gpt_params.c. */
void mr_gpt_init_params(struct mr_gpt *m, uint64_t seed);
/* Finds a tensor by name; NULL if absent. */
const struct mr_gpt_tensor *mr_gpt_find(const struct mr_gpt *m, const char *name);
/* Weight-tensor count without the embeddings' duplicates: N in 6N. */
size_t mr_gpt_flops_per_token(const struct mr_gpt *m);

/* inputs/targets (B,T) token ids, checked to be in [0, V): MR_ERANGE names
 * the first bad one. targets may be NULL (no loss). */
int mr_gpt_forward(struct mr_gpt *m, const int *inputs, const int *targets,
		   struct mr_errbuf *eb);
void mr_gpt_zero_grad(struct mr_gpt *m);
/* Adds d(loss * dscale)/dparams into grads; after a forward with targets.
 * Use dscale = 1/micro_batches for gradient accumulation. */
void mr_gpt_backward(struct mr_gpt *m, float dscale);

#endif
