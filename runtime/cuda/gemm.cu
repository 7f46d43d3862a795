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
 * Epilogues (each, where cuBLASLt has no algorithm for it, runs apart as
 * separate kernels - counted as a fallback, named once):
 *   - bias (BIAS) in every forward;
 *   - the MLP's GELU in its first GEMM (mr_cuda_matmul_gelu_fwd,
 *     GELU_AUX_BIAS): out = gelu(fp32 product + bias) and the GELU's
 *     input, each rounded once, as llm.c does on H100;
 *   - the GELU's gradient in the GEMM after it (mr_cuda_matmul_dgelu_bwd,
 *     DGELU): the fp32 product times gelu'(pre), rounded once;
 *   - every bias gradient in its weight-gradient GEMM (BGRADB: the sum of
 *     dout's rows, fp32). The epilogue writes rather than adds, so it goes
 *     to scratch and one small kernel adds it to dbias. Without a weight
 *     gradient, dbias is a fixed-order column sum (partials per row chunk,
 *     then one sum per column).
 * The two GELU epilogues run with bf16 activations only: cuBLASLt's GELU
 * is the tanh form with its own tanh, close to ours but not within fp32's
 * bounds, and fp32 activations are the exact mode (the kernels for float,
 * no TF32). Both round like the bf16 kernels they replace, but not bit for
 * bit like them: a selective recomputation's GELU of the stored input
 * cannot repeat the fused forward, so the model fuses only blocks whose
 * GELU output stays (gpt2.c).
 * Compute type CUBLAS_COMPUTE_32F everywhere: with bf16 inputs the tensor
 * cores accumulate in fp32; with fp32 inputs (precision fp32) it is an
 * exact fp32 GEMM, never TF32 (that would need _FAST_TF32, which we never
 * ask for, and the cuBLAS math mode stays CUBLAS_DEFAULT_MATH).
 *
 * The MoE experts' GEMMs are strided-batched (the *_batched entries): one
 * cuBLASLt call over the E experts' (cap, width) blocks, each layout with
 * a batch count and stride and the bias / DGELU input with their batch
 * strides; the fallback is cublasGemmStridedBatchedEx, and dbias the same
 * fixed-order column sum per batch item.
 *
 * Non-goals: fp8, grouped GEMMs of varying row counts, the DGELU_BGRAD
 * epilogue (the fc layer's bias gradient comes from its own weight
 * GEMM's BGRADB instead, one launch either way).
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
	/* strided batch (batch <= 1: one GEMM): element strides of A, B, C,
	 * the bias (or bgrad) and the aux matrix (pre or gelu_in) from one
	 * batch item to the next */
	int batch;
	long long sa, sb, sc, sbias, saux;
	/* cuBLASLt only: C = gelu(AB + bias), gelu_in = AB + bias (as C) */
	void *gelu_in;
	/* cuBLASLt only: bgrad (n) = the sum of op(B) over k (written) */
	float *bgrad;
};

/* The largest power of two up to 256 dividing a (an address or a byte
 * count). */
static unsigned int align_of_n(uintptr_t a)
{
	unsigned int al = 256;

	while (al > 1 && (a % al))
		al >>= 1;
	return al;
}

static unsigned int align_of(const void *p)
{
	return align_of_n((uintptr_t)p);
}

/* The alignment every batch item of a strided batch keeps: the base's,
 * and the stride's in bytes (item b sits b strides further). */
static unsigned int batch_align(const void *p, int batch, long long stride, cudaDataType_t t)
{
	unsigned int al = align_of(p), as;

	if (batch <= 1)
		return al;
	as = align_of_n((uintptr_t)stride * (t == CUDA_R_16BF ? 2u : 4u));
	return as < al ? as : al;
}

/* What a cuBLASLt plan depends on besides its pointers (memcmp'd: zero
 * the padding with memset before filling). */
struct lt_key {
	cublasOperation_t ta, tb;
	int m, n, k, lda, ldb, ldc;
	cublasLtEpilogue_t epi;
	cudaDataType_t ab_type, c_type;
	uint32_t al_a, al_b, al_c, al_e; /* the pointers' alignments (e: the epilogue's) */
	int batch;
	long long sa, sb, sc, sbias, saux;
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

/* A layout's strided batch (nothing for one item); 0 or a cuBLAS status. */
static int layout_batch(cublasLtMatrixLayout_t l, int batch, long long stride)
{
	int32_t n = batch;
	int64_t st = stride;

	if (batch <= 1)
		return 0;
	return (int)cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n,
						     sizeof(n)) ||
	       (int)cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
						     &st, sizeof(st));
}

