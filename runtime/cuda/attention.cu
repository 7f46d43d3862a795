/*
 * attention.cu - causal multi-head attention, block-wise with an online
 * softmax (FlashAttention-2 style), forward and backward, plus the merge of
 * partial results (see mr_cuda.h and the CPU twin in mr_attention.h).
 *
 * Layout of the work: a CTA of 4 warps owns BR = 16 rows (4 per warp) of
 * one (batch, head) and walks tiles of BC = 32 rows of the other operand,
 * staged in shared memory as fp32. In a tile, lane j handles row j of the
 * tile for the scores (dot products against a padded smem row: stride
 * hs+1 keeps the 32 lanes on 32 banks), and for the accumulations lane l
 * owns channels l, l+32, .. (hs/32 <= 4 registers per row) and receives
 * the 32 per-tile weights by shuffles. Memory is O(T): only lse (B,NH,T)
 * is kept for backward; scores are recomputed.
 *
 *   fwd : rows = queries, tiles = keys; running max m, sum l, acc rescaled
 *         by exp(m_old - m_new); out = acc / l, lse = m + log l.
 *   dq  : rows = queries, tiles = keys; P = exp(S - lse),
 *         dS = P (dP - delta) scale with dP = dO V^T; dQ += dS K.
 *   dkdv: rows = keys, tiles = queries; dV += P^T dO, dK += dS^T Q.
 * dq and dk/dv are separate passes (2x the score recompute of FA-2's
 * single pass) so that no atomics are needed and the result is
 * deterministic. Tiles entirely in the causal future are skipped.
 *
 * Grouped-query attention (Ainslie et al. 2023, "GQA", arXiv:2305.13245):
 * NKV key/value heads, each shared by G = NH/NKV consecutive query heads
 * (query head h reads key/value head h / G). fwd and dq index the shared
 * head; a dkdv CTA owns rows of one key/value head and walks the query
 * tiles of its G query heads one head after the other into the same
 * registers, so dK, dV are the sum over the group in a fixed order, with
 * no atomics and no partial buffers. G = 1 is the multi-head case, the
 * same arithmetic in the same order as without groups.
 *
 * Every kernel is a template over the storage type of q/k/v/dout (the
 * context's activation type) and of its output or gradients.
 *
 * The whole-layer entries (mr_cuda_attn_layer_fwd/_bwd) try cuDNN's fused
 * flash attention on tensor cores first (cudnn_attn.cu) and run these
 * kernels where it does not take the call (fp32, no cuDNN, a refused
 * shape); the context-parallel entries always run these kernels.
 *
 * Non-goals: tensor-core MMA in these kernels (correctness and O(T)
 * memory first; the layer's speed comes from cuDNN), dropout, head sizes
 * above 128 or not a multiple of 32.
 */
#include <string.h>

#include "cuda_int.cuh"

#define BR 16           /* rows per CTA */
#define BC 32           /* rows per tile = warp width */
#define NWARP 4
#define RPW (BR / NWARP)
#define NCMAX 4         /* hs <= 32 * NCMAX */
#define ATTN_THREADS (32 * NWARP)
#define FULL 0xffffffffu

typedef struct mr_cuda_attn attn_t;

/* Copies rows [r0, r0+nr) of a (., hs) operand into smem with row stride
 * ld, converting to fp32; rows past `limit` become 0. */
template <typename T>
__device__ void load_rows(float *dst, int ld, const T *base, size_t row_stride, int r0, int nr,
			  int limit, int hs)
{
	for (int idx = threadIdx.x; idx < nr * hs; idx += blockDim.x) {
		int r = idx / hs, c = idx - r * hs;
		dst[r * ld + c] = r0 + r < limit ? mr__ld(base + (size_t)(r0 + r) * row_stride + c)
						 : 0.0f;
	}
}

