/*
 * cpu.c - the cpu device (see mr_device.h): host memory through the rank's
 * ledger allocator (registered with the communicator, so shared-memory
 * peers read it with one copy), fp32 everywhere, and the kernels of
 * kernels/ (the MoE MLP of kernels/moe.c included) on the rank's thread
 * pool. Every operation has finished when it returns.
 *
 * The only state is a column of ones for the bias gradients' gemv, grown
 * to the largest row count seen (N floats, a few KiB).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/dev_int.h"
#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"
#include "kernels/mr_moe.h"
#include "optim/mr_adamw.h"

#define F(p) ((float *)(void *)(p))
#define CF(p) ((const float *)(const void *)(p))

struct cpu_state {
	float *ones;
	size_t nones;
	struct mr_dev_adamw adamw; /* adamw_args' */
};

static const float *ones_for(struct mr_dev *d, int N)
{
	struct cpu_state *s = d->impl;
	size_t i;

	if ((size_t)N > s->nones) {
		float *o = realloc(s->ones, (size_t)N * sizeof(float));
		if (!o)
			return NULL;
		for (i = s->nones; i < (size_t)N; i++)
			o[i] = 1.0f;
		s->ones = o;
		s->nones = (size_t)N;
	}
	return s->ones;
}

static void *cpu_alloc(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind,
		       size_t bytes)
{
	(void)d;
	return mr_mem_alloc(mem, kind, bytes);
}

static void cpu_free(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind, void *p,
		     size_t bytes)
{
	(void)d;
	mr_mem_free(mem, kind, p, bytes);
}

static int cpu_copy(struct mr_dev *d, void *dst, const void *src, size_t bytes)
{
	(void)d;
	if (dst != src && bytes)
		memmove(dst, src, bytes);
	return 0;
}

static int cpu_copy2d(struct mr_dev *d, void *dst, size_t dpitch, const void *src,
		      size_t spitch, size_t width, size_t rows)
{
	size_t r;

	(void)d;
	for (r = 0; r < rows; r++)
		memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
	return 0;
}

static int cpu_zero(struct mr_dev *d, void *p, size_t bytes)
{
	(void)d;
	memset(p, 0, bytes);
	return 0;
}

static int cpu_to_act(struct mr_dev *d, mr_act *dst, const float *src, size_t n)
{
	return cpu_copy(d, dst, src, n * sizeof(float));
}

static int cpu_to_f32(struct mr_dev *d, float *dst, const mr_act *src, size_t n)
{
	return cpu_copy(d, dst, src, n * sizeof(float));
}

static int cpu_sync(struct mr_dev *d)
{
	(void)d;
	return 0;
}

static int cpu_matmul_fwd(struct mr_dev *d, mr_act *out, const mr_act *inp, const mr_act *w,
			  const mr_act *bias, int N, int IC, int OC)
{
	mr_matmul_fwd(d->pool, F(out), CF(inp), CF(w), CF(bias), N, IC, OC);
	return 0;
}

static int cpu_matmul_bwd(struct mr_dev *d, mr_act *dinp, float *dw, float *dbias,
			  const mr_act *dout, const mr_act *inp, const mr_act *w, int N, int IC,
			  int OC, int acc)
{
	const float *ones = dbias ? ones_for(d, N) : NULL;

	if (dbias && !ones)
		return MR_ENOMEM;
	mr_matmul_bwd(d->pool, F(dinp), dw, dbias, CF(dout), CF(inp), CF(w), N, IC, OC, acc,
		      ones);
	return 0;
}

static int cpu_layernorm_fwd(struct mr_dev *d, mr_act *out, float *mean, float *rstd,
			     const mr_act *inp, const mr_act *w, const mr_act *b, int N, int C)
{
	mr_layernorm_fwd(d->pool, F(out), mean, rstd, CF(inp), CF(w), CF(b), N, C);
	return 0;
}

