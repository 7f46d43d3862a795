/*
 * moe.cu - the mixture-of-experts kernels (see mr_cuda.h; CPU twins in
 * kernels/moe.c, every routing rule in kernels/mr_moe.h): router softmax and
 * top-k, capacity slots, dispatch, combine, and their backward.
 *
 * Routing without atomics: one warp per token for the softmax, the top-k
 * choice and the gates; then one block per expert walks the N*k
 * assignments in token order with a block-wide prefix sum, so the slot of
 * every assignment (its rank among the expert's assignments, -1 past the
 * capacity) is exactly the CPU's first-come order, and sums its
 * probability column in double; one thread forms the aux loss from those
 * sums in expert order, in double, as the twin does. On the host path
 * (dropless routing) the per-expert counts, the aux loss and the dropped
 * count are read back once per forward (the expert GEMMs run over the
 * counts); on the sync-free path (capacity) nothing is: the aux loss and
 * the dropped count stay in the caller's device array.
 * Dispatch, combine and their backward write each output element from one
 * thread; the <dy, yo> dot products are warp sums.
 *
 * Non-goals: grouped expert GEMMs of device-side row counts, expert
 * choice routing.
 */
#include <string.h>

#include "cuda_int.cuh"
#include "kernels/mr_moe.h"

#define FULL 0xffffffffu
#define WARPS_PER_BLOCK (MR__CU_THREADS / 32)

/* Index of the largest p[e] (e != skip) over a warp, ties to the lower
 * index; every lane gets it. */
__device__ int warp_argmax(const float *p, int E, int skip)
{
	int lane = threadIdx.x & 31, bi = -1;

	for (int e = lane; e < E; e += 32)
		if (e != skip && (bi < 0 || p[e] > p[bi]))
			bi = e;
	for (int o = 16; o > 0; o >>= 1) {
		int oi = __shfl_xor_sync(FULL, bi, o);
		if (oi >= 0 && (bi < 0 || p[oi] > p[bi] || (p[oi] == p[bi] && oi < bi)))
			bi = oi;
	}
	return bi;
}

/* Warp per token: probs row (logits in) := softmax; topi, gate (norm:
 * renormalised over the k chosen). */
__global__ void route_topk_kernel(float *probs, int *topi, float *gate, int N, int E, int k,
				  int norm)
{
	int n = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	float *p, mx = -INFINITY, s = 0.0f;
	int t0, t1 = -1;

	if (n >= N)
		return; /* warp-uniform */
	p = probs + (size_t)n * E;
	for (int e = lane; e < E; e += 32)
		mx = fmaxf(mx, p[e]);
	mx = mr__warp_max(mx);
	for (int e = lane; e < E; e += 32) {
		float x = expf(p[e] - mx);
		p[e] = x;
		s += x;
	}
	s = mr__warp_sum(s);
	for (int e = lane; e < E; e += 32)
		p[e] /= s;
	__syncwarp();
	t0 = warp_argmax(p, E, -1);
	if (k == 2)
		t1 = warp_argmax(p, E, t0);
	if (lane == 0) {
		float gs = k == 1 ? p[t0] : p[t0] + p[t1];

		topi[(size_t)n * k] = t0;
		gate[(size_t)n * k] = norm ? p[t0] / gs : p[t0];
		if (k == 2) {
			topi[(size_t)n * k + 1] = t1;
			gate[(size_t)n * k + 1] = norm ? p[t1] / gs : p[t1];
		}
	}
}

/* Inclusive prefix sum of x over the block; *total gets the block's sum.
 * sh: 32 ints of shared memory. */
__device__ int block_scan(int x, int *sh, int *total)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, pre = 0, t = 0;

	for (int o = 1; o < 32; o <<= 1) {
		int y = __shfl_up_sync(FULL, x, o);
		if (lane >= o)
			x += y;
	}
	__syncthreads(); /* the previous call's readers are done with sh */
	if (lane == 31)
		sh[warp] = x;
	__syncthreads();
	for (int w = 0; w < nw; w++) {
		if (w < warp)
			pre += sh[w];
		t += sh[w];
	}
	*total = t;
	return x + pre;
}

