/*
 * adamw.cu - AdamW update on fp32 master weights (writing the compute copy
 * the kernels read, in the activation type), global gradient sum of
 * squares, gradient scaling (see mr_cuda.h; CPU twin in optim/mr_adamw.h).
 *
 * The update is the CPU twin's formula line for line; the bias-correction
 * terms are computed on the host in double exactly as the twin does. The
 * sum of squares is two passes with a FIXED grid (512 blocks, so the
 * partition does not depend on the device), fp32 within a block, the 512
 * partials added by one thread in double: deterministic. The sums of
 * squares of k ranges are one launch of k x 512 blocks (the same partition
 * per range, so the same bits as a launch per range).
 *
 * The multi-range update (mr_cuda_adamw_multi) is one launch over a table
 * of the ranges cut into chunks of ADAMW_CHUNK elements, a block per
 * chunk (the multi-tensor apply of PyTorch's fused optimizers and of
 * apex): a step updates every tensor in one launch instead of one per
 * tensor. Every element runs the same inline function as the one-range
 * kernel. The table holds no per-step value, so it is uploaded once and
 * again only when the ranges change; the per-step scalars (step size,
 * bias correction, decay and clip factors: struct adamw_args_dev) are a
 * small device block mr_cuda_adamw_args uploads before each step, which
 * the kernel reads - never kernel arguments, which a captured graph would
 * replay with the values of the step it was captured in.
 *
 * Non-goals: ZeRO sharding (a shard is just a sub-range passed to these
 * calls), stochastic rounding of the bf16 copy.
 */
#include <math.h>

#include "cuda_int.cuh"

#define NORM_BLOCKS 512

#define ADAMW_CHUNK 65536 /* elements of one block of the multi-range update */

/* Element i of a range: the twin's formula line for line. */
template <typename T>
__device__ __forceinline__ void adamw_one(float *p, T *pc, const float *g, float *m, float *v,
					  size_t i, float step_size, float bc2_sqrt, float decay,
					  float b1, float b2, float eps, float gscale)
{
	float gi = g[i] * gscale, pi = p[i] * decay, mi, vi, denom;

	mi = m[i] * b1 + gi * (1.0f - b1);
	vi = v[i] * b2 + gi * gi * (1.0f - b2);
	denom = sqrtf(vi) / bc2_sqrt + eps;
	pi -= step_size * (mi / denom);
	m[i] = mi;
	v[i] = vi;
	p[i] = pi;
	if (pc)
		mr__st(pc + i, pi);
}

template <typename T>
__global__ void adamw_kernel(float *p, T *pc, const float *g, float *m, float *v, size_t n,
			     float step_size, float bc2_sqrt, float decay, float b1, float b2,
			     float eps, float gscale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		adamw_one<T>(p, pc, g, m, v, i, step_size, bc2_sqrt, decay, b1, b2, eps, gscale);
}

/* The multi-range table on the device: the ranges, then the chunks. */
struct adamw_range_dev {
	float *p;
	void *pc;
	const float *g;
	float *m, *v;
	int decay;
};

struct adamw_chunk {
	size_t start, len;
	int range;
};

/* The per-step scalars on the device (mr_cuda_adamw_args). */
struct adamw_args_dev {
	float step_size, bc2_sqrt, decay_on, decay_off, b1, b2, eps, gscale;
};
static_assert(sizeof(struct adamw_args_dev) == sizeof(((struct mr_cuda *)0)->adamw_args_host),
	      "the context's host copy of the AdamW block");

template <typename T>
__global__ void adamw_multi_kernel(const struct adamw_range_dev *R, const struct adamw_chunk *ch,
				   const struct adamw_args_dev *args)
{
	const struct adamw_chunk c = ch[blockIdx.x];
	const struct adamw_range_dev r = R[c.range];
	const struct adamw_args_dev a = *args;
	float decay = r.decay ? a.decay_on : a.decay_off;

	for (size_t i = c.start + threadIdx.x; i < c.start + c.len; i += blockDim.x)
		adamw_one<T>(r.p, (T *)r.pc, r.g, r.m, r.v, i, a.step_size, a.bc2_sqrt, decay, a.b1,
			     a.b2, a.eps, a.gscale);
}

