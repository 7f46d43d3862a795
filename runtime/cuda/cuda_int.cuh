/*
 * cuda_int.cuh - internals shared by the runtime/cuda .cu files: the
 * context struct, error plumbing, the dispatch on the activation type,
 * bf16/fp32 load/store and warp/block reductions.
 *
 * Non-goals: anything callable from C (that is mr_cuda.h).
 */
#ifndef MR_CUDA_INT_CUH
#define MR_CUDA_INT_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/mr_cuda.h"

struct mr_cuda {
	int device;
	enum mr_cuda_dtype act;  /* storage type of activation arguments */
	cudaStream_t stream;
	cublasHandle_t blas;
	cublasLtHandle_t lt;
	int use_lt;
	struct mr__lt_plan *plans; /* MR__LT_PLANS of them (gemm.cu); NULL: none kept */
	int nplans;
	long lt_fallbacks;       /* GEMMs cuBLASLt did not run although in use */
	char lt_why[256];        /* the first one's reason */
	void *gemm_ws;           /* cuBLASLt workspace */
	size_t gemm_ws_bytes;
	float *scratch;          /* partial sums; grown stream-ordered */
	size_t scratch_bytes;
	int *bucket_dev;         /* encoder backward token buckets */
	size_t bucket_dev_n;
	int *bucket_host;
	size_t bucket_host_n;
	struct mr__bucket_job *bucket_job; /* a captured encoder backward's host node */
	int *count_host;         /* (V+1) counting-sort histogram */
	size_t count_host_n;
	double *sum_host;        /* pinned result of the grad norm */
	int *moe_host;           /* MoE routing summary read back (2 + E ints) */
	size_t moe_host_n;
	void *adamw_tab;         /* mr_cuda_adamw_multi's range table on the device, */
	void *adamw_tab_host;    /* the host copy it was uploaded from, */
	size_t adamw_tab_bytes;  /* its size, */
	size_t adamw_tab_cap;    /* and the room of both */
	void *adamw_args;        /* mr_cuda_adamw_args's device block (adamw.cu) */
	float adamw_args_host[8]; /* the host copy it is staged from */
	int capturing;           /* inside mr_cuda_graph_capture's fn */
	cudaEvent_t *marks;      /* timing marks (mr_cuda_marks), nmarks of them */
	int nmarks, marks_used;
	struct mr__dnn *dnn;     /* cuDNN attention (cudnn_attn.cu); NULL until first used */
	int use_dnn;             /* 0: MESHRUN_CUDNN=0 or mr_cuda_disable_cudnn */
	long attn_fast;          /* layer attention calls cuDNN ran */
	long attn_fallbacks;     /* ... the own kernels ran although use_dnn */
	char attn_why[224];      /* the first fallback's reason */
	char err[256];
};

/* cuBLASLt plans a context keeps (one per GEMM shape: a model has ~10). */
#define MR__LT_PLANS 64
struct mr__lt_plan;
size_t mr__cuda_lt_plan_size(void);
/* Releases the context's plans (before cublasLtDestroy). */
void mr__cuda_lt_plans_free(struct mr_cuda *cu);

/* The whole-layer attention through cuDNN (cudnn_attn.cu), arguments as
 * mr_cuda_attn_layer_fwd/_bwd's (already checked): 0 when cuDNN ran it,
 * 1 when it did not take the call (the caller runs its own kernels; the
 * call is counted in mr_cuda_attn_fallbacks when use_dnn, and the reason
 * logged once per shape). */
int mr__dnn_layer_fwd(struct mr_cuda *cu, void *out, float *lse, const void *qkv, int B, int T,
		      int C, int NH, int NKV);
int mr__dnn_layer_bwd(struct mr_cuda *cu, void *dqkv, const void *dout, const void *qkv,
		      const void *out, const float *lse, int B, int T, int C, int NH, int NKV);
