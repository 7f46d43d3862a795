/*
 * gpt_params.c - GPT config and placement checks, allocation of
 * parameters/gradients/activations/workspace, and initialisation (the
 * parameter table itself is gpt_table.c).
 *
 * Init follows each tensor's table entry (gpt_table.c: GPT-2 / nanoGPT
 * values). Tensor i draws from its own stream mr_rng_seed(seed, i), whole,
 * then is sliced: the values do not depend on which rank creates which
 * tensor or on the tp degree.
 *
 * Non-goals: loading checkpoints (weights.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"
#include "gpt_int.h"
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

/* Carves activations (cv) and workspace (wv); sizes only when bases are
 * NULL. With tp, the head-, hidden- and vocab-sized buffers are this
 * rank's slice; with sp, the residual stream holds this rank's rows only
 * (N/tp) while the LayerNorm outputs feeding GEMMs are kept gathered. */
static void carve_all(struct mr_gpt *m, struct carve *cv, struct carve *wv)
{
	const struct mr_gpt_config *c = &m->cfg;
	int tp = m->tp.size;
	size_t N = (size_t)m->B * m->T, C = (size_t)c->d_model;
	size_t Nl = (size_t)mr_tp_local_rows(&m->tp), Cl = C / (size_t)tp;
	size_t Hl = 4 * Cl, Vl = (size_t)mr_tp_vocab_rows(&m->tp);
	int l, any_moe = 0;
	struct mr_moe_shape ms = { 0, 0, 0, 0, 0, 0 };
	size_t kws, mws = 0;

	if (c->moe_every > 0)
		ms = mr_gpt_moe_shape(m);
	m->encoded = take(cv, Nl * C);
	for (l = 0; l < c->n_layer; l++) {
		struct mr_gpt_layer_acts *a = &m->la[l];
		memset(a, 0, sizeof(*a));
		a->ln1 = take(cv, N * C);
		a->ln1_mean = take(cv, Nl);
		a->ln1_rstd = take(cv, Nl);
		a->qkv = take(cv, N * 3 * Cl);
		a->atty = take(cv, N * Cl);
		a->att_lse = take(cv, N * (size_t)(c->n_head / tp));
		a->res2 = take(cv, Nl * C);
		a->ln2 = take(cv, N * C);
		a->ln2_mean = take(cv, Nl);
		a->ln2_rstd = take(cv, Nl);
		if (mr_gpt_layer_is_moe(c, l)) {
			float *f = take(cv, mr_moe_act_floats(&ms));
			/* ints share the float arena (same size, 4 bytes) */
			float *iv = take(cv, mr_moe_act_ints(&ms));
			if (f)
				mr_moe_acts_bind(&a->moe, &ms, f, (int *)(void *)iv);
			any_moe = 1;
		} else {
			a->fch = take(cv, N * Hl);
			a->fch_gelu = take(cv, N * Hl);
		}
		a->res3 = take(cv, Nl * C);
	}
	m->lnf = take(cv, N * C);
	m->lnf_mean = take(cv, Nl);
	m->lnf_rstd = take(cv, Nl);
	m->logits = take(cv, N * Vl);
	m->ce_lse = take(cv, N);
	m->losses = take(cv, N);
	m->inputs = (int *)(void *)take(cv, N);
	m->targets = (int *)(void *)take(cv, N);
	m->tok_tp = tp > 1 ? (int *)(void *)take(cv, N) : NULL;
	m->tgt_tp = tp > 1 ? (int *)(void *)take(cv, N) : NULL;

	m->ones = take(wv, N);
	m->dres = take(wv, Nl * C);
	m->dln = take(wv, N * C);
	m->datty = take(wv, N * Cl);
	m->dqkv = take(wv, N * 3 * Cl);
	m->dfch = take(wv, N * Hl);
	m->dtmp = take(wv, N * C);
	m->sp_full = m->tp.sp ? take(wv, N * C) : NULL;
	m->tp.tmp = tp > 1 ? take(wv, N * (C > 3 ? C : 3)) : NULL;
	kws = mr_attn_layer_ws_floats(m->pool, m->T, c->d_model / c->n_head);
	if (mr_layernorm_ws_floats(m->pool, c->d_model) > kws)
		kws = mr_layernorm_ws_floats(m->pool, c->d_model);
	if (any_moe)
		mws = mr_moe_ws_floats(&ms);
	m->k_ws = take(wv, kws > mws ? kws : mws);
}

struct mr_moe_shape mr_gpt_moe_shape(const struct mr_gpt *m)
{
	struct mr_moe_shape s;
	int N = m->B * m->T;

	s.N = N;
	s.C = m->cfg.d_model;
	s.H = 4 * m->cfg.d_model / m->tp.size;
	s.E = m->cfg.n_experts;
	s.k = m->cfg.top_k;
	s.cap = mr_moe_capacity(N, s.E, s.k, m->cfg.capacity_factor);
	return s;
}