/* The epilogue an argument set asks for. */
static cublasLtEpilogue_t epilogue_of(const struct gemm_args *g)
{
	if (g->dgelu_pre)
		return CUBLASLT_EPILOGUE_DGELU;
	if (g->gelu_in)
		return g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
	if (g->bgrad)
		return CUBLASLT_EPILOGUE_BGRADB;
	return g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

/* Whether epilogue e reads or writes the bias pointer / the aux matrix. */
static int epi_has_bias(cublasLtEpilogue_t e)
{
	return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
	       e == CUBLASLT_EPILOGUE_BGRADB;
}

static int epi_has_aux(cublasLtEpilogue_t e)
{
	return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_GELU_AUX ||
	       e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

/* The epilogue's pointers of g: the bias (or bgrad), the aux matrix. */
static const void *bias_ptr(const struct gemm_args *g)
{
	return g->bgrad ? (const void *)g->bgrad : g->bias;
}

static const void *aux_ptr(const struct gemm_args *g)
{
	return g->dgelu_pre ? g->dgelu_pre : g->gelu_in;
}

/* Sets d's epilogue pointers to g's; 0 or a cuBLAS status. The heuristic
 * reads their alignment from them, so a plan is made with them set. */
static int desc_pointers(cublasLtMatmulDesc_t d, cublasLtEpilogue_t e, const struct gemm_args *g)
{
	const void *b = bias_ptr(g), *x = aux_ptr(g);

	return (epi_has_bias(e) &&
		cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b,
					       sizeof(b))) ||
	       (epi_has_aux(e) &&
		cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x,
					       sizeof(x)));
}

/* The bias's and the aux matrix's batch strides; 0 or a cuBLAS status. */
static int desc_batch(cublasLtMatmulDesc_t d, const struct lt_key *k)
{
	int64_t sbias = k->sbias, saux = k->saux;

	if (k->batch <= 1)
		return 0;
	return (epi_has_bias(k->epi) &&
		cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &sbias,
					       sizeof(sbias))) ||
	       (epi_has_aux(k->epi) &&
		cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE,
					       &saux, sizeof(saux)));
}

/* Fills p for k (g: the call it is made for): descriptor, layouts, the
 * heuristic's best algorithm within the workspace. 0, or 1 when cuBLASLt
 * cannot do the shape. */
static int plan_build(struct mr_cuda *cu, struct mr__lt_plan *p, const struct lt_key *k,
		      const struct gemm_args *g)
{
	cublasLtMatmulPreference_t pref = NULL;
	cublasLtMatmulHeuristicResult_t heur;
	cublasLtEpilogue_t epi = k->epi;
	int64_t aux_ld = k->ldc; /* the aux matrix (pre, gelu_in) has C's layout */
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
	    (epi_has_aux(epi) &&
	     cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
					    sizeof(aux_ld))) ||
	    desc_batch(p->desc, k) || desc_pointers(p->desc, epi, g))
		goto out;
	if (cublasLtMatrixLayoutCreate(&p->la, k->ab_type, k->ta == CUBLAS_OP_N ? k->m : k->k,
				       k->ta == CUBLAS_OP_N ? k->k : k->m, k->lda) ||
	    cublasLtMatrixLayoutCreate(&p->lb, k->ab_type, k->tb == CUBLAS_OP_N ? k->k : k->n,
				       k->tb == CUBLAS_OP_N ? k->n : k->k, k->ldb) ||
	    cublasLtMatrixLayoutCreate(&p->lc, k->c_type, k->m, k->n, k->ldc) ||
	    layout_batch(p->la, k->batch, k->sa) || layout_batch(p->lb, k->batch, k->sb) ||
	    layout_batch(p->lc, k->batch, k->sc))
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
	k.epi = epilogue_of(g);
	/* the aux matrix's leading dimension and batch stride: multiples of 8 */
	if (epi_has_aux(k.epi) && (g->ldc % 8 || (g->batch > 1 && g->saux % 8)))
		return 1;
	k.ab_type = g->ab_type;
	k.c_type = g->c_type;
	k.al_a = batch_align(g->A, g->batch, g->sa, g->ab_type);
	k.al_b = batch_align(g->B, g->batch, g->sb, g->ab_type);
	k.al_c = batch_align(g->C, g->batch, g->sc, g->c_type);
	k.al_e = 256;
	if (epi_has_bias(k.epi))
		k.al_e = batch_align(bias_ptr(g), g->batch, g->sbias,
				     g->bgrad ? CUDA_R_32F : g->c_type);
	if (epi_has_aux(k.epi)) {
		unsigned int al = batch_align(aux_ptr(g), g->batch, g->saux, g->c_type);
		k.al_e = al < k.al_e ? al : k.al_e;
	}
	k.batch = g->batch > 1 ? g->batch : 1;
	if (k.batch > 1) {
		k.sa = g->sa;
		k.sb = g->sb;
		k.sc = g->sc;
		k.sbias = epi_has_bias(k.epi) ? g->sbias : 0;
		k.saux = epi_has_aux(k.epi) ? g->saux : 0;
	}
	for (int i = 0; i < cu->nplans && !p; i++)
		if (!memcmp(&cu->plans[i].key, &k, sizeof(k)))
			p = &cu->plans[i];
	if (!p) {
		/* a full cache (more shapes than a model has) plans per call */
		p = cu->plans && cu->nplans < MR__LT_PLANS ? &cu->plans[cu->nplans++] : &tmp;
		memset(p, 0, sizeof(*p));
		p->has_algo = plan_build(cu, p, &k, g) == 0;
	}
	if (p->has_algo && desc_pointers(p->desc, k.epi, g) == 0 &&
	    cublasLtMatmul(cu->lt, p->desc, &alpha, g->A, p->la, g->B, p->lb, &g->beta, g->C, p->lc,
			   g->C, p->lc, &p->algo, cu->gemm_ws, cu->gemm_ws_bytes,
			   cu->stream) == CUBLAS_STATUS_SUCCESS)
		ret = 0;
	if (p == &tmp)
		plan_release(&tmp);
	return ret;
}

