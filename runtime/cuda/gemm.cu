/*
 * gemm.cu - the GEMMs of the linear layers (see mr_cuda.h).
 *
 * Row-major tensors are column-major transposes, so with w (OC,IC):
 *   out (N,OC) = inp @ w^T   is  out^T (OC,N) = op_T(w) * inp^T
 *   dinp (N,IC) = dout @ w    is  dinp^T (IC,N) = w^T * dout^T
 *   dw (OC,IC) += dout^T inp  is  dw^T (IC,OC) += inp^T * op_T(dout^T)
 * Each GEMM goes through cuBLASLt (A/B of the activation type, fp32
 * compute, bias in the epilogue), with its descriptor, layouts and
 * algorithm planned once per shape and kept in the context
 * (struct mr__lt_plan); if cuBLASLt is disabled, finds no algorithm or
 * fails, the same call runs through cublasGemmEx (the bias is then
 * broadcast into the output first and added with beta = 1, as the CPU
 * twin does) - counted as a fallback (mr_cuda_lt_fallbacks).
 * dbias is a fixed-order column sum (partials per row chunk, then one sum
 * per column) rather than cuBLASLt's BGRADB epilogue, so it is fp32 and
 * deterministic whatever algorithm cuBLASLt picks.
 * The MLP's GELU gradient rides on the GEMM before it
 * (mr_cuda_matmul_dgelu_bwd): cuBLASLt's DGELU epilogue multiplies the
 * fp32 product by gelu'(pre) before the one rounding, as llm.c does on
 * H100; where cuBLASLt has no algorithm for it, the GEMM and the GELU
 * backward run apart (counted as a fallback).
 * Compute type CUBLAS_COMPUTE_32F everywhere: with bf16 inputs the tensor
 * cores accumulate in fp32; with fp32 inputs (precision fp32) it is an
 * exact fp32 GEMM, never TF32 (that would need _FAST_TF32, which we never
 * ask for, and the cuBLAS math mode stays CUBLAS_DEFAULT_MATH).
 *
 * Non-goals: the forward's GELU epilogue (it would compute GELU from the
 * fp32 product, so a selective recomputation's GELU of the bf16 input
 * could no longer repeat it bit for bit), fp8, batched GEMMs (MoE experts
 * loop).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_int.cuh"

#define ROWS_PER_CHUNK 128

struct gemm_args {
	cublasOperation_t ta, tb;
	int m, n, k;
	const void *A, *B, *bias;
	cudaDataType_t ab_type, c_type;
	int lda, ldb, ldc;
	float beta;
	void *C;
	const void *dgelu_pre; /* cuBLASLt only: C = AB * gelu'(pre), pre laid out as C */
};

static unsigned int align_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	unsigned int al = 256;

	while (al > 1 && (a % al))
		al >>= 1;
	return al;
}

/* What a cuBLASLt plan depends on besides its pointers (memcmp'd: zero
 * the padding with memset before filling). */
struct lt_key {
	cublasOperation_t ta, tb;
	int m, n, k, lda, ldb, ldc;
	cublasLtEpilogue_t epi;
	cudaDataType_t ab_type, c_type;
	uint32_t al_a, al_b, al_c; /* the pointers' alignments */
};

/* One shape's matmul descriptor, layouts and chosen algorithm, made the
 * first time the shape runs and reused after (the heuristic is asked
 * once per shape, not per call). */
struct mr__lt_plan {
	struct lt_key key;
	cublasLtMatmulDesc_t desc;
	cublasLtMatrixLayout_t la, lb, lc;
	cublasLtMatmulAlgo_t algo;
	int has_algo; /* 0: cuBLASLt has none for the shape (the fallback runs) */
};

static void plan_release(struct mr__lt_plan *p)
{
	if (p->lc)
		cublasLtMatrixLayoutDestroy(p->lc);
	if (p->lb)
		cublasLtMatrixLayoutDestroy(p->lb);
	if (p->la)
		cublasLtMatrixLayoutDestroy(p->la);
	if (p->desc)
		cublasLtMatmulDescDestroy(p->desc);
	memset(p, 0, sizeof(*p));
}