__device__ __forceinline__ float dot_sm(const float *a, const float *b, int hs)
{
	float d = 0.0f;

#pragma unroll 8
	for (int c = 0; c < hs; c++)
		d += a[c] * b[c];
	return d;
}

/* Number of keys (from 0) any query up to position qlast can see. */
__device__ __forceinline__ int key_end(const attn_t &a, int qlast)
{
	if (!a.causal)
		return a.tk;
	return min(a.tk, max(0, a.q_pos0 + qlast - a.k_pos0 + 1));
}

template <typename TI, typename OutT>
__global__ void __launch_bounds__(ATTN_THREADS)
	attn_fwd_kernel(attn_t a, OutT *out, size_t o_row, size_t o_batch, float *lse)
{
	extern __shared__ float sm[];
	int hs = a.hs, nc = hs / 32, ks = hs + 1;
	float *sq = sm, *sk = sq + BR * hs, *sv = sk + BC * ks;
	int bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, q0 = blockIdx.x * BR;
	int kvh = h / (a.NH / a.NKV);
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const TI *qb = (const TI *)a.q + b * a.q_batch + (size_t)h * hs;
	const TI *kb = (const TI *)a.k + b * a.kv_batch + (size_t)kvh * hs;
	const TI *vb = (const TI *)a.v + b * a.kv_batch + (size_t)kvh * hs;
	float m[RPW], l[RPW], acc[RPW][NCMAX];
	int kend = key_end(a, min(q0 + BR, a.tq) - 1);

	load_rows(sq, hs, qb, a.q_row, q0, BR, a.tq, hs);
	#pragma unroll
	for (int i = 0; i < RPW; i++) {
		m[i] = -INFINITY;
		l[i] = 0.0f;
		for (int cc = 0; cc < NCMAX; cc++)
			acc[i][cc] = 0.0f;
	}
	for (int k0 = 0; k0 < kend; k0 += BC) {
		__syncthreads();
		load_rows(sk, ks, kb, a.kv_row, k0, BC, kend, hs);
		load_rows(sv, hs, vb, a.kv_row, k0, BC, kend, hs);
		__syncthreads();
		#pragma unroll
		for (int i = 0; i < RPW; i++) {
			int r = warp * RPW + i, qi = q0 + r, kj = k0 + lane;
			int vis = qi < a.tq && kj < kend &&
				  (!a.causal || a.k_pos0 + kj <= a.q_pos0 + qi);
			float s = vis ? dot_sm(sq + r * hs, sk + lane * ks, hs) * a.scale : -INFINITY;
			float tmax = mr__warp_max(s), mn, corr, p;

			if (tmax == -INFINITY)
				continue; /* warp-uniform: nothing visible here */
			mn = fmaxf(m[i], tmax);
			corr = expf(m[i] - mn); /* 0 while m is -inf */
			p = vis ? expf(s - mn) : 0.0f;
			l[i] = l[i] * corr + mr__warp_sum(p);
#pragma unroll
			for (int cc = 0; cc < NCMAX; cc++)
				acc[i][cc] *= corr;
			for (int jj = 0; jj < BC; jj++) {
				float pj = __shfl_sync(FULL, p, jj);
#pragma unroll
				for (int cc = 0; cc < NCMAX; cc++)
					if (cc < nc)
						acc[i][cc] += pj * sv[jj * hs + lane + 32 * cc];
			}
			m[i] = mn;
		}
	}
	#pragma unroll
	for (int i = 0; i < RPW; i++) {
		int qi = q0 + warp * RPW + i;
		OutT *o = out + b * o_batch + (size_t)qi * o_row + (size_t)h * hs;
		float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;

		if (qi >= a.tq)
			continue;
#pragma unroll
		for (int cc = 0; cc < NCMAX; cc++)
			if (cc < nc)
				mr__st(o + lane + 32 * cc, acc[i][cc] * inv);
		if (lane == 0)
			lse[(size_t)bh * a.tq + qi] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
	}
}