static int cpu_layernorm_bwd(struct mr_dev *d, mr_act *dinp, float *dw, float *db,
			     const mr_act *dout, const mr_act *inp, const mr_act *w,
			     const float *mean, const float *rstd, int N, int C, void *ws)
{
	mr_layernorm_bwd(d->pool, F(dinp), dw, db, CF(dout), CF(inp), CF(w), mean, rstd, N, C,
			 ws);
	return 0;
}

static int cpu_gelu_fwd(struct mr_dev *d, mr_act *out, const mr_act *inp, size_t n)
{
	mr_gelu_fwd(d->pool, F(out), CF(inp), n);
	return 0;
}

static int cpu_gelu_bwd(struct mr_dev *d, mr_act *dinp, const mr_act *inp, const mr_act *dout,
			size_t n)
{
	mr_gelu_bwd(d->pool, F(dinp), CF(inp), CF(dout), n);
	return 0;
}

static int cpu_add(struct mr_dev *d, mr_act *y, const mr_act *x, size_t n)
{
	mr_add_inplace(d->pool, F(y), CF(x), n);
	return 0;
}

static int cpu_add_bias(struct mr_dev *d, mr_act *rows, const mr_act *bias, int n, int C)
{
	float *r = F(rows);
	const float *b = CF(bias);
	int i, c;

	(void)d;
	for (i = 0; i < n; i++)
		for (c = 0; c < C; c++)
			r[(size_t)i * C + c] += b[c];
	return 0;
}

static int cpu_embed_fwd(struct mr_dev *d, mr_act *out, const int *tok, const mr_act *wte,
			 const mr_act *wpe, int B, int T, int C)
{
	mr_encoder_fwd(d->pool, F(out), tok, CF(wte), CF(wpe), B, T, C);
	return 0;
}

static int cpu_embed_bwd(struct mr_dev *d, float *dwte, float *dwpe, const mr_act *dout,
			 const int *tok, const int *tok_host, int B, int T, int C)
{
	(void)tok_host;
	mr_encoder_bwd(d->pool, dwte, dwpe, CF(dout), tok, B, T, C);
	return 0;
}

static int cpu_add_pos(struct mr_dev *d, mr_act *out, const mr_act *wpe, int n, int C,
		       int period, int off)
{
	float *o = F(out);
	const float *pe = CF(wpe);
	int i, c;

	(void)d;
	for (i = 0; i < n; i++) {
		const float *p = pe + (size_t)(off + i % period) * C;
		float *r = o + (size_t)i * C;
		for (c = 0; c < C; c++)
			r[c] += p[c];
	}
	return 0;
}

static int cpu_ce_fwd(struct mr_dev *d, float *losses, float *lse, const mr_act *logits,
		      const int *tgt, int N, int V)
{
	mr_crossentropy_fwd(d->pool, losses, lse, CF(logits), tgt, N, V);
	return 0;
}

static int cpu_ce_rowmax(struct mr_dev *d, float *mx, const mr_act *logits, int N, int V)
{
	mr_crossentropy_rowmax(d->pool, mx, CF(logits), N, V);
	return 0;
}

static int cpu_ce_sumexp(struct mr_dev *d, float *sum, float *tl, const mr_act *logits,
			 const float *mx, const int *tgt, int N, int V)
{
	mr_crossentropy_sumexp(d->pool, sum, tl, CF(logits), mx, tgt, N, V);
	return 0;
}

static int cpu_ce_finish(struct mr_dev *d, float *losses, float *lse, const float *mx,
			 const float *sum, const float *tl, int N)
{
	int i;

	(void)d;
	for (i = 0; i < N; i++) {
		lse[i] = mx[i] + logf(sum[i] > 0.0f ? sum[i] : 1.0f);
		losses[i] = lse[i] - tl[i];
	}
	return 0;
}

