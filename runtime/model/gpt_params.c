/*
 * gpt_params.c - GPT config and placement checks, allocation of
 * parameters/gradients/activations/workspace, and initialisation (the
 * parameter table itself is gpt_table.c).
 *
 * Init follows each tensor's table entry (gpt_table.c: GPT-2 / nanoGPT
 * values). Tensor i of the whole model draws from its own stream
 * mr_rng_seed(seed, i), whole, then is sliced: the values do not depend on
 * which rank creates which tensor, on the tp degree or on the stage.
 *
 * Non-goals: loading checkpoints (weights.c).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"
#include "gpt_family.h"
#include "core/mr_rng.h"

#define MAX_DIM (1 << 20)

int mr_gpt_layer_is_moe(const struct mr_gpt_config *c, int l)
{
	return c->moe_every > 0 && (l + 1) % c->moe_every == 0;
}

int mr_gpt_kv_heads(const struct mr_gpt_config *c)
{
	return c->arch == MR_ARCH_LLAMA && c->n_kv_head > 0 ? c->n_kv_head : c->n_head;
}

int mr_gpt_kv_local(const struct mr_gpt_config *c, int tp)
{
	int kv = mr_gpt_kv_heads(c);

	return tp > kv ? 1 : kv / (tp > 1 ? tp : 1);
}

int mr_gpt_kv_rep(const struct mr_gpt_config *c, int tp)
{
	int kv = mr_gpt_kv_heads(c);

	return tp > kv ? tp / kv : 1;
}

int mr_gpt_ffn(const struct mr_gpt_config *c)
{
	long h;

	if (c->arch != MR_ARCH_LLAMA)
		return 4 * c->d_model;
	if (c->ffn_hidden > 0)
		return c->ffn_hidden;
	/* Llama (Touvron et al. 2023): 2/3 of 4C, up to a multiple of 256 */
	h = 2L * (4L * c->d_model) / 3;
	return (int)((h + 255) / 256 * 256);
}

float mr_gpt_norm_eps(const struct mr_gpt_config *c)
{
	return c->norm_eps > 0.0f ? c->norm_eps : 1e-5f;
}

float mr_gpt_rope_theta(const struct mr_gpt_config *c)
{
	return c->rope_theta > 0.0f ? c->rope_theta : 500000.0f;
}

int mr_gpt_moe_norm_topk(const struct mr_gpt_config *c)
{
	struct mr_moe_shape s = { .k = c->top_k, .norm_topk = c->moe_norm_topk };

	return mr_moe_norm_topk(&s);
}

int mr_gpt_tied(const struct mr_gpt_config *c)
{
	return c->arch != MR_ARCH_LLAMA || c->tie_embeddings;
}

/* The Llama keys (the shared ones are checked by mr_gpt_config_check). */
static int llama_check(const struct mr_gpt_config *c, struct mr_errbuf *eb)
{
	int kv = mr_gpt_kv_heads(c), hs = c->d_model / c->n_head;

	if (c->n_kv_head < 0 || c->n_head % kv != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_kv_head",
				     "'n_kv_head' (%d) must divide 'n_head' (%d)", c->n_kv_head,
				     c->n_head);
	if (hs % 2 != 0 || hs > MR_ROPE_MAX_D)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "rotary positions need an even head size up to %d: 'd_model' "
				     "%d / 'n_head' %d = %d", MR_ROPE_MAX_D, c->d_model, c->n_head,
				     hs);
	if (c->ffn_hidden < 0 || c->ffn_hidden > MAX_DIM)
		return mr_errf_field(eb, MR_EINVAL, "ffn_hidden",
				     "'ffn_hidden' must be in [0, %d] (0: from d_model), got %d",
				     MAX_DIM, c->ffn_hidden);
	if (!(c->norm_eps >= 0.0f) || !isfinite(c->norm_eps))
		return mr_errf_field(eb, MR_EINVAL, "norm_eps", "'norm_eps' must be >= 0, got %g",
				     (double)c->norm_eps);
	if (!(c->rope_theta >= 0.0f) || !isfinite(c->rope_theta))
		return mr_errf_field(eb, MR_EINVAL, "rope_theta",
				     "'rope_theta' must be >= 0, got %g", (double)c->rope_theta);
	return 0;
}