template <typename TI, typename GT>
__global__ void __launch_bounds__(ATTN_THREADS)
	attn_dq_kernel(attn_t a, const TI *dout, size_t o_row, size_t o_batch,
		       const float *lse, const float *delta, GT *dq, size_t dq_row, size_t dq_batch)
{
	extern __shared__ float sm[];
	int hs = a.hs, nc = hs / 32, ks = hs + 1;
	float *sq = sm, *sdo = sq + BR * hs, *sk = sdo + BR * hs, *sv = sk + BC * ks;
	int bh = blockIdx.y, b = bh / a.NH, h = bh % a.NH, q0 = blockIdx.x * BR;
	int kvh = h / (a.NH / a.NKV);
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const TI *qb = (const TI *)a.q + b * a.q_batch + (size_t)h * hs;
	const TI *kb = (const TI *)a.k + b * a.kv_batch + (size_t)kvh * hs;
	const TI *vb = (const TI *)a.v + b * a.kv_batch + (size_t)kvh * hs;
	const TI *db = dout + b * o_batch + (size_t)h * hs;
	float acc[RPW][NCMAX], li[RPW], di[RPW];
	int kend = key_end(a, min(q0 + BR, a.tq) - 1);

	load_rows(sq, hs, qb, a.q_row, q0, BR, a.tq, hs);
	load_rows(sdo, hs, db, o_row, q0, BR, a.tq, hs);
	#pragma unroll
	for (int i = 0; i < RPW; i++) {
		int qi = q0 + warp * RPW + i;
		li[i] = qi < a.tq ? lse[(size_t)bh * a.tq + qi] : -INFINITY;
		di[i] = qi < a.tq ? delta[(size_t)bh * a.tq + qi] : 0.0f;
		for (int cc = 0; cc < NCMAX; cc++)
			acc[i][cc] = 0.0f;
	}
	for (int k0 = 0; k0 < kend; k0 += BC) {
		__syncthreads();
		load_rows(sk, ks, kb, a.kv_row, k0, BC, kend, hs);
		load_rows(sv, ks, vb, a.kv_row, k0, BC, kend, hs);
		__syncthreads();
		#pragma unroll
		for (int i = 0; i < RPW; i++) {
			int r = warp * RPW + i, qi = q0 + r, kj = k0 + lane;
			int vis = qi < a.tq && kj < kend && li[i] != -INFINITY &&
				  (!a.causal || a.k_pos0 + kj <= a.q_pos0 + qi);
			float ds = 0.0f;

			if (!__any_sync(FULL, vis))
				continue;
			if (vis) {
				float s = dot_sm(sq + r * hs, sk + lane * ks, hs) * a.scale;
				float p = expf(s - li[i]);
				float dp = dot_sm(sdo + r * hs, sv + lane * ks, hs);
				ds = p * (dp - di[i]) * a.scale;
			}
			for (int jj = 0; jj < BC; jj++) {
				float dj = __shfl_sync(FULL, ds, jj);
#pragma unroll
				for (int cc = 0; cc < NCMAX; cc++)
					if (cc < nc)
						acc[i][cc] += dj * sk[jj * ks + lane + 32 * cc];
			}
		}
	}
	#pragma unroll
	for (int i = 0; i < RPW; i++) {
		int qi = q0 + warp * RPW + i;
		GT *g = dq + b * dq_batch + (size_t)qi * dq_row + (size_t)h * hs;

		if (qi >= a.tq)
			continue;
#pragma unroll
		for (int cc = 0; cc < NCMAX; cc++)
			if (cc < nc)
				mr__st(g + lane + 32 * cc, mr__ld(g + lane + 32 * cc) + acc[i][cc]);
	}
}

/* Grid (key blocks of BR, B*NKV): the CTA of key/value head kvh of batch b
 * walks the query tiles of query heads kvh*G .. kvh*G+G-1 in that order. */
