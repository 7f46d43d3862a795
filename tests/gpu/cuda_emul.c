/*
 * cuda_emul.c - a CPU emulation of the mr_cuda.h API, so that code built
 * on it (the device GPT, runtime/cuda/gpt*.cu) can be exercised on a
 * machine without a GPU: link it instead of libmeshrun_cuda.a.
 *
 * "Device" memory is host memory (filled with 0xff bytes on allocation,
 * so a buffer used before it is written gives NaNs as garbage would).
 * Every kernel is its CPU twin (kernels/, optim/) run on fp32 copies of
 * its bf16 inputs, its bf16 outputs rounded to nearest even once, with
 * the = / += rule mr_cuda.h documents for each argument. So an emulated
 * run has the device's bf16 rounding points but the CPU's summation
 * order: what it checks is the orchestration (offsets, layouts, call
 * order, accumulation, the optimizer step), not the CUDA kernels (those
 * are tests/gpu/test_cuda_kernels.c and test_cuda_attention.c on a GPU).
 *
 * Build (the Makefile does not build it yet; a target is proposed with
 * it), from the repository root after `make BUILD=b` built the libraries:
 *   g++ -x c++ -std=c++17 -Icommon -Iruntime -c runtime/cuda/gpt.cu -o /tmp/gpt.o
 *   g++ -x c++ -std=c++17 -Icommon -Iruntime -c runtime/cuda/gpt_train.cu -o /tmp/gpt_train.o
 *   cc -std=c11 -D_GNU_SOURCE -Icommon -Iruntime -Itests/support \
 *      -I/usr/include/x86_64-linux-gnu/openblas-pthread -o /tmp/test_cuda_gpt_emul \
 *      tests/gpu/test_cuda_gpt.c tests/gpu/cuda_emul.c /tmp/gpt.o /tmp/gpt_train.o \
 *      b/libmeshrun.a b/libmrcommon.a -lcriterion -lopenblas -lm -lpthread -lstdc++
 * (with a CUDA build's libmeshrun.a add -L$CUDA_HOME/lib64 -lnccl -lcudart for
 * the NCCL backend). MR_CUDA_EMUL_NODEV=1 makes it report no device.
 *
 * Non-goals: the fp32 attention/merge variants and the MoE fp32 GEMM
 * (not used by the device GPT), speed, asynchrony.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/mr_cuda.h"
#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"
#include "optim/mr_adamw.h"

#define EMUL_BLOCK 16 /* attention block sizes of the CPU twin */

struct mr_cuda {
	char err[64];
};

static void *xalloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);

	if (!p)
		abort();
	return p;
}

/* fp32 copy of n bf16 values (caller frees). */
static float *tof(const mr_bf16 *x, size_t n)
{
	float *f = xalloc(n * sizeof(float));
	size_t i;

	for (i = 0; i < n; i++)
		f[i] = mr_bf16_to_f32(x[i]);
	return f;
}

static void tobf(mr_bf16 *dst, const float *f, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		dst[i] = mr_bf16_from_f32(f[i]);
}

/* ---- context and memory ------------------------------------------------------ */

int mr_cuda_device_count(struct mr_errbuf *eb)
{
	if (getenv("MR_CUDA_EMUL_NODEV")) {
		mr_errf(eb, MR_ENOTSUP, "no cuda device: emulation told so");
		return 0;
	}
	return 1;
}

int mr_cuda_create(struct mr_cuda **out, int device, struct mr_errbuf *eb)
{
	if (device != 0 || mr_cuda_device_count(eb) < 1) {
		*out = NULL;
		return mr_errf(eb, MR_ENOTSUP, "cuda device '%d' not available", device);
	}
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : MR_ENOMEM;
}

void mr_cuda_free(struct mr_cuda *cu)
{
	free(cu);
}

const char *mr_cuda_errmsg(const struct mr_cuda *cu)
{
	return cu ? cu->err : "no cuda context";
}

int mr_cuda_sync(struct mr_cuda *cu)
{
	(void)cu;
	return 0;
}

int mr_cuda_using_lt(const struct mr_cuda *cu)
{
	(void)cu;
	return 0;
}

void mr_cuda_disable_lt(struct mr_cuda *cu)
{
	(void)cu;
}

