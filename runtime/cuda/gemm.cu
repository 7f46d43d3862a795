/*
 * gemm.cu - the GEMMs of the linear layers (see mr_cuda.h).
 *
 * Row-major tensors are column-major transposes, so with w (OC,IC):
 *   out (N,OC) = inp @ w^T   is  out^T (OC,N) = op_T(w) * inp^T
 *   dinp (N,IC) = dout @ w    is  dinp^T (IC,N) = w^T * dout^T
 *   dw (OC,IC) += dout^T inp  is  dw^T (IC,OC) += inp^T * op_T(dout^T)
 * Each GEMM goes through cuBLASLt (A/B of the activation type, fp32
 * compute, bias in the epilogue); if cuBLASLt is disabled, finds no
 * algorithm or fails, the same call runs through cublasGemmEx (the bias
 * is then broadcast into the output first and added with beta = 1, as the
 * CPU twin does).
 * dbias is a fixed-order column sum (partials per row chunk, then one sum
 * per column) rather than cuBLASLt's BGRADB epilogue, so it is fp32 and
 * deterministic whatever algorithm cuBLASLt picks.
 * Compute type CUBLAS_COMPUTE_32F everywhere: with bf16 inputs the tensor
 * cores accumulate in fp32; with fp32 inputs (precision fp32) it is an
 * exact fp32 GEMM, never TF32 (that would need _FAST_TF32, which we never
 * ask for, and the cuBLAS math mode stays CUBLAS_DEFAULT_MATH).
 *
 * Non-goals: fused GELU epilogues, fp8, batched GEMMs (MoE experts loop).
 */
#include <stdio.h>

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
};

static unsigned int align_of(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	unsigned int al = 256;

	while (al > 1 && (a % al))
		al >>= 1;
	return al;
}

/* 0 on success, 1 when cuBLASLt cannot do it (caller falls back). */
static int gemm_lt(struct mr_cuda *cu, const struct gemm_args *g)
{
	cublasLtMatmulDesc_t desc = NULL;
	cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t heur;
	cublasLtEpilogue_t epi = g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
	size_t ws = cu->gemm_ws_bytes;
	uint32_t al_a = align_of(g->A), al_b = align_of(g->B), al_c = align_of(g->C);
	float alpha = 1.0f;
	int nres = 0, ret = 1;

	if (cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
	    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta,
					   sizeof(g->ta)) ||
	    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb,
					   sizeof(g->tb)) ||
	    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)))
		goto out;
	if (g->bias && cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
						      &g->bias, sizeof(g->bias)))
		goto out;
	if (cublasLtMatrixLayoutCreate(&la, g->ab_type, g->ta == CUBLAS_OP_N ? g->m : g->k,
				       g->ta == CUBLAS_OP_N ? g->k : g->m, g->lda) ||
	    cublasLtMatrixLayoutCreate(&lb, g->ab_type, g->tb == CUBLAS_OP_N ? g->k : g->n,
				       g->tb == CUBLAS_OP_N ? g->n : g->k, g->ldb) ||
	    cublasLtMatrixLayoutCreate(&lc, g->c_type, g->m, g->n, g->ldc))
		goto out;
	if (cublasLtMatmulPreferenceCreate(&pref) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
						 &ws, sizeof(ws)) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
						 &al_a, sizeof(al_a)) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
						 &al_b, sizeof(al_b)) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
						 &al_c, sizeof(al_c)) ||
	    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
						 &al_c, sizeof(al_c)))
		goto out;
	if (cublasLtMatmulAlgoGetHeuristic(cu->lt, desc, la, lb, lc, lc, pref, 1, &heur, &nres) ||
	    nres < 1)
		goto out;
	if (cublasLtMatmul(cu->lt, desc, &alpha, g->A, la, g->B, lb, &g->beta, g->C, lc, g->C, lc,
			   &heur.algo, cu->gemm_ws, ws, cu->stream) == CUBLAS_STATUS_SUCCESS)
		ret = 0;
out:
	if (pref)
		cublasLtMatmulPreferenceDestroy(pref);
	if (lc)
		cublasLtMatrixLayoutDestroy(lc);
	if (lb)
		cublasLtMatrixLayoutDestroy(lb);
	if (la)
		cublasLtMatrixLayoutDestroy(la);
	if (desc)
		cublasLtMatmulDescDestroy(desc);
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

	if (cu->use_lt && cu->lt && gemm_lt(cu, &g) == 0)
		return mr__cuda_launched(cu, what);
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
			       t, t, IC, IC, OC, 0.0f, out };

	if (N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_fwd");
	return gemm(cu, g, "matmul_fwd");
}

int mr__cuda_matmul_f32out(struct mr_cuda *cu, float *out, const void *inp, const void *w, int N,
			   int IC, int OC)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, NULL,
			       t, CUDA_R_32F, IC, IC, OC, 0.0f, out };

	if (N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_f32out");
	return gemm(cu, g, "matmul_f32out");
}

extern "C" int mr_cuda_matmul_fwd_f32(struct mr_cuda *cu, float *out, const float *inp,
				      const float *w, const float *bias, int N, int IC, int OC)
{
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, bias,
			       CUDA_R_32F, CUDA_R_32F, IC, IC, OC, 0.0f, out };

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
				       t, t, IC, OC, IC, accumulate_dinp ? 1.0f : 0.0f, dinp };
		rc = gemm(cu, g, "matmul_bwd dinp");
		if (rc)
			return rc;
	}
	if (dw) {
		struct gemm_args g = { CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, dout, NULL,
				       t, CUDA_R_32F, IC, OC, IC, 1.0f, dw };
		rc = gemm(cu, g, "matmul_bwd dw");
		if (rc)
			return rc;
	}
	if (dbias)
		return MR__BY_ACT(cu, colsum, cu, dbias, dout, N, OC);
	return 0;
}