template <typename TI, typename GT>
__global__ void __launch_bounds__(ATTN_THREADS)
	attn_dkdv_kernel(attn_t a, const TI *dout, size_t o_row, size_t o_batch,
			 const float *lse, const float *delta, GT *dk, GT *dv, size_t dkv_row,
			 size_t dkv_batch)
{
	extern __shared__ float sm[];
	int hs = a.hs, nc = hs / 32, ks = hs + 1, G = a.NH / a.NKV;
	float *skr = sm, *svr = skr + BR * hs, *sq = svr + BR * hs, *sdo = sq + BC * ks;
	float *slse = sdo + BC * ks, *sdelta = slse + BC;
	int bkv = blockIdx.y, b = bkv / a.NKV, kvh = bkv % a.NKV, k0 = blockIdx.x * BR;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const TI *kb = (const TI *)a.k + b * a.kv_batch + (size_t)kvh * hs;
	const TI *vb = (const TI *)a.v + b * a.kv_batch + (size_t)kvh * hs;
	float dka[RPW][NCMAX], dva[RPW][NCMAX];
	int qs = a.causal ? max(0, a.k_pos0 + k0 - a.q_pos0) : 0;

	qs = (qs / BC) * BC;
	load_rows(skr, hs, kb, a.kv_row, k0, BR, a.tk, hs);
	load_rows(svr, hs, vb, a.kv_row, k0, BR, a.tk, hs);
	#pragma unroll
	for (int i = 0; i < RPW; i++)
		for (int cc = 0; cc < NCMAX; cc++)
			dka[i][cc] = dva[i][cc] = 0.0f;
	for (int g = 0; g < G; g++) {
		int h = kvh * G + g, bh = b * a.NH + h;
		const TI *qb = (const TI *)a.q + b * a.q_batch + (size_t)h * hs;
		const TI *db = dout + b * o_batch + (size_t)h * hs;
		const float *lb = lse + (size_t)bh * a.tq, *deb = delta + (size_t)bh * a.tq;

		for (int qt = qs; qt < a.tq; qt += BC) {
			__syncthreads();
			load_rows(sq, ks, qb, a.q_row, qt, BC, a.tq, hs);
			load_rows(sdo, ks, db, o_row, qt, BC, a.tq, hs);
			if (threadIdx.x < BC) {
				int qi = qt + threadIdx.x;
				slse[threadIdx.x] = qi < a.tq ? lb[qi] : -INFINITY;
				sdelta[threadIdx.x] = qi < a.tq ? deb[qi] : 0.0f;
			}
			__syncthreads();
			#pragma unroll
			for (int i = 0; i < RPW; i++) {
				int r = warp * RPW + i, kj = k0 + r, qi = qt + lane;
				float li = slse[lane], p = 0.0f, ds = 0.0f;
				int vis = kj < a.tk && qi < a.tq && li != -INFINITY &&
					  (!a.causal || a.k_pos0 + kj <= a.q_pos0 + qi);

				if (!__any_sync(FULL, vis))
					continue;
				if (vis) {
					float s = dot_sm(sq + lane * ks, skr + r * hs, hs) *
						  a.scale;
					float dp = dot_sm(sdo + lane * ks, svr + r * hs, hs);
					p = expf(s - li);
					ds = p * (dp - sdelta[lane]) * a.scale;
				}
				for (int jj = 0; jj < BC; jj++) {
					float pj = __shfl_sync(FULL, p, jj);
					float dj = __shfl_sync(FULL, ds, jj);
#pragma unroll
					for (int cc = 0; cc < NCMAX; cc++) {
						if (cc < nc) {
							int c = lane + 32 * cc;

							dva[i][cc] += pj * sdo[jj * ks + c];
							dka[i][cc] += dj * sq[jj * ks + c];
						}
					}
				}
			}
		}
	}
	#pragma unroll
	for (int i = 0; i < RPW; i++) {
		int kj = k0 + warp * RPW + i;
		size_t off = b * dkv_batch + (size_t)kj * dkv_row + (size_t)kvh * hs;

		if (kj >= a.tk)
			continue;
#pragma unroll
		for (int cc = 0; cc < NCMAX; cc++) {
			if (cc < nc) {
				int c = lane + 32 * cc;
				mr__st(dk + off + c, mr__ld(dk + off + c) + dka[i][cc]);
				mr__st(dv + off + c, mr__ld(dv + off + c) + dva[i][cc]);
			}
		}
	}
}