__device__ double block_sum_double(double x, double *sh)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;

	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_xor_sync(FULL, x, o);
	if (lane == 0)
		sh[warp] = x;
	__syncthreads();
	x = 0.0;
	for (int w = 0; w < nw; w++)
		x += sh[w];
	return x;
}

/* Over a block: the sum over tokens of probs[n][e] (double), every
 * thread gets it. dsh: 32 doubles of shared memory. */
__device__ double prob_column_sum(const float *probs, int N, int E, int e, double *dsh)
{
	double ps = 0.0;

	for (int n = threadIdx.x; n < N; n += blockDim.x)
		ps += (double)probs[(size_t)n * E + e];
	return block_sum_double(ps, dsh);
}

/* Block per expert e: slots of its assignments in token order, routed,
 * count, and psum[e] = sum over tokens of probs[n][e] (double). */
__global__ void route_slots_kernel(int *slot, int *count, int *routed, double *psum,
				   const int *topi, const float *probs, int N, int E, int k,
				   int cap)
{
	__shared__ int ish[32];
	__shared__ double dsh[32];
	int e = blockIdx.x, A = N * k, base = 0, total;
	double ps;

	for (int a0 = 0; a0 < A; a0 += blockDim.x) {
		int a = a0 + threadIdx.x, f = a < A && topi[a] == e;
		int r = base + block_scan(f, ish, &total) - 1;

		if (f)
			slot[a] = r < cap ? r : -1;
		base += total;
	}
	ps = prob_column_sum(probs, N, E, e, dsh);
	if (threadIdx.x == 0) {
		routed[e] = base;
		count[e] = base < cap ? base : cap;
		psum[e] = ps;
	}
}

/* stat = [aux (float bits), dropped]: the twin's formula; counts (may be
 * NULL) a copy of count, for the host path's one read-back. */
__global__ void route_aux_kernel(int *stat, int *counts, const int *count, const int *routed,
				 const double *psum, int N, int E, int k)
{
	double aux = 0.0;
	int dropped = 0;

	for (int e = 0; e < E; e++) {
		aux += ((double)routed[e] / ((double)N * k)) * (psum[e] / N);
		dropped += routed[e] - count[e];
		if (counts)
			counts[e] = count[e];
	}
	stat[0] = __float_as_int((float)(aux * E));
	stat[1] = dropped;
}

/* Block per expert: psum[e] = sum over tokens of probs[n][e]. */
__global__ void prob_sums_kernel(double *psum, const float *probs, int N, int E)
{
	__shared__ double dsh[32];
	double ps = prob_column_sum(probs, N, E, blockIdx.x, dsh);

	if (threadIdx.x == 0)
		psum[blockIdx.x] = ps;
}

/* stat[0] = the aux loss's float bits from routed summed over `ranks`
 * ranks' N tokens each: mr_moe_aux's formula. */
__global__ void aux_of_sums_kernel(int *stat, const int *routed, const double *psum, int N,
				   int E, int k, int ranks)
{
	double aux = 0.0;

	for (int e = 0; e < E; e++)
		aux += ((double)routed[e] / ((double)N * ranks * k)) * (psum[e] / N);
	stat[0] = __float_as_int((float)(aux * E));
}

extern "C" int mr_cuda_moe_aux(struct mr_cuda *cu, const struct mr_moe_shape *s, int *stat,
			       const float *probs, const int *routed, int ranks)
{
	float *scr;
	double *psum;
	int rc;

	if (s->N <= 0 || s->E <= 0 || (s->k != 1 && s->k != 2) || ranks < 1 || !stat)
		return mr__cuda_inval(cu, "moe_aux");
	if ((rc = mr__cuda_scratch(cu, (size_t)s->E * sizeof(double), &scr)))
		return rc;
	psum = (double *)(void *)scr;
	prob_sums_kernel<<<(unsigned int)s->E, MR__CU_THREADS, 0, cu->stream>>>(psum, probs, s->N,
										 s->E);
	aux_of_sums_kernel<<<1, 1, 0, cu->stream>>>(stat, routed, psum, s->N, s->E, s->k, ranks);
	return mr__cuda_launched(cu, "moe_aux");
}