/* out (batch, rows, cols) row-major, each row of item b = its bias, at
 * bias + b * sbias. */
template <typename T>
__global__ void bias_fill_kernel(T *out, const T *bias, int batch, size_t rows, int cols,
				 long long sbias)
{
	size_t item = rows * (size_t)cols, n = item * (size_t)batch;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = bias[(i / item) * (size_t)sbias + i % (size_t)cols];
}

/* The fallback's GEMM: one, or the strided batch. */
static cublasStatus_t gemm_ex(struct mr_cuda *cu, const struct gemm_args *g)
{
	float alpha = 1.0f;

	if (g->batch > 1)
		return cublasGemmStridedBatchedEx(cu->blas, g->ta, g->tb, g->m, g->n, g->k, &alpha,
						  g->A, g->ab_type, g->lda, g->sa, g->B, g->ab_type,
						  g->ldb, g->sb, &g->beta, g->C, g->c_type, g->ldc,
						  g->sc, g->batch, CUBLAS_COMPUTE_32F,
						  CUBLAS_GEMM_DEFAULT);
	return cublasGemmEx(cu->blas, g->ta, g->tb, g->m, g->n, g->k, &alpha, g->A, g->ab_type,
			    g->lda, g->B, g->ab_type, g->ldb, &g->beta, g->C, g->c_type, g->ldc,
			    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static int gemm(struct mr_cuda *cu, struct gemm_args g, const char *what)
{
	int batch = g.batch > 1 ? g.batch : 1;
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
		unsigned int nb = mr__cu_blocks((size_t)g.m * g.n * batch, MR__CU_THREADS);
		if (g.c_type == CUDA_R_16BF)
			bias_fill_kernel<<<nb, MR__CU_THREADS, 0, cu->stream>>>(
				(__nv_bfloat16 *)g.C, (const __nv_bfloat16 *)g.bias, batch,
				(size_t)g.n, g.m, g.sbias);
		else
			bias_fill_kernel<<<nb, MR__CU_THREADS, 0, cu->stream>>>(
				(float *)g.C, (const float *)g.bias, batch, (size_t)g.n, g.m,
				g.sbias);
		g.beta = 1.0f;
	}
	st = gemm_ex(cu, &g);
	if (st != CUBLAS_STATUS_SUCCESS) {
		snprintf(cu->err, sizeof(cu->err), "%s: cublasGemmEx status %d", what, (int)st);
		return MR_ESYS;
	}
	return mr__cuda_launched(cu, what);
}

/* Strides of the (batch, N, IC) x (batch, OC, IC) items of a forward:
 * A = w, B = inp, C = out. */
static void fwd_strides(struct gemm_args *g, int batch, int N, int IC, int OC)
{
	g->batch = batch;
	g->sa = (long long)OC * IC;
	g->sb = (long long)N * IC;
	g->sc = (long long)N * OC;
	g->sbias = OC;
}

static int matmul_fwd(struct mr_cuda *cu, void *out, const void *inp, const void *w,
		      const void *bias, int batch, int N, int IC, int OC, const char *what)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, bias,
			       t, t, IC, IC, OC, 0.0f, out, NULL,
			       1, 0, 0, 0, 0, 0, NULL, NULL };

	if (batch <= 0 || N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, what);
	fwd_strides(&g, batch, N, IC, OC);
	return gemm(cu, g, what);
}