size_t mr__cuda_lt_plan_size(void)
{
	return sizeof(struct mr__lt_plan);
}

void mr__cuda_lt_plans_free(struct mr_cuda *cu)
{
	for (int i = 0; i < cu->nplans; i++)
		plan_release(&cu->plans[i]);
	free(cu->plans);
	cu->plans = NULL;
	cu->nplans = 0;
}

/* Fills p for k: descriptor, layouts, the heuristic's best algorithm
 * within the workspace. 0, or 1 when cuBLASLt cannot do the shape. */
static int plan_build(struct mr_cuda *cu, struct mr__lt_plan *p, const struct lt_key *k)
{
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t heur;
	cublasLtEpilogue_t epi = k->epi;
	int64_t aux_ld = k->ldc; /* DGELU's pre has C's layout */
	size_t ws = cu->gemm_ws_bytes;
	int nres = 0, ret = 1;

	p->key = *k;
	if (cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
	    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &k->ta,
					   sizeof(k->ta)) ||
	    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &k->tb,
					   sizeof(k->tb)) ||
	    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
					   sizeof(epi)) ||
	    (epi == CUBLASLT_EPILOGUE_DGELU &&
	     cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
					    sizeof(aux_ld))))
		goto out;
	if (cublasLtMatrixLayoutCreate(&p->la, k->ab_type, k->ta == CUBLAS_OP_N ? k->m : k->k,
				       k->ta == CUBLAS_OP_N ? k->k : k->m, k->lda) ||
	    cublasLtMatrixLayoutCreate(&p->lb, k->ab_type, k->tb == CUBLAS_OP_N ? k->k : k->n,
				       k->tb == CUBLAS_OP_N ? k->n : k->k, k->ldb) ||
	    cublasLtMatrixLayoutCreate(&p->lc, k->c_type, k->m, k->n, k->ldc))
		goto out;
	if (cublasLtMatmulPreferenceCreate(&pref) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
						 &ws, sizeof(ws)) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
						 &k->al_a, sizeof(k->al_a)) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
						 &k->al_b, sizeof(k->al_b)) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
						 &k->al_c, sizeof(k->al_c)) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
						 &k->al_c, sizeof(k->al_c)))
		goto out;
	if (cublasLtMatmulAlgoGetHeuristic(cu->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 1,
					   &heur, &nres) == CUBLAS_STATUS_SUCCESS &&
	    nres >= 1) {
		p->algo = heur.algo;
		ret = 0;
	}
out:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	return ret;
}

/* 0 on success, 1 when cuBLASLt cannot do it (caller falls back). */
static int gemm_lt(struct mr_cuda *cu, const struct gemm_args *g)
{
	struct mr__lt_plan tmp, *p = NULL;
	struct lt_key k;
	float alpha = 1.0f;
	int ret = 1;

	memset(&k, 0, sizeof(k));
	k.ta = g->ta;
	k.tb = g->tb;
	k.m = g->m;
	k.n = g->n;
	k.k = g->k;
	k.lda = g->lda;
	k.ldb = g->ldb;
	k.ldc = g->ldc;
	k.epi = g->dgelu_pre ? CUBLASLT_EPILOGUE_DGELU
		: g->bias   ? CUBLASLT_EPILOGUE_BIAS
			    : CUBLASLT_EPILOGUE_DEFAULT;
	k.ab_type = g->ab_type;
	k.c_type = g->c_type;
	k.al_a = align_of(g->A);
	k.al_b = align_of(g->B);
	k.al_c = align_of(g->C);
	for (int i = 0; i < cu->nplans && !p; i++)
		if (!memcmp(&cu->plans[i].key, &k, sizeof(k)))
			p = &cu->plans[i];
	if (!p) {
		/* a full cache (more shapes than a model has) plans per call */
		p = cu->plans && cu->nplans < MR__LT_PLANS ? &cu->plans[cu->nplans++] : &tmp;
		memset(p, 0, sizeof(*p));
		p->has_algo = plan_build(cu, p, &k) == 0;
	}
	if (p->has_algo &&
	    (!g->bias || cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
							&g->bias, sizeof(g->bias)) ==
				 CUBLAS_STATUS_SUCCESS) &&
	    (!g->dgelu_pre ||
	     cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
					    &g->dgelu_pre, sizeof(g->dgelu_pre)) ==
		     CUBLAS_STATUS_SUCCESS) &&
	    cublasLtMatmul(cu->lt, p->desc, &alpha, g->A, p->la, g->B, p->lb, &g->beta, g->C, p->lc,
			   g->C, p->lc, &p->algo, cu->gemm_ws, cu->gemm_ws_bytes,
			   cu->stream) == CUBLAS_STATUS_SUCCESS)
		ret = 0;
	if (p == &tmp)
		plan_release(&tmp);
	return ret;
}

