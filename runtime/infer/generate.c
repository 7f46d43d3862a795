/*
 * generate.c - decoding with a key/value cache on the device table (see
 * mr_generate.h): loading a checkpoint into a one-rank model, the
 * per-feed passes of both families' blocks, the loop that samples and
 * feeds. Sampling itself is sample.c.
 *
 * Shapes: n rows a feed (the prompt, then 1), C = NH*hs, kv = NKV*hs,
 * qkv = C + 2 kv (rows [q | k | v], the training layout), fc the first
 * MLP GEMM's columns (gpt2 4C; llama [gate | up] 2F), ffn the hidden
 * (gpt2 4C; llama F).
 *
 * Non-goals: the training passes (model/gpt.c, llama.c), which recompute
 * every position; this file never writes the model's activations.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/mr_generate.h"

#define ALIGN 256

/* The weight views the kernels read: the compute copy where the
 * activation type is not fp32, else the master (as model/gpt.c). */
static const struct mr_gpt_weights *views(const struct mr_gen *g)
{
	return g->dev->act != MR_DT_F32 ? &g->m.wc : &g->m.w;
}

static const mr_act *cw(const float *view)
{
	return (const mr_act *)(const void *)view;
}

/* The MoE shape of a feed of n rows: dropless (cap = n). */
static struct mr_moe_shape moe_shape(const struct mr_gen *g, int n)
{
	const struct mr_gpt_config *c = &g->m.cfg;
	struct mr_moe_shape s = { .N = n, .C = c->d_model, .H = mr_gpt_ffn(c), .E = c->n_experts,
				  .k = c->top_k, .cap = n, .swiglu = c->arch == MR_ARCH_LLAMA,
				  .norm_topk = c->moe_norm_topk };
	return s;
}

/* Carves one feed's buffers out of base (NULL: sizes only); bytes used. */
static size_t carve(struct mr_gen *g, char *base)
{
	size_t off = 0, n = (size_t)g->maxn, C = (size_t)g->C;
	size_t ab = g->dev->act_bytes, fl = sizeof(float), in = sizeof(int);
	int moe = g->m.cfg.moe_every > 0;
	struct mr_moe_shape s = moe_shape(g, g->maxn);
#define TAKE(field, type, bytes)                                          \
	do {                                                              \
		g->field = base ? (type)(void *)(base + off) : NULL;      \
		off += ((bytes) + ALIGN - 1) / ALIGN * ALIGN;             \
	} while (0)
	TAKE(tok, int *, n * in);
	TAKE(posv, int *, n * in);
	TAKE(x, mr_act *, n * C * ab);
	TAKE(h, mr_act *, n * C * ab);
	TAKE(att, mr_act *, n * C * ab);
	TAKE(y, mr_act *, n * C * ab);
	TAKE(qkvr, mr_act *, n * (size_t)g->qkv * ab);
	TAKE(fch, mr_act *, n * (size_t)g->fc * ab);
	TAKE(fcg, mr_act *, n * (size_t)g->ffn * ab);
	TAKE(logits, mr_act *, (size_t)g->V * ab);
	TAKE(attf, float *, n * C * fl);
	TAKE(mean, float *, n * fl);
	TAKE(rstd, float *, n * fl);
	TAKE(lse, float *, n * (size_t)g->NH * fl);
	TAKE(logf, float *, (size_t)g->V * fl);
	TAKE(moe_f, float *, moe ? mr_moe_act_floats(&s) * fl : 0);
	TAKE(moe_i, int *, moe ? mr_moe_act_ints(&s) * in : 0);
#undef TAKE
	return off;
}