/* Releases the context's cuDNN handle, plans and workspace (the stream
 * synced first). */
void mr__dnn_free(struct mr_cuda *cu);

/* While capturing a graph: records "'what' needs the host" and returns
 * MR_ENEEDHOST, before the call touches the stream; 0 otherwise. */
int mr__cuda_no_capture(struct mr_cuda *cu, const char *what);
/* The encoder backward's host node state (encoder.cu): released; after a
 * sync, MR_ENOMEM (message in cu) when a node ran out of host memory. */
void mr__cuda_bucket_free(struct mr_cuda *cu);
int mr__cuda_bucket_failed(struct mr_cuda *cu);

/* Records "what: cuda message" and returns MR_ESYS; 0 for cudaSuccess. */
int mr__cuda_check(struct mr_cuda *cu, cudaError_t e, const char *what);
/* After a launch: checks cudaGetLastError. */
int mr__cuda_launched(struct mr_cuda *cu, const char *what);
/* Records a shape error and returns MR_EINVAL. */
int mr__cuda_inval(struct mr_cuda *cu, const char *what);
/* Scratch of at least bytes, valid for work queued on cu->stream. */
int mr__cuda_scratch(struct mr_cuda *cu, size_t bytes, float **out);
/* out (N,OC) fp32 (=) = inp (N,IC) @ w^T, inp and w of the activation
 * type (the MoE router: fp32 logits from activations). */
int mr__cuda_matmul_f32out(struct mr_cuda *cu, float *out, const void *inp, const void *w,
			   int N, int IC, int OC);
/* Grows a host int array to n entries; MR_ENOMEM (message in cu). */
int mr__cuda_grow_host(struct mr_cuda *cu, int **p, size_t *cap, size_t n);

/*
 * Runs fn<T>(args) with T the context's activation storage type (float or
 * __nv_bfloat16): every kernel over activations is written once, as a
 * template, and instantiated for both.
 */
#define MR__BY_ACT(cu, fn, ...)                                               \
	((cu)->act == MR_CUDA_F32 ? fn<float>(__VA_ARGS__)                   \
				  : fn<__nv_bfloat16>(__VA_ARGS__))

/* cuBLAS type of the activation type. */
static inline cudaDataType_t mr__cu_act_type(const struct mr_cuda *cu)
{
	return cu->act == MR_CUDA_F32 ? CUDA_R_32F : CUDA_R_16BF;
}

#define MR__CU_THREADS 256
/* LayerNorm epsilon; the same value as MR_LN_EPS of the CPU kernels. */
#define MR_LN_EPS_CU 1e-5f

static inline unsigned int mr__cu_blocks(size_t n, unsigned int per)
{
	size_t b = (n + per - 1) / per;

	return (unsigned int)(b > 65535u * 32u ? 65535u * 32u : (b ? b : 1));
}

__device__ __forceinline__ float mr__ld(const __nv_bfloat16 *p)
{
	return __bfloat162float(*p);
}

__device__ __forceinline__ float mr__ld(const float *p)
{
	return *p;
}

__device__ __forceinline__ void mr__st(__nv_bfloat16 *p, float x)
{
	*p = __float2bfloat16_rn(x);
}

__device__ __forceinline__ void mr__st(float *p, float x)
{
	*p = x;
}

__device__ __forceinline__ float mr__warp_sum(float x)
{
	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_xor_sync(0xffffffffu, x, o);
	return x;
}

__device__ __forceinline__ float mr__warp_max(float x)
{
	for (int o = 16; o > 0; o >>= 1)
		x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
	return x;
}

/* Block-wide sum (blockDim.x a multiple of 32, <= 1024); every thread gets
 * the result. sh: 32 floats of shared memory. Fixed order: deterministic. */