int mr_cuda_alloc(struct mr_cuda *cu, void **p, size_t bytes)
{
	(void)cu;
	*p = xalloc(bytes);
	memset(*p, 0xff, bytes);
	return 0;
}

void mr_cuda_dfree(struct mr_cuda *cu, void *p)
{
	(void)cu;
	free(p);
}

int mr_cuda_memset0(struct mr_cuda *cu, void *p, size_t bytes)
{
	(void)cu;
	memset(p, 0, bytes);
	return 0;
}

int mr_cuda_upload(struct mr_cuda *cu, void *dst, const void *src_host, size_t bytes)
{
	(void)cu;
	memcpy(dst, src_host, bytes);
	return 0;
}

int mr_cuda_download(struct mr_cuda *cu, void *dst_host, const void *src, size_t bytes)
{
	(void)cu;
	memcpy(dst_host, src, bytes);
	return 0;
}

int mr_cuda_f32_to_bf16(struct mr_cuda *cu, mr_bf16 *dst, const float *src, size_t n)
{
	(void)cu;
	tobf(dst, src, n);
	return 0;
}

int mr_cuda_bf16_to_f32(struct mr_cuda *cu, float *dst, const mr_bf16 *src, size_t n)
{
	size_t i;

	(void)cu;
	for (i = 0; i < n; i++)
		dst[i] = mr_bf16_to_f32(src[i]);
	return 0;
}

/* ---- GEMM ---------------------------------------------------------------------- */

int mr_cuda_matmul_fwd(struct mr_cuda *cu, mr_bf16 *out, const mr_bf16 *inp, const mr_bf16 *w,
		       const mr_bf16 *bias, int N, int IC, int OC)
{
	float *fi = tof(inp, (size_t)N * IC), *fw = tof(w, (size_t)OC * IC);
	float *fb = bias ? tof(bias, (size_t)OC) : NULL;
	float *fo = xalloc(sizeof(float) * (size_t)N * OC);

	(void)cu;
	mr_matmul_fwd(NULL, fo, fi, fw, fb, N, IC, OC);
	tobf(out, fo, (size_t)N * OC);
	free(fi);
	free(fw);
	free(fb);
	free(fo);
	return 0;
}

int mr_cuda_matmul_bwd(struct mr_cuda *cu, mr_bf16 *dinp, float *dw, float *dbias,
		       const mr_bf16 *dout, const mr_bf16 *inp, const mr_bf16 *w, int N, int IC,
		       int OC, int accumulate_dinp)
{
	float *fd = tof(dout, (size_t)N * OC), *fi = tof(inp, (size_t)N * IC);
	float *fw = tof(w, (size_t)OC * IC), *ones = xalloc(sizeof(float) * (size_t)N);
	float *fdi = NULL;
	int i;

	(void)cu;
	for (i = 0; i < N; i++)
		ones[i] = 1.0f;
	if (dinp)
		fdi = accumulate_dinp ? tof(dinp, (size_t)N * IC)
				      : calloc((size_t)N * IC, sizeof(float));
	mr_matmul_bwd(NULL, fdi, dw, dbias, fd, fi, fw, N, IC, OC, accumulate_dinp, ones);
	if (dinp)
		tobf(dinp, fdi, (size_t)N * IC);
	free(fd);
	free(fi);
	free(fw);
	free(fdi);
	free(ones);
	return 0;
}

int mr_cuda_matmul_fwd_f32(struct mr_cuda *cu, float *out, const float *inp, const float *w,
			   const float *bias, int N, int IC, int OC)
{
	(void)cu;
	mr_matmul_fwd(NULL, out, inp, w, bias, N, IC, OC);
	return 0;
}

/* ---- embedding, layernorm, elementwise, cross-entropy -------------------------- */