extern "C" int mr_cuda_matmul_fwd(struct mr_cuda *cu, void *out, const void *inp, const void *w,
				  const void *bias, int N, int IC, int OC)
{
	return matmul_fwd(cu, out, inp, w, bias, 1, N, IC, OC, "matmul_fwd");
}

extern "C" int mr_cuda_matmul_fwd_batched(struct mr_cuda *cu, void *out, const void *inp,
					  const void *w, const void *bias, int batch, int N,
					  int IC, int OC)
{
	return matmul_fwd(cu, out, inp, w, bias, batch, N, IC, OC, "matmul_fwd_batched");
}

/* Whether the GELU epilogues may run: cuBLASLt in use, bf16 activations
 * (see the header). */
static int gelu_epilogues(const struct mr_cuda *cu)
{
	return cu->use_lt && cu->lt && mr__cu_act_type(cu) == CUDA_R_16BF;
}

/* g through cuBLASLt with its epilogue: 0 (ran), an error, or 1 when
 * cuBLASLt cannot - nothing ran, counted as a fallback (the first one's
 * reason kept) for the caller's separate kernels. */
static int gemm_epilogue(struct mr_cuda *cu, const struct gemm_args *g, const char *what)
{
	if (gemm_lt(cu, g) == 0)
		return mr__cuda_launched(cu, what);
	if (!cu->lt_fallbacks++)
		snprintf(cu->lt_why, sizeof(cu->lt_why),
			 "%s: cuBLASLt has no algorithm with the epilogue or failed for batch %d m "
			 "%d n %d k %d: separate kernels instead",
			 what, g->batch, g->m, g->n, g->k);
	return 1;
}

static int matmul_gelu_fwd(struct mr_cuda *cu, void *out, void *pre, const void *inp,
			   const void *w, const void *bias, int batch, int N, int IC, int OC,
			   const char *what)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, bias,
			       t, t, IC, IC, OC, 0.0f, out, NULL,
			       1, 0, 0, 0, 0, 0, pre, NULL };
	int rc;

	if (batch <= 0 || N <= 0 || IC <= 0 || OC <= 0 || !out || !pre)
		return mr__cuda_inval(cu, what);
	fwd_strides(&g, batch, N, IC, OC);
	g.saux = g.sc;
	if (gelu_epilogues(cu) && (rc = gemm_epilogue(cu, &g, what)) != 1)
		return rc;
	if ((rc = matmul_fwd(cu, pre, inp, w, bias, batch, N, IC, OC, what)))
		return rc;
	return mr_cuda_gelu_fwd(cu, out, pre, (size_t)batch * N * OC);
}

extern "C" int mr_cuda_matmul_gelu_fwd(struct mr_cuda *cu, void *out, void *pre, const void *inp,
				       const void *w, const void *bias, int N, int IC, int OC)
{
	return matmul_gelu_fwd(cu, out, pre, inp, w, bias, 1, N, IC, OC, "matmul_gelu_fwd");
}

extern "C" int mr_cuda_matmul_gelu_fwd_batched(struct mr_cuda *cu, void *out, void *pre,
					       const void *inp, const void *w, const void *bias,
					       int batch, int N, int IC, int OC)
{
	return matmul_gelu_fwd(cu, out, pre, inp, w, bias, batch, N, IC, OC,
			       "matmul_gelu_fwd_batched");
}

int mr__cuda_matmul_f32out(struct mr_cuda *cu, float *out, const void *inp, const void *w, int N,
			   int IC, int OC)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, NULL,
			       t, CUDA_R_32F, IC, IC, OC, 0.0f, out, NULL,
			       1, 0, 0, 0, 0, 0, NULL, NULL };

	if (N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_f32out");
	return gemm(cu, g, "matmul_f32out");
}