__device__ __forceinline__ float mr__block_sum(float x, float *sh)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int nw = blockDim.x >> 5;

	x = mr__warp_sum(x);
	__syncthreads();
	if (lane == 0)
		sh[warp] = x;
	__syncthreads();
	x = lane < nw ? sh[lane] : 0.0f;
	return mr__warp_sum(x);
}

__device__ __forceinline__ float mr__block_max(float x, float *sh)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int nw = blockDim.x >> 5;

	x = mr__warp_max(x);
	__syncthreads();
	if (lane == 0)
		sh[warp] = x;
	__syncthreads();
	x = lane < nw ? sh[lane] : -INFINITY;
	return mr__warp_max(x);
}

/* 16 bytes of the storage type (8 bf16 or 4 floats), moved with one
 * 128-bit load or store: the element-wise kernels' unit where every
 * pointer they touch is 16-byte aligned. */
template <typename T>
struct alignas(16) mr__x128 {
	T v[16 / sizeof(T)];
};

template <typename T>
__device__ __forceinline__ mr__x128<T> mr__ld128(const T *p)
{
	mr__x128<T> r;

	*reinterpret_cast<int4 *>(r.v) = *reinterpret_cast<const int4 *>(p);
	return r;
}

template <typename T>
__device__ __forceinline__ void mr__st128(T *p, const mr__x128<T> &x)
{
	*reinterpret_cast<int4 *>(p) = *reinterpret_cast<const int4 *>(x.v);
}

/* Whether every pointer given is 16-byte aligned (NULL counts as aligned). */
static inline int mr__aligned16(const void *a, const void *b, const void *c)
{
	return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15u) == 0;
}

/* The pack width of rows of C elements whose buffers are all 16-byte
 * aligned: 16 bytes of T when C fills whole packs (so every row starts
 * aligned too), else 1. */
template <typename T>
static inline int mr__pack_width(size_t C, const void *a, const void *b, const void *c,
				 const void *d)
{
	const size_t P = 16 / sizeof(T);

	return C % P == 0 && mr__aligned16(a, b, c) && mr__aligned16(d, NULL, NULL) ? (int)P : 1;
}

/* P consecutive elements from p into f: one 16-byte load when P packs
 * them (the packed path), one element when P is 1. */
template <int P, typename T>
__device__ __forceinline__ void mr__ld_n(float *f, const T *p)
{
	if constexpr (P == 1) {
		f[0] = mr__ld(p);
	} else {
		mr__x128<T> x = mr__ld128(p);
#pragma unroll
		for (int j = 0; j < P; j++)
			f[j] = mr__ld(&x.v[j]);
	}
}

template <int P, typename T>
__device__ __forceinline__ void mr__st_n(T *p, const float *f)
{
	if constexpr (P == 1) {
		mr__st(p, f[0]);
	} else {
		mr__x128<T> x;
#pragma unroll
		for (int j = 0; j < P; j++)
			mr__st(&x.v[j], f[j]);
		mr__st128(p, x);
	}
}

/* Launches kernel<P, T> on cu's stream (cu in scope) with P the pack
 * width when packed is true, else kernel<1, T>: the one place a kernel's
 * two widths are chosen. */
#define MR__LAUNCH_PACKED(packed, kernel, T, grid, ...)                                  \
	do {                                                                             \
		if (packed)                                                              \
			kernel<16 / sizeof(T), T><<<(grid), MR__CU_THREADS, 0, cu->stream>>>(    \
				__VA_ARGS__);                                            \
		else                                                                     \
			kernel<1, T><<<(grid), MR__CU_THREADS, 0, cu->stream>>>(__VA_ARGS__);    \
	} while (0)

#define MR__BF(p) (reinterpret_cast<__nv_bfloat16 *>(p))
#define MR__CBF(p) (reinterpret_cast<const __nv_bfloat16 *>(p))

/* A grid-stride loop over [0, n). */
#define MR__GRID_STRIDE(i, n)                                                  \
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
	     i += (size_t)gridDim.x * blockDim.x)

#endif
