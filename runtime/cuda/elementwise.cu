/*
 * elementwise.cu - GELU (tanh) forward/backward, residual and in-place
 * adds, bias and position rows, column fill, fp32 add (see mr_cuda.h).
 * Storage of the activation type, fp32 math, grid-stride loops; each
 * kernel is a template over the storage type.
 *
 * GELU and the adds - the memory-bound passes over whole activations,
 * the fp32 gradient add too - are one map kernel over a functor
 * (map_kernel): 16 bytes per load and store (8 bf16 or 4 floats,
 * mr__x128) where every pointer is 16-byte aligned, element by element
 * for the tail and for unaligned views; each element's arithmetic is the
 * functor's either way. Bias and position rows are one row-add kernel
 * (add_rows), packed where the rows are.
 *
 * Non-goals: packing the column fill, which writes the vocabulary's
 * padding columns (50257..50303 for GPT-2: never on a pack boundary).
 */
#include "cuda_int.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

#define LAUNCH(kernel, n, ...)                                                         \
	kernel<<<mr__cu_blocks((n), MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(  \
		__VA_ARGS__)

/* gelu(x) (the tanh form) */
struct gelu_f {
	__device__ __forceinline__ float operator()(float x, float) const
	{
		float u = GELU_K * (x + 0.044715f * x * x * x);
		return 0.5f * x * (1.0f + tanhf(u));
	}
};

/* dout * gelu'(x) */
struct gelu_grad_f {
	__device__ __forceinline__ float operator()(float x, float dout) const
	{
		float u = GELU_K * (x + 0.044715f * x * x * x);
		float th = tanhf(u);
		float sech2 = 1.0f - th * th;
		float g = 0.5f * (1.0f + th) +
			  0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
		return g * dout;
	}
};

struct add_f {
	__device__ __forceinline__ float operator()(float a, float b) const
	{
		return a + b;
	}
};

/* out[i] = f(a[i], b[i]) (b NULL: f(a[i], 0)): packs of 16 bytes when vec
 * (every pointer 16-byte aligned), then the tail element by element;
 * out may alias a or b (each element is read before it is written). */
template <typename T, typename F>
__global__ void map_kernel(T *out, const T *a, const T *b, size_t n, F f, int vec)
{
	const int P = 16 / sizeof(T);
	size_t np = vec ? n / P : 0;
	size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t k = tid; k < np; k += stride) {
		mr__x128<T> x = mr__ld128(a + k * P), y, o;
		if (b)
			y = mr__ld128(b + k * P);
#pragma unroll
		for (int j = 0; j < P; j++)
			mr__st(&o.v[j], f(mr__ld(&x.v[j]), b ? mr__ld(&y.v[j]) : 0.0f));
		mr__st128(out + k * P, o);
	}
	for (size_t i = np * P + tid; i < n; i += stride)
		mr__st(out + i, f(mr__ld(a + i), b ? mr__ld(b + i) : 0.0f));
}

/* Launches map_kernel over n elements: a thread per pack where packed. */
template <typename T, typename F>
static void map(struct mr_cuda *cu, T *out, const T *a, const T *b, size_t n, F f)
{
	int vec = mr__aligned16(out, a, b);
	size_t units = vec ? (n + 16 / sizeof(T) - 1) / (16 / sizeof(T)) : n;

	map_kernel<T, F><<<mr__cu_blocks(units, MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(
		out, a, b, n, f, vec);
}

/* row r of out (width C) += src row off + r % period (a bias: period 1,
 * off 0): a thread per P adjacent elements of a row. */
template <int P, typename T>
__global__ void add_rows_kernel(T *out, const T *src, size_t n, int C, int period, int off)
{
	for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n / P;
	     k += (size_t)gridDim.x * blockDim.x) {
		size_t i = k * P, r = i / (size_t)C;
		size_t p = (size_t)off + r % (size_t)period;
		float o[P], a[P];

		mr__ld_n<P>(o, out + i);
		mr__ld_n<P>(a, src + p * C + i % (size_t)C);
#pragma unroll
		for (int j = 0; j < P; j++)
			o[j] += a[j];
		mr__st_n<P>(out + i, o);
	}
}