template <typename T>
static int adamw(struct mr_cuda *cu, float *p, void *pc, const float *g, float *m, float *v,
		 size_t n, const struct mr_cuda_adamw *o)
{
	double bc1 = 1.0 - pow((double)o->beta1, (double)o->t);
	double bc2 = 1.0 - pow((double)o->beta2, (double)o->t);

	adamw_kernel<T><<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(
		p, (T *)pc, g, m, v, n, (float)((double)o->lr / bc1), (float)sqrt(bc2),
		1.0f - o->lr * o->weight_decay, o->beta1, o->beta2, o->eps, o->grad_scale);
	return mr__cuda_launched(cu, "adamw_step");
}

extern "C" int mr_cuda_adamw_step(struct mr_cuda *cu, float *p, void *pc, const float *g,
				  float *m, float *v, size_t n, const struct mr_cuda_adamw *o)
{
	if (o->t < 1)
		return mr__cuda_inval(cu, "adamw_step");
	return n ? MR__BY_ACT(cu, adamw, cu, p, pc, g, m, v, n, o) : 0;
}

/* The table of r in the context's host copy (grown); its chunk count in
 * *nchunks. */
static int adamw_table(struct mr_cuda *cu, const struct mr_cuda_adamw_range *r, int k,
		       size_t *bytes, int *nchunks)
{
	size_t nc = 0, need, at;
	struct adamw_range_dev *R;
	struct adamw_chunk *ch;
	int i;

	for (i = 0; i < k; i++)
		nc += (r[i].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
	if (nc > 0x7fffffff)
		return mr__cuda_inval(cu, "adamw_multi");
	/* the chunks after the ranges, aligned for their size_t */
	at = ((size_t)k * sizeof(*R) + 15) & ~(size_t)15;
	need = at + nc * sizeof(*ch);
	if (need > cu->adamw_tab_cap) {
		void *h;
		if (mr__cuda_no_capture(cu, "adamw_multi table growth"))
			return MR_ENEEDHOST;
		if (!(h = realloc(cu->adamw_tab_host, need))) {
			snprintf(cu->err, sizeof(cu->err), "out of host memory (adamw table)");
			return MR_ENOMEM;
		}
		cu->adamw_tab_host = h;
		cudaFree(cu->adamw_tab); /* waits for the kernels that read it */
		cu->adamw_tab = NULL;
		cu->adamw_tab_bytes = cu->adamw_tab_cap = 0;
		if (mr__cuda_check(cu, cudaMalloc(&cu->adamw_tab, need), "adamw table") < 0)
			return MR_ESYS;
		cu->adamw_tab_cap = need;
	}
	R = (struct adamw_range_dev *)cu->adamw_tab_host;
	ch = (struct adamw_chunk *)(void *)((char *)cu->adamw_tab_host + at);
	memset(cu->adamw_tab_host, 0, need); /* no stray padding: the table is compared */
	for (nc = 0, i = 0; i < k; i++) {
		R[i].p = r[i].p;
		R[i].pc = r[i].pc;
		R[i].g = r[i].g;
		R[i].m = r[i].m;
		R[i].v = r[i].v;
		R[i].decay = r[i].decay;
		for (size_t s = 0; s < r[i].n; s += ADAMW_CHUNK, nc++) {
			ch[nc].start = s;
			ch[nc].len = r[i].n - s < ADAMW_CHUNK ? r[i].n - s : ADAMW_CHUNK;
			ch[nc].range = i;
		}
	}
	*bytes = need;
	*nchunks = (int)nc;
	return 0;
}

template <typename T>
static int adamw_multi(struct mr_cuda *cu, int nchunks, size_t tab_at)
{
	const char *tab = (const char *)cu->adamw_tab;

	adamw_multi_kernel<T><<<(unsigned int)nchunks, MR__CU_THREADS, 0, cu->stream>>>(
		(const struct adamw_range_dev *)tab, (const struct adamw_chunk *)(tab + tab_at),
		(const struct adamw_args_dev *)cu->adamw_args);
	return mr__cuda_launched(cu, "adamw_multi");
}

extern "C" int mr_cuda_adamw_args(struct mr_cuda *cu, const struct mr_cuda_adamw *o)
{
	double bc1, bc2;
	struct adamw_args_dev a;
	int rc;

	if (o->t < 1)
		return mr__cuda_inval(cu, "adamw_args");
	if ((rc = mr__cuda_no_capture(cu, "adamw_args")))
		return rc;
	if (!cu->adamw_args &&
	    (rc = mr__cuda_check(cu, cudaMalloc(&cu->adamw_args, sizeof(a)), "adamw args")))
		return rc;
	/* the one-range kernel's values, computed the same way */
	bc1 = 1.0 - pow((double)o->beta1, (double)o->t);
	bc2 = 1.0 - pow((double)o->beta2, (double)o->t);
	a.step_size = (float)((double)o->lr / bc1);
	a.bc2_sqrt = (float)sqrt(bc2);
	a.decay_on = 1.0f - o->lr * o->weight_decay;
	a.decay_off = 1.0f - o->lr * 0.0f;
	a.b1 = o->beta1;
	a.b2 = o->beta2;
	a.eps = o->eps;
	a.gscale = o->grad_scale;
	/* pageable source: staged by the driver before the call returns (and
	 * kept in the context until the next call all the same) */
	memcpy(cu->adamw_args_host, &a, sizeof(a));
	return mr__cuda_check(cu, cudaMemcpyAsync(cu->adamw_args, cu->adamw_args_host, sizeof(a),
						  cudaMemcpyHostToDevice, cu->stream),
			      "adamw args");
}

extern "C" int mr_cuda_adamw_multi(struct mr_cuda *cu, const struct mr_cuda_adamw_range *r,
				   int k)
{
	void *old = NULL;
	size_t bytes = 0, oldbytes = cu->adamw_tab_bytes;
	int nchunks = 0, rc;

	if (k < 0)
		return mr__cuda_inval(cu, "adamw_multi");
	if (k == 0)
		return 0;
	if (!cu->adamw_args) {
		snprintf(cu->err, sizeof(cu->err), "adamw_multi before adamw_args");
		return MR_ESTATE;
	}
	/* what was uploaded last, to compare with the table built anew */
	if (oldbytes && !(old = malloc(oldbytes))) {
		snprintf(cu->err, sizeof(cu->err), "out of host memory (adamw table)");
		return MR_ENOMEM;
	}
	if (old)
		memcpy(old, cu->adamw_tab_host, oldbytes);
	rc = adamw_table(cu, r, k, &bytes, &nchunks);
	if (rc == 0 && (bytes != oldbytes || memcmp(old, cu->adamw_tab_host, bytes))) {
		/* a capture refuses: the graph would replay this upload's staging */
		if ((rc = mr__cuda_no_capture(cu, "adamw_multi table change")) == 0)
			/* pageable source: staged by the driver before the call returns */
			rc = mr__cuda_check(cu, cudaMemcpyAsync(cu->adamw_tab, cu->adamw_tab_host,
								bytes, cudaMemcpyHostToDevice,
								cu->stream),
					    "adamw table");
		cu->adamw_tab_bytes = rc == 0 ? bytes : 0;
	}
	free(old);
	if (rc || nchunks == 0)
		return rc;
	return MR__BY_ACT(cu, adamw_multi, cu, nchunks,
			  ((size_t)k * sizeof(struct adamw_range_dev) + 15) & ~(size_t)15);
}

/* This block's share of sum g^2 over a grid of gridDim.x blocks, into
 * *part (thread 0). */
__device__ __forceinline__ void sumsq_block(float *part, const float *g, size_t n, float *sh)
{
	float s = 0.0f;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		s += g[i] * g[i];
	s = mr__block_sum(s, sh);
	if (threadIdx.x == 0)
		*part = s;
}

__global__ void sumsq_partial_kernel(float *part, const float *g, size_t n)
{
	__shared__ float sh[32];

	sumsq_block(part + blockIdx.x, g, n, sh);
}

/* Range blockIdx.y of g (offsets and lengths on the device). */
__global__ void sumsq_ranges_partial_kernel(float *part, const float *g, const size_t *off,
					    const size_t *n)
{
	__shared__ float sh[32];
	size_t r = blockIdx.y;

	sumsq_block(part + r * gridDim.x + blockIdx.x, g + off[r], n[r], sh);
}

__global__ void sumsq_final_kernel(double *out, const float *part, int np)
{
	double s = 0.0;

	for (int i = 0; i < np; i++)
		s += (double)part[i];
	*out = s;
}

extern "C" int mr_cuda_grad_sumsq(struct mr_cuda *cu, const float *g, size_t n,
				  double *sumsq_host)
{
	float *part;
	int rc;

	*sumsq_host = 0.0;
	if ((rc = mr__cuda_no_capture(cu, "grad_sumsq")) || !n)
		return rc;
	/* NORM_BLOCKS partials, then one double (8-byte aligned after them) */
	rc = mr__cuda_scratch(cu, NORM_BLOCKS * sizeof(float) + 2 * sizeof(double), &part);
	if (rc)
		return rc;
	sumsq_partial_kernel<<<NORM_BLOCKS, MR__CU_THREADS, 0, cu->stream>>>(part, g, n);
	sumsq_final_kernel<<<1, 1, 0, cu->stream>>>((double *)(part + NORM_BLOCKS), part,
						     NORM_BLOCKS);
	rc = mr__cuda_launched(cu, "grad_sumsq");
	if (rc)
		return rc;
	rc = mr__cuda_check(cu, cudaMemcpyAsync(cu->sum_host, part + NORM_BLOCKS, sizeof(double),
						cudaMemcpyDeviceToHost, cu->stream),
			    "grad_sumsq copy");
	if (rc || (rc = mr_cuda_sync(cu)))
		return rc;
	*sumsq_host = *cu->sum_host;
	return 0;
}

/* out[i] = sum of range i's NORM_BLOCKS partials, in double. */
__global__ void sumsq_ranges_final_kernel(double *out, const float *part, int k)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	double s = 0.0;

	if (i >= k)
		return;
	for (int j = 0; j < NORM_BLOCKS; j++)
		s += (double)part[(size_t)i * NORM_BLOCKS + j];
	out[i] = s;
}