int mr_gpt_check_placement(const struct mr_gpt_config *c, int T, const struct mr_place *place,
			   struct mr_errbuf *eb)
{
	static const enum mr_axis later[] = { MR_AXIS_PP, MR_AXIS_CP, MR_AXIS_EP };
	int tp = mr_place_size(place, MR_AXIS_TP), sp = place && place->sp, rc;
	size_t i;

	if ((rc = mr_gpt_config_check(c, eb)) < 0)
		return rc;
	for (i = 0; i < sizeof(later) / sizeof(later[0]); i++)
		if (mr_place_size(place, later[i]) > 1)
			return mr_errf_field(eb, MR_EINVAL, mr_axis_name(later[i]),
					     "the gpt runtime does not implement %s > 1 yet (mesh "
					     "pp=%d cp=%d ep=%d)",
					     mr_axis_name(later[i]), mr_place_size(place, MR_AXIS_PP),
					     mr_place_size(place, MR_AXIS_CP),
					     mr_place_size(place, MR_AXIS_EP));
	if (place && place->layer_hi && (place->layer_lo != 0 || place->layer_hi != c->n_layer))
		return mr_errf_field(eb, MR_EINVAL, "pp_layers",
				     "a stage holding layers [%d, %d) of %d needs pipeline "
				     "parallelism, which the gpt runtime does not implement yet",
				     place->layer_lo, place->layer_hi, c->n_layer);
	if (tp > 1024)
		return mr_errf_field(eb, MR_EINVAL, "tp", "'tp' must be in [1, 1024], got %d", tp);
	if (mr_place_index(place, MR_AXIS_TP) < 0 || mr_place_index(place, MR_AXIS_TP) >= tp)
		return mr_errf_field(eb, MR_EINVAL, "tp", "tp rank %d is outside [0, %d)",
				     mr_place_index(place, MR_AXIS_TP), tp);
	if (c->n_head % tp != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "'n_head' (%d) is not divisible by tp (%d)", c->n_head, tp);
	if (sp && tp == 1)
		return mr_errf_field(eb, MR_EINVAL, "sequence_parallel",
				     "'sequence_parallel' needs tp > 1");
	if (sp && T % tp != 0)
		return mr_errf_field(eb, MR_EINVAL, "seq_len",
				     "'seq_len' (%d) is not divisible by tp (%d), as sequence "
				     "parallel needs", T, tp);
	return 0;
}

int mr_gpt_create(struct mr_gpt *m, const struct mr_gpt_config *cfg, int B, int T,
		  struct mr_pool *pool, struct mr_errbuf *eb)
{
	return mr_gpt_create_placed(m, cfg, B, T, pool, NULL, 0, eb);
}

int mr_gpt_create_placed(struct mr_gpt *m, const struct mr_gpt_config *cfg, int B, int T,
			 struct mr_pool *pool, const struct mr_place *place, unsigned flags,
			 struct mr_errbuf *eb)
{
	struct carve cv = { NULL, 0 }, wv = { NULL, 0 };
	size_t i;
	int rc, u;

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
	if (place)
		m->place = *place;
	m->flags = flags;
	rc = mr_gpt_check_placement(cfg, T, &m->place, eb);
	if (rc < 0)
		return rc;
	if (mr_place_size(&m->place, MR_AXIS_TP) > 1 && !m->place.comm[MR_AXIS_TP])
		return mr_errf_field(eb, MR_EINVAL, "tp", "tp %d without a tp communicator",
				     mr_place_size(&m->place, MR_AXIS_TP));
	m->cfg = *cfg;
	m->B = B;
	m->T = T;
	m->pool = pool;
	mr_tp_init(&m->tp, mr_place_size(&m->place, MR_AXIS_TP),
		   mr_place_index(&m->place, MR_AXIS_TP), m->place.sp, m->place.comm[MR_AXIS_TP],
		   B, T, cfg->d_model, cfg->vocab);
	m->w.layer = calloc((size_t)cfg->n_layer, sizeof(*m->w.layer));
	m->g.layer = calloc((size_t)cfg->n_layer, sizeof(*m->g.layer));
	m->la = calloc((size_t)cfg->n_layer, sizeof(*m->la));
	if (!m->w.layer || !m->g.layer || !m->la || mr__gpt_table_create(m) < 0)
		goto nomem;
	if (!(flags & MR_GPT_EXT_PARAMS)) {
		m->params = mr_mem_alloc(&m->mem, MR_MEM_PARAMS, m->nparams * sizeof(float));
		if (!m->params)
			goto nomem;
	}
	if (!(flags & MR_GPT_EXT_GRADS)) {
		m->grads = mr_mem_alloc(&m->mem, MR_MEM_GRADS, m->nparams * sizeof(float));
		if (!m->grads)
			goto nomem;
	}
	for (u = 0; u < m->nunits; u++) {
		size_t off, n;
		mr_gpt_unit_range(m, u, &off, &n);
		mr_gpt_bind_unit(m, u, m->params ? m->params + off : NULL,
				 m->grads ? m->grads + off : NULL);
	}

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
	if (m->tp.size > 1) {
		m->xchg.reduce = mr_tp_moe_reduce;
		m->xchg.ctx = &m->tp;
		m->xchg.router_dx_off = m->tp.rank != 0;
	}
	return 0;
nomem:
	rc = mr_errf(eb, MR_ENOMEM, "unable to allocate the model (%zu parameters)",
		     m->nparams);
	mr_gpt_release(m);
	return rc;
}