/* Warp per row r of (B,NH,tq): delta = sum over the head's channels. */
template <typename T>
__global__ void attn_delta_kernel(float *delta, const T *dout, const T *out, int NH, int tq,
				  int hs, size_t o_row, size_t o_batch, size_t rows)
{
	size_t r = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	size_t bh = r / (size_t)tq, b = bh / (size_t)NH;
	int qi = (int)(r % (size_t)tq), h = (int)(bh % (size_t)NH);
	size_t off;
	float s = 0.0f;

	if (r >= rows)
		return;
	off = b * o_batch + (size_t)qi * o_row + (size_t)h * hs;
	for (int c = lane; c < hs; c += 32)
		s += mr__ld(dout + off + c) * mr__ld(out + off + c);
	s = mr__warp_sum(s);
	if (lane == 0)
		delta[r] = s;
}

__global__ void attn_merge_kernel(float *out_a, float *lse_a, const float *out_b,
				  const float *lse_b, int NH, int tq, int hs, size_t o_row,
				  size_t o_batch, size_t rows)
{
	size_t r = blockIdx.x * (size_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	size_t bh = r / (size_t)tq, b = bh / (size_t)NH;
	int qi = (int)(r % (size_t)tq), h = (int)(bh % (size_t)NH);
	float la, lb, mx, wa, wb, inv;
	size_t off;

	if (r >= rows)
		return;
	la = lse_a[r];
	lb = lse_b[r];
	mx = fmaxf(la, lb);
	if (mx == -INFINITY)
		return; /* both empty: a already holds 0, -inf */
	wa = expf(la - mx);
	wb = expf(lb - mx);
	inv = 1.0f / (wa + wb);
	off = b * o_batch + (size_t)qi * o_row + (size_t)h * hs;
	for (int c = lane; c < hs; c += 32)
		out_a[off + c] = (wa * out_a[off + c] + wb * out_b[off + c]) * inv;
	if (lane == 0)
		lse_a[r] = mx + logf(wa + wb);
}

/* The descriptor the kernels take: NKV 0 is NH. Checks the shape (the
 * kernels' limits, NKV dividing NH). */
static int kernel_desc(struct mr_cuda *cu, const attn_t *a, attn_t *k, const char *what)
{
	*k = *a;
	if (k->NKV == 0)
		k->NKV = k->NH;
	if (k->B <= 0 || k->NH <= 0 || k->tq <= 0 || k->tk <= 0 || k->hs <= 0 || k->hs % 32 ||
	    k->hs > 32 * NCMAX || (long)k->B * k->NH > 65535 || k->NKV < 0 ||
	    k->NKV > k->NH || k->NH % k->NKV)
		return mr__cuda_inval(cu, what);
	return 0;
}

/* Dynamic smem above 48 KiB needs an opt-in per kernel. */
template <typename K>
static int smem_optin(struct mr_cuda *cu, K kernel, size_t bytes)
{
	if (bytes <= 48 * 1024)
		return 0;
	return mr__cuda_check(cu,
			      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
						   (int)bytes),
			      "attention smem");
}