static int cpu_ce_bwd(struct mr_dev *d, mr_act *logits, const float *lse, const int *tgt, int N,
		      int V, float dscale)
{
	mr_crossentropy_bwd_inplace(d->pool, F(logits), lse, tgt, N, V, dscale);
	return 0;
}

static int cpu_fill_cols(struct mr_dev *d, mr_act *x, int N, int V, int from, float value)
{
	float *r = F(x);
	int i, v;

	(void)d;
	for (i = 0; i < N; i++)
		for (v = from; v < V; v++)
			r[(size_t)i * V + v] = value;
	return 0;
}

static int cpu_attn_fwd(struct mr_dev *d, mr_act *out, float *lse, const mr_act *qkv, int B,
			int T, int C, int NH, int NKV, void *ws)
{
	mr_attn_layer_fwd(d->pool, F(out), lse, CF(qkv), B, T, C, NH, NKV, ws);
	return 0;
}

static int cpu_attn_bwd(struct mr_dev *d, mr_act *dqkv, const mr_act *dout, const mr_act *qkv,
			const mr_act *out, const float *lse, int B, int T, int C, int NH, int NKV,
			void *ws)
{
	mr_attn_layer_bwd(d->pool, F(dqkv), CF(dout), CF(qkv), CF(out), lse, B, T, C, NH, NKV,
			  ws);
	return 0;
}

static size_t cpu_ws_bytes(struct mr_dev *d, int T, int C, int NH)
{
	size_t a = mr_attn_layer_ws_floats(d->pool, T, C / NH);
	size_t l = mr_layernorm_ws_floats(d->pool, C);
	size_t r = mr_rmsnorm_ws_floats(d->pool, C);

	a = a > l ? a : l;
	return (a > r ? a : r) * sizeof(float);
}

static int cpu_rmsnorm_fwd(struct mr_dev *d, mr_act *out, float *rstd, const mr_act *inp,
			   const mr_act *w, int N, int C, float eps)
{
	mr_rmsnorm_fwd(d->pool, F(out), rstd, CF(inp), CF(w), N, C, eps);
	return 0;
}

static int cpu_rmsnorm_bwd(struct mr_dev *d, mr_act *dinp, float *dw, const mr_act *dout,
			   const mr_act *inp, const mr_act *w, const float *rstd, int N, int C,
			   void *ws)
{
	mr_rmsnorm_bwd(d->pool, F(dinp), dw, CF(dout), CF(inp), CF(w), rstd, N, C, ws);
	return 0;
}

static int cpu_rope(struct mr_dev *d, mr_act *x, size_t stride, int N, int nheads, int D,
		    const int *pos, const float *inv_freq, int dir)
{
	if (dir > 0)
		mr_rope_fwd(d->pool, F(x), stride, N, nheads, D, pos, inv_freq);
	else
		mr_rope_bwd(d->pool, F(x), stride, N, nheads, D, pos, inv_freq);
	return 0;
}

static int cpu_swiglu_fwd(struct mr_dev *d, mr_act *out, const mr_act *ab, int N, int H)
{
	mr_swiglu_fwd(d->pool, F(out), CF(ab), N, H);
	return 0;
}

static int cpu_swiglu_bwd(struct mr_dev *d, mr_act *dab, const mr_act *ab, const mr_act *dout,
			  int N, int H)
{
	mr_swiglu_bwd(d->pool, F(dab), CF(ab), CF(dout), N, H);
	return 0;
}

static struct mr_attn_slice cpu_slice(const struct mr_dev_attn *a)
{
	struct mr_attn_slice s = { CF(a->q), CF(a->k), CF(a->v), a->q_row, a->q_batch,
				   a->kv_row, a->kv_batch, a->B, a->NH, a->hs, a->tq,
				   a->q_pos0, a->tk, a->k_pos0, a->causal, a->scale, a->NKV };
	return s;
}