/* out (rows, cols) row-major, each row = bias. */
template <typename T>
__global__ void bias_fill_kernel(T *out, const T *bias, size_t rows, int cols)
{
	size_t n = rows * (size_t)cols;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = bias[i % (size_t)cols];
}

static int gemm(struct mr_cuda *cu, struct gemm_args g, const char *what)
{
	float alpha = 1.0f;
	cublasStatus_t st;

	if (cu->use_lt && cu->lt) {
		if (gemm_lt(cu, &g) == 0)
			return mr__cuda_launched(cu, what);
		/* counted, never silent: the device layer logs the first and
		 * the worker's stats carry the count */
		if (!cu->lt_fallbacks++)
			snprintf(cu->lt_why, sizeof(cu->lt_why),
				 "%s: cuBLASLt has no algorithm or failed for m %d n %d k %d: "
				 "cublasGemmEx instead",
				 what, g.m, g.n, g.k);
	}
	if (g.bias) {
		/* column-major (m, n) with bias per row m == row-major (n, m) rows */
		unsigned int nb = mr__cu_blocks((size_t)g.m * g.n, MR__CU_THREADS);
		if (g.c_type == CUDA_R_16BF)
			bias_fill_kernel<<<nb, MR__CU_THREADS, 0, cu->stream>>>(
				(__nv_bfloat16 *)g.C, (const __nv_bfloat16 *)g.bias, (size_t)g.n,
				g.m);
		else
			bias_fill_kernel<<<nb, MR__CU_THREADS, 0, cu->stream>>>(
				(float *)g.C, (const float *)g.bias, (size_t)g.n, g.m);
		g.beta = 1.0f;
	}
	st = cublasGemmEx(cu->blas, g.ta, g.tb, g.m, g.n, g.k, &alpha, g.A, g.ab_type, g.lda, g.B,
			  g.ab_type, g.ldb, &g.beta, g.C, g.c_type, g.ldc, CUBLAS_COMPUTE_32F,
			  CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS) {
		snprintf(cu->err, sizeof(cu->err), "%s: cublasGemmEx status %d", what, (int)st);
		return MR_ESYS;
	}
	return mr__cuda_launched(cu, what);
}

extern "C" int mr_cuda_matmul_fwd(struct mr_cuda *cu, void *out, const void *inp, const void *w,
				  const void *bias, int N, int IC, int OC)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, bias,
			       t, t, IC, IC, OC, 0.0f, out, NULL };

	if (N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_fwd");
	return gemm(cu, g, "matmul_fwd");
}

int mr__cuda_matmul_f32out(struct mr_cuda *cu, float *out, const void *inp, const void *w, int N,
			   int IC, int OC)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, NULL,
			       t, CUDA_R_32F, IC, IC, OC, 0.0f, out, NULL };

	if (N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_f32out");
	return gemm(cu, g, "matmul_f32out");
}

extern "C" int mr_cuda_matmul_fwd_f32(struct mr_cuda *cu, float *out, const float *inp,
				      const float *w, const float *bias, int N, int IC, int OC)
{
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, bias,
			       CUDA_R_32F, CUDA_R_32F, IC, IC, OC, 0.0f, out, NULL };

	if (N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_fwd_f32");
	return gemm(cu, g, "matmul_fwd_f32");
}