int mr_gpt_config_check(const struct mr_gpt_config *c, struct mr_errbuf *eb)
{
	int rc;

	if (c->arch != MR_ARCH_GPT2 && c->arch != MR_ARCH_LLAMA)
		return mr_errf_field(eb, MR_EINVAL, "arch", "'arch' %d is not a model family",
				     c->arch);
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
	if (c->arch == MR_ARCH_LLAMA && (rc = llama_check(c, eb)) < 0)
		return rc;
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

/* An arena of device memory carved in bytes (256-byte aligned pieces, as
 * the fastest GEMM kernels want): sizes only while base is NULL. */
struct carve {
	char *base;
	size_t used;
};

static void *take_bytes(struct carve *cv, size_t bytes)
{
	void *p = cv->base ? cv->base + cv->used : NULL;

	cv->used += (bytes + 255) & ~(size_t)255;
	return p;
}

static mr_act *take(const struct mr_gpt *m, struct carve *cv, size_t n)
{
	return take_bytes(cv, mr_dev_act_bytes(m->dev, n));
}

static float *take_f32(struct carve *cv, size_t n)
{
	return take_bytes(cv, n * sizeof(float));
}

/* Device memory of the model (ledger m->mem). */
static void *dalloc(struct mr_gpt *m, enum mr_mem_kind kind, size_t bytes)
{
	return mr_dev_alloc(m->dev, &m->mem, kind, bytes);
}

/* Rows of m->ones: a micro-batch's N, or under expert parallelism the
 * most rows one expert can get, E * cap / (E / ep) (kernels/mr_moe.h). */
static size_t ones_n(const struct mr_gpt *m)
{
	size_t N = (size_t)m->B * m->T;
	int ep = mr_place_size(&m->place, MR_AXIS_EP);

	if (ep > 1 && m->cfg.moe_every > 0) {
		struct mr_moe_shape s = mr_gpt_moe_shape(m);
		size_t rows = (size_t)ep * (size_t)s.cap;
		return rows > N ? rows : N;
	}
	return N;
}

/* A MoE layer's activations: device memory the device's MoE ops read and
 * write. */
static void carve_moe(struct carve *cv, struct mr_moe_acts *a, const struct mr_moe_shape *ms)
{
	float *f = take_f32(cv, mr_moe_act_floats(ms));
	int *iv = take_bytes(cv, mr_moe_act_ints(ms) * sizeof(int));

	if (f)
		mr_moe_acts_bind(a, ms, f, iv);
}

int mr_gpt_layer_recompute(const struct mr_gpt *m, int l)
{
	int c, lo, hi;

	if (m->rc_mode == MR_GPT_RC_NONE || m->rc_layers <= 0)
		return m->rc_mode;
	for (c = 0; c < mr_place_chunks(&m->place); c++) {
		mr_place_chunk(&m->place, m->cfg.n_layer, c, &lo, &hi);
		if (l >= lo && l < hi)
			return l - lo < m->rc_layers ? m->rc_mode : MR_GPT_RC_NONE;
	}
	return MR_GPT_RC_NONE;
}

/*
 * A block's activations into a: the pieces `sel` selects carved from cv,
 * the others' views copied from `from` (NULL: none). The classes, by what
 * recomputation does with them (mr_gpt.h's enum mr_gpt_recompute): NORMS,
 * the two norms with their statistics and the MLP's activation (GELU /
 * SwiGLU output), which selective drops; MID, the GEMM outputs, the
 * attention's output and log-sum-exp and res2 (a MoE block's buffers
 * with them), which full drops too; OUT, res3. dense / moe: whether the
 * dense MLP's pieces and the MoE buffers are there (a block has one; the
 * recompute scratch may serve both). A recomputed MoE block writes its
 * output into `*out` (the scratch's; NULL: none).
 */
enum { TAKE_NORMS = 1, TAKE_MID = 2, TAKE_OUT = 4 };

static void carve_layer(struct mr_gpt *m, struct carve *cv, struct mr_gpt_layer_acts *a,
			const struct mr_gpt_layer_acts *from, int sel, int dense, int moe)
{
	static const struct mr_gpt_layer_acts none;
	const struct mr_gpt_config *c = &m->cfg;
	const struct mr_gpt_layer_acts *f = from ? from : &none;
	size_t N = (size_t)m->B * m->T, C = (size_t)c->d_model;
	size_t Nl = (size_t)mr_tp_local_rows(&m->par.tp), Cl = C / (size_t)m->par.tp.size;
	int norms = sel & TAKE_NORMS, mid = sel & TAKE_MID;

	memset(a, 0, sizeof(*a));
	a->ln1 = norms ? take(m, cv, N * C) : f->ln1;
	a->ln1_mean = norms ? take_f32(cv, Nl) : f->ln1_mean;
	a->ln1_rstd = norms ? take_f32(cv, Nl) : f->ln1_rstd;
	a->qkv = mid ? take(m, cv, N * mr__gpt_qkv_cols(m)) : f->qkv;
	a->atty = mid ? take(m, cv, N * Cl) : f->atty;
	a->att_lse = mid ? take_f32(cv, N * (size_t)(c->n_head / m->par.tp.size)) : f->att_lse;
	a->res2 = mid ? take(m, cv, Nl * C) : f->res2;
	a->ln2 = norms ? take(m, cv, N * C) : f->ln2;
	a->ln2_mean = norms ? take_f32(cv, Nl) : f->ln2_mean;
	a->ln2_rstd = norms ? take_f32(cv, Nl) : f->ln2_rstd;
	if (moe && mid) {
		struct mr_moe_shape ms = mr_gpt_moe_shape(m);
		carve_moe(cv, &a->moe, &ms);
	} else if (moe) {
		a->moe = f->moe;
	}
	if (dense) {
		a->fch = mid ? take(m, cv, N * mr__gpt_fc_cols(m)) : f->fch;
		a->fch_gelu = norms ? take(m, cv, N * mr__gpt_ffn_cols(m)) : f->fch_gelu;
	}
	a->res3 = sel & TAKE_OUT ? take(m, cv, Nl * C) : f->res3;
}

/*
 * Carves the recompute scratch (once per model, not per slot): one
 * block's pieces that recomputing blocks do not keep - the dense MLP's if
 * a recomputing block is dense, under full the MoE buffers if one is MoE,
 * with the (Nl,C) output its recomputed forward writes (m->rc_out; the
 * kept output is not touched; a dense block's recomputation stops before
 * its output). Sizes only when cv's base is NULL; nothing without
 * recomputation.
 */
static void carve_scratch(struct mr_gpt *m, struct carve *cv)
{
	const struct mr_gpt_config *c = &m->cfg;
	int l, dense = 0, moe = 0, full = m->rc_mode == MR_GPT_RC_FULL;

	memset(&m->rc_la, 0, sizeof(m->rc_la));
	m->rc_out = NULL;
	for (l = 0; l < c->n_layer; l++)
		if (m->layer_unit[l] >= 0 && mr_gpt_layer_recompute(m, l) != MR_GPT_RC_NONE) {
			moe |= mr_gpt_layer_is_moe(c, l);
			dense |= !mr_gpt_layer_is_moe(c, l);
		}
	if (!dense && !moe)
		return;
	carve_layer(m, cv, &m->rc_la, NULL,
		    TAKE_NORMS | (full ? TAKE_MID : 0) | (full && moe ? TAKE_OUT : 0), dense,
		    moe && full);
	m->rc_out = m->rc_la.res3;
}

/* Carves a micro-batch slot's activations into m's fields; sizes only
 * when cv's base is NULL. With tp, the head-, hidden- and vocab-sized
 * buffers are this rank's slice; with sp, the residual stream holds this
 * rank's rows only (N/tp) while the LayerNorm outputs feeding GEMMs are
 * kept gathered. */
static void carve_acts(struct mr_gpt *m, struct carve *cv)
{
	const struct mr_gpt_config *c = &m->cfg;
	size_t N = (size_t)m->B * m->T, C = (size_t)c->d_model;
	size_t Nl = (size_t)mr_tp_local_rows(&m->par.tp), Vl = (size_t)mr_tp_vocab_rows(&m->par.tp);
	int l;

	m->encoded = m->first_stage ? take(m, cv, Nl * C) : NULL;
	for (l = 0; l < mr_place_chunks(&m->place) && m->place.chunks > 0; l++) {
		mr_act *in = take(m, cv, Nl * C), *g = take(m, cv, Nl * C);
		if (m->xin) {
			m->xin[l] = in;
			m->xgrad[l] = g;
		}
	}
	for (l = 0; l < c->n_layer; l++) {
		int rc = mr_gpt_layer_recompute(m, l), moe = mr_gpt_layer_is_moe(c, l);
		int keep = TAKE_OUT | (rc == MR_GPT_RC_NONE ? TAKE_NORMS : 0) |
			   (rc != MR_GPT_RC_FULL ? TAKE_MID : 0);

		if (m->layer_unit[l] < 0)
			memset(&m->la[l], 0, sizeof(m->la[l])); /* another stage's */
		else
			carve_layer(m, cv, &m->la[l], &m->rc_la, keep, !moe, moe);
	}
	m->tok_dev = m->first_stage ? take_bytes(cv, N * sizeof(int)) : NULL;
	if (!m->last_stage) {
		m->lnf = m->logits = NULL;
		m->lnf_mean = m->lnf_rstd = m->ce_lse = m->losses = NULL;
		m->tgt_dev = NULL;
		return;
	}
	m->lnf = take(m, cv, N * C);
	m->lnf_mean = take_f32(cv, Nl);
	m->lnf_rstd = take_f32(cv, Nl);
	m->logits = take(m, cv, N * Vl);
	m->ce_lse = take_f32(cv, N);
	m->losses = take_f32(cv, N);
	m->tgt_dev = take_bytes(cv, N * sizeof(int));
}

/* Carves the workspace every pass shares; sizes only when wv's base is NULL. */
static void carve_ws(struct mr_gpt *m, struct carve *wv)
{
	const struct mr_gpt_config *c = &m->cfg;
	int tp = m->par.tp.size;
	size_t N = (size_t)m->B * m->T, C = (size_t)c->d_model;
	size_t Nl = (size_t)mr_tp_local_rows(&m->par.tp), Cl = C / (size_t)tp;
	size_t kws, mws = 0;

	m->ones = take(m, wv, ones_n(m));
	m->dres = take(m, wv, Nl * C);
	m->dln = take(m, wv, N * C);
	m->datty = take(m, wv, N * Cl);
	m->dqkv = take(m, wv, N * mr__gpt_qkv_cols(m));
	/* llama: the SwiGLU output's gradient behind (llama.c) */
	m->dfch = take(m, wv, N * (mr__gpt_fc_cols(m) +
				   (c->arch == MR_ARCH_LLAMA ? mr__gpt_ffn_cols(m) : 0)));
	m->dtmp = take(m, wv, N * C);
	m->sp_full = m->par.tp.sp ? take(m, wv, N * C) : NULL;
	m->par.tp.tmp = tp > 1 ? take(m, wv, N * C) : NULL;
	m->par.tp.ce = tp > 1 ? take_f32(wv, 3 * N) : NULL;
	m->par.tp.norm_g = m->par.tp.sp ? take_f32(wv, 2 * C) : NULL;
	/* replicated key/value heads: a layer's k and v weight gradients */
	m->par.tp.kv_g = m->par.tp.kv ? take_f32(wv, m->par.tp.kv_n) : NULL;
	kws = m->dev->ops->ws_bytes(m->dev, m->T, c->d_model, c->n_head);
	if (c->moe_every > 0) {
		struct mr_moe_shape ms = mr_gpt_moe_shape(m);
		mws = mr_moe_ws_floats(&ms) * sizeof(float);
	}
	m->k_ws = take_bytes(wv, kws > mws ? kws : mws);
	m->moe_stat = c->moe_every > 0 ? take_bytes(wv, 2 * (size_t)c->n_layer * sizeof(int))
				       : NULL;
}

/* ---- a micro-batch's state ---- */

/* The model's fields that hold the state of the micro-batch in use. */
#define SLOT_FIELDS(X)                                                                      \
	X(acts) X(la) X(encoded) X(lnf) X(logits) X(lnf_mean) X(lnf_rstd) X(ce_lse) X(losses) \
	X(tok_dev) X(tgt_dev) X(inputs) X(targets) X(tok_tp) X(tgt_tp) X(tok_local)          \
	X(losses_host) X(has_targets) X(loss) X(aux_loss) X(stash) X(stash_mem) X(xin) X(xgrad)

static void slot_save(const struct mr_gpt *m, struct mr_gpt_slot *s)
{
#define X(f) s->f = m->f;
	SLOT_FIELDS(X)
#undef X
}

static void slot_load(struct mr_gpt *m, const struct mr_gpt_slot *s)
{
#define X(f) m->f = s->f;
	SLOT_FIELDS(X)
#undef X
}

void mr_gpt_slot_swap(struct mr_gpt *m, struct mr_gpt_slot *s)
{
	struct mr_gpt_slot cur;

	slot_save(m, &cur);
	slot_load(m, s);
	*s = cur;
}

/* The split backward's stash of the state in m's fields. */
static int stash_alloc(struct mr_gpt *m)
{
	size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model;
	size_t QKVl = mr__gpt_qkv_cols(m), Gl = mr__gpt_fc_cols(m);
	size_t per = N * (QKVl + C + Gl + C);
	int l, k = 0, held = 0, L = m->cfg.n_layer;

	if (m->stash)
		return 0;
	for (l = 0; l < L; l++)
		held += m->layer_unit[l] >= 0;
	m->stash = calloc((size_t)L, sizeof(*m->stash));
	m->nstash = mr_dev_act_bytes(m->dev, per * (size_t)held);
	m->stash_mem = m->stash ? dalloc(m, MR_MEM_ACTS, m->nstash) : NULL;
	if (!m->stash_mem) {
		free(m->stash);
		m->stash = NULL;
		return MR_ENOMEM;
	}
	for (l = 0; l < L; l++) {
		mr_act *b;
		if (m->layer_unit[l] < 0)
			continue;
		b = mr_dev_at(m->dev, m->stash_mem, per * (size_t)k++);
		m->stash[l].dqkv = b;
		m->stash[l].dproj1 = mr_dev_at(m->dev, b, N * QKVl);
		m->stash[l].dfc = mr_dev_at(m->dev, m->stash[l].dproj1, N * C);
		m->stash[l].dproj2 = mr_dev_at(m->dev, m->stash[l].dfc, N * Gl);
	}
	return 0;
}

/* A new state in m's fields (the caller set the one there aside); on
 * failure what was allocated is in m's fields for slot_free. */
static int slot_alloc(struct mr_gpt *m)
{
	size_t N = (size_t)m->B * m->T;
	struct carve cv = { NULL, 0 };
	int nx = m->place.chunks > 0 ? m->place.chunks : 0;

	m->la = calloc((size_t)m->cfg.n_layer, sizeof(*m->la));
	m->inputs = calloc(4 * N, sizeof(int));
	m->losses_host = calloc(N, sizeof(float));
	m->xin = nx ? calloc(2 * (size_t)nx, sizeof(*m->xin)) : NULL;
	m->xgrad = m->xin ? m->xin + nx : NULL;
	m->stash = NULL;
	m->stash_mem = NULL;
	m->tok_local = NULL;
	m->has_targets = 0;
	m->loss = m->aux_loss = 0.0f;
	m->acts = m->la && m->inputs && m->losses_host && (m->xin || !nx)
			  ? dalloc(m, MR_MEM_ACTS, m->nacts)
			  : NULL;
	if (!m->acts)
		return MR_ENOMEM;
	m->targets = m->inputs + N;
	m->tok_tp = m->targets + N;
	m->tgt_tp = m->tok_tp + N;
	cv.base = m->acts;
	carve_acts(m, &cv);
	return m->split ? stash_alloc(m) : 0;
}

static void slot_free(struct mr_gpt *m, struct mr_gpt_slot *s)
{
	mr_dev_free(m->dev, &m->mem, MR_MEM_ACTS, s->stash_mem, m->nstash);
	mr_dev_free(m->dev, &m->mem, MR_MEM_ACTS, s->acts, m->nacts);
	free(s->stash);
	free(s->la);
	free(s->xin);
	free(s->inputs);
	free(s->losses_host);
	memset(s, 0, sizeof(*s));
}

int mr_gpt_slot_alloc(struct mr_gpt *m, struct mr_gpt_slot *s)
{
	int rc;

	memset(s, 0, sizeof(*s));
	mr_gpt_slot_swap(m, s); /* m's state aside in s, m's fields empty */
	rc = slot_alloc(m);
	mr_gpt_slot_swap(m, s); /* m's state back, the new one in s */
	if (rc < 0) {
		slot_free(m, s);
		return rc;
	}
	m->slots_out++;
	return 0;
}

void mr_gpt_slot_free(struct mr_gpt *m, struct mr_gpt_slot *s)
{
	if (!s->acts)
		return;
	slot_free(m, s);
	m->slots_out--;
}

/* Frees the state in m's fields (empty after). */
static void own_state_free(struct mr_gpt *m)
{
	struct mr_gpt_slot own;

	slot_save(m, &own);
	slot_free(m, &own);
	slot_load(m, &own);
}

/* Sizes a state's arena for the current carve (on a scratch layer table)
 * and allocates the model's own state into its empty fields. */
static int own_state_alloc(struct mr_gpt *m, struct mr_errbuf *eb)
{
	struct carve cv = { NULL, 0 };
	int rc;

	if (!(m->la = calloc((size_t)m->cfg.n_layer, sizeof(*m->la))))
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	carve_acts(m, &cv);
	m->nacts = cv.used;
	free(m->la);
	m->la = NULL;
	if ((rc = slot_alloc(m)) < 0) {
		own_state_free(m);
		return mr_errf(eb, rc, "unable to allocate the model's micro-batch state (%zu bytes "
				       "of activations)",
			       m->nacts);
	}
	return 0;
}

int mr_gpt_set_recompute(struct mr_gpt *m, int mode, int layers, struct mr_errbuf *eb)
{
	struct carve cv = { NULL, 0 };

	if (mode < MR_GPT_RC_NONE || mode > MR_GPT_RC_FULL)
		return mr_errf_field(eb, MR_EINVAL, "recompute", "recompute mode %d is unknown",
				     mode);
	if (layers < 0)
		return mr_errf_field(eb, MR_EINVAL, "recompute_layers",
				     "'recompute_layers' must be >= 0, got %d", layers);
	if (mode == m->rc_mode && layers == m->rc_layers)
		return 0;
	/* only the state in m's fields is carved anew: others would keep
	 * views into the scratch freed below */
	if (m->slots_out > 0)
		return mr_errf_field(eb, MR_ESTATE, "recompute",
				     "'recompute' must be set before a pipeline takes micro-batch "
				     "slots (%d taken)",
				     m->slots_out);
	own_state_free(m);
	mr_dev_free(m->dev, &m->mem, MR_MEM_ACTS, m->rc_mem, m->nrc);
	m->rc_mem = NULL;
	m->rc_mode = mode;
	m->rc_layers = layers;
	carve_scratch(m, &cv);
	m->nrc = cv.used;
	if (m->nrc && !(m->rc_mem = dalloc(m, MR_MEM_ACTS, m->nrc))) {
		m->nrc = 0;
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the recompute scratch");
	}
	cv = (struct carve){ m->rc_mem, 0 };
	carve_scratch(m, &cv);
	return own_state_alloc(m, eb);
}

struct mr_moe_shape mr_gpt_moe_shape(const struct mr_gpt *m)
{
	struct mr_moe_shape s;
	int N = m->B * m->T;

	s.N = N;
	s.C = m->cfg.d_model;
	s.H = mr_gpt_ffn(&m->cfg) / m->par.tp.size;
	s.swiglu = m->cfg.arch == MR_ARCH_LLAMA;
	s.E = m->cfg.n_experts;
	s.k = m->cfg.top_k;
	s.norm_topk = m->cfg.moe_norm_topk;
	/* dropless: an expert can be chosen by every token of the
	 * micro-batch (a token's k choices are distinct experts) */
	s.cap = m->cfg.moe_dropless ? N : mr_moe_capacity(N, s.E, s.k, m->cfg.capacity_factor);
	s.dropless = m->cfg.moe_dropless;
	return s;
}

/* A pipeline stage's chunks: ascending, disjoint, non-empty ranges of
 * blocks; pp > 1 needs them. */
static int check_chunks(const struct mr_gpt_config *c, const struct mr_place *place,
			struct mr_errbuf *eb)
{
	int pp = mr_place_size(place, MR_AXIS_PP), k, prev = 0;

	if (!place || place->chunks == 0)
		return pp > 1 ? mr_errf_field(eb, MR_EINVAL, "pp_layers",
					      "pipeline stage %d of %d holds no layer range",
					      mr_place_index(place, MR_AXIS_PP), pp)
			      : 0;
	if (place->chunks < 0 || place->chunks > MR_PLACE_MAX_CHUNKS)
		return mr_errf_field(eb, MR_EINVAL, "pp_virtual",
				     "a stage holds 1 to %d model chunks, got %d",
				     MR_PLACE_MAX_CHUNKS, place->chunks);
	for (k = 0; k < place->chunks; k++) {
		int lo = place->layer_lo[k], hi = place->layer_hi[k];
		if (lo < prev || hi <= lo || hi > c->n_layer)
			return mr_errf_field(eb, MR_EINVAL, "pp_layers",
					     "chunk %d of pipeline stage %d holds layers [%d, %d): "
					     "chunks must be non-empty, ascending ranges within "
					     "n_layer=%d", k, mr_place_index(place, MR_AXIS_PP), lo,
					     hi, c->n_layer);
		prev = hi;
	}
	return 0;
}

int mr_gpt_check_placement(const struct mr_gpt_config *c, int T, const struct mr_place *place,
			   struct mr_errbuf *eb)
{
	int tp = mr_place_size(place, MR_AXIS_TP), sp = place && place->sp, rc;
	int ep = mr_place_size(place, MR_AXIS_EP), cp = mr_place_size(place, MR_AXIS_CP);

	if ((rc = mr_gpt_config_check(c, eb)) < 0)
		return rc;
	if (cp > 1 && T % (2 * cp) != 0)
		return mr_errf_field(eb, MR_EINVAL, "seq_len",
				     "'seq_len' (%d) is not divisible by 2 * cp (%d), as context "
				     "parallel's load-balanced chunks need", T, 2 * cp);
	if (cp > 1 && sp && (T / cp) % tp != 0)
		return mr_errf_field(eb, MR_EINVAL, "seq_len",
				     "'seq_len' / cp (%d) is not divisible by tp (%d), as sequence "
				     "parallel needs", T / cp, tp);
	if (ep > 1 && c->moe_every == 0)
		return mr_errf_field(eb, MR_EINVAL, "ep",
				     "ep %d needs a MoE model ('moe_every' > 0)", ep);
	if (ep > 1 && c->n_experts % ep != 0)
		return mr_errf_field(eb, MR_EINVAL, "ep",
				     "ep (%d) does not divide 'n_experts' (%d)", ep, c->n_experts);
	if ((rc = check_chunks(c, place, eb)) < 0)
		return rc;
	if (tp > 1024)
		return mr_errf_field(eb, MR_EINVAL, "tp", "'tp' must be in [1, 1024], got %d", tp);
	if (mr_place_index(place, MR_AXIS_TP) < 0 || mr_place_index(place, MR_AXIS_TP) >= tp)
		return mr_errf_field(eb, MR_EINVAL, "tp", "tp rank %d is outside [0, %d)",
				     mr_place_index(place, MR_AXIS_TP), tp);
	if (c->n_head % tp != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "'n_head' (%d) is not divisible by tp (%d)", c->n_head, tp);
	/* key/value heads split (tp divides them) or replicated (tp a
	 * multiple of them: mr_gpt_kv_rep) */
	if (c->arch == MR_ARCH_LLAMA && mr_gpt_kv_heads(c) % tp != 0 &&
	    tp % mr_gpt_kv_heads(c) != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_kv_head",
				     "'n_kv_head' (%d) and tp (%d): tp must divide 'n_kv_head' "
				     "(key/value heads split) or be a multiple of it (replicated)",
				     mr_gpt_kv_heads(c), tp);
	if (c->arch == MR_ARCH_LLAMA && mr_gpt_ffn(c) % tp != 0)
		return mr_errf_field(eb, MR_EINVAL, "ffn_hidden",
				     "the SwiGLU hidden size %d ('ffn_hidden') is not divisible "
				     "by tp (%d)", mr_gpt_ffn(c), tp);
	if (cp > 1 && place->cp_algo == MR_CP_ULYSSES && mr_gpt_kv_heads(c) != c->n_head &&
	    mr_gpt_kv_local(c, tp) % cp != 0)
		return mr_errf_field(eb, MR_EINVAL, "n_kv_head",
				     "'n_kv_head' (%d) gives each tp rank %d key/value heads (tp "
				     "%d%s), not divisible by cp (%d), as cp_algo \"ulysses\" needs",
				     mr_gpt_kv_heads(c), mr_gpt_kv_local(c, tp), tp,
				     mr_gpt_kv_rep(c, tp) > 1 ? ", replicated" : "", cp);
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
	struct mr_dev own;
	int rc = mr_dev_open(&own, "cpu", 0, NULL, pool, eb);

	if (rc < 0)
		return rc;
	rc = mr_gpt_create_on(m, cfg, B, T, &own, place, flags, eb);
	if (rc < 0) {
		mr_dev_close(&own);
		return rc;
	}
	/* the model keeps the device it opened and closes it at release */
	m->own_dev = own;
	m->dev = &m->own_dev;
	m->par.tp.dev = m->dev;
	if (m->par.cp.dev)
		m->par.cp.dev = m->dev;
	if (m->par.ep.dev)
		m->par.ep.dev = m->dev;
	return 0;
}

/* m->ones := 1 (through a host copy and the device's conversion, in
 * pieces of the fp32 that dtmp's N*C activations have room for). */
static int fill_ones(struct mr_gpt *m)
{
	size_t i, n = ones_n(m), done;
	size_t piece = mr_dev_act_bytes(m->dev, (size_t)m->B * m->T * (size_t)m->cfg.d_model) /
		       sizeof(float);
	float *h, *f32 = (float *)(void *)m->dtmp;
	int rc = 0;

	if (piece > n)
		piece = n;
	if (!(h = malloc(piece * sizeof(float))))
		return MR_ENOMEM;
	for (i = 0; i < piece; i++)
		h[i] = 1.0f;
	for (done = 0; done < n && rc == 0; done += piece) {
		size_t k = n - done < piece ? n - done : piece;
		rc = m->dev->ops->upload(m->dev, f32, h, k * sizeof(float));
		if (rc == 0)
			rc = m->dev->ops->to_act(m->dev, mr_dev_at(m->dev, m->ones, done), f32, k);
	}
	free(h);
	return rc;
}

/* llama: m->rope_pos, every local row's sequence position (under context
 * parallel its chunks' places, mr_cp_pos0), and m->rope_freq. */
static int rope_tables(struct mr_gpt *m)
{
	int hs = m->cfg.d_model / m->cfg.n_head, cp = mr_place_size(&m->place, MR_AXIS_CP);
	int cr = mr_place_index(&m->place, MR_AXIS_CP), Tc = m->T / 2, b, t, rc;
	size_t N = (size_t)m->B * m->T;
	int *pos = malloc(N * sizeof(int));
	float *freq = malloc((size_t)hs / 2 * sizeof(float));

	m->rope_pos = dalloc(m, MR_MEM_WORKSPACE, N * sizeof(int));
	m->rope_freq = dalloc(m, MR_MEM_WORKSPACE, (size_t)hs / 2 * sizeof(float));
	rc = pos && freq && m->rope_pos && m->rope_freq ? 0 : MR_ENOMEM;
	for (b = 0; b < m->B && rc == 0; b++)
		for (t = 0; t < m->T; t++)
			pos[(size_t)b * m->T + t] =
				cp > 1 ? mr_cp_pos0(cp, Tc, cr, t / Tc) + t % Tc : t;
	if (rc == 0) {
		mr_rope_freqs(freq, hs, mr_gpt_rope_theta(&m->cfg), &m->cfg.rope_scaling);
		rc = m->dev->ops->upload(m->dev, m->rope_pos, pos, N * sizeof(int));
	}
	if (rc == 0)
		rc = m->dev->ops->upload(m->dev, m->rope_freq, freq,
					 (size_t)hs / 2 * sizeof(float));
	free(pos);
	free(freq);
	return rc;
}

/* The device's attention limits (mr_dev.attn_*), so a shape its kernels
 * refuse fails here naming the field, not at the first forward. */
static int check_device_shape(const struct mr_gpt_config *cfg, int B, int tp,
			      const struct mr_dev *dev, struct mr_errbuf *eb)
{
	int hs = cfg->d_model / cfg->n_head;

	if (mr_gpt_kv_heads(cfg) != cfg->n_head && !dev->attn_gqa)
		return mr_errf_field(eb, MR_ENOTSUP, "n_kv_head",
				     "'n_kv_head' %d below 'n_head' %d (grouped-query attention) "
				     "is not on device %s yet", mr_gpt_kv_heads(cfg), cfg->n_head,
				     dev->ops->name);
	if (cfg->arch == MR_ARCH_LLAMA && !dev->ops->rmsnorm_fwd)
		return mr_errf_field(eb, MR_ENOTSUP, "arch",
				     "device %s has no Llama kernels", dev->ops->name);
	if (dev->attn_hs_align > 0 && (hs % dev->attn_hs_align || hs > dev->attn_hs_max))
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "'n_head' %d gives a head size of %d (d_model %d / n_head); "
				     "device %s needs a multiple of %d up to %d",
				     cfg->n_head, hs, cfg->d_model, dev->ops->name,
				     dev->attn_hs_align, dev->attn_hs_max);
	if (dev->attn_bh_max > 0 && (long)B * (cfg->n_head / tp) > dev->attn_bh_max)
		return mr_errf_field(eb, MR_EINVAL, "batch_size",
				     "'batch_size' %d x %d heads per rank exceeds device %s's "
				     "attention limit of %d",
				     B, cfg->n_head / tp, dev->ops->name, dev->attn_bh_max);
	return 0;
}

