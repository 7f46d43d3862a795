/*
 * matmul.c - GEMM wrappers over OpenBLAS cblas_sgemm (see mr_kernels.h).
 *
 * Weights are stored (OC,IC) as in PyTorch's nn.Linear, so the forward is
 * inp @ w^T. Bias is added by filling the output rows first and calling
 * sgemm with beta = 1.
 *
 * Threading: the GEMMs are split across the pool - by rows of the output
 * for the forward and for dinp, by output channels for dw/dbias - and each
 * slice is one single-threaded sgemm. The worker runs OpenBLAS with one
 * thread, so there is exactly one set of N threads and no OpenBLAS spinning
 * threads competing with the pool. Slices are disjoint and their bounds
 * depend only on the thread count, so results are deterministic.
 *
 * Non-goals: own GEMM micro-kernels.
 */
#include <cblas.h>
#include <string.h>

#include "mr_kernels.h"

struct mm {
	float *out, *dinp, *dw, *dbias;
	const float *inp, *w, *bias, *dout, *ones;
	int N, IC, OC, acc;
};

static void fwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct mm *a = ctxp;
	float beta = 0.0f;
	size_t i;

	(void)tid;
	if (a->bias) {
		for (i = i0; i < i1; i++)
			memcpy(a->out + i * a->OC, a->bias, sizeof(float) * (size_t)a->OC);
		beta = 1.0f;
	}
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(i1 - i0), a->OC, a->IC, 1.0f,
		    a->inp + i0 * a->IC, a->IC, a->w, a->IC, beta, a->out + i0 * a->OC, a->OC);
}

/* Rows per slice below which splitting costs more than it gains. */
#define MIN_ROWS 32

void mr_matmul_fwd(struct mr_pool *p, float *out, const float *inp, const float *w,
		   const float *bias, int N, int IC, int OC)
{
	struct mm a = { out, NULL, NULL, NULL, inp, w, bias, NULL, NULL, N, IC, OC, 0 };

	mr_pool_run(p, (size_t)N, MIN_ROWS, fwd_rows, &a);
}

static void bwd_dinp_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct mm *a = ctxp;

	(void)tid;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(i1 - i0), a->IC, a->OC, 1.0f,
		    a->dout + i0 * a->OC, a->OC, a->w, a->IC, a->acc ? 1.0f : 0.0f,
		    a->dinp + i0 * a->IC, a->IC);
}

static void bwd_dw_cols(void *ctxp, size_t o0, size_t o1, int tid)
{
	const struct mm *a = ctxp;
	int m = (int)(o1 - o0);

	(void)tid;
	if (a->dw)
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, a->IC, a->N, 1.0f,
			    a->dout + o0, a->OC, a->inp, a->IC, 1.0f, a->dw + o0 * a->IC, a->IC);
	if (a->dbias)
		cblas_sgemv(CblasRowMajor, CblasTrans, a->N, m, 1.0f, a->dout + o0, a->OC, a->ones,
			    1, 1.0f, a->dbias + o0, 1);
}

void mr_matmul_bwd(struct mr_pool *p, float *dinp, float *dw, float *dbias, const float *dout,
		   const float *inp, const float *w, int N, int IC, int OC,
		   int accumulate_dinp, const float *ones)
{
	struct mm a = { NULL, dinp, dw, dbias, inp, w, NULL, dout, ones, N, IC, OC,
			accumulate_dinp };

	if (dinp)
		mr_pool_run(p, (size_t)N, MIN_ROWS, bwd_dinp_rows, &a);
	if (dw || dbias)
		mr_pool_run(p, (size_t)OC, 16, bwd_dw_cols, &a);
}
