/*
 * gpt.cu - the device GPT's checks, allocation (with the byte ledger),
 * parameter table and parameter/optimizer-state transfers (see
 * mr_cuda_gpt.h; the passes and the step are in gpt_train.cu).
 *
 * The parameter table is the CPU model's own: a host struct mr_gpt of
 * shape (1,1) with ext_params/ext_grads (so it holds no parameters, only
 * the table and a few KiB of one-token activations) is created with the
 * same config, and every offset below is looked up in it by tensor name.
 * Device buffers are carved from one allocation per category at 256-byte
 * aligned offsets (cuBLASLt picks its fastest kernels for 16-byte+
 * alignment; 256 matches cudaMalloc's own).
 *
 * Non-goals: the CPU model's units/hooks (ZeRO, pipeline), tp > 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_int.cuh"

#define CARVE_ALIGN 256

int mr__cg_fail(struct mr_cuda_gpt *g, int rc, const char *what, struct mr_errbuf *eb)
{
	return mr_errf(eb, rc, "cuda %s failed: %s", what, mr_cuda_errmsg(g->cu));
}

extern "C" int mr_cuda_gpt_check(const struct mr_gpt_config *cfg, int B, int T,
				 struct mr_errbuf *eb)
{
	int rc = mr_gpt_config_check(cfg, eb), hs;

	if (rc < 0)
		return rc;
	if (B < 1 || B > (1 << 20))
		return mr_errf_field(eb, MR_EINVAL, "batch_size",
				     "'batch_size' must be in [1, %d], got %d", 1 << 20, B);
	if (T < 1 || T > cfg->max_seq)
		return mr_errf_field(eb, MR_EINVAL, "seq_len",
				     "'seq_len' must be in [1, max_seq=%d], got %d", cfg->max_seq,
				     T);
	if (cfg->moe_every != 0)
		return mr_errf_field(eb, MR_EINVAL, "moe_every",
				     "'moe_every' must be 0 on a cuda device (MoE layers need "
				     "device routing, not implemented), got %d",
				     cfg->moe_every);
	hs = cfg->d_model / cfg->n_head;
	if (hs % 32 != 0 || hs > 128)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "head size d_model/n_head = %d/%d = %d must be a multiple of "
				     "32 and at most 128 on a cuda device",
				     cfg->d_model, cfg->n_head, hs);
	if ((long)B * cfg->n_head > 65535)
		return mr_errf_field(eb, MR_EINVAL, "batch_size",
				     "batch_size * n_head = %ld is above the cuda limit 65535",
				     (long)B * cfg->n_head);
	if ((long long)B * T > (1 << 30) / 4)
		return mr_errf_field(eb, MR_EINVAL, "batch_size",
				     "batch_size * seq_len = %lld is above the cuda limit %d",
				     (long long)B * T, (1 << 30) / 4);
	return 0;
}

/* ---- ledger and carving ------------------------------------------------------ */

static int dev_alloc(struct mr_cuda_gpt *g, enum mr_mem_kind kind, void **p, size_t bytes)
{
	int rc = mr_cuda_alloc(g->cu, p, bytes);

	if (rc < 0)
		return rc;
	g->mem.bytes[kind] += bytes;
	if (g->mem.bytes[kind] > g->mem.peak[kind])
		g->mem.peak[kind] = g->mem.bytes[kind];
	return 0;
}

static void dev_free(struct mr_cuda_gpt *g, enum mr_mem_kind kind, void **p, size_t *bytes)
{
	if (!*p)
		return;
	mr_cuda_dfree(g->cu, *p);
	g->mem.bytes[kind] -= *bytes;
	*p = NULL;
	*bytes = 0;
}

/* Sizes with base == NULL (only counts), hands out pointers otherwise. */
struct carve {
	char *base;
	size_t used;
};

static void *take(struct carve *cv, size_t bytes)
{
	void *p = cv->base ? cv->base + cv->used : NULL;

	cv->used += (bytes + CARVE_ALIGN - 1) / CARVE_ALIGN * CARVE_ALIGN;
	return p;
}

#define TAKE_BF(cv, n) ((mr_bf16 *)take(cv, (n) * sizeof(mr_bf16)))
#define TAKE_F(cv, n) ((float *)take(cv, (n) * sizeof(float)))

