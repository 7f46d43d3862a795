/*
 * gpt_params.c - GPT config checks, the parameter table, allocation of
 * parameters/gradients/activations/workspace, and initialisation.
 *
 * Init (GPT-2 / nanoGPT): every matrix and embedding ~ normal(0, 0.02);
 * the residual projections (attn.proj.w, mlp.proj.w, also per expert) use
 * 0.02 / sqrt(2 L); biases 0; LayerNorm weight 1, bias 0. Tensor i draws
 * from its own stream mr_rng_seed(seed, i), so the values do not depend on
 * which rank creates which tensor.
 *
 * Non-goals: loading checkpoints (weights.c), sharding.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"
#include "mr_gpt.h"
#include "mr_rng.h"

#define MAX_DIM (1 << 20)

int mr_gpt_layer_is_moe(const struct mr_gpt_config *c, int l)
{
	return c->moe_every > 0 && (l + 1) % c->moe_every == 0;
}

int mr_gpt_config_check(const struct mr_gpt_config *c, struct mr_errbuf *eb)
{
	if (c->vocab < 2 || c->vocab > MAX_DIM)
		return mr_errf_field(eb, MR_EINVAL, "vocab_size",
				     "'vocab_size' must be in [2, %d], got %d", MAX_DIM, c->vocab);
	if (c->max_seq < 1 || c->max_seq > MAX_DIM)
		return mr_errf_field(eb, MR_EINVAL, "max_seq",
				     "'max_seq' must be in [1, %d], got %d", MAX_DIM, c->max_seq);
	if (c->n_layer < 1 || c->n_layer > 1024)
		return mr_errf_field(eb, MR_EINVAL, "n_layer",
				     "'n_layer' must be in [1, 1024], got %d", c->n_layer);
	if (c->d_model < 1 || c->d_model > 65536)
		return mr_errf_field(eb, MR_EINVAL, "d_model",
				     "'d_model' must be in [1, 65536], got %d", c->d_model);
	if (c->n_head < 1 || c->d_model % c->n_head != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "'n_head' (%d) must be >= 1 and divide 'd_model' (%d)",
				     c->n_head, c->d_model);
	if (c->d_model / c->n_head > 1024)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "head size %d is above the limit 1024",
				     c->d_model / c->n_head);
	if (c->moe_every < 0 || c->moe_every > c->n_layer)
		return mr_errf_field(eb, MR_EINVAL, "moe_every",
				     "'moe_every' must be in [0, n_layer=%d], got %d", c->n_layer,
				     c->moe_every);
	if (c->moe_every == 0)
		return 0;
	if (c->n_experts < 1 || c->n_experts > 1024)
		return mr_errf_field(eb, MR_EINVAL, "n_experts",
				     "'n_experts' must be in [1, 1024], got %d", c->n_experts);
	if (c->top_k < 1 || c->top_k > 2)
		return mr_errf_field(eb, MR_EINVAL, "top_k", "'top_k' must be 1 or 2, got %d",
				     c->top_k);
	if (c->top_k > c->n_experts)
		return mr_errf_field(eb, MR_EINVAL, "top_k",
				     "'top_k' (%d) must not exceed 'n_experts' (%d)", c->top_k,
				     c->n_experts);
	if (!(c->capacity_factor > 0.0f) || !isfinite(c->capacity_factor))
		return mr_errf_field(eb, MR_EINVAL, "capacity_factor",
				     "'capacity_factor' must be > 0, got %g",
				     (double)c->capacity_factor);
	if (!(c->aux_coef >= 0.0f) || !isfinite(c->aux_coef))
		return mr_errf_field(eb, MR_EINVAL, "aux_coef",
				     "'aux_coef' must be >= 0, got %g", (double)c->aux_coef);
	return 0;
}

/* ---- parameter table -------------------------------------------------------- */

struct table {
	struct mr_gpt_tensor *t;
	int n, cap;
	size_t off;
};

static void add(struct table *tb, const char *name, int d0, int d1, int d2,
		enum mr_gpt_init init, float std)
{
	struct mr_gpt_tensor *t;