int mr_cuda_encoder_fwd(struct mr_cuda *cu, mr_bf16 *out, const int *tok, const mr_bf16 *wte,
			const mr_bf16 *wpe, int B, int T, int C)
{
	size_t n = (size_t)B * T * C;
	int V = 0, i;
	float *fe, *fp, *fo = xalloc(sizeof(float) * n);

	(void)cu;
	for (i = 0; i < B * T; i++) /* wte rows read: up to the largest token */
		if (tok[i] + 1 > V)
			V = tok[i] + 1;
	fe = tof(wte, (size_t)V * C);
	fp = tof(wpe, (size_t)T * C);
	mr_encoder_fwd(NULL, fo, tok, fe, fp, B, T, C);
	tobf(out, fo, n);
	free(fe);
	free(fp);
	free(fo);
	return 0;
}

int mr_cuda_encoder_bwd(struct mr_cuda *cu, float *dwte, float *dwpe, const mr_bf16 *dout,
			const int *tok_host, int B, int T, int C, int V)
{
	float *fd = tof(dout, (size_t)B * T * C);

	(void)cu;
	(void)V;
	mr_encoder_bwd(NULL, dwte, dwpe, fd, tok_host, B, T, C);
	free(fd);
	return 0;
}

int mr_cuda_layernorm_fwd(struct mr_cuda *cu, mr_bf16 *out, float *mean, float *rstd,
			  const mr_bf16 *inp, const mr_bf16 *w, const mr_bf16 *b, int N, int C)
{
	size_t n = (size_t)N * C;
	float *fi = tof(inp, n), *fw = tof(w, (size_t)C), *fb = tof(b, (size_t)C);
	float *fo = xalloc(sizeof(float) * n);

	(void)cu;
	mr_layernorm_fwd(NULL, fo, mean, rstd, fi, fw, fb, N, C);
	tobf(out, fo, n);
	free(fi);
	free(fw);
	free(fb);
	free(fo);
	return 0;
}

int mr_cuda_layernorm_bwd(struct mr_cuda *cu, mr_bf16 *dinp, float *dw, float *db,
			  const mr_bf16 *dout, const mr_bf16 *inp, const mr_bf16 *w,
			  const float *mean, const float *rstd, int N, int C)
{
	size_t n = (size_t)N * C;
	float *fdi = tof(dinp, n), *fd = tof(dout, n), *fi = tof(inp, n), *fw = tof(w, (size_t)C);
	float *ws = xalloc(sizeof(float) * (mr_layernorm_ws_floats(NULL, C) + 1));

	(void)cu;
	mr_layernorm_bwd(NULL, fdi, dw, db, fd, fi, fw, mean, rstd, N, C, ws);
	tobf(dinp, fdi, n);
	free(fdi);
	free(fd);
	free(fi);
	free(fw);
	free(ws);
	return 0;
}

int mr_cuda_gelu_fwd(struct mr_cuda *cu, mr_bf16 *out, const mr_bf16 *inp, size_t n)
{
	float *f = tof(inp, n);

	(void)cu;
	mr_gelu_fwd(NULL, f, f, n);
	tobf(out, f, n);
	free(f);
	return 0;
}

int mr_cuda_gelu_bwd(struct mr_cuda *cu, mr_bf16 *dinp, const mr_bf16 *inp,
		     const mr_bf16 *dout, size_t n)
{
	float *fi = tof(inp, n), *fd = tof(dout, n);

	(void)cu;
	mr_gelu_bwd(NULL, fd, fi, fd, n);
	tobf(dinp, fd, n);
	free(fi);
	free(fd);
	return 0;
}

int mr_cuda_residual_fwd(struct mr_cuda *cu, mr_bf16 *out, const mr_bf16 *a, const mr_bf16 *b,
			 size_t n)
{
	size_t i;

	(void)cu;
	for (i = 0; i < n; i++)
		out[i] = mr_bf16_from_f32(mr_bf16_to_f32(a[i]) + mr_bf16_to_f32(b[i]));
	return 0;
}

int mr_cuda_add_inplace(struct mr_cuda *cu, mr_bf16 *y, const mr_bf16 *x, size_t n)
{
	return mr_cuda_residual_fwd(cu, y, y, x, n);
}

int mr_cuda_crossentropy_fwd(struct mr_cuda *cu, float *losses, float *lse,
			     const mr_bf16 *logits, const int *targets, int N, int V)
{
	float *f = tof(logits, (size_t)N * V);

	(void)cu;
	mr_crossentropy_fwd(NULL, losses, lse, f, targets, N, V);
	free(f);
	return 0;
}