static void carve_acts(struct mr_cuda_gpt *g, struct carve *cv)
{
	const struct mr_gpt_config *c = &g->tbl.cfg;
	size_t N = (size_t)g->B * g->T, C = (size_t)c->d_model, nl = N * c->n_head;
	int l;

	for (l = 0; l < c->n_layer; l++) {
		struct mr__cg_layer_acts *a = &g->la[l];
		a->ln1 = TAKE_BF(cv, N * C);
		a->qkv = TAKE_BF(cv, N * 3 * C);
		a->atty = TAKE_BF(cv, N * C);
		a->res2 = TAKE_BF(cv, N * C);
		a->ln2 = TAKE_BF(cv, N * C);
		a->fch = TAKE_BF(cv, N * 4 * C);
		a->fch_gelu = TAKE_BF(cv, N * 4 * C);
		a->res3 = TAKE_BF(cv, N * C);
		a->ln1_mean = TAKE_F(cv, N);
		a->ln1_rstd = TAKE_F(cv, N);
		a->ln2_mean = TAKE_F(cv, N);
		a->ln2_rstd = TAKE_F(cv, N);
		a->att_lse = TAKE_F(cv, nl);
	}
	g->tok = (int *)take(cv, N * sizeof(int));
	g->tgt = (int *)take(cv, N * sizeof(int));
	g->encoded = TAKE_BF(cv, N * C);
	g->lnf = TAKE_BF(cv, N * C);
	g->lnf_mean = TAKE_F(cv, N);
	g->lnf_rstd = TAKE_F(cv, N);
	g->logits = TAKE_BF(cv, N * (size_t)c->vocab);
	g->losses = TAKE_F(cv, N);
	g->ce_lse = TAKE_F(cv, N);
}

static void carve_ws(struct mr_cuda_gpt *g, struct carve *cv)
{
	size_t N = (size_t)g->B * g->T, C = (size_t)g->tbl.cfg.d_model;

	g->dres = TAKE_BF(cv, N * C);
	g->dln = TAKE_BF(cv, N * C);
	g->datty = TAKE_BF(cv, N * C);
	g->dqkv = TAKE_BF(cv, N * 3 * C);
	g->dfch = TAKE_BF(cv, N * 4 * C);
	g->delta = TAKE_F(cv, N * g->tbl.cfg.n_head);
}

/* ---- the table ------------------------------------------------------------- */

static int offset_of(const struct mr_gpt *m, const char *name, size_t *off,
		     struct mr_errbuf *eb)
{
	const struct mr_gpt_tensor *t = mr_gpt_find(m, name);

	if (!t)
		return mr_errf(eb, MR_EINVAL, "parameter table has no tensor '%s'", name);
	*off = t->off;
	return 0;
}

static int find_offsets(struct mr_cuda_gpt *g, struct mr_errbuf *eb)
{
	typedef size_t mr__cg_layer_off::*field_t;
	static const struct {
		const char *name;
		field_t f;
	} fields[] = {
		{ "ln1.w", &mr__cg_layer_off::ln1w },
		{ "ln1.b", &mr__cg_layer_off::ln1b },
		{ "attn.qkv.w", &mr__cg_layer_off::qkvw },
		{ "attn.qkv.b", &mr__cg_layer_off::qkvb },
		{ "attn.proj.w", &mr__cg_layer_off::attprojw },
		{ "attn.proj.b", &mr__cg_layer_off::attprojb },
		{ "ln2.w", &mr__cg_layer_off::ln2w },
		{ "ln2.b", &mr__cg_layer_off::ln2b },
		{ "mlp.fc.w", &mr__cg_layer_off::fcw },
		{ "mlp.fc.b", &mr__cg_layer_off::fcb },
		{ "mlp.proj.w", &mr__cg_layer_off::fcprojw },
		{ "mlp.proj.b", &mr__cg_layer_off::fcprojb },
	};
	char nm[64];
	size_t k;
	int l, rc;

	if ((rc = offset_of(&g->tbl, "wte", &g->wte, eb)) < 0 ||
	    (rc = offset_of(&g->tbl, "wpe", &g->wpe, eb)) < 0 ||
	    (rc = offset_of(&g->tbl, "lnf.w", &g->lnfw, eb)) < 0 ||
	    (rc = offset_of(&g->tbl, "lnf.b", &g->lnfb, eb)) < 0)
		return rc;
	for (l = 0; l < g->tbl.cfg.n_layer; l++)
		for (k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
			snprintf(nm, sizeof(nm), "h.%d.%s", l, fields[k].name);
			if ((rc = offset_of(&g->tbl, nm, &(g->lo[l].*fields[k].f), eb)) < 0)
				return rc;
		}
	return 0;
}

/* ---- create / free ------------------------------------------------------------ */