	if (tb->t && tb->n < tb->cap) {
		t = &tb->t[tb->n];
		memset(t, 0, sizeof(*t));
		snprintf(t->name, sizeof(t->name), "%s", name);
		t->shape[0] = d0;
		t->shape[1] = d1;
		t->shape[2] = d2;
		t->ndim = d2 ? 3 : d1 ? 2 : 1;
		t->n = (size_t)d0 * (size_t)(d1 ? d1 : 1) * (size_t)(d2 ? d2 : 1);
		t->off = tb->off;
		t->init = init;
		t->std = std;
		t->decay = init == MR_INIT_NORMAL;
	}
	tb->off += (size_t)d0 * (size_t)(d1 ? d1 : 1) * (size_t)(d2 ? d2 : 1);
	tb->n++;
}

/* Fills the table (or only counts when tb->t is NULL). */
static void build_table(const struct mr_gpt_config *c, struct table *tb)
{
	int C = c->d_model, E = c->n_experts, l;
	float sd = 0.02f, rsd = 0.02f / sqrtf(2.0f * (float)c->n_layer);
	char nm[32];

#define NAME(fmt) (snprintf(nm, sizeof(nm), "h.%d." fmt, l), nm)
	add(tb, "wte", c->vocab, C, 0, MR_INIT_NORMAL, sd);
	add(tb, "wpe", c->max_seq, C, 0, MR_INIT_NORMAL, sd);
	for (l = 0; l < c->n_layer; l++) {
		add(tb, NAME("ln1.w"), C, 0, 0, MR_INIT_ONE, 0);
		add(tb, NAME("ln1.b"), C, 0, 0, MR_INIT_ZERO, 0);
		add(tb, NAME("attn.qkv.w"), 3 * C, C, 0, MR_INIT_NORMAL, sd);
		add(tb, NAME("attn.qkv.b"), 3 * C, 0, 0, MR_INIT_ZERO, 0);
		add(tb, NAME("attn.proj.w"), C, C, 0, MR_INIT_NORMAL, rsd);
		add(tb, NAME("attn.proj.b"), C, 0, 0, MR_INIT_ZERO, 0);
		add(tb, NAME("ln2.w"), C, 0, 0, MR_INIT_ONE, 0);
		add(tb, NAME("ln2.b"), C, 0, 0, MR_INIT_ZERO, 0);
		if (mr_gpt_layer_is_moe(c, l)) {
			add(tb, NAME("moe.router.w"), E, C, 0, MR_INIT_NORMAL, sd);
			add(tb, NAME("moe.fc.w"), E, 4 * C, C, MR_INIT_NORMAL, sd);
			add(tb, NAME("moe.fc.b"), E, 4 * C, 0, MR_INIT_ZERO, 0);
			add(tb, NAME("moe.proj.w"), E, C, 4 * C, MR_INIT_NORMAL, rsd);
			add(tb, NAME("moe.proj.b"), E, C, 0, MR_INIT_ZERO, 0);
		} else {
			add(tb, NAME("mlp.fc.w"), 4 * C, C, 0, MR_INIT_NORMAL, sd);
			add(tb, NAME("mlp.fc.b"), 4 * C, 0, 0, MR_INIT_ZERO, 0);
			add(tb, NAME("mlp.proj.w"), C, 4 * C, 0, MR_INIT_NORMAL, rsd);
			add(tb, NAME("mlp.proj.b"), C, 0, 0, MR_INIT_ZERO, 0);
		}
	}
#undef NAME
	add(tb, "lnf.w", C, 0, 0, MR_INIT_ONE, 0);
	add(tb, "lnf.b", C, 0, 0, MR_INIT_ZERO, 0);
}

/* Points the views of one buffer (params or grads) at the table. */
static void bind_views(struct mr_gpt *m, float *base, struct mr_gpt_weights *w)
{
	int i = 0, l;
	const struct mr_gpt_tensor *t = m->tensors;

#define NEXT (base + t[i++].off)
	w->wte = NEXT;
	w->wpe = NEXT;
	for (l = 0; l < m->cfg.n_layer; l++) {
		struct mr_gpt_layer_w *lw = &w->layer[l];
		memset(lw, 0, sizeof(*lw));
		lw->ln1w = NEXT;
		lw->ln1b = NEXT;
		lw->qkvw = NEXT;
		lw->qkvb = NEXT;
		lw->attprojw = NEXT;
		lw->attprojb = NEXT;
		lw->ln2w = NEXT;
		lw->ln2b = NEXT;
		if (mr_gpt_layer_is_moe(&m->cfg, l))
			lw->routerw = NEXT;
		lw->fcw = NEXT;
		lw->fcb = NEXT;
		lw->fcprojw = NEXT;
		lw->fcprojb = NEXT;
	}
	w->lnfw = NEXT;
	w->lnfb = NEXT;
#undef NEXT
}