template <typename TI, typename OutT>
static int attn_fwd(struct mr_cuda *cu, const attn_t *a, OutT *out, size_t o_row,
		    size_t o_batch, float *lse)
{
	size_t sm = sizeof(float) * ((size_t)BR * a->hs + (size_t)BC * (a->hs + 1) +
				     (size_t)BC * a->hs);
	dim3 grid((unsigned int)((a->tq + BR - 1) / BR), (unsigned int)(a->B * a->NH));
	attn_t k;
	int rc = kernel_desc(cu, a, &k, "attn_fwd");

	if (rc || (rc = smem_optin(cu, attn_fwd_kernel<TI, OutT>, sm)))
		return rc;
	attn_fwd_kernel<TI, OutT><<<grid, ATTN_THREADS, sm, cu->stream>>>(k, out, o_row, o_batch,
									  lse);
	return mr__cuda_launched(cu, "attn_fwd");
}

/* The forward with outputs of the activation type. */
template <typename T>
static int attn_fwd_act(struct mr_cuda *cu, const attn_t *a, void *out, size_t o_row,
			size_t o_batch, float *lse)
{
	return attn_fwd<T, T>(cu, a, (T *)out, o_row, o_batch, lse);
}

/* The forward with fp32 outputs. */
template <typename T>
static int attn_fwd_f32(struct mr_cuda *cu, const attn_t *a, float *out, size_t o_row,
			size_t o_batch, float *lse)
{
	return attn_fwd<T, float>(cu, a, out, o_row, o_batch, lse);
}

extern "C" int mr_cuda_attn_fwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, void *out,
				size_t o_row, size_t o_batch, float *lse)
{
	return MR__BY_ACT(cu, attn_fwd_act, cu, a, out, o_row, o_batch, lse);
}

extern "C" int mr_cuda_attn_fwd_f32(struct mr_cuda *cu, const struct mr_cuda_attn *a,
				    float *out, size_t o_row, size_t o_batch, float *lse)
{
	return MR__BY_ACT(cu, attn_fwd_f32, cu, a, out, o_row, o_batch, lse);
}

extern "C" int mr_cuda_attn_merge(struct mr_cuda *cu, float *out_a, float *lse_a,
				  const float *out_b, const float *lse_b, int B, int NH, int tq,
				  int hs, size_t o_row, size_t o_batch)
{
	size_t rows = (size_t)B * NH * tq;
	unsigned int per = MR__CU_THREADS / 32;

	if (B <= 0 || NH <= 0 || tq <= 0 || hs <= 0)
		return mr__cuda_inval(cu, "attn_merge");
	attn_merge_kernel<<<(unsigned int)((rows + per - 1) / per), MR__CU_THREADS, 0,
			    cu->stream>>>(out_a, lse_a, out_b, lse_b, NH, tq, hs, o_row, o_batch,
					  rows);
	return mr__cuda_launched(cu, "attn_merge");
}

template <typename T>
static int attn_delta(struct mr_cuda *cu, float *delta, const void *dout, const void *out,
		      int NH, int tq, int hs, size_t o_row, size_t o_batch, size_t rows)
{
	unsigned int per = MR__CU_THREADS / 32;

	attn_delta_kernel<T><<<(unsigned int)((rows + per - 1) / per), MR__CU_THREADS, 0,
			       cu->stream>>>(delta, (const T *)dout, (const T *)out, NH, tq, hs,
					     o_row, o_batch, rows);
	return mr__cuda_launched(cu, "attn_delta");
}

extern "C" int mr_cuda_attn_delta(struct mr_cuda *cu, float *delta, const void *dout,
				  const void *out, int B, int NH, int tq, int hs, size_t o_row,
				  size_t o_batch)
{
	if (B <= 0 || NH <= 0 || tq <= 0 || hs <= 0)
		return mr__cuda_inval(cu, "attn_delta");
	return MR__BY_ACT(cu, attn_delta, cu, delta, dout, out, NH, tq, hs, o_row, o_batch,
			  (size_t)B * NH * tq);
}