extern "C" int mr_cuda_gpt_create(struct mr_cuda_gpt **out, struct mr_cuda *cu,
				  const struct mr_gpt_config *cfg, int B, int T,
				  const struct mr_adamw_config *ocfg, struct mr_errbuf *eb)
{
	struct mr_cuda_gpt *g;
	struct carve cv = { NULL, 0 };
	size_t N = (size_t)B * T;
	int rc;

	*out = NULL;
	if ((rc = mr_cuda_gpt_check(cfg, B, T, eb)) < 0)
		return rc;
	g = (struct mr_cuda_gpt *)calloc(1, sizeof(*g));
	if (!g)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the cuda model");
	g->cu = cu;
	g->ocfg = *ocfg;
	g->B = B;
	g->T = T;
	rc = mr_gpt_create_placed(&g->tbl, cfg, 1, 1, NULL, NULL,
				  MR_GPT_EXT_PARAMS | MR_GPT_EXT_GRADS, eb);
	if (rc < 0) {
		free(g);
		return rc;
	}
	g->n = g->tbl.nparams;
	g->lo = (struct mr__cg_layer_off *)calloc((size_t)cfg->n_layer, sizeof(*g->lo));
	g->la = (struct mr__cg_layer_acts *)calloc((size_t)cfg->n_layer, sizeof(*g->la));
	g->tok_host = (int *)calloc(N, sizeof(int));
	g->loss_host = (float *)calloc(N, sizeof(float));
	if (!g->lo || !g->la || !g->tok_host || !g->loss_host) {
		rc = mr_errf(eb, MR_ENOMEM, "unable to allocate the cuda model's host tables");
		goto fail;
	}
	if ((rc = find_offsets(g, eb)) < 0)
		goto fail;

	/* fp32 masters, then the bf16 copy, each 256-byte aligned */
	g->b_params = ((g->n * sizeof(float) + CARVE_ALIGN - 1) / CARVE_ALIGN) * CARVE_ALIGN +
		      g->n * sizeof(mr_bf16);
	g->b_grads = g->n * sizeof(float);
	g->b_optim = 2 * g->n * sizeof(float);
	carve_acts(g, &cv);
	g->b_acts = cv.used;
	cv.used = 0;
	carve_ws(g, &cv);
	g->b_ws = cv.used;
	if ((rc = dev_alloc(g, MR_MEM_PARAMS, &g->d_params, g->b_params)) < 0 ||
	    (rc = dev_alloc(g, MR_MEM_GRADS, &g->d_grads, g->b_grads)) < 0 ||
	    (rc = dev_alloc(g, MR_MEM_OPTIM, &g->d_optim, g->b_optim)) < 0 ||
	    (rc = dev_alloc(g, MR_MEM_ACTS, &g->d_acts, g->b_acts)) < 0 ||
	    (rc = dev_alloc(g, MR_MEM_WORKSPACE, &g->d_ws, g->b_ws)) < 0) {
		rc = mr_errf(eb, MR_ENOMEM,
			     "unable to allocate the cuda model (%zu parameters, %zu bytes of "
			     "activations): %s",
			     g->n, g->b_acts, mr_cuda_errmsg(cu));
		goto fail;
	}
	g->p32 = (float *)g->d_params;
	g->p16 = (mr_bf16 *)((char *)g->d_params + (g->b_params - g->n * sizeof(mr_bf16)));
	g->grads = (float *)g->d_grads;
	g->m = (float *)g->d_optim;
	g->v = g->m + g->n;
	cv.base = (char *)g->d_acts;
	cv.used = 0;
	carve_acts(g, &cv);
	cv.base = (char *)g->d_ws;
	cv.used = 0;
	carve_ws(g, &cv);
	if ((rc = mr_cuda_memset0(cu, g->d_params, g->b_params)) < 0 ||
	    (rc = mr_cuda_memset0(cu, g->d_grads, g->b_grads)) < 0 ||
	    (rc = mr_cuda_memset0(cu, g->d_optim, g->b_optim)) < 0 ||
	    (rc = mr_cuda_memset0(cu, g->d_acts, g->b_acts)) < 0 ||
	    (rc = mr_cuda_memset0(cu, g->d_ws, g->b_ws)) < 0 ||
	    (rc = mr_cuda_sync(cu)) < 0) {
		rc = mr__cg_fail(g, rc, "model init", eb);
		goto fail;
	}
	*out = g;
	return 0;
fail:
	mr_cuda_gpt_free(g);
	return rc;
}

extern "C" void mr_cuda_gpt_free(struct mr_cuda_gpt *g)
{
	if (!g)
		return;
	dev_free(g, MR_MEM_PARAMS, &g->d_params, &g->b_params);
	dev_free(g, MR_MEM_GRADS, &g->d_grads, &g->b_grads);
	dev_free(g, MR_MEM_OPTIM, &g->d_optim, &g->b_optim);
	dev_free(g, MR_MEM_ACTS, &g->d_acts, &g->b_acts);
	dev_free(g, MR_MEM_WORKSPACE, &g->d_ws, &g->b_ws);
	mr_gpt_release(&g->tbl);
	free(g->lo);
	free(g->la);
	free(g->tok_host);
	free(g->loss_host);
	free(g);
}