/* ---- activations -------------------------------------------------------------- */

struct carve {
	float *base;
	size_t used;
};

static float *take(struct carve *cv, size_t n)
{
	float *p = cv->base ? cv->base + cv->used : NULL;

	cv->used += (n + 15) & ~(size_t)15;
	return p;
}

static struct mr_moe_shape moe_shape(const struct mr_gpt *m)
{
	struct mr_moe_shape s;
	int N = m->B * m->T;

	s.N = N;
	s.C = m->cfg.d_model;
	s.E = m->cfg.n_experts;
	s.k = m->cfg.top_k;
	s.cap = mr_moe_capacity(N, s.E, s.k, m->cfg.capacity_factor);
	return s;
}

/* Carves activations (cv) and workspace (wv); sizes only when bases are NULL. */
static void carve_all(struct mr_gpt *m, struct carve *cv, struct carve *wv)
{
	const struct mr_gpt_config *c = &m->cfg;
	size_t N = (size_t)m->B * m->T, C = (size_t)c->d_model, V = (size_t)c->vocab;
	int l, any_moe = 0;
	struct mr_moe_shape ms = { 0, 0, 0, 0, 0 };
	size_t kws, mws = 0;

	if (c->moe_every > 0)
		ms = moe_shape(m);
	m->encoded = take(cv, N * C);
	for (l = 0; l < c->n_layer; l++) {
		struct mr_gpt_layer_acts *a = &m->la[l];
		memset(a, 0, sizeof(*a));
		a->ln1 = take(cv, N * C);
		a->ln1_mean = take(cv, N);
		a->ln1_rstd = take(cv, N);
		a->qkv = take(cv, N * 3 * C);
		a->atty = take(cv, N * C);
		a->att_lse = take(cv, N * (size_t)c->n_head);
		a->res2 = take(cv, N * C);
		a->ln2 = take(cv, N * C);
		a->ln2_mean = take(cv, N);
		a->ln2_rstd = take(cv, N);
		if (mr_gpt_layer_is_moe(c, l)) {
			float *f = take(cv, mr_moe_act_floats(&ms));
			/* ints share the float arena (same size, 4 bytes) */
			float *iv = take(cv, mr_moe_act_ints(&ms));
			if (f)
				mr_moe_acts_bind(&a->moe, &ms, f, (int *)(void *)iv);
			any_moe = 1;
		} else {
			a->fch = take(cv, N * 4 * C);
			a->fch_gelu = take(cv, N * 4 * C);
		}
		a->res3 = take(cv, N * C);
	}
	m->lnf = take(cv, N * C);
	m->lnf_mean = take(cv, N);
	m->lnf_rstd = take(cv, N);
	m->logits = take(cv, N * V);
	m->ce_lse = take(cv, N);
	m->losses = take(cv, N);
	m->inputs = (int *)(void *)take(cv, N);
	m->targets = (int *)(void *)take(cv, N);

	m->ones = take(wv, N);
	m->dres = take(wv, N * C);
	m->dln = take(wv, N * C);
	m->datty = take(wv, N * C);
	m->dqkv = take(wv, N * 3 * C);
	m->dfch = take(wv, N * 4 * C);
	m->dtmp = take(wv, N * C);
	kws = mr_attn_layer_ws_floats(m->pool, m->T, c->d_model / c->n_head);
	if (mr_layernorm_ws_floats(m->pool, c->d_model) > kws)
		kws = mr_layernorm_ws_floats(m->pool, c->d_model);
	if (any_moe)
		mws = mr_moe_ws_floats(&ms);
	m->k_ws = take(wv, kws > mws ? kws : mws);
}

int mr_gpt_create(struct mr_gpt *m, const struct mr_gpt_config *cfg, int B, int T,
		  struct mr_pool *pool, struct mr_errbuf *eb)
{
	struct table tb = { NULL, 0, 0, 0 };
	struct carve cv = { NULL, 0 }, wv = { NULL, 0 };
	size_t i;
	int rc;