static int cpu_attn_part_fwd(struct mr_dev *d, const struct mr_dev_attn *a, float *out,
			     size_t o_row, size_t o_batch, float *lse)
{
	struct mr_attn_slice s = cpu_slice(a);

	return mr_attn_slice_fwd(d->pool, &s, out, o_row, o_batch, lse);
}

static int cpu_attn_merge(struct mr_dev *d, float *out_a, float *lse_a, const float *out_b,
			  const float *lse_b, int B, int NH, int tq, int hs, size_t o_row,
			  size_t o_batch)
{
	mr_attn_slice_merge(d->pool, out_a, lse_a, out_b, lse_b, B, NH, tq, hs, o_row, o_batch);
	return 0;
}

static int cpu_attn_delta(struct mr_dev *d, float *delta, const mr_act *dout, const mr_act *out,
			  int B, int NH, int tq, int hs, size_t o_row, size_t o_batch)
{
	mr_attn_slice_delta(d->pool, delta, CF(dout), CF(out), B, NH, tq, hs, o_row, o_batch);
	return 0;
}

static int cpu_attn_part_bwd(struct mr_dev *d, const struct mr_dev_attn *a, const mr_act *dout,
			     size_t o_row, size_t o_batch, const float *lse, const float *delta,
			     float *dq, size_t dq_row, size_t dq_batch, float *dk, float *dv,
			     size_t dkv_row, size_t dkv_batch)
{
	struct mr_attn_slice s = cpu_slice(a);

	return mr_attn_slice_bwd(d->pool, &s, CF(dout), o_row, o_batch, lse, delta, dq, dq_row,
				 dq_batch, dk, dv, dkv_row, dkv_batch);
}

static int cpu_moe_fwd(struct mr_dev *d, const struct mr_moe_shape *s, struct mr_moe_acts *a,
		       const struct mr_moe_xchg *xg, mr_act *y, const mr_act *x,
		       const mr_act *routerw, const mr_act *fcw, const mr_act *fcb,
		       const mr_act *fcprojw, const mr_act *fcprojb)
{
	return mr_moe_fwd(d->pool, s, a, xg, F(y), CF(x), CF(routerw), CF(fcw), CF(fcb),
			  CF(fcprojw), CF(fcprojb));
}

static int cpu_moe_bwd(struct mr_dev *d, const struct mr_moe_shape *s,
		       const struct mr_moe_acts *a, const struct mr_moe_xchg *xg, mr_act *dx,
		       const mr_act *dy, const mr_act *x, const mr_act *routerw, const mr_act *fcw,
		       const mr_act *fcprojw, float *drouterw, float *dfcw, float *dfcb,
		       float *dfcprojw, float *dfcprojb, float aux_scale, void *ws,
		       const mr_act *ones)
{
	return mr_moe_bwd(d->pool, s, a, xg, F(dx), CF(dy), CF(x), CF(routerw), CF(fcw),
			  CF(fcprojw), drouterw, dfcw, dfcb, dfcprojw, dfcprojb, aux_scale, ws,
			  CF(ones));
}

/* Elementwise operations run on the pool in contiguous ranges: each
 * element sees the same arithmetic on any thread, so results do not depend
 * on the thread count. */
#define CPU_GRAIN ((size_t)1 << 15)

struct cpu_adamw_args {
	struct mr_adamw_config c;
	const struct mr_dev_adamw *o;
	const struct mr_dev_adamw_range *r;
	int k;
};

/* Elements [i0, i1) of range r, the gradient times o->grad_scale first
 * (in pieces through a buffer: the gradients stay as they are). */
