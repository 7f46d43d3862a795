/*
 * encoder.c - token + position embedding, forward and backward.
 *
 * The backward splits the channels across threads (every thread walks all
 * tokens for its channel range), so repeated token ids never race and the
 * sum order is fixed. A negative token id selects no wte row (its rows
 * live on another tensor-parallel rank: zeros forward, no gradient), and a
 * NULL wpe / dwte / dwpe skips that part. Non-goals: sparse gradients.
 */
#include "mr_kernels.h"

struct enc {
	float *out, *dwte, *dwpe;
	const float *wte, *wpe, *dout;
	const int *tok;
	int B, T, C;
};

static void enc_fwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct enc *e = ctxp;
	size_t i;
	int c;

	(void)tid;
	for (i = i0; i < i1; i++) {
		int t = (int)(i % (size_t)e->T), tok = e->tok[i];
		const float *a = e->wte + (size_t)(tok < 0 ? 0 : tok) * (size_t)e->C;
		const float *b = e->wpe ? e->wpe + (size_t)t * (size_t)e->C : NULL;
		float *o = e->out + i * (size_t)e->C;
		if (tok < 0)
			for (c = 0; c < e->C; c++)
				o[c] = 0.0f;
		else if (!b)
			for (c = 0; c < e->C; c++)
				o[c] = a[c];
		else
			for (c = 0; c < e->C; c++)
				o[c] = a[c] + b[c];
	}
}

void mr_encoder_fwd(struct mr_pool *p, float *out, const int *tok, const float *wte,
		    const float *wpe, int B, int T, int C)
{
	struct enc e = { out, NULL, NULL, wte, wpe, NULL, tok, B, T, C };

	mr_pool_run(p, (size_t)B * (size_t)T, 16, enc_fwd_rows, &e);
}

static void enc_bwd_cols(void *ctxp, size_t c0, size_t c1, int tid)
{
	const struct enc *e = ctxp;
	size_t n = (size_t)e->B * (size_t)e->T, i, c;

	(void)tid;
	for (i = 0; i < n; i++) {
		int t = (int)(i % (size_t)e->T), tok = e->tok[i];
		const float *d = e->dout + i * (size_t)e->C;
		if (tok >= 0 && e->dwte) {
			float *a = e->dwte + (size_t)tok * (size_t)e->C;
			for (c = c0; c < c1; c++)
				a[c] += d[c];
		}
		if (e->dwpe) {
			float *b = e->dwpe + (size_t)t * (size_t)e->C;
			for (c = c0; c < c1; c++)
				b[c] += d[c];
		}
	}
}

void mr_encoder_bwd(struct mr_pool *p, float *dwte, float *dwpe, const float *dout,
		    const int *tok, int B, int T, int C)
{
	struct enc e = { NULL, dwte, dwpe, NULL, NULL, dout, tok, B, T, C };

	mr_pool_run(p, (size_t)C, 16, enc_bwd_cols, &e);
}