/* The model on dev and every buffer, weights not loaded. */
static int setup(struct mr_gen *g, const struct mr_gpt_config *cfg, struct mr_dev *dev,
		 int maxn, struct mr_errbuf *eb)
{
	const struct mr_gpt_config *c;
	int rc;

	memset(g, 0, sizeof(*g));
	g->dev = dev;
	if (maxn < 1)
		return mr_errf(eb, MR_EINVAL, "a feed takes at least one row (maxn %d)", maxn);
	/* no gradients: decoding never runs a backward */
	if ((rc = mr_gpt_create_on(&g->m, cfg, 1, 1, dev, NULL, MR_GPT_EXT_GRADS, eb)) < 0) {
		memset(g, 0, sizeof(*g));
		return rc;
	}
	c = &g->m.cfg;
	g->maxn = maxn < c->max_seq ? maxn : c->max_seq;
	g->V = c->vocab;
	g->C = c->d_model;
	g->NH = c->n_head;
	g->NKV = mr_gpt_kv_heads(c);
	g->hs = c->d_model / c->n_head;
	g->kv = (size_t)g->NKV * (size_t)g->hs;
	g->qkv = g->C + 2 * (int)g->kv;
	g->ffn = mr_gpt_ffn(c);
	g->fc = c->arch == MR_ARCH_LLAMA ? 2 * g->ffn : g->ffn;
	g->cache_bytes = (size_t)c->n_layer * 2 * (size_t)c->max_seq * g->kv * dev->act_bytes;
	g->buf_bytes = carve(g, NULL);
	g->cache = mr_dev_alloc(dev, &g->m.mem, MR_MEM_ACTS, g->cache_bytes);
	g->buf = mr_dev_alloc(dev, &g->m.mem, MR_MEM_WORKSPACE, g->buf_bytes);
	g->host_logits = malloc((size_t)g->V * sizeof(float));
	g->prob = malloc((size_t)g->V * sizeof(float));
	g->idx = malloc((size_t)g->V * sizeof(int));
	if (!g->cache || !g->buf || !g->host_logits || !g->prob || !g->idx) {
		rc = mr_errf(eb, MR_ENOMEM,
			     "unable to allocate the key/value cache (%zu bytes) and buffers "
			     "(%zu bytes)%s%s", g->cache_bytes, g->buf_bytes,
			     dev->fault[0] ? ": " : "", dev->fault);
		mr_gen_release(g);
		return rc;
	}
	carve(g, g->buf);
	return 0;
}

/* Uploads the whole model's host params and refreshes the compute copy. */
static int upload(struct mr_gen *g, const float *params, struct mr_errbuf *eb)
{
	struct mr_dev *d = g->dev;
	int rc = d->ops->upload(d, g->m.params, params, g->m.nparams * sizeof(float));

	if (rc == 0)
		rc = mr_gpt_refresh_compute(&g->m);
	return rc < 0 ? mr_errf(eb, rc, "unable to copy the weights to the %s device%s%s",
				d->ops->name, d->fault[0] ? ": " : "", d->fault)
		      : 0;
}

int mr_gen_init_params(struct mr_gen *g, const struct mr_gpt_config *cfg, const float *params,
		       struct mr_dev *dev, int maxn, struct mr_errbuf *eb)
{
	int rc = setup(g, cfg, dev, maxn, eb);

	if (rc == 0 && (rc = upload(g, params, eb)) < 0)
		mr_gen_release(g);
	return rc;
}

int mr_gen_init(struct mr_gen *g, const struct mr_ckpt_manifest *mf, struct mr_dev *dev,
		int maxn, struct mr_errbuf *eb)
{
	float *host = NULL;
	int rc = setup(g, &mf->model, dev, maxn, eb);

	if (rc < 0)
		return rc;
	if (!(host = malloc(g->m.nparams * sizeof(float))))
		rc = mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
	else
		rc = mr_ckpt_read_model(mf, &g->m, host, eb);
	if (rc == 0)
		rc = upload(g, host, eb);
	free(host);
	if (rc < 0)
		mr_gen_release(g);
	return rc;
}

void mr_gen_release(struct mr_gen *g)
{
	if (!g->dev)
		return;
	mr_dev_free(g->dev, &g->m.mem, MR_MEM_ACTS, g->cache, g->cache_bytes);
	mr_dev_free(g->dev, &g->m.mem, MR_MEM_WORKSPACE, g->buf, g->buf_bytes);
	free(g->host_logits);
	free(g->prob);
	free(g->idx);
	mr_gpt_release(&g->m);
	memset(g, 0, sizeof(*g));
}

void mr_gen_reset(struct mr_gen *g)
{
	g->pos = 0;
}

#define OP(name, ...) (d->ops->name(d, __VA_ARGS__))
#define CK(call)                       \
	do {                           \
		if ((rc = (call)) < 0) \
			return rc;     \
	} while (0)

/* The block's norm (LayerNorm; RMSNorm for llama) of n rows. */
static int norm(struct mr_gen *g, mr_act *out, const mr_act *in, const float *w, const float *b,
		int n)
{
	struct mr_dev *d = g->dev;

	if (g->m.cfg.arch == MR_ARCH_LLAMA)
		return OP(rmsnorm_fwd, out, g->rstd, in, cw(w), n, g->C, mr_gpt_norm_eps(&g->m.cfg));
	return OP(layernorm_fwd, out, g->mean, g->rstd, in, cw(w), cw(b), n, g->C);
}