/* columns [from, V) of x (rows, V) := value; n = rows * (V - from) */
template <typename T>
__global__ void fill_cols_kernel(T *x, size_t n, int V, int from, float value)
{
	int w = V - from;

	MR__GRID_STRIDE(i, n)
	mr__st(x + (i / (size_t)w) * V + from + (int)(i % (size_t)w), value);
}

template <typename T>
static int gelu_fwd(struct mr_cuda *cu, void *out, const void *inp, size_t n)
{
	map<T>(cu, (T *)out, (const T *)inp, (const T *)NULL, n, gelu_f());
	return mr__cuda_launched(cu, "gelu_fwd");
}

template <typename T>
static int gelu_bwd(struct mr_cuda *cu, void *dinp, const void *inp, const void *dout, size_t n)
{
	map<T>(cu, (T *)dinp, (const T *)inp, (const T *)dout, n, gelu_grad_f());
	return mr__cuda_launched(cu, "gelu_bwd");
}

template <typename T>
static int add(struct mr_cuda *cu, void *out, const void *a, const void *b, size_t n)
{
	map<T>(cu, (T *)out, (const T *)a, (const T *)b, n, add_f());
	return mr__cuda_launched(cu, "add");
}

template <typename T>
static int add_rows(struct mr_cuda *cu, void *out, const void *src, size_t n, int C, int period,
		    int off)
{
	int P = mr__pack_width<T>((size_t)C, out, src, NULL, NULL);

	MR__LAUNCH_PACKED(P > 1, add_rows_kernel, T, mr__cu_blocks(n / P, MR__CU_THREADS),
			  (T *)out, (const T *)src, n, C, period, off);
	return mr__cuda_launched(cu, period == 1 && off == 0 ? "add_bias" : "add_pos");
}

template <typename T>
static int fill_cols(struct mr_cuda *cu, void *x, size_t n, int V, int from, float value)
{
	LAUNCH(fill_cols_kernel<T>, n, (T *)x, n, V, from, value);
	return mr__cuda_launched(cu, "fill_cols");
}

extern "C" int mr_cuda_gelu_fwd(struct mr_cuda *cu, void *out, const void *inp, size_t n)
{
	return n ? MR__BY_ACT(cu, gelu_fwd, cu, out, inp, n) : 0;
}

extern "C" int mr_cuda_gelu_bwd(struct mr_cuda *cu, void *dinp, const void *inp,
				const void *dout, size_t n)
{
	return n ? MR__BY_ACT(cu, gelu_bwd, cu, dinp, inp, dout, n) : 0;
}

extern "C" int mr_cuda_residual_fwd(struct mr_cuda *cu, void *out, const void *a, const void *b,
				    size_t n)
{
	return n ? MR__BY_ACT(cu, add, cu, out, a, b, n) : 0;
}

extern "C" int mr_cuda_add_inplace(struct mr_cuda *cu, void *y, const void *x, size_t n)
{
	return n ? MR__BY_ACT(cu, add, cu, y, y, x, n) : 0;
}

extern "C" int mr_cuda_add_bias(struct mr_cuda *cu, void *rows, const void *bias, int n, int C)
{
	if (n < 0 || C <= 0)
		return mr__cuda_inval(cu, "add_bias");
	return n ? MR__BY_ACT(cu, add_rows, cu, rows, bias, (size_t)n * C, C, 1, 0) : 0;
}

extern "C" int mr_cuda_add_pos(struct mr_cuda *cu, void *out, const void *wpe, int n, int C,
			       int period, int off)
{
	if (n < 0 || C <= 0 || period <= 0 || off < 0)
		return mr__cuda_inval(cu, "add_pos");
	return n ? MR__BY_ACT(cu, add_rows, cu, out, wpe, (size_t)n * C, C, period, off) : 0;
}

extern "C" int mr_cuda_fill_cols(struct mr_cuda *cu, void *x, int N, int V, int from,
				 float value)
{
	if (N < 0 || V <= 0 || from < 0 || from > V)
		return mr__cuda_inval(cu, "fill_cols");
	if (!N || from == V)
		return 0;
	return MR__BY_ACT(cu, fill_cols, cu, x, (size_t)N * (V - from), V, from, value);
}

extern "C" int mr_cuda_add_f32(struct mr_cuda *cu, float *y, const float *x, size_t n)
{
	if (!n)
		return 0;
	map<float>(cu, y, y, x, n, add_f());
	return mr__cuda_launched(cu, "add_f32");
}