extern "C" int mr_cuda_grad_sumsq_ranges(struct mr_cuda *cu, const float *g, const size_t *off,
					 const size_t *n, int k, double *out_host)
{
	size_t pbytes = (size_t)k * NORM_BLOCKS * sizeof(float), kb = (size_t)k * sizeof(size_t);
	float *part;
	double *out;
	size_t *doff, *dn;
	int rc;

	if (k < 0 || k > 65535) /* a grid's y extent */
		return mr__cuda_inval(cu, "grad_sumsq_ranges");
	if ((rc = mr__cuda_no_capture(cu, "grad_sumsq_ranges")))
		return rc;
	if (k == 0)
		return 0;
	pbytes = (pbytes + 7) & ~(size_t)7; /* the doubles after the partials */
	rc = mr__cuda_scratch(cu, pbytes + (size_t)k * sizeof(double) + 2 * kb, &part);
	if (rc)
		return rc;
	out = (double *)(void *)((char *)part + pbytes);
	doff = (size_t *)(void *)(out + k);
	dn = doff + k;
	/* pageable sources: staged by the driver before the calls return */
	if ((rc = mr__cuda_check(cu, cudaMemcpyAsync(doff, off, kb, cudaMemcpyHostToDevice,
						     cu->stream),
				 "grad_sumsq_ranges offsets")) ||
	    (rc = mr__cuda_check(cu, cudaMemcpyAsync(dn, n, kb, cudaMemcpyHostToDevice, cu->stream),
				 "grad_sumsq_ranges lengths")))
		return rc;
	/* one launch; an empty range's blocks run too: their partials are 0 */
	sumsq_ranges_partial_kernel<<<dim3(NORM_BLOCKS, (unsigned int)k), MR__CU_THREADS, 0,
				      cu->stream>>>(part, g, doff, dn);
	sumsq_ranges_final_kernel<<<(unsigned int)((k + MR__CU_THREADS - 1) / MR__CU_THREADS),
				    MR__CU_THREADS, 0, cu->stream>>>(out, part, k);
	rc = mr__cuda_launched(cu, "grad_sumsq_ranges");
	if (rc)
		return rc;
	return mr_cuda_download(cu, out_host, out, (size_t)k * sizeof(double));
}

__global__ void scale_kernel(float *g, size_t n, float f)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		g[i] *= f;
}

extern "C" int mr_cuda_scale(struct mr_cuda *cu, float *g, size_t n, float scale)
{
	if (!n)
		return 0;
	scale_kernel<<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(g, n,
											    scale);
	return mr__cuda_launched(cu, "scale");
}