/* part (nchunks, OC): sums of ROWS_PER_CHUNK rows of dout per column. */
template <typename T>
__global__ void colsum_partial_kernel(float *part, const T *dout, int N, int OC)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	int r0 = blockIdx.y * ROWS_PER_CHUNK;
	int r1 = min(r0 + ROWS_PER_CHUNK, N);
	float s = 0.0f;

	if (c >= OC)
		return;
	for (int r = r0; r < r1; r++)
		s += mr__ld(dout + (size_t)r * OC + c);
	part[(size_t)blockIdx.y * OC + c] = s;
}

/* dst (OC) += sum over chunks of part, in chunk order. */
__global__ void colsum_final_kernel(float *dst, const float *part, int nchunks, int OC)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	float s = 0.0f;

	if (c >= OC)
		return;
	for (int k = 0; k < nchunks; k++)
		s += part[(size_t)k * OC + c];
	dst[c] += s;
}

/* dbias (OC) += colsum(dout (N,OC)): fixed chunks, then chunk order. */
template <typename T>
static int colsum(struct mr_cuda *cu, float *dbias, const void *dout, int N, int OC)
{
	int nchunks = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
	unsigned int gx = (unsigned int)((OC + MR__CU_THREADS - 1) / MR__CU_THREADS);
	float *part;
	int rc = mr__cuda_scratch(cu, (size_t)nchunks * OC * sizeof(float), &part);

	if (rc)
		return rc;
	colsum_partial_kernel<T><<<dim3(gx, nchunks), MR__CU_THREADS, 0, cu->stream>>>(
		part, (const T *)dout, N, OC);
	colsum_final_kernel<<<gx, MR__CU_THREADS, 0, cu->stream>>>(dbias, part, nchunks, OC);
	return mr__cuda_launched(cu, "matmul_bwd dbias");
}

extern "C" int mr_cuda_matmul_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
				  const void *dout, const void *inp, const void *w, int N, int IC,
				  int OC, int accumulate_dinp)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	int rc;

	if (N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_bwd");
	if (dinp) {
		struct gemm_args g = { CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, dout, NULL,
				       t, t, IC, OC, IC, accumulate_dinp ? 1.0f : 0.0f, dinp, NULL };
		rc = gemm(cu, g, "matmul_bwd dinp");
		if (rc)
			return rc;
	}
	if (dw) {
		struct gemm_args g = { CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, dout, NULL,
				       t, CUDA_R_32F, IC, OC, IC, 1.0f, dw, NULL };
		rc = gemm(cu, g, "matmul_bwd dw");
		if (rc)
			return rc;
	}
	if (dbias)
		return MR__BY_ACT(cu, colsum, cu, dbias, dout, N, OC);
	return 0;
}

extern "C" int mr_cuda_matmul_dgelu_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
					const void *dout, const void *inp, const void *w,
					const void *pre, int N, int IC, int OC)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	struct gemm_args g = { CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, dout, NULL,
			       t, t, IC, OC, IC, 0.0f, dinp, pre };
	int rc;

	if (N <= 0 || IC <= 0 || OC <= 0 || !dinp || !pre)
		return mr__cuda_inval(cu, "matmul_dgelu_bwd");
	if (cu->use_lt && cu->lt && gemm_lt(cu, &g) == 0) {
		rc = mr__cuda_launched(cu, "matmul_dgelu_bwd");
	} else {
		if (cu->use_lt && cu->lt && !cu->lt_fallbacks++)
			snprintf(cu->lt_why, sizeof(cu->lt_why),
				 "matmul_dgelu_bwd: cuBLASLt has no DGELU algorithm or failed for "
				 "m %d n %d k %d: the GEMM and the GELU backward apart",
				 IC, N, OC);
		rc = mr_cuda_matmul_bwd(cu, dinp, NULL, NULL, dout, inp, w, N, IC, OC, 0);
		if (rc == 0)
			rc = mr_cuda_gelu_bwd(cu, dinp, pre, dinp, (size_t)N * IC);
	}
	if (rc == 0 && (dw || dbias))
		rc = mr_cuda_matmul_bwd(cu, NULL, dw, dbias, dout, inp, w, N, IC, OC, 0);
	return rc;
}