/* Block l on g->x (n rows at positions g->pos..), in place. */
static int block(struct mr_gen *g, int l, int n)
{
	struct mr_dev *d = g->dev;
	const struct mr_gpt_config *c = &g->m.cfg;
	const struct mr_gpt_layer_w *w = &views(g)->layer[l];
	int llama = c->arch == MR_ARCH_LLAMA, rc;
	size_t ab = d->act_bytes, nc = (size_t)n * (size_t)g->C;
	size_t lay = (size_t)c->max_seq * g->kv; /* one layer's keys (or values) */
	mr_act *kc = mr_dev_at(d, g->cache, 2 * (size_t)l * lay), *vc = mr_dev_at(d, kc, lay);
	struct mr_dev_attn a;

	/* attention: q, k, v of the new rows; k and v appended to the cache */
	CK(norm(g, g->h, g->x, w->ln1w, w->ln1b, n));
	CK(OP(matmul_fwd, g->qkvr, g->h, cw(w->qkvw), llama ? NULL : cw(w->qkvb), n, g->C,
	      g->qkv));
	if (llama)
		CK(OP(rope, g->qkvr, (size_t)g->qkv, n, g->NH + g->NKV, g->hs, g->posv,
		      g->m.rope_freq, 1));
	CK(OP(copy2d, mr_dev_at(d, kc, (size_t)g->pos * g->kv), g->kv * ab,
	      mr_dev_at(d, g->qkvr, (size_t)g->C), (size_t)g->qkv * ab, g->kv * ab, (size_t)n));
	CK(OP(copy2d, mr_dev_at(d, vc, (size_t)g->pos * g->kv), g->kv * ab,
	      mr_dev_at(d, g->qkvr, (size_t)g->C + g->kv), (size_t)g->qkv * ab, g->kv * ab,
	      (size_t)n));
	memset(&a, 0, sizeof(a));
	a.q = g->qkvr;
	a.k = kc;
	a.v = vc;
	a.q_row = (size_t)g->qkv;
	a.q_batch = (size_t)n * (size_t)g->qkv;
	a.kv_row = g->kv;
	a.kv_batch = lay;
	a.B = 1;
	a.NH = g->NH;
	a.hs = g->hs;
	a.NKV = g->NKV;
	a.tq = n;
	a.q_pos0 = g->pos;
	a.tk = g->pos + n;
	a.k_pos0 = 0;
	a.causal = 1;
	a.scale = 1.0f / sqrtf((float)g->hs);
	CK(OP(attn_part_fwd, &a, g->attf, (size_t)g->C, nc, g->lse));
	CK(OP(to_act, g->att, g->attf, nc));
	CK(OP(matmul_fwd, g->y, g->att, cw(w->attprojw), llama ? NULL : cw(w->attprojb), n,
	      g->C, g->C));
	CK(OP(add, g->x, g->y, nc));
	/* the MLP: dense, or MoE dropless */
	CK(norm(g, g->h, g->x, w->ln2w, w->ln2b, n));
	if (mr_gpt_layer_is_moe(c, l)) {
		struct mr_moe_shape s = moe_shape(g, n);
		struct mr_moe_acts ma;
		memset(&ma, 0, sizeof(ma));
		mr_moe_acts_bind(&ma, &s, g->moe_f, g->moe_i);
		CK(OP(moe_fwd, &s, &ma, &g->m.par.xchg, g->y, g->h, cw(w->routerw), cw(w->fcw),
		      cw(w->fcb), cw(w->fcprojw), cw(w->fcprojb)));
	} else {
		if (llama) {
			CK(OP(matmul_fwd, g->fch, g->h, cw(w->fcw), NULL, n, g->C, g->fc));
			CK(OP(swiglu_fwd, g->fcg, g->fch, n, g->ffn));
		} else if (g->m.fuse_gelu) { /* as the training forward does */
			CK(OP(matmul_gelu_fwd, g->fcg, g->fch, g->h, cw(w->fcw), cw(w->fcb), n,
			      g->C, g->fc));
		} else {
			CK(OP(matmul_fwd, g->fch, g->h, cw(w->fcw), cw(w->fcb), n, g->C, g->fc));
			CK(OP(gelu_fwd, g->fcg, g->fch, (size_t)n * (size_t)g->ffn));
		}
		CK(OP(matmul_fwd, g->y, g->fcg, cw(w->fcprojw), llama ? NULL : cw(w->fcprojb), n,
		      g->ffn, g->C));
	}
	return OP(add, g->x, g->y, nc);
}