template <typename TI, typename GT>
static int attn_bwd(struct mr_cuda *cu, const attn_t *a, const TI *dout, size_t o_row,
		    size_t o_batch, const float *lse, const float *delta, GT *dq, size_t dq_row,
		    size_t dq_batch, GT *dk, GT *dv, size_t dkv_row, size_t dkv_batch)
{
	size_t sm = sizeof(float) * (2 * (size_t)BR * a->hs + 2 * (size_t)BC * (a->hs + 1) +
				     2 * (size_t)BC);
	attn_t k;
	int rc = kernel_desc(cu, a, &k, "attn_bwd");
	/* dq per query head; dk/dv per key/value head (it sums its group) */
	dim3 gq((unsigned int)((a->tq + BR - 1) / BR), (unsigned int)(a->B * a->NH));
	dim3 gk((unsigned int)((a->tk + BR - 1) / BR), (unsigned int)(a->B * k.NKV));

	if (rc || (rc = smem_optin(cu, attn_dq_kernel<TI, GT>, sm)) ||
	    (rc = smem_optin(cu, attn_dkdv_kernel<TI, GT>, sm)))
		return rc;
	attn_dq_kernel<TI, GT><<<gq, ATTN_THREADS, sm, cu->stream>>>(
		k, dout, o_row, o_batch, lse, delta, dq, dq_row, dq_batch);
	attn_dkdv_kernel<TI, GT><<<gk, ATTN_THREADS, sm, cu->stream>>>(
		k, dout, o_row, o_batch, lse, delta, dk, dv, dkv_row, dkv_batch);
	return mr__cuda_launched(cu, "attn_bwd");
}

/* Gradients of the activation type. */
template <typename T>
static int attn_bwd_act(struct mr_cuda *cu, const attn_t *a, const void *dout, size_t o_row,
			size_t o_batch, const float *lse, const float *delta, void *dq,
			size_t dq_row, size_t dq_batch, void *dk, void *dv, size_t dkv_row,
			size_t dkv_batch)
{
	return attn_bwd<T, T>(cu, a, (const T *)dout, o_row, o_batch, lse, delta, (T *)dq, dq_row,
			      dq_batch, (T *)dk, (T *)dv, dkv_row, dkv_batch);
}

/* fp32 gradients. */
template <typename T>
static int attn_bwd_f32(struct mr_cuda *cu, const attn_t *a, const void *dout, size_t o_row,
			size_t o_batch, const float *lse, const float *delta, float *dq,
			size_t dq_row, size_t dq_batch, float *dk, float *dv, size_t dkv_row,
			size_t dkv_batch)
{
	return attn_bwd<T, float>(cu, a, (const T *)dout, o_row, o_batch, lse, delta, dq, dq_row,
				  dq_batch, dk, dv, dkv_row, dkv_batch);
}

extern "C" int mr_cuda_attn_bwd(struct mr_cuda *cu, const struct mr_cuda_attn *a,
				const void *dout, size_t o_row, size_t o_batch, const float *lse,
				const float *delta, void *dq, size_t dq_row, size_t dq_batch,
				void *dk, void *dv, size_t dkv_row, size_t dkv_batch)
{
	return MR__BY_ACT(cu, attn_bwd_act, cu, a, dout, o_row, o_batch, lse, delta, dq, dq_row,
			  dq_batch, dk, dv, dkv_row, dkv_batch);
}

extern "C" int mr_cuda_attn_bwd_f32(struct mr_cuda *cu, const struct mr_cuda_attn *a,
				    const void *dout, size_t o_row, size_t o_batch,
				    const float *lse, const float *delta, float *dq, size_t dq_row,
				    size_t dq_batch, float *dk, float *dv, size_t dkv_row,
				    size_t dkv_batch)
{
	return MR__BY_ACT(cu, attn_bwd_f32, cu, a, dout, o_row, o_batch, lse, delta, dq, dq_row,
			  dq_batch, dk, dv, dkv_row, dkv_batch);
}

/* The packed qkv (B,T,C+2*NKV*hs) of a causal layer as the kernels see
 * it: q at column 0, k at C, v at C + NKV*hs. */