int mr_gpt_split_bwd(struct mr_gpt *m)
{
	size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model;
	size_t Cl = C / (size_t)m->tp.size, per = N * (3 * Cl + C + 4 * Cl + C);
	int l, L = m->cfg.n_layer;

	if (m->stash)
		return 0;
	m->stash = calloc((size_t)L, sizeof(*m->stash));
	m->nstash = per * (size_t)L;
	m->stash_mem = m->stash ? mr_mem_alloc(&m->mem, MR_MEM_ACTS, m->nstash * sizeof(float))
				: NULL;
	if (!m->stash_mem) {
		free(m->stash);
		m->stash = NULL;
		return MR_ENOMEM;
	}
	for (l = 0; l < L; l++) {
		float *b = m->stash_mem + per * (size_t)l;
		m->stash[l].dqkv = b;
		m->stash[l].dproj1 = b + N * 3 * Cl;
		m->stash[l].dfc = m->stash[l].dproj1 + N * C;
		m->stash[l].dproj2 = m->stash[l].dfc + N * 4 * Cl;
	}
	return 0;
}

void mr_gpt_release(struct mr_gpt *m)
{
	if (m->stash_mem)
		mr_mem_free(&m->mem, MR_MEM_ACTS, m->stash_mem, m->nstash * sizeof(float));
	free(m->stash);
	mr_mem_free(&m->mem, MR_MEM_PARAMS, m->params, m->nparams * sizeof(float));
	mr_mem_free(&m->mem, MR_MEM_GRADS, m->grads, m->nparams * sizeof(float));
	mr_mem_free(&m->mem, MR_MEM_ACTS, m->acts, m->nacts * sizeof(float));
	mr_mem_free(&m->mem, MR_MEM_WORKSPACE, m->ws, m->nws * sizeof(float));
	free(m->tensors);
	free(m->unit_first);
	free(m->w.layer);
	free(m->g.layer);
	free(m->la);
	memset(m, 0, sizeof(*m));
}

int mr_gpt_init_tensor(const struct mr_gpt *m, uint64_t seed, int i, float *dst)
{
	const struct mr_gpt_tensor *t = &m->tensors[i];
	size_t j, n = mr_gpt_tensor_full_n(t);
	float *full = t->split[MR_AXIS_TP] >= 0 ? malloc(n * sizeof(float)) : dst;
	struct mr_rng r;

	if (!full)
		return MR_ENOMEM;
	mr_rng_seed(&r, seed, (uint64_t)i);
	for (j = 0; j < n; j++) {
		if (t->init == MR_INIT_NORMAL)
			full[j] = (float)(mr_rng_normal(&r) * t->std);
		else
			full[j] = t->init == MR_INIT_ONE ? 1.0f : 0.0f;
	}
	if (full != dst) {
		mr_gpt_tensor_slice(t, m->tp.size, m->tp.rank, full, dst, 0);
		free(full);
	}
	return 0;
}

int mr_gpt_init_params(struct mr_gpt *m, uint64_t seed)
{
	int i, rc;

	for (i = 0; i < m->ntensors; i++)
		if ((rc = mr_gpt_init_tensor(m, seed, i, m->params + m->tensors[i].off)) < 0)
			return rc;
	return 0;
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
	/* 6N + 6 L C T (llm.c / torchtitan), for this rank's slice: N counts
	 * the local parameters touched per token - for MoE experts only top_k
	 * of E, and not wpe (a lookup) - and C is this rank's channels. */
	const struct mr_gpt_config *c = &m->cfg;
	size_t n = 0, C = (size_t)c->d_model / (size_t)m->tp.size;
	int i;

	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		if (strcmp(t->name, "wpe") == 0)
			continue;
		if (strstr(t->name, ".moe.") && !strstr(t->name, ".router."))
			n += t->n / (size_t)c->n_experts * (size_t)c->top_k;
		else
			n += t->n;
	}
	return 6 * n + 6 * (size_t)c->n_layer * C * (size_t)m->T;
}