extern "C" const struct mr_gpt *mr_cuda_gpt_table(const struct mr_cuda_gpt *g)
{
	return &g->tbl;
}

extern "C" size_t mr_cuda_gpt_nparams(const struct mr_cuda_gpt *g)
{
	return g->n;
}

extern "C" const struct mr_mem *mr_cuda_gpt_mem(const struct mr_cuda_gpt *g)
{
	return &g->mem;
}

extern "C" size_t mr_cuda_gpt_flops_per_token(const struct mr_cuda_gpt *g)
{
	/* the table model has T = 1: add the attention term for the other T-1 */
	const struct mr_gpt_config *c = &g->tbl.cfg;

	return mr_gpt_flops_per_token(&g->tbl) +
	       6 * (size_t)c->n_layer * (size_t)c->d_model * (size_t)(g->T - 1);
}

extern "C" long mr_cuda_gpt_steps(const struct mr_cuda_gpt *g)
{
	return g->t;
}

extern "C" void mr_cuda_gpt_set_steps(struct mr_cuda_gpt *g, long t)
{
	g->t = t;
}

/* ---- transfers ---------------------------------------------------------------- */

static int check_n(const struct mr_cuda_gpt *g, size_t n, const char *what,
		   struct mr_errbuf *eb)
{
	if (n != g->n)
		return mr_errf(eb, MR_EINVAL, "%s: %zu floats given, the model has %zu", what, n,
			       g->n);
	return 0;
}

extern "C" int mr_cuda_gpt_upload_params(struct mr_cuda_gpt *g, const float *host, size_t n,
					 struct mr_errbuf *eb)
{
	int rc = check_n(g, n, "parameter upload", eb);

	if (rc < 0)
		return rc;
	if ((rc = mr_cuda_upload(g->cu, g->p32, host, n * sizeof(float))) < 0 ||
	    (rc = mr_cuda_f32_to_bf16(g->cu, g->p16, g->p32, n)) < 0 ||
	    (rc = mr_cuda_sync(g->cu)) < 0)
		return mr__cg_fail(g, rc, "parameter upload", eb);
	return 0;
}

extern "C" int mr_cuda_gpt_init_params(struct mr_cuda_gpt *g, uint64_t seed,
				       struct mr_errbuf *eb)
{
	float *host = (float *)malloc(g->n * sizeof(float));
	int i, rc = 0;

	if (!host)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate %zu floats for init", g->n);
	for (i = 0; i < g->tbl.ntensors && rc == 0; i++)
		rc = mr_gpt_init_tensor(&g->tbl, seed, i, host + g->tbl.tensors[i].off);
	if (rc < 0)
		rc = mr_errf(eb, rc, "unable to initialise tensor '%s'",
			     g->tbl.tensors[i - 1].name);
	else
		rc = mr_cuda_gpt_upload_params(g, host, g->n, eb);
	free(host);
	return rc;
}

static int download(struct mr_cuda_gpt *g, float *host, const float *dev, size_t n,
		    const char *what, struct mr_errbuf *eb)
{
	int rc = check_n(g, n, what, eb);

	if (rc < 0)
		return rc;
	if ((rc = mr_cuda_download(g->cu, host, dev, n * sizeof(float))) < 0)
		return mr__cg_fail(g, rc, what, eb);
	return 0;
}

extern "C" int mr_cuda_gpt_download_params(struct mr_cuda_gpt *g, float *host, size_t n,
					   struct mr_errbuf *eb)
{
	return download(g, host, g->p32, n, "parameter download", eb);
}

extern "C" int mr_cuda_gpt_download_grads(struct mr_cuda_gpt *g, float *host, size_t n,
					  struct mr_errbuf *eb)
{
	return download(g, host, g->grads, n, "gradient download", eb);
}

extern "C" int mr_cuda_gpt_download_optim(struct mr_cuda_gpt *g, float *m, float *v, size_t n,
					  struct mr_errbuf *eb)
{
	int rc = download(g, m, g->m, n, "optimizer state download", eb);

	return rc < 0 ? rc : download(g, v, g->v, n, "optimizer state download", eb);
}

extern "C" int mr_cuda_gpt_upload_optim(struct mr_cuda_gpt *g, const float *m, const float *v,
					size_t n, struct mr_errbuf *eb)
{
	int rc = check_n(g, n, "optimizer state upload", eb);

	if (rc < 0)
		return rc;
	if ((rc = mr_cuda_upload(g->cu, g->m, m, n * sizeof(float))) < 0 ||
	    (rc = mr_cuda_upload(g->cu, g->v, v, n * sizeof(float))) < 0)
		return mr__cg_fail(g, rc, "optimizer state upload", eb);
	return 0;
}