int mr_cuda_crossentropy_bwd_inplace(struct mr_cuda *cu, mr_bf16 *logits, const float *lse,
				     const int *targets, int N, int V, float dscale)
{
	float *f = tof(logits, (size_t)N * V);

	(void)cu;
	mr_crossentropy_bwd_inplace(NULL, f, lse, targets, N, V, dscale);
	tobf(logits, f, (size_t)N * V);
	free(f);
	return 0;
}

/* ---- attention (per batch and head through the CPU head kernels) -------------- */

/* n rows of hs values at base (row stride `row`) as a contiguous fp32 (n, hs). */
static float *gather(const mr_bf16 *base, size_t row, int n, int hs)
{
	float *f = xalloc(sizeof(float) * (size_t)n * hs);
	int i, c;

	for (i = 0; i < n; i++)
		for (c = 0; c < hs; c++)
			f[(size_t)i * hs + c] = mr_bf16_to_f32(base[i * row + c]);
	return f;
}

/* base rows += f (n, hs), rounding each sum to bf16 once. */
static void add_rows(mr_bf16 *base, size_t row, const float *f, int n, int hs)
{
	int i, c;

	for (i = 0; i < n; i++)
		for (c = 0; c < hs; c++)
			base[i * row + c] = mr_bf16_from_f32(mr_bf16_to_f32(base[i * row + c]) +
							     f[(size_t)i * hs + c]);
}

static struct mr_attn_head head_of(const struct mr_cuda_attn *a, int b, int h, float **q,
				   float **k, float **v)
{
	struct mr_attn_head hd;
	int hs = a->hs;

	*q = gather(a->q + b * a->q_batch + h * hs, a->q_row, a->tq, hs);
	*k = gather(a->k + b * a->kv_batch + h * hs, a->kv_row, a->tk, hs);
	*v = gather(a->v + b * a->kv_batch + h * hs, a->kv_row, a->tk, hs);
	memset(&hd, 0, sizeof(hd));
	hd.q = *q;
	hd.k = *k;
	hd.v = *v;
	hd.q_stride = hd.kv_stride = (size_t)hs;
	hd.tq = a->tq;
	hd.q_pos0 = a->q_pos0;
	hd.tk = a->tk;
	hd.k_pos0 = a->k_pos0;
	hd.hs = hs;
	hd.causal = a->causal;
	hd.scale = a->scale;
	hd.bq = hd.bk = EMUL_BLOCK;
	return hd;
}

/* The device kernels' shape limits. */
static int attn_shape_ok(const struct mr_cuda_attn *a)
{
	return a->B > 0 && a->NH > 0 && a->tq > 0 && a->tk > 0 && a->hs > 0 && a->hs % 32 == 0 &&
	       a->hs <= 128 && (long)a->B * a->NH <= 65535;
}

int mr_cuda_attn_fwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, mr_bf16 *out,
		     size_t o_row, size_t o_batch, float *lse)
{
	float *ws, *fo, *q, *k, *v;
	int b, h, i, hs = a->hs;

	(void)cu;
	if (!attn_shape_ok(a))
		return MR_EINVAL;
	ws = xalloc(sizeof(float) * mr_attn_head_ws_floats(EMUL_BLOCK, EMUL_BLOCK, hs));
	fo = xalloc(sizeof(float) * (size_t)a->tq * hs);
	for (b = 0; b < a->B; b++)
		for (h = 0; h < a->NH; h++) {
			struct mr_attn_head hd = head_of(a, b, h, &q, &k, &v);
			mr_attn_head_fwd(&hd, fo, (size_t)hs,
					 lse + ((size_t)b * a->NH + h) * a->tq, ws);
			for (i = 0; i < a->tq; i++)
				tobf(out + b * o_batch + i * o_row + h * hs, fo + (size_t)i * hs,
				     (size_t)hs);
			free(q);
			free(k);
			free(v);
		}
	free(ws);
	free(fo);
	return 0;
}