int mr_gpt_create_on(struct mr_gpt *m, const struct mr_gpt_config *cfg, int B, int T,
		     struct mr_dev *dev, const struct mr_place *place, unsigned flags,
		     struct mr_errbuf *eb)
{
	struct carve wv = { NULL, 0 };
	struct mr_layers_shape shape = { .B = B, .T = T, .C = cfg->d_model, .V = cfg->vocab,
					 .n_head = cfg->n_head, .n_kv_head = mr_gpt_kv_heads(cfg),
					 .n_experts = cfg->n_experts };
	const char *fused;
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
	if (cfg->moe_every > 0 && !dev->ops->moe_fwd)
		return mr_errf_field(eb, MR_ENOTSUP, "moe_every",
				     "'moe_every' must be 0 on device %s (no MoE kernels there yet)",
				     dev->ops->name);
	if (cfg->moe_every > 0 && cfg->arch == MR_ARCH_LLAMA && !dev->moe_swiglu)
		return mr_errf_field(eb, MR_ENOTSUP, "moe_every",
				     "'moe_every' must be 0 for arch llama on device %s (no SwiGLU "
				     "expert kernels there yet)", dev->ops->name);
	if (place)
		m->place = *place;
	m->flags = flags;
	rc = mr_gpt_check_placement(cfg, T, &m->place, eb);
	if (rc < 0)
		return rc;
	if ((rc = check_device_shape(cfg, B, mr_place_size(&m->place, MR_AXIS_TP), dev, eb)) < 0)
		return rc;
	m->cfg = *cfg;
	m->family = mr__gpt_family_of(cfg);
	m->B = B;
	/* context parallel: this rank's rows of every sequence (mr_cp.h) */
	m->T = T / mr_place_size(&m->place, MR_AXIS_CP);
	m->dev = dev;
	fused = getenv("MESHRUN_FUSED_GELU");
	m->fuse_gelu = dev->ops->matmul_gelu_fwd && !(fused && fused[0] == '0');
	m->first_stage = mr_place_index(&m->place, MR_AXIS_PP) == 0;
	m->last_stage = mr_place_index(&m->place, MR_AXIS_PP) ==
			mr_place_size(&m->place, MR_AXIS_PP) - 1;
	m->tied_replica = m->last_stage && !m->first_stage && mr_gpt_tied(cfg);
	m->pool = dev->pool;
	if ((rc = mr_layers_attach(&m->par, &m->place, dev, &m->mem, &shape, eb)) < 0) {
		mr_gpt_release(m);
		return rc;
	}
	m->w.layer = calloc((size_t)cfg->n_layer, sizeof(*m->w.layer));
	m->g.layer = calloc((size_t)cfg->n_layer, sizeof(*m->g.layer));
	if (!m->w.layer || !m->g.layer || mr__gpt_table_create(m) < 0)
		goto nomem;
	if (!(flags & MR_GPT_EXT_PARAMS) &&
	    !(m->params = dalloc(m, MR_MEM_PARAMS, m->nparams * sizeof(float))))
		goto nomem;
	if (!(flags & MR_GPT_EXT_GRADS) &&
	    !(m->grads = dalloc(m, MR_MEM_GRADS, m->nparams * sizeof(float))))
		goto nomem;
	for (u = 0; u < m->nunits; u++) {
		size_t off, n;
		mr_gpt_unit_range(m, u, &off, &n);
		mr_gpt_bind_unit(m, u, m->params ? m->params + off : NULL,
				 m->grads ? m->grads + off : NULL);
	}
	/* the weights' compute copy where the kernels do not read fp32 */
	if (dev->act != MR_DT_F32) {
		m->wc.layer = calloc((size_t)cfg->n_layer, sizeof(*m->wc.layer));
		if (!m->wc.layer)
			goto nomem;
		if (!(flags & MR_GPT_EXT_COMPUTE)) {
			m->params_c = dalloc(m, MR_MEM_PARAMS, mr_dev_act_bytes(dev, m->nparams));
			if (!m->params_c)
				goto nomem;
			mr__gpt_bind_compute(m);
		}
	}

