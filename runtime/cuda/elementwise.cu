/*
 * elementwise.cu - GELU (tanh) forward/backward, residual add, in-place add
 * (see mr_cuda.h). bf16 storage, fp32 math, grid-stride loops.
 *
 * Non-goals: vectorised 128-bit loads (these kernels are memory-bound but
 * small next to the GEMMs; a packed variant can replace them later).
 */
#include "cuda_int.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

#define GRID_STRIDE(i, n)                                                     \
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t)gridDim.x * blockDim.x)

__global__ void gelu_fwd_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *inp, size_t n)
{
	GRID_STRIDE(i, n)
	{
		float x = __bfloat162float(inp[i]);
		float u = GELU_K * (x + 0.044715f * x * x * x);
		out[i] = __float2bfloat16_rn(0.5f * x * (1.0f + tanhf(u)));
	}
}

__global__ void gelu_bwd_kernel(__nv_bfloat16 *dinp, const __nv_bfloat16 *inp,
				const __nv_bfloat16 *dout, size_t n)
{
	GRID_STRIDE(i, n)
	{
		float x = __bfloat162float(inp[i]);
		float u = GELU_K * (x + 0.044715f * x * x * x);
		float th = tanhf(u);
		float sech2 = 1.0f - th * th;
		float g = 0.5f * (1.0f + th) +
			  0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
		dinp[i] = __float2bfloat16_rn(g * __bfloat162float(dout[i]));
	}
}

__global__ void add_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
			   size_t n)
{
	GRID_STRIDE(i, n)
	out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

#define LAUNCH(kernel, n, ...)                                                         \
	kernel<<<mr__cu_blocks((n), MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(  \
		__VA_ARGS__)

extern "C" int mr_cuda_gelu_fwd(struct mr_cuda *cu, mr_bf16 *out, const mr_bf16 *inp, size_t n)
{
	if (!n)
		return 0;
	LAUNCH(gelu_fwd_kernel, n, MR__BF(out), MR__CBF(inp), n);
	return mr__cuda_launched(cu, "gelu_fwd");
}

extern "C" int mr_cuda_gelu_bwd(struct mr_cuda *cu, mr_bf16 *dinp, const mr_bf16 *inp,
				const mr_bf16 *dout, size_t n)
{
	if (!n)
		return 0;
	LAUNCH(gelu_bwd_kernel, n, MR__BF(dinp), MR__CBF(inp), MR__CBF(dout), n);
	return mr__cuda_launched(cu, "gelu_bwd");
}

extern "C" int mr_cuda_residual_fwd(struct mr_cuda *cu, mr_bf16 *out, const mr_bf16 *a,
				    const mr_bf16 *b, size_t n)
{
	if (!n)
		return 0;
	LAUNCH(add_kernel, n, MR__BF(out), MR__CBF(a), MR__CBF(b), n);
	return mr__cuda_launched(cu, "residual_fwd");
}

extern "C" int mr_cuda_add_inplace(struct mr_cuda *cu, mr_bf16 *y, const mr_bf16 *x, size_t n)
{
	if (!n)
		return 0;
	LAUNCH(add_kernel, n, MR__BF(y), MR__CBF(y), MR__CBF(x), n);
	return mr__cuda_launched(cu, "add_inplace");
}