/* The passes of one feed; the device's error code. */
static int feed(struct mr_gen *g, const int *tok, int n)
{
	struct mr_dev *d = g->dev;
	const struct mr_gpt_weights *w = views(g);
	int pos[256], i, k, l, rc;

	CK(OP(upload, g->tok, tok, (size_t)n * sizeof(int)));
	for (i = 0; i < n; i += k) { /* positions pos.. in pieces of 256 */
		k = n - i < 256 ? n - i : 256;
		for (int j = 0; j < k; j++)
			pos[j] = g->pos + i + j;
		CK(OP(upload, g->posv + i, pos, (size_t)k * sizeof(int)));
	}
	CK(OP(embed_fwd, g->x, g->tok, cw(w->wte), NULL, 1, n, g->C));
	if (w->wpe)
		CK(OP(add_pos, g->x, cw(w->wpe), n, g->C, n, g->pos));
	for (l = 0; l < g->m.cfg.n_layer; l++)
		CK(block(g, l, n));
	/* the last row only: final norm, LM head, logits to the host */
	CK(norm(g, g->h, mr_dev_at(d, g->x, (size_t)(n - 1) * (size_t)g->C), w->lnfw, w->lnfb, 1));
	CK(OP(matmul_fwd, g->logits, g->h, cw(w->head ? w->head : w->wte), NULL, 1, g->C, g->V));
	CK(OP(to_f32, g->logf, g->logits, (size_t)g->V));
	return OP(download, g->host_logits, g->logf, (size_t)g->V * sizeof(float));
}

#undef OP
#undef CK

int mr_gen_feed(struct mr_gen *g, const int *tok, int n, struct mr_errbuf *eb)
{
	int rc;

	if (n < 1 || n > g->maxn)
		return mr_errf(eb, MR_EINVAL, "a feed of %d tokens (1 to %d)", n, g->maxn);
	if (g->pos + n > g->m.cfg.max_seq)
		return mr_errf(eb, MR_ERANGE,
			       "%d tokens past position %d exceed the model's max_seq %d", n,
			       g->pos, g->m.cfg.max_seq);
	if ((rc = mr_gpt_check_tokens(tok, n, g->V, "prompt", eb)) < 0)
		return rc;
	if ((rc = feed(g, tok, n)) < 0)
		return mr_errf(eb, rc, "decoding at position %d failed on the %s device%s%s",
			       g->pos, g->dev->ops->name, g->dev->fault[0] ? ": " : "",
			       g->dev->fault);
	g->pos += n;
	return 0;
}

int mr_gen_run(struct mr_gen *g, const int *prompt, int np, const struct mr_gen_opts *o,
	       int *out, int *nout, mr_gen_emit_fn emit, void *ctx, struct mr_errbuf *eb)
{
	struct mr_rng r;
	int i, rc, tok, max_seq = g->m.cfg.max_seq;

	*nout = 0;
	if (np < 1)
		return mr_errf_field(eb, MR_EINVAL, "prompt", "the prompt is empty");
	if (np >= max_seq)
		return mr_errf_field(eb, MR_ERANGE, "prompt",
				     "the prompt's %d tokens leave no room for a new one: the "
				     "model's max_seq is %d", np, max_seq);
	mr_gen_reset(g);
	mr_rng_seed(&r, o->seed, 0);
	if ((rc = mr_gen_feed(g, prompt, np, eb)) < 0)
		return rc;
	for (i = 0; i < o->max_new; i++) {
		tok = mr_gen_sample(g->host_logits, g->V, o, &r, g->prob, g->idx);
		if (out)
			out[i] = tok;
		*nout = i + 1;
		if (emit && emit(ctx, tok))
			break;
		/* the sequence (g->pos fed + this one) is full: this token is its last */
		if (i + 1 == o->max_new || g->pos + 1 >= max_seq)
			break;
		if ((rc = mr_gen_feed(g, &tok, 1, eb)) < 0)
			return rc;
	}
	return 0;
}