extern "C" int mr_cuda_moe_route(struct mr_cuda *cu, const struct mr_moe_shape *s, float *probs,
				 int *topi, float *gate, int *slot, int *count, int *routed,
				 int *stat, const void *x, const void *routerw, int *count_host,
				 float *aux_host, int *dropped_host)
{
	int N = s->N, E = s->E, k = s->k, rc;
	size_t pbytes = ((size_t)E * sizeof(double) + 255) & ~(size_t)255;
	float *scr;
	double *psum;
	int *summary;

	if (N <= 0 || E <= 0 || s->C <= 0 || (k != 1 && k != 2) || k > E || s->cap <= 0 ||
	    (!count_host && !stat))
		return mr__cuda_inval(cu, "moe_route");
	/* the host path's counts go to the host: not in a capture */
	if ((count_host && ((rc = mr__cuda_no_capture(cu, "moe_route")) ||
			    (rc = mr__cuda_grow_host(cu, &cu->moe_host, &cu->moe_host_n,
						     2 + (size_t)E)))) ||
	    (rc = mr__cuda_scratch(cu, pbytes + (2 + (size_t)E) * sizeof(int), &scr)) ||
	    (rc = mr__cuda_matmul_f32out(cu, probs, x, routerw, N, s->C, E)))
		return rc;
	psum = (double *)(void *)scr;
	summary = (int *)(void *)((char *)scr + pbytes);
	route_topk_kernel<<<(unsigned int)((N + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK),
			    MR__CU_THREADS, 0, cu->stream>>>(probs, topi, gate, N, E, k,
							     mr_moe_norm_topk(s));
	route_slots_kernel<<<(unsigned int)E, MR__CU_THREADS, 0, cu->stream>>>(
		slot, count, routed, psum, topi, probs, N, E, k, s->cap);
	/* the host path's summary = [stat (2), count (E)] in the scratch */
	route_aux_kernel<<<1, 1, 0, cu->stream>>>(count_host ? summary : stat,
						  count_host ? summary + 2 : NULL, count, routed,
						  psum, N, E, k);
	if ((rc = mr__cuda_launched(cu, "moe_route")) || !count_host ||
	    (rc = mr_cuda_download(cu, cu->moe_host, summary, (2 + (size_t)E) * sizeof(int))))
		return rc;
	memcpy(aux_host, &cu->moe_host[0], sizeof(float));
	*dropped_host = cu->moe_host[1];
	memcpy(count_host, cu->moe_host + 2, (size_t)E * sizeof(int));
	return 0;
}

/* xin row [topi*cap + slot] = x row of the assignment's token. */
template <typename T>
__global__ void moe_dispatch_kernel(T *xin, const T *x, const int *topi, const int *slot,
				    size_t n, int C, int k, int cap)
{
	MR__GRID_STRIDE(i, n)
	{
		size_t a = i / (size_t)C;
		int c = (int)(i % (size_t)C), sl = slot[a];

		if (sl >= 0)
			xin[((size_t)topi[a] * cap + sl) * C + c] = x[(a / k) * C + c];
	}
}

/* y (token, c) = sum over kept j of gate (or 1) * rows[topi*cap + slot]. */
template <typename T>
__global__ void moe_combine_kernel(T *y, const T *rows, const int *topi, const int *slot,
				   const float *gate, size_t n, int C, int k, int cap)
{
	MR__GRID_STRIDE(i, n)
	{
		size_t tok = i / (size_t)C;
		int c = (int)(i % (size_t)C);
		float s = 0.0f;

		for (int j = 0; j < k; j++) {
			size_t a = tok * k + j;
			int sl = slot[a];

			if (sl >= 0)
				s += (gate ? gate[a] : 1.0f) *
				     mr__ld(rows + ((size_t)topi[a] * cap + sl) * C + c);
		}
		mr__st(y + i, s);
	}
}

/* dyo row of a kept assignment = gate * dy row of its token. */
template <typename T>
__global__ void moe_dyo_kernel(T *dyo, const T *dy, const int *topi, const int *slot,
			       const float *gate, size_t n, int C, int k, int cap)
{
	MR__GRID_STRIDE(i, n)
	{
		size_t a = i / (size_t)C;
		int c = (int)(i % (size_t)C), sl = slot[a];

		if (sl >= 0)
			mr__st(dyo + ((size_t)topi[a] * cap + sl) * C + c,
			       gate[a] * mr__ld(dy + (a / k) * C + c));
	}
}

/* Warp per assignment: dgate = <dy row, yo row> (0 when dropped). */
template <typename T>
__global__ void moe_dgate_kernel(float *dgate, const T *dy, const T *yo, const int *topi,
				 const int *slot, int A, int C, int k, int cap)
{
	int a = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31, sl;
	const T *d, *o;
	float s = 0.0f;

	if (a >= A)
		return; /* warp-uniform */
	sl = slot[a];
	if (sl >= 0) {
		d = dy + (size_t)(a / k) * C;
		o = yo + ((size_t)topi[a] * cap + sl) * C;
		for (int c = lane; c < C; c += 32)
			s += mr__ld(d + c) * mr__ld(o + c);
		s = mr__warp_sum(s);
	}
	if (lane == 0)
		dgate[a] = s;
}

/* d(loss)/d(probs[n][e]) before the softmax: the gate term of the chosen
 * experts plus the aux term; the twin's order of additions. */
__device__ float dprob(int e, const int *ti, const float *dg, float gs, float gdot,
		       const int *routed, int N, int E, int k, int norm, float aux_scale)
{
	float d = 0.0f;

	for (int j = 0; j < k; j++)
		if (e == ti[j])
			d = norm ? (dg[j] - gdot) / gs : dg[j];
	return d + aux_scale * (float)E * ((float)routed[e] / ((float)N * k)) / (float)N;
}

/* Warp per token: dlogits = p * (dp - <p, dp>). */
template <typename T>
__global__ void moe_router_bwd_kernel(T *dl, const float *probs, const int *topi,
				      const float *gate, const float *dgate, const int *routed,
				      int N, int E, int k, int norm, float aux_scale)
{
	int n = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	const float *p, *dg, *g;
	const int *ti;
	float gs = 0.0f, gdot = 0.0f, dot = 0.0f;

	if (n >= N)
		return; /* warp-uniform */
	p = probs + (size_t)n * E;
	ti = topi + (size_t)n * k;
	dg = dgate + (size_t)n * k;
	g = gate + (size_t)n * k;
	for (int j = 0; norm && j < k; j++) {
		gs += p[ti[j]];
		gdot += dg[j] * g[j];
	}
	for (int e = lane; e < E; e += 32)
		dot += p[e] * dprob(e, ti, dg, gs, gdot, routed, N, E, k, norm, aux_scale);
	dot = mr__warp_sum(dot);
	for (int e = lane; e < E; e += 32)
		mr__st(dl + (size_t)n * E + e,
		       p[e] * (dprob(e, ti, dg, gs, gdot, routed, N, E, k, norm, aux_scale) - dot));
}

static int bad_shape(const struct mr_moe_shape *s)
{
	return s->N <= 0 || s->C <= 0 || s->E <= 0 || (s->k != 1 && s->k != 2) || s->cap <= 0;
}

template <typename T>
static int dispatch(struct mr_cuda *cu, const struct mr_moe_shape *s, void *xin, const void *x,
		    const int *topi, const int *slot)
{
	size_t n = (size_t)s->N * s->k * s->C;

	moe_dispatch_kernel<T><<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0,
				 cu->stream>>>((T *)xin, (const T *)x, topi, slot, n, s->C, s->k,
					       s->cap);
	return mr__cuda_launched(cu, "moe_dispatch");
}

template <typename T>
static int combine(struct mr_cuda *cu, const struct mr_moe_shape *s, void *y, const void *rows,
		   const int *topi, const int *slot, const float *gate)
{
	size_t n = (size_t)s->N * s->C;

	moe_combine_kernel<T><<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0,
				cu->stream>>>((T *)y, (const T *)rows, topi, slot, gate, n, s->C,
					      s->k, s->cap);
	return mr__cuda_launched(cu, "moe_combine");
}

template <typename T>
static int combine_bwd(struct mr_cuda *cu, const struct mr_moe_shape *s, void *dyo,
		       float *dgate, const void *dy, const void *yo, const int *topi,
		       const int *slot, const float *gate)
{
	int A = s->N * s->k;
	size_t n = (size_t)A * s->C;

	moe_dyo_kernel<T><<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(
		(T *)dyo, (const T *)dy, topi, slot, gate, n, s->C, s->k, s->cap);
	moe_dgate_kernel<T><<<(unsigned int)((A + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK),
			      MR__CU_THREADS, 0, cu->stream>>>(dgate, (const T *)dy,
							       (const T *)yo, topi, slot, A, s->C,
							       s->k, s->cap);
	return mr__cuda_launched(cu, "moe_combine_bwd");
}

template <typename T>
static int router_bwd(struct mr_cuda *cu, const struct mr_moe_shape *s, void *dlogits,
		      const float *probs, const int *topi, const float *gate, const float *dgate,
		      const int *routed, float aux_scale)
{
	moe_router_bwd_kernel<T><<<(unsigned int)((s->N + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK),
				   MR__CU_THREADS, 0, cu->stream>>>((T *)dlogits, probs, topi,
								    gate, dgate, routed, s->N,
								    s->E, s->k, mr_moe_norm_topk(s),
								    aux_scale);
	return mr__cuda_launched(cu, "moe_router_bwd");
}

extern "C" int mr_cuda_moe_dispatch(struct mr_cuda *cu, const struct mr_moe_shape *s, void *xin,
				    const void *x, const int *topi, const int *slot)
{
	if (bad_shape(s))
		return mr__cuda_inval(cu, "moe_dispatch");
	return MR__BY_ACT(cu, dispatch, cu, s, xin, x, topi, slot);
}

extern "C" int mr_cuda_moe_combine(struct mr_cuda *cu, const struct mr_moe_shape *s, void *y,
				   const void *rows, const int *topi, const int *slot,
				   const float *gate)
{
	if (bad_shape(s))
		return mr__cuda_inval(cu, "moe_combine");
	return MR__BY_ACT(cu, combine, cu, s, y, rows, topi, slot, gate);
}

extern "C" int mr_cuda_moe_combine_bwd(struct mr_cuda *cu, const struct mr_moe_shape *s,
				       void *dyo, float *dgate, const void *dy, const void *yo,
				       const int *topi, const int *slot, const float *gate)
{
	if (bad_shape(s))
		return mr__cuda_inval(cu, "moe_combine_bwd");
	return MR__BY_ACT(cu, combine_bwd, cu, s, dyo, dgate, dy, yo, topi, slot, gate);
}

extern "C" int mr_cuda_moe_router_bwd(struct mr_cuda *cu, const struct mr_moe_shape *s,
				      void *dlogits, const float *probs, const int *topi,
				      const float *gate, const float *dgate, const int *routed,
				      float aux_scale)
{
	if (bad_shape(s))
		return mr__cuda_inval(cu, "moe_router_bwd");
	return MR__BY_ACT(cu, router_bwd, cu, s, dlogits, probs, topi, gate, dgate, routed,
			  aux_scale);
}
