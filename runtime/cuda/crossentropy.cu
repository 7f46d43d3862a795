/*
 * crossentropy.cu - softmax fused with cross-entropy (see mr_cuda.h).
 *
 * Forward: one block per row; max and sum of exp are block reductions in
 * fp32 (fixed order), lse = max + log(sum), loss = lse - logit[target].
 * Backward: in place, dlogit = exp(logit - lse) * dscale, minus dscale at
 * the target; the saved lse means probabilities are never stored.
 *
 * Non-goals: label smoothing, ignore_index, vocab padding.
 */
#include "cuda_int.cuh"

#define CE_THREADS 512

__global__ void ce_fwd_kernel(float *losses, float *lse, const __nv_bfloat16 *logits,
			      const int *targets, int V)
{
	__shared__ float sh[32];
	const __nv_bfloat16 *row = logits + (size_t)blockIdx.x * V;
	float mx = -INFINITY, s = 0.0f, l;
	int tgt = targets[blockIdx.x];

	for (int v = threadIdx.x; v < V; v += blockDim.x)
		mx = fmaxf(mx, __bfloat162float(row[v]));
	mx = mr__block_max(mx, sh);
	for (int v = threadIdx.x; v < V; v += blockDim.x)
		s += expf(__bfloat162float(row[v]) - mx);
	s = mr__block_sum(s, sh);
	if (threadIdx.x == 0) {
		l = mx + logf(s);
		lse[blockIdx.x] = l;
		losses[blockIdx.x] = tgt >= 0 && tgt < V ? l - __bfloat162float(row[tgt]) : NAN;
	}
}

__global__ void ce_bwd_kernel(__nv_bfloat16 *logits, const float *lse, const int *targets,
			      int V, float dscale)
{
	__nv_bfloat16 *row = logits + (size_t)blockIdx.x * V;
	float l = lse[blockIdx.x];
	int tgt = targets[blockIdx.x];

	for (int v = threadIdx.x; v < V; v += blockDim.x) {
		float g = expf(__bfloat162float(row[v]) - l) * dscale;
		if (v == tgt)
			g -= dscale;
		row[v] = __float2bfloat16_rn(g);
	}
}

extern "C" int mr_cuda_crossentropy_fwd(struct mr_cuda *cu, float *losses, float *lse,
					const mr_bf16 *logits, const int *targets, int N, int V)
{
	if (N <= 0 || V <= 0)
		return mr__cuda_inval(cu, "crossentropy_fwd");
	ce_fwd_kernel<<<(unsigned int)N, CE_THREADS, 0, cu->stream>>>(losses, lse,
								     MR__CBF(logits), targets, V);
	return mr__cuda_launched(cu, "crossentropy_fwd");
}

extern "C" int mr_cuda_crossentropy_bwd_inplace(struct mr_cuda *cu, mr_bf16 *logits,
						const float *lse, const int *targets, int N, int V,
						float dscale)
{
	if (N <= 0 || V <= 0)
		return mr__cuda_inval(cu, "crossentropy_bwd");
	ce_bwd_kernel<<<(unsigned int)N, CE_THREADS, 0, cu->stream>>>(MR__BF(logits), lse,
								     targets, V, dscale);
	return mr__cuda_launched(cu, "crossentropy_bwd");
}