extern "C" int mr_cuda_matmul_fwd_f32(struct mr_cuda *cu, float *out, const float *inp,
				      const float *w, const float *bias, int N, int IC, int OC)
{
	struct gemm_args g = { CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, inp, bias,
			       CUDA_R_32F, CUDA_R_32F, IC, IC, OC, 0.0f, out, NULL,
			       1, 0, 0, 0, 0, 0, NULL, NULL };

	if (N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_fwd_f32");
	return gemm(cu, g, "matmul_fwd_f32");
}

/* part (batch, nchunks, OC): sums of ROWS_PER_CHUNK rows of each batch
 * item of dout (batch, N, OC) per column. */
template <typename T>
__global__ void colsum_partial_kernel(float *part, const T *dout, int N, int OC)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	int r0 = blockIdx.y * ROWS_PER_CHUNK;
	int r1 = min(r0 + ROWS_PER_CHUNK, N);
	size_t b = blockIdx.z;
	float s = 0.0f;

	if (c >= OC)
		return;
	dout += b * (size_t)N * OC;
	for (int r = r0; r < r1; r++)
		s += mr__ld(dout + (size_t)r * OC + c);
	part[(b * gridDim.y + blockIdx.y) * OC + c] = s;
}

/* dst (batch, OC) += sum over chunks of part, in chunk order. */
__global__ void colsum_final_kernel(float *dst, const float *part, int nchunks, int OC)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	size_t b = blockIdx.y;
	float s = 0.0f;

	if (c >= OC)
		return;
	part += b * (size_t)nchunks * OC;
	for (int k = 0; k < nchunks; k++)
		s += part[(size_t)k * OC + c];
	dst[b * OC + c] += s;
}

/* dbias (batch, OC) += colsum(dout (batch, N, OC)) per item: fixed chunks,
 * then chunk order. */
template <typename T>
static int colsum(struct mr_cuda *cu, float *dbias, const void *dout, int batch, int N, int OC)
{
	int nchunks = (N + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
	unsigned int gx = (unsigned int)((OC + MR__CU_THREADS - 1) / MR__CU_THREADS);
	float *part;
	int rc;

	if (batch > 65535 || nchunks > 65535)
		return mr__cuda_inval(cu, "matmul_bwd dbias");
	if ((rc = mr__cuda_scratch(cu, (size_t)batch * nchunks * OC * sizeof(float), &part)))
		return rc;
	colsum_partial_kernel<T><<<dim3(gx, (unsigned int)nchunks, (unsigned int)batch),
				   MR__CU_THREADS, 0, cu->stream>>>(part, (const T *)dout, N, OC);
	colsum_final_kernel<<<dim3(gx, (unsigned int)batch), MR__CU_THREADS, 0, cu->stream>>>(
		dbias, part, nchunks, OC);
	return mr__cuda_launched(cu, "matmul_bwd dbias");
}

/* dinp (batch, N, IC) = or += dout @ w per item (pre: times gelu'(pre)
 * in cuBLASLt's DGELU epilogue, which the caller checked may run; 1 when
 * cuBLASLt cannot, counted, nothing run). */
static int dinp_gemm(struct mr_cuda *cu, void *dinp, const void *dout, const void *w,
		     const void *pre, int batch, int N, int IC, int OC, float beta,
		     const char *what)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	struct gemm_args g = { CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, dout, NULL,
			       t, t, IC, OC, IC, beta, dinp, pre,
			       1, 0, 0, 0, 0, 0, NULL, NULL };

	g.batch = batch;
	g.sa = (long long)OC * IC;
	g.sb = (long long)N * OC;
	g.sc = g.saux = (long long)N * IC;
	return pre ? gemm_epilogue(cu, &g, what) : gemm(cu, g, what);
}

/* The weight-gradient GEMM g with dbias (batch, OC) += the sum of dout's
 * rows from its BGRADB epilogue, written to scratch then added: 0, an
 * error, or 1 when cuBLASLt cannot (counted; nothing ran). */
static int dw_bgrad_gemm(struct mr_cuda *cu, struct gemm_args g, float *dbias)
{
	size_t n = (size_t)g.batch * (size_t)g.n;
	int rc;

	if (!cu->use_lt || !cu->lt)
		return 1;
	if ((rc = mr__cuda_scratch(cu, n * sizeof(float), &g.bgrad)))
		return rc;
	g.sbias = g.n;
	if ((rc = gemm_epilogue(cu, &g, "matmul_bwd dw+dbias")))
		return rc;
	return mr_cuda_add_f32(cu, dbias, g.bgrad, n);
}