static void adamw_piece(const struct cpu_adamw_args *a, const struct mr_dev_adamw_range *r,
			size_t i0, size_t i1)
{
	const struct mr_dev_adamw *o = a->o;
	int decay = r->decay && o->weight_decay > 0.0f;
	float g[512];
	size_t j, n;

	if (o->grad_scale == 1.0f) {
		mr_adamw_update_range(&a->c, o->t, o->lr, r->p + i0, r->g + i0, r->m + i0,
				      r->v + i0, i1 - i0, decay);
		return;
	}
	for (; i0 < i1; i0 += n) {
		n = i1 - i0 < 512 ? i1 - i0 : 512;
		for (j = 0; j < n; j++)
			g[j] = r->g[i0 + j] * o->grad_scale;
		mr_adamw_update_range(&a->c, o->t, o->lr, r->p + i0, g, r->m + i0, r->v + i0, n,
				      decay);
	}
}

/* [e0, e1) of the ranges laid end to end, so the work splits by
 * elements, not by ranges (a step has a range per tensor, most of them
 * small). */
static void adamw_range(void *ctxp, size_t e0, size_t e1, int tid)
{
	const struct cpu_adamw_args *a = ctxp;
	size_t at = 0;

	(void)tid;
	for (int i = 0; i < a->k && at < e1; at += a->r[i].n, i++) {
		const struct mr_dev_adamw_range *r = &a->r[i];
		size_t i0 = e0 > at ? e0 - at : 0, i1 = e1 - at < r->n ? e1 - at : r->n;
		float *pc = F(r->pc);

		if (at + r->n <= e0 || i0 >= i1)
			continue;
		adamw_piece(a, r, i0, i1);
		/* the compute copy of an fp32 device is the master itself */
		if (pc && pc != r->p)
			memcpy(pc + i0, r->p + i0, (i1 - i0) * sizeof(float));
	}
}

static int cpu_adamw_args(struct mr_dev *d, const struct mr_dev_adamw *o)
{
	struct cpu_state *s = d->impl;

	s->adamw = *o;
	return 0;
}

static int cpu_adamw(struct mr_dev *d, const struct mr_dev_adamw_range *r, int k)
{
	const struct mr_dev_adamw *o = &((struct cpu_state *)d->impl)->adamw;
	struct cpu_adamw_args a = { .o = o, .r = r, .k = k };
	size_t total = 0;

	a.c.beta1 = o->beta1;
	a.c.beta2 = o->beta2;
	a.c.eps = o->eps;
	a.c.weight_decay = o->weight_decay;
	for (int i = 0; i < k; i++)
		total += r[i].n;
	mr_pool_run(d->pool, total, CPU_GRAIN, adamw_range, &a);
	return 0;
}

struct cpu_sumsq_args {
	const float *g;
	const size_t *off, *n;
	double *out;
	int k;
};

/* [e0, e1) of the ranges laid end to end: this thread sums every range
 * that starts there, so the work splits by elements, not by ranges. */
static void sumsq_range(void *ctxp, size_t e0, size_t e1, int tid)
{
	const struct cpu_sumsq_args *a = ctxp;
	size_t at = 0;

	(void)tid;
	for (int i = 0; i < a->k && at < e1; at += a->n[i], i++)
		if (at >= e0)
			a->out[i] = mr_grad_sumsq(a->g + a->off[i], a->n[i]);
}

/* A range's sum is one sequential loop (mr_grad_sumsq) wherever it runs:
 * the same value for any thread count. */
static int cpu_sumsq(struct mr_dev *d, const float *g, const size_t *off, const size_t *n, int k,
		     double *out)
{
	struct cpu_sumsq_args a = { g, off, n, out, k };
	size_t total = 0;

	for (int i = 0; i < k; i++) {
		total += n[i];
		out[i] = 0.0; /* empty ranges start nowhere */
	}
	mr_pool_run(d->pool, total, (size_t)1 << 16, sumsq_range, &a);
	return 0;
}

struct cpu_axpy_args {
	float *y;
	const float *x; /* NULL: y *= s */
	float s;
};

static void axpy_range(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct cpu_axpy_args *a = ctxp;
	float *y = a->y;
	size_t i;

	(void)tid;
	if (a->x)
		for (i = i0; i < i1; i++)
			y[i] += a->x[i];
	else
		for (i = i0; i < i1; i++)
			y[i] *= a->s;
}