	carve_ws(m, &wv);
	m->nws = wv.used;
	if (!(m->ws = dalloc(m, MR_MEM_WORKSPACE, m->nws)))
		goto nomem;
	wv.base = m->ws;
	wv.used = 0;
	carve_ws(m, &wv);
	if (m->moe_stat &&
	    !(m->moe_stat_host = calloc(2 * (size_t)cfg->n_layer, sizeof(int))))
		goto nomem;
	if (fill_ones(m) < 0)
		goto nomem;
	if (cfg->arch == MR_ARCH_LLAMA && rope_tables(m) < 0)
		goto nomem;
	if ((rc = own_state_alloc(m, eb)) < 0) {
		mr_gpt_release(m);
		return rc;
	}
	return 0;
nomem:
	if (m->dev->fault[0]) /* not memory: the device failed */
		rc = mr_errf(eb, MR_ESYS, "unable to allocate the model: device error (%s)",
			     m->dev->fault);
	else
		rc = mr_errf(eb, MR_ENOMEM, "unable to allocate the model (%zu parameters)",
			     m->nparams);
	mr_gpt_release(m);
	return rc;
}

int mr_gpt_split_bwd(struct mr_gpt *m)
{
	int rc;

	if (m->split)
		return 0;
	/* states carved from now on get theirs in slot_alloc; the model
	 * cannot reach those already out */
	if (m->slots_out > 0)
		return MR_ESTATE;
	rc = stash_alloc(m);
	m->split = rc == 0;
	return rc;
}