int mr_cuda_attn_delta(struct mr_cuda *cu, float *delta, const mr_bf16 *dout,
		       const mr_bf16 *out, int B, int NH, int tq, int hs, size_t o_row,
		       size_t o_batch)
{
	int b, h, i, c;

	(void)cu;
	for (b = 0; b < B; b++)
		for (h = 0; h < NH; h++)
			for (i = 0; i < tq; i++) {
				size_t o = b * o_batch + i * o_row + (size_t)h * hs;
				float s = 0.0f;
				for (c = 0; c < hs; c++)
					s += mr_bf16_to_f32(dout[o + c]) *
					     mr_bf16_to_f32(out[o + c]);
				delta[((size_t)b * NH + h) * tq + i] = s;
			}
	return 0;
}

int mr_cuda_attn_bwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, const mr_bf16 *dout,
		     size_t o_row, size_t o_batch, const float *lse, const float *delta,
		     mr_bf16 *dq, size_t dq_row, size_t dq_batch, mr_bf16 *dk, mr_bf16 *dv,
		     size_t dkv_row, size_t dkv_batch)
{
	float *ws, *q, *k, *v, *d, *fq, *fk, *fv;
	int b, h, hs = a->hs;

	(void)cu;
	if (!attn_shape_ok(a))
		return MR_EINVAL;
	ws = xalloc(sizeof(float) * mr_attn_head_ws_floats(EMUL_BLOCK, EMUL_BLOCK, hs));
	for (b = 0; b < a->B; b++)
		for (h = 0; h < a->NH; h++) {
			struct mr_attn_head hd = head_of(a, b, h, &q, &k, &v);
			size_t r = ((size_t)b * a->NH + h) * a->tq;
			d = gather(dout + b * o_batch + h * hs, o_row, a->tq, hs);
			fq = calloc((size_t)a->tq * hs, sizeof(float));
			fk = calloc((size_t)a->tk * hs, sizeof(float));
			fv = calloc((size_t)a->tk * hs, sizeof(float));
			if (!fq || !fk || !fv)
				abort();
			mr_attn_head_bwd(&hd, d, (size_t)hs, lse + r, delta + r, fq, (size_t)hs, fk,
					 fv, (size_t)hs, ws);
			add_rows(dq + b * dq_batch + h * hs, dq_row, fq, a->tq, hs);
			add_rows(dk + b * dkv_batch + h * hs, dkv_row, fk, a->tk, hs);
			add_rows(dv + b * dkv_batch + h * hs, dkv_row, fv, a->tk, hs);
			free(q);
			free(k);
			free(v);
			free(d);
			free(fq);
			free(fk);
			free(fv);
		}
	free(ws);
	return 0;
}

/* ---- optimizer (adamw.cu's formula, which is the CPU twin's) ------------------- */

int mr_cuda_adamw_step(struct mr_cuda *cu, float *p, mr_bf16 *p_bf16, const float *g, float *m,
		       float *v, size_t n, const struct mr_cuda_adamw *o)
{
	double bc1 = 1.0 - pow((double)o->beta1, (double)o->t);
	double bc2 = 1.0 - pow((double)o->beta2, (double)o->t);
	float step_size = (float)((double)o->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
	float decay = 1.0f - o->lr * o->weight_decay;
	size_t i;

	(void)cu;
	if (o->t < 1)
		return MR_EINVAL;
	for (i = 0; i < n; i++) {
		float gi = g[i] * o->grad_scale, pi = p[i] * decay, mi, vi, denom;
		mi = m[i] * o->beta1 + gi * (1.0f - o->beta1);
		vi = v[i] * o->beta2 + gi * gi * (1.0f - o->beta2);
		denom = sqrtf(vi) / bc2_sqrt + o->eps;
		pi -= step_size * (mi / denom);
		m[i] = mi;
		v[i] = vi;
		p[i] = pi;
		if (p_bf16)
			p_bf16[i] = mr_bf16_from_f32(pi);
	}
	return 0;
}

int mr_cuda_grad_sumsq(struct mr_cuda *cu, const float *g, size_t n, double *sumsq_host)
{
	(void)cu;
	*sumsq_host = mr_grad_sumsq(g, n);
	return 0;
}

int mr_cuda_scale(struct mr_cuda *cu, float *g, size_t n, float scale)
{
	size_t i;

	(void)cu;
	for (i = 0; i < n; i++)
		g[i] *= scale;
	return 0;
}