static attn_t layer_desc(const struct mr_cuda *cu, const void *qkv, int B, int T, int C, int NH,
			 int NKV)
{
	size_t esz = cu->act == MR_CUDA_F32 ? sizeof(float) : sizeof(mr_bf16);
	attn_t a;

	memset(&a, 0, sizeof(a));
	a.B = B;
	a.NH = NH;
	a.NKV = NKV;
	a.hs = NH > 0 ? C / NH : 0;
	a.q = qkv;
	a.k = (const char *)qkv + (size_t)C * esz;
	a.v = (const char *)qkv + ((size_t)C + (size_t)NKV * a.hs) * esz;
	a.q_row = a.kv_row = (size_t)C + 2 * (size_t)NKV * a.hs;
	a.q_batch = a.kv_batch = (size_t)T * a.q_row;
	a.tq = a.tk = T;
	a.causal = 1;
	a.scale = a.hs > 0 ? 1.0f / sqrtf((float)a.hs) : 0.0f;
	return a;
}

/* The layer's own checks before the kernels' (kernel_desc): whole heads,
 * and NKV given (0 is not "NH" here: the caller knows its layout). */
static int layer_ok(int C, int NH, int NKV)
{
	return NH > 0 && C % NH == 0 && NKV > 0 && NKV <= NH && NH % NKV == 0;
}

/* Both layer entries check the shape as the kernels would (so a shape is
 * valid whichever path runs it), then try cuDNN (cudnn_attn.cu), then
 * run the kernels when it did not take the call. */
extern "C" int mr_cuda_attn_layer_fwd(struct mr_cuda *cu, void *out, float *lse, const void *qkv,
				      int B, int T, int C, int NH, int NKV)
{
	attn_t a = layer_desc(cu, qkv, B, T, C, NH, NKV), k;
	int rc;

	if (!layer_ok(C, NH, NKV))
		return mr__cuda_inval(cu, "attn_layer_fwd");
	if ((rc = kernel_desc(cu, &a, &k, "attn_layer_fwd")) ||
	    (rc = mr__dnn_layer_fwd(cu, out, lse, qkv, B, T, C, NH, NKV)) <= 0)
		return rc;
	return mr_cuda_attn_fwd(cu, &a, out, (size_t)C, (size_t)T * C, lse);
}

extern "C" int mr_cuda_attn_layer_bwd(struct mr_cuda *cu, void *dqkv, const void *dout,
				      const void *qkv, const void *out, const float *lse, int B,
				      int T, int C, int NH, int NKV)
{
	attn_t a = layer_desc(cu, qkv, B, T, C, NH, NKV), k;
	size_t esz = cu->act == MR_CUDA_F32 ? sizeof(float) : sizeof(mr_bf16);
	char *dq = (char *)dqkv;
	float *delta;
	int rc;

	if (!layer_ok(C, NH, NKV))
		return mr__cuda_inval(cu, "attn_layer_bwd");
	if ((rc = kernel_desc(cu, &a, &k, "attn_layer_bwd")) ||
	    (rc = mr__dnn_layer_bwd(cu, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV)) <= 0)
		return rc;
	if ((rc = mr__cuda_scratch(cu, (size_t)B * NH * T * sizeof(float), &delta)) ||
	    (rc = mr_cuda_memset0(cu, dqkv, (size_t)B * a.q_batch * esz)) ||
	    (rc = mr_cuda_attn_delta(cu, delta, dout, out, B, NH, T, a.hs, (size_t)C,
				     (size_t)T * C)))
		return rc;
	return mr_cuda_attn_bwd(cu, &a, dout, (size_t)C, (size_t)T * C, lse, delta, dq, a.q_row,
				a.q_batch, dq + (size_t)C * esz,
				dq + ((size_t)C + (size_t)NKV * a.hs) * esz, a.kv_row, a.kv_batch);
}
