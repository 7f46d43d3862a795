/*
 * gpt_int.cuh - internals shared by gpt.cu (allocation, parameters,
 * ledger) and gpt_train.cu (forward, backward, optimizer step) of the
 * device GPT (see mr_cuda_gpt.h).
 *
 * Non-goals: anything callable from C.
 */
#ifndef MR_CUDA_GPT_INT_CUH
#define MR_CUDA_GPT_INT_CUH

#include "cuda/mr_cuda_gpt.h"

/* Offsets (elements) of one layer's tensors in the parameter table. */
struct mr__cg_layer_off {
	size_t ln1w, ln1b, qkvw, qkvb, attprojw, attprojb;
	size_t ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};

/* One layer's saved activations (N = B*T rows). */
struct mr__cg_layer_acts {
	mr_bf16 *ln1, *qkv, *atty, *res2;   /* (N,C), (N,3C), (N,C), (N,C) */
	mr_bf16 *ln2, *fch, *fch_gelu, *res3; /* (N,C), (N,4C), (N,4C), (N,C) */
	float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd; /* (N) */
	float *att_lse;                      /* (B,NH,T) */
};

struct mr_cuda_gpt {
	struct mr_cuda *cu;       /* borrowed */
	struct mr_gpt tbl;        /* table only: shape (1,1), no params/grads */
	struct mr_adamw_config ocfg;
	long t;                   /* AdamW steps taken */
	int B, T;
	size_t n;                 /* parameters */
	struct mr_mem mem;        /* device ledger */

	/* one device allocation per ledger category */
	void *d_params, *d_grads, *d_optim, *d_acts, *d_ws;
	size_t b_params, b_grads, b_optim, b_acts, b_ws;

	float *p32;               /* (n) fp32 master */
	mr_bf16 *p16;             /* (n) bf16 copy */
	float *grads;             /* (n) */
	float *m, *v;             /* (n) each */

	size_t wte, wpe, lnfw, lnfb; /* table offsets */
	struct mr__cg_layer_off *lo; /* (L) */

	struct mr__cg_layer_acts *la; /* (L) */
	int *tok, *tgt;           /* (N) device ids of the current batch */
	mr_bf16 *encoded;         /* (N,C) */
	mr_bf16 *lnf;             /* (N,C) */
	float *lnf_mean, *lnf_rstd; /* (N) */
	mr_bf16 *logits;          /* (N,V); dlogits in place after backward */
	float *losses, *ce_lse;   /* (N) */

	mr_bf16 *dres, *dln, *datty; /* (N,C) each */
	mr_bf16 *dqkv;            /* (N,3C) */
	mr_bf16 *dfch;            /* (N,4C) */
	float *delta;             /* (B,NH,T) */

	int *tok_host;            /* (N) inputs of the last forward */
	float *loss_host;         /* (N) */
	int has_targets;          /* the last forward had targets */
	float loss;               /* of the last forward */
};

/* Records a failed device call in eb: "<what> failed: <cuda message>". */
int mr__cg_fail(struct mr_cuda_gpt *g, int rc, const char *what, struct mr_errbuf *eb);

#endif