static int cpu_scale(struct mr_dev *d, float *g, size_t n, float s)
{
	struct cpu_axpy_args a = { g, NULL, s };

	mr_pool_run(d->pool, n, CPU_GRAIN, axpy_range, &a);
	return 0;
}

static int cpu_add_f32(struct mr_dev *d, float *y, const float *x, size_t n)
{
	struct cpu_axpy_args a = { y, x, 1.0f };

	mr_pool_run(d->pool, n, CPU_GRAIN, axpy_range, &a);
	return 0;
}

static int cpu_upload(struct mr_dev *d, void *dst, const void *src_host, size_t bytes)
{
	return cpu_copy(d, dst, src_host, bytes);
}

static int cpu_download(struct mr_dev *d, void *dst_host, const void *src, size_t bytes)
{
	return cpu_copy(d, dst_host, src, bytes);
}

static void cpu_close(struct mr_dev *d)
{
	struct cpu_state *s = d->impl;

	if (s)
		free(s->ones);
	free(s);
	d->impl = NULL;
}

static const struct mr_dev_ops cpu_ops = {
	.name = "cpu",
	.close = cpu_close,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_upload,
	.download = cpu_download,
	.copy = cpu_copy,
	.copy2d = cpu_copy2d,
	.zero = cpu_zero,
	.to_act = cpu_to_act,
	.to_f32 = cpu_to_f32,
	.sync = cpu_sync,
	.matmul_fwd = cpu_matmul_fwd,
	.matmul_bwd = cpu_matmul_bwd,
	.layernorm_fwd = cpu_layernorm_fwd,
	.layernorm_bwd = cpu_layernorm_bwd,
	.gelu_fwd = cpu_gelu_fwd,
	.gelu_bwd = cpu_gelu_bwd,
	.add = cpu_add,
	.add_bias = cpu_add_bias,
	.embed_fwd = cpu_embed_fwd,
	.embed_bwd = cpu_embed_bwd,
	.add_pos = cpu_add_pos,
	.ce_fwd = cpu_ce_fwd,
	.ce_rowmax = cpu_ce_rowmax,
	.ce_sumexp = cpu_ce_sumexp,
	.ce_finish = cpu_ce_finish,
	.ce_bwd = cpu_ce_bwd,
	.fill_cols = cpu_fill_cols,
	.attn_fwd = cpu_attn_fwd,
	.attn_bwd = cpu_attn_bwd,
	.ws_bytes = cpu_ws_bytes,
	.rmsnorm_fwd = cpu_rmsnorm_fwd,
	.rmsnorm_bwd = cpu_rmsnorm_bwd,
	.rope = cpu_rope,
	.swiglu_fwd = cpu_swiglu_fwd,
	.swiglu_bwd = cpu_swiglu_bwd,
	.attn_part_fwd = cpu_attn_part_fwd,
	.attn_merge = cpu_attn_merge,
	.attn_delta = cpu_attn_delta,
	.attn_part_bwd = cpu_attn_part_bwd,
	.moe_fwd = cpu_moe_fwd,
	.moe_bwd = cpu_moe_bwd,
	.adamw_args = cpu_adamw_args,
	.adamw = cpu_adamw,
	.sumsq = cpu_sumsq,
	.scale = cpu_scale,
	.add_f32 = cpu_add_f32,
};


int mr__dev_cpu_open(struct mr_dev *d, struct mr_pool *pool)
{
	memset(d, 0, sizeof(*d));
	d->ops = &cpu_ops;
	d->act = MR_DT_F32;
	d->attn_gqa = 1;
	d->moe_swiglu = 1;
	d->act_bytes = sizeof(float);
	snprintf(d->model, sizeof(d->model), "cpu");
	d->pool = pool;
	d->impl = calloc(1, sizeof(struct cpu_state));
	return d->impl ? 0 : MR_ENOMEM;
}