	memset(m, 0, sizeof(*m));
	rc = mr_gpt_config_check(cfg, eb);
	if (rc < 0)
		return rc;
	if (B < 1 || B > MAX_DIM)
		return mr_errf_field(eb, MR_EINVAL, "batch_size",
				     "'batch_size' must be in [1, %d], got %d", MAX_DIM, B);
	if (T < 1 || T > cfg->max_seq)
		return mr_errf_field(eb, MR_EINVAL, "seq_len",
				     "'seq_len' must be in [1, max_seq=%d], got %d", cfg->max_seq, T);
	m->cfg = *cfg;
	m->B = B;
	m->T = T;
	m->pool = pool;
	build_table(cfg, &tb);
	m->tensors = calloc((size_t)tb.n, sizeof(*m->tensors));
	m->w.layer = calloc((size_t)cfg->n_layer, sizeof(*m->w.layer));
	m->g.layer = calloc((size_t)cfg->n_layer, sizeof(*m->g.layer));
	m->la = calloc((size_t)cfg->n_layer, sizeof(*m->la));
	if (!m->tensors || !m->w.layer || !m->g.layer || !m->la)
		goto nomem;
	tb.t = m->tensors;
	tb.cap = tb.n;
	tb.n = 0;
	tb.off = 0;
	build_table(cfg, &tb);
	m->ntensors = tb.n;
	m->nparams = tb.off;
	m->params = mr_mem_alloc(&m->mem, MR_MEM_PARAMS, m->nparams * sizeof(float));
	m->grads = mr_mem_alloc(&m->mem, MR_MEM_GRADS, m->nparams * sizeof(float));
	if (!m->params || !m->grads)
		goto nomem;
	bind_views(m, m->params, &m->w);
	bind_views(m, m->grads, &m->g);

	carve_all(m, &cv, &wv);
	m->nacts = cv.used;
	m->nws = wv.used;
	m->acts = mr_mem_alloc(&m->mem, MR_MEM_ACTS, m->nacts * sizeof(float));
	m->ws = mr_mem_alloc(&m->mem, MR_MEM_WORKSPACE, m->nws * sizeof(float));
	if (!m->acts || !m->ws)
		goto nomem;
	cv.base = m->acts;
	cv.used = 0;
	wv.base = m->ws;
	wv.used = 0;
	carve_all(m, &cv, &wv);
	for (i = 0; i < (size_t)B * T; i++)
		m->ones[i] = 1.0f;
	return 0;
nomem:
	rc = mr_errf(eb, MR_ENOMEM, "unable to allocate the model (%zu parameters)",
		     m->nparams);
	mr_gpt_release(m);
	return rc;
}

void mr_gpt_release(struct mr_gpt *m)
{
	mr_mem_free(&m->mem, MR_MEM_PARAMS, m->params, m->nparams * sizeof(float));
	mr_mem_free(&m->mem, MR_MEM_GRADS, m->grads, m->nparams * sizeof(float));
	mr_mem_free(&m->mem, MR_MEM_ACTS, m->acts, m->nacts * sizeof(float));
	mr_mem_free(&m->mem, MR_MEM_WORKSPACE, m->ws, m->nws * sizeof(float));
	free(m->tensors);
	free(m->w.layer);
	free(m->g.layer);
	free(m->la);
	memset(m, 0, sizeof(*m));
}

void mr_gpt_init_params(struct mr_gpt *m, uint64_t seed)
{
	int i;
	size_t j;

	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		float *p = m->params + t->off;
		struct mr_rng r;

		mr_rng_seed(&r, seed, (uint64_t)i);
		for (j = 0; j < t->n; j++) {
			if (t->init == MR_INIT_NORMAL)
				p[j] = (float)(mr_rng_normal(&r) * t->std);
			else
				p[j] = t->init == MR_INIT_ONE ? 1.0f : 0.0f;
		}
	}
}

const struct mr_gpt_tensor *mr_gpt_find(const struct mr_gpt *m, const char *name)
{
	int i;

	for (i = 0; i < m->ntensors; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			return &m->tensors[i];
	return NULL;
}

size_t mr_gpt_flops_per_token(const struct mr_gpt *m)
{
	/* 6N + 6 L C T (llm.c / torchtitan); N counts parameters touched per
	 * token: for MoE layers only top_k experts, and wpe is a lookup. */
	const struct mr_gpt_config *c = &m->cfg;
	size_t n = m->nparams - (size_t)c->max_seq * c->d_model, C = (size_t)c->d_model;
	int l;

	for (l = 0; l < c->n_layer; l++)
		if (mr_gpt_layer_is_moe(c, l))
			n -= (size_t)(c->n_experts - c->top_k) * (8 * C * C + 5 * C);
	return 6 * n + 6 * (size_t)c->n_layer * C * (size_t)m->T;
}