/* dw (batch, OC, IC) += dout^T @ inp per item (fp32), dbias (batch, OC)
 * += colsum(dout); each may be NULL. */
static int dw_gemm(struct mr_cuda *cu, float *dw, float *dbias, const void *dout,
		   const void *inp, int batch, int N, int IC, int OC)
{
	cudaDataType_t t = mr__cu_act_type(cu);
	int rc;

	if (dw) {
		struct gemm_args g = { CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, dout, NULL,
				       t, CUDA_R_32F, IC, OC, IC, 1.0f, dw, NULL,
				       1, 0, 0, 0, 0, 0, NULL, NULL };
		g.batch = batch;
		g.sa = (long long)N * IC;
		g.sb = (long long)N * OC;
		g.sc = (long long)OC * IC;
		if (dbias && (rc = dw_bgrad_gemm(cu, g, dbias)) != 1)
			return rc;
		if ((rc = gemm(cu, g, "matmul_bwd dw")))
			return rc;
	}
	if (dbias)
		return MR__BY_ACT(cu, colsum, cu, dbias, dout, batch, N, OC);
	return 0;
}

static int matmul_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
		      const void *dout, const void *inp, const void *w, int batch, int N, int IC,
		      int OC, int accumulate_dinp)
{
	int rc;

	if (batch <= 0 || N <= 0 || IC <= 0 || OC <= 0)
		return mr__cuda_inval(cu, "matmul_bwd");
	if (dinp && (rc = dinp_gemm(cu, dinp, dout, w, NULL, batch, N, IC, OC,
				    accumulate_dinp ? 1.0f : 0.0f, "matmul_bwd dinp")))
		return rc;
	return dw_gemm(cu, dw, dbias, dout, inp, batch, N, IC, OC);
}

extern "C" int mr_cuda_matmul_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
				  const void *dout, const void *inp, const void *w, int N, int IC,
				  int OC, int accumulate_dinp)
{
	return matmul_bwd(cu, dinp, dw, dbias, dout, inp, w, 1, N, IC, OC, accumulate_dinp);
}

extern "C" int mr_cuda_matmul_bwd_batched(struct mr_cuda *cu, void *dinp, float *dw,
					  float *dbias, const void *dout, const void *inp,
					  const void *w, int batch, int N, int IC, int OC)
{
	return matmul_bwd(cu, dinp, dw, dbias, dout, inp, w, batch, N, IC, OC, 0);
}

static int matmul_dgelu_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
			    const void *dout, const void *inp, const void *w, const void *pre,
			    int batch, int N, int IC, int OC)
{
	int rc;

	if (batch <= 0 || N <= 0 || IC <= 0 || OC <= 0 || !dinp || !pre)
		return mr__cuda_inval(cu, "matmul_dgelu_bwd");
	rc = gelu_epilogues(cu) ? dinp_gemm(cu, dinp, dout, w, pre, batch, N, IC, OC, 0.0f,
					    "matmul_dgelu_bwd")
				: 1;
	if (rc == 1) {
		rc = dinp_gemm(cu, dinp, dout, w, NULL, batch, N, IC, OC, 0.0f,
			       "matmul_bwd dinp");
		if (rc == 0)
			rc = mr_cuda_gelu_bwd(cu, dinp, pre, dinp, (size_t)batch * N * IC);
	}
	if (rc == 0)
		rc = dw_gemm(cu, dw, dbias, dout, inp, batch, N, IC, OC);
	return rc;
}

extern "C" int mr_cuda_matmul_dgelu_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
					const void *dout, const void *inp, const void *w,
					const void *pre, int N, int IC, int OC)
{
	return matmul_dgelu_bwd(cu, dinp, dw, dbias, dout, inp, w, pre, 1, N, IC, OC);
}

extern "C" int mr_cuda_matmul_dgelu_bwd_batched(struct mr_cuda *cu, void *dinp, float *dw,
						float *dbias, const void *dout, const void *inp,
						const void *w, const void *pre, int batch, int N,
						int IC, int OC)
{
	return matmul_dgelu_bwd(cu, dinp, dw, dbias, dout, inp, w, pre, batch, N, IC, OC);
}