void mr_gpt_release(struct mr_gpt *m)
{
	struct mr_dev *d = m->dev;

	if (d) {
		mr_layers_release(&m->par);
		own_state_free(m);
		mr_dev_free(d, &m->mem, MR_MEM_PARAMS, m->params, m->nparams * sizeof(float));
		mr_dev_free(d, &m->mem, MR_MEM_PARAMS, m->params_c,
			    mr_dev_act_bytes(d, m->nparams));
		mr_dev_free(d, &m->mem, MR_MEM_GRADS, m->grads, m->nparams * sizeof(float));
		mr_dev_free(d, &m->mem, MR_MEM_WORKSPACE, m->ws, m->nws);
		mr_dev_free(d, &m->mem, MR_MEM_ACTS, m->rc_mem, m->nrc);
		mr_dev_free(d, &m->mem, MR_MEM_WORKSPACE, m->rope_pos,
			    (size_t)m->B * m->T * sizeof(int));
		mr_dev_free(d, &m->mem, MR_MEM_WORKSPACE, m->rope_freq,
			    (size_t)(m->cfg.d_model / m->cfg.n_head) / 2 * sizeof(float));
	}
	if (d == &m->own_dev)
		mr_dev_close(&m->own_dev);
	free(m->tensors);
	free(m->unit_first);
	free(m->layer_unit);
	free(m->w.layer);
	free(m->g.layer);
	free(m->wc.layer);
	free(m->moe_stat_host);
	memset(m, 0, sizeof(*m));
}

