/*
 * encoder.cu - token + position embedding, forward and backward (see
 * mr_cuda.h).
 *
 * Backward without atomics: the host (which holds the batch anyway) sorts
 * the positions by token with a stable counting sort and uploads
 * [bucket starts (nb+1) | bucket tokens (nb) | positions (N)]; one thread
 * per (bucket, channel) then sums its positions in order and adds the sum
 * to dwte once. dwpe is one thread per (t, channel) summing over b.
 *
 * Non-goals: sparse gradients, a device-side sort (B*T is small).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_int.cuh"

__global__ void encoder_fwd_kernel(__nv_bfloat16 *out, const int *tok,
				   const __nv_bfloat16 *wte, const __nv_bfloat16 *wpe, int T,
				   int C, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t row = i / (size_t)C;
		int c = (int)(i % (size_t)C), t = (int)(row % (size_t)T);
		float x = __bfloat162float(wte[(size_t)tok[row] * C + c]) +
			  __bfloat162float(wpe[(size_t)t * C + c]);
		out[i] = __float2bfloat16_rn(x);
	}
}

extern "C" int mr_cuda_encoder_fwd(struct mr_cuda *cu, mr_bf16 *out, const int *tok,
				   const mr_bf16 *wte, const mr_bf16 *wpe, int B, int T, int C)
{
	size_t n = (size_t)B * T * C;

	if (B <= 0 || T <= 0 || C <= 0)
		return mr__cuda_inval(cu, "encoder_fwd");
	encoder_fwd_kernel<<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(
		MR__BF(out), tok, MR__CBF(wte), MR__CBF(wpe), T, C, n);
	return mr__cuda_launched(cu, "encoder_fwd");
}

/* grid (nb, ceil(C/threads)); buckets as described above. */
__global__ void encoder_dwte_kernel(float *dwte, const __nv_bfloat16 *dout, const int *bk,
				    int nb, int C)
{
	const int *start = bk, *btok = bk + nb + 1, *pos = btok + nb;
	int b = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
	float s = 0.0f;

	if (c >= C)
		return;
	for (int i = start[b]; i < start[b + 1]; i++)
		s += __bfloat162float(dout[(size_t)pos[i] * C + c]);
	dwte[(size_t)btok[b] * C + c] += s;
}

/* thread per (t, c): dwpe[t,c] += sum_b dout[b,t,c]. */
__global__ void encoder_dwpe_kernel(float *dwpe, const __nv_bfloat16 *dout, int B, int T, int C)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	float s = 0.0f;

	if (i >= (size_t)T * C)
		return;
	for (int b = 0; b < B; b++)
		s += __bfloat162float(dout[(size_t)b * T * C + i]);
	dwpe[i] += s;
}

/* Grows a host int array to n entries. */
static int grow(int **p, size_t *cap, size_t n)
{
	int *q;

	if (n <= *cap)
		return 0;
	q = (int *)realloc(*p, n * sizeof(int));
	if (!q)
		return MR_ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

/* Fills cu->bucket_host; returns nb (>= 0) or a negative code. */
static int bucket(struct mr_cuda *cu, const int *tok, int N, int V)
{
	int *cnt, *out, nb = 0, i, v;

	if (grow(&cu->count_host, &cu->count_host_n, (size_t)V + 1) ||
	    grow(&cu->bucket_host, &cu->bucket_host_n, 3 * (size_t)N + 1)) {
		snprintf(cu->err, sizeof(cu->err), "encoder_bwd: out of host memory");
		return MR_ENOMEM;
	}
	cnt = cu->count_host;
	out = cu->bucket_host;
	for (v = 0; v <= V; v++)
		cnt[v] = 0;
	for (i = 0; i < N; i++) {
		if (tok[i] < 0 || tok[i] >= V) {
			snprintf(cu->err, sizeof(cu->err),
				 "encoder_bwd: token '%d' at %d out of range [0, %d)", tok[i], i, V);
			return MR_ERANGE;
		}
		cnt[tok[i] + 1]++;
	}
	for (v = 0; v < V; v++)
		nb += cnt[v + 1] > 0;
	/* starts and tokens of the non-empty buckets; cnt[v] -> first slot */
	{
		int *start = out, *btok = out + nb + 1, *pos = btok + nb, b = 0, at = 0;

		for (v = 0; v < V; v++) {
			int c = cnt[v + 1];
			cnt[v] = at;
			if (c) {
				start[b] = at;
				btok[b] = v;
				b++;
				at += c;
			}
		}
		start[nb] = at;
		for (i = 0; i < N; i++)
			pos[cnt[tok[i]]++] = i; /* stable: positions ascend */
	}
	return nb;
}

extern "C" int mr_cuda_encoder_bwd(struct mr_cuda *cu, float *dwte, float *dwpe,
				   const mr_bf16 *dout, const int *tok_host, int B, int T, int C,
				   int V)
{
	int N = B * T, nb, rc;
	size_t nint;
	unsigned int gy = (unsigned int)((C + MR__CU_THREADS - 1) / MR__CU_THREADS);

	if (B <= 0 || T <= 0 || C <= 0 || V <= 0)
		return mr__cuda_inval(cu, "encoder_bwd");
	nb = bucket(cu, tok_host, N, V);
	if (nb < 0)
		return nb;
	nint = 2 * (size_t)nb + 1 + (size_t)N;
	if (nint > cu->bucket_dev_n) {
		void *p = NULL;
		if (cu->bucket_dev)
			cudaFreeAsync(cu->bucket_dev, cu->stream);
		cu->bucket_dev = NULL;
		cu->bucket_dev_n = 0;
		rc = mr__cuda_check(cu, cudaMallocAsync(&p, 3 * (size_t)N * sizeof(int) + 4,
							cu->stream),
				    "encoder_bwd buckets");
		if (rc)
			return rc;
		cu->bucket_dev = (int *)p;
		cu->bucket_dev_n = 3 * (size_t)N + 1;
	}
	/* Pageable source: the call returns once the data is staged, so the
	 * host buffer may be refilled by the next call. */
	rc = mr__cuda_check(cu, cudaMemcpyAsync(cu->bucket_dev, cu->bucket_host, nint * sizeof(int),
						cudaMemcpyHostToDevice, cu->stream),
			    "encoder_bwd upload");
	if (rc)
		return rc;
	encoder_dwte_kernel<<<dim3((unsigned int)nb, gy), MR__CU_THREADS, 0, cu->stream>>>(
		dwte, MR__CBF(dout), cu->bucket_dev, nb, C);
	encoder_dwpe_kernel<<<mr__cu_blocks((size_t)T * C, MR__CU_THREADS), MR__CU_THREADS, 0,
			      cu->stream>>>(dwpe, MR__CBF(dout), B, T, C);
	return mr__cuda_launched(cu, "encoder_bwd");
}