int mr_gpt_init_tensor(const struct mr_gpt *m, uint64_t seed, int i, float *dst)
{
	const struct mr_gpt_tensor *t = &m->tensors[i];
	size_t j, n = mr_gpt_tensor_full_n(t);
	float *full = t->split[MR_AXIS_TP] >= 0 || t->split[MR_AXIS_EP] >= 0
			      ? malloc(n * sizeof(float))
			      : dst;
	struct mr_rng r;

	if (!full)
		return MR_ENOMEM;
	mr_rng_seed(&r, seed, (uint64_t)t->id);
	for (j = 0; j < n; j++) {
		if (t->init == MR_INIT_NORMAL)
			full[j] = (float)(mr_rng_normal(&r) * t->std);
		else
			full[j] = t->init == MR_INIT_ONE ? 1.0f : 0.0f;
	}
	if (full != dst) {
		mr_gpt_tensor_slice(t, m->par.tp.size, m->par.tp.rank, m->par.ep.rank, full, dst, 0);
		free(full);
	}
	return 0;
}

int mr_gpt_init_params(struct mr_gpt *m, uint64_t seed)
{
	size_t mx = 0;
	float *h;
	int i, rc = 0;

	for (i = 0; i < m->ntensors; i++)
		if (m->tensors[i].n > mx)
			mx = m->tensors[i].n;
	if (!(h = malloc(mx * sizeof(float))))
		return MR_ENOMEM;
	for (i = 0; i < m->ntensors && rc == 0; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		if ((rc = mr_gpt_init_tensor(m, seed, i, h)) == 0)
			rc = m->dev->ops->upload(m->dev, m->params + t->off, h, t->n * sizeof(float));
	}
	free(h);
	return rc < 0 ? rc : mr_gpt_refresh_compute(m);
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
	 * of E, not wpe (a lookup), and wte once, as the LM head of the last
	 * stage - C is this rank's channels and L its stage's blocks. */
	const struct mr_gpt_config *c = &m->cfg;
	size_t n = 0, C = (size_t)c->d_model / (size_t)m->par.tp.size, L = 0;
	int i;

	for (i = 0; i < c->n_layer; i++)
		L += m->layer_unit[i] >= 0;
	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		/* lookups: positions, and the token embedding unless it is
		 * the last stage's LM head */
		if (t->layer < 0 && (t->view == offsetof(struct mr_gpt_weights, wpe) ||
				     (t->view == offsetof(struct mr_gpt_weights, wte) &&
				      !(m->last_stage && mr_gpt_tied(c)))))
			continue;
		if (strstr(t->name, ".moe.") && !strstr(t->name, ".router."))
			n += t->n / (size_t)c->n_experts * (size_t)c->top_k;
		else
			n += t->n;
	}
	return 6 * n + 6 * L * C * (size_t)m->T;
}
