/*
 * encoder.cu - token + position embedding, forward and backward (see
 * mr_cuda.h).
 *
 * Backward without atomics: the host (which holds the batch anyway) sorts
 * the positions by token with a stable counting sort and uploads
 * [nb | bucket starts (nb+1) | bucket tokens (nb) | positions (N)]; one
 * thread per (bucket, channel) then sums its positions in order and adds
 * the sum to dwte once. dwpe is one thread per (t, channel) summing over b.
 * Captured into a graph the sort is a host node (cudaLaunchHostFunc) that
 * reads the token buffer when the graph runs, into a pinned table a copy
 * node brings up, and the grid has a block row per position (nb <= N;
 * the rows past nb, read from the table, return at once): the graph holds
 * nothing of the tokens it was captured with.
 *
 * Non-goals: sparse gradients, a device-side sort (B*T is small).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_int.cuh"

/* out = wte[tok] + wpe[t] (none when wpe is NULL); a row of zeros for
 * tok < 0, a token of another rank's vocabulary slice (as the cpu kernel) */
template <typename T>
__global__ void encoder_fwd_kernel(T *out, const int *tok, const T *wte, const T *wpe, int T_,
				   int C, size_t n)
{
	MR__GRID_STRIDE(i, n)
	{
		size_t row = i / (size_t)C;
		int c = (int)(i % (size_t)C), t = (int)(row % (size_t)T_), k = tok[row];
		float x = 0.0f;

		if (k >= 0)
			x = mr__ld(wte + (size_t)k * C + c) +
			    (wpe ? mr__ld(wpe + (size_t)t * C + c) : 0.0f);
		mr__st(out + i, x);
	}
}

template <typename T>
static int encoder_fwd(struct mr_cuda *cu, void *out, const int *tok, const void *wte,
		       const void *wpe, int T_, int C, size_t n)
{
	encoder_fwd_kernel<T><<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(
		(T *)out, tok, (const T *)wte, (const T *)wpe, T_, C, n);
	return mr__cuda_launched(cu, "encoder_fwd");
}

extern "C" int mr_cuda_encoder_fwd(struct mr_cuda *cu, void *out, const int *tok,
				   const void *wte, const void *wpe, int B, int T, int C)
{
	if (B <= 0 || T <= 0 || C <= 0)
		return mr__cuda_inval(cu, "encoder_fwd");
	return MR__BY_ACT(cu, encoder_fwd, cu, out, tok, wte, wpe, T, C, (size_t)B * T * C);
}

/* grid (>= nb, ceil(C/threads)); buckets as described above. */
template <typename T>
__global__ void encoder_dwte_kernel(float *dwte, const T *dout, const int *bk, int C)
{
	int nb = bk[0];
	const int *start = bk + 1, *btok = start + nb + 1, *pos = btok + nb;
	int b = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
	float s = 0.0f;

	if (c >= C || b >= nb)
		return;
	for (int i = start[b]; i < start[b + 1]; i++)
		s += mr__ld(dout + (size_t)pos[i] * C + c);
	dwte[(size_t)btok[b] * C + c] += s;
}

/* thread per (t, c): dwpe[t,c] += sum_b dout[b,t,c]. */
template <typename T>
__global__ void encoder_dwpe_kernel(float *dwpe, const T *dout, int B, int T_, int C)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	float s = 0.0f;

	if (i >= (size_t)T_ * C)
		return;
	for (int b = 0; b < B; b++)
		s += mr__ld(dout + (size_t)b * T_ * C + i);
	dwpe[i] += s;
}

/* Ints of the bucket table of N positions at most. */
static size_t table_ints(int N)
{
	return 3 * (size_t)N + 2;
}

/* The table of tok (ids < V, V + 1 counters in cnt) into out; nb. */
static int bucket_into(int *out, int *cnt, const int *tok, int N, int V)
{
	int nb = 0, i, v;

	for (v = 0; v <= V; v++)
		cnt[v] = 0;
	for (i = 0; i < N; i++)
		if (tok[i] >= 0) /* negative: another rank's vocabulary, no dwte row */
			cnt[tok[i] + 1]++;
	for (v = 0; v < V; v++)
		nb += cnt[v + 1] > 0;
	out[0] = nb;
	/* starts and tokens of the non-empty buckets; cnt[v] -> first slot */
	{
		int *start = out + 1, *btok = start + nb + 1, *pos = btok + nb, b = 0, at = 0;

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
			if (tok[i] >= 0)
				pos[cnt[tok[i]]++] = i; /* stable: positions ascend */
	}
	return nb;
}

/* Fills cu->bucket_host; returns nb (>= 0) or a negative code. */
static int bucket(struct mr_cuda *cu, const int *tok, int N, int V)
{
	int i;

	if (mr__cuda_grow_host(cu, &cu->count_host, &cu->count_host_n, (size_t)V + 1) ||
	    mr__cuda_grow_host(cu, &cu->bucket_host, &cu->bucket_host_n, table_ints(N)))
		return MR_ENOMEM;
	for (i = 0; i < N; i++)
		if (tok[i] >= V) {
			snprintf(cu->err, sizeof(cu->err),
				 "encoder_bwd: token '%d' at %d out of range [0, %d)", tok[i], i, V);
			return MR_ERANGE;
		}
	return bucket_into(cu->bucket_host, cu->count_host, tok, N, V);
}

/* A captured backward's host node: the token buffer it reads when the
 * graph runs, the pinned table it fills (allocated by an eager call, so
 * the capture allocates nothing) and its own counters (the host thread's
 * eager calls may run beside it). */
struct mr__bucket_job {
	const int *tok;
	int N;
	int *pinned;       /* table_ints(N) */
	int *cnt;          /* grown inside the node */
	size_t cnt_n;
	int failed;        /* out of host memory inside the node: the next sync fails */
};

static void CUDART_CB bucket_node(void *arg)
{
	struct mr__bucket_job *j = (struct mr__bucket_job *)arg;
	int V = 1, i;

	for (i = 0; i < j->N; i++) /* checked < the vocabulary before the launch */
		if (j->tok[i] >= V)
			V = j->tok[i] + 1;
	if ((size_t)V + 1 > j->cnt_n) {
		int *c = (int *)realloc(j->cnt, ((size_t)V + 1) * sizeof(int));
		if (!c) {
			j->failed = 1;
			j->pinned[0] = 0;
			return;
		}
		j->cnt = c;
		j->cnt_n = (size_t)V + 1;
	}
	bucket_into(j->pinned, j->cnt, j->tok, j->N, V);
}

void mr__cuda_bucket_free(struct mr_cuda *cu)
{
	struct mr__bucket_job *j = cu->bucket_job;

	if (!j)
		return;
	/* no graph reads it: never captured, or mr_cuda_free synced the stream
	 * after the graphs were freed */
	cudaFreeHost(j->pinned);
	free(j->cnt);
	free(j);
	cu->bucket_job = NULL;
}

int mr__cuda_bucket_failed(struct mr_cuda *cu)
{
	struct mr__bucket_job *j = cu->bucket_job;

	if (!j || !j->failed)
		return 0;
	j->failed = 0;
	snprintf(cu->err, sizeof(cu->err), "out of host memory (encoder_bwd host node)");
	return MR_ENOMEM;
}

/* The host node's state for N positions, made outside a capture; a
 * captured graph's is kept (the graph points at it). */
static int bucket_job_for(struct mr_cuda *cu, int N)
{
	struct mr__bucket_job *j = cu->bucket_job;
	int rc;

	if (j && j->N >= N)
		return 0;
	if (j && j->tok) {
		snprintf(cu->err, sizeof(cu->err),
			 "encoder_bwd: %d positions, a captured graph's table holds %d", N, j->N);
		return MR_ESTATE;
	}
	mr__cuda_bucket_free(cu);
	if (!(j = (struct mr__bucket_job *)calloc(1, sizeof(*j)))) {
		snprintf(cu->err, sizeof(cu->err), "out of host memory (encoder_bwd)");
		return MR_ENOMEM;
	}
	cu->bucket_job = j;
	j->N = N;
	rc = mr__cuda_check(cu, cudaMallocHost((void **)&j->pinned, table_ints(N) * sizeof(int)),
			    "encoder_bwd pinned table");
	if (rc)
		mr__cuda_bucket_free(cu);
	return rc;
}

/* Captured: the host node, the copy of its table, for this launch's tokens. */
static int bucket_captured(struct mr_cuda *cu, const int *tok_host, int N)
{
	struct mr__bucket_job *j = cu->bucket_job;
	int rc;

	if (!j || j->N < N) /* no eager call made the table yet */
		return mr__cuda_no_capture(cu, "encoder_bwd first use");
	/* one job per context: a second token buffer would retarget the first graph */
	if (j->tok && (j->tok != tok_host || j->N != N))
		return mr__cuda_no_capture(cu, "encoder_bwd of another token buffer");
	j->tok = tok_host;
	j->N = N;
	if ((rc = mr__cuda_check(cu, cudaLaunchHostFunc(cu->stream, bucket_node, j),
				 "encoder_bwd host node")))
		return rc;
	return mr__cuda_check(cu, cudaMemcpyAsync(cu->bucket_dev, j->pinned,
						  table_ints(N) * sizeof(int),
						  cudaMemcpyHostToDevice, cu->stream),
			      "encoder_bwd table copy");
}

/* nb: the grid's bucket rows (at least the table's nb). */
template <typename T>
static int encoder_dw(struct mr_cuda *cu, float *dwte, float *dwpe, const void *dout, int nb,
		      int B, int T_, int C)
{
	unsigned int gy = (unsigned int)((C + MR__CU_THREADS - 1) / MR__CU_THREADS);

	if (dwte && nb > 0)
		encoder_dwte_kernel<T><<<dim3((unsigned int)nb, gy), MR__CU_THREADS, 0, cu->stream>>>(
			dwte, (const T *)dout, cu->bucket_dev, C);
	if (dwpe)
		encoder_dwpe_kernel<T><<<mr__cu_blocks((size_t)T_ * C, MR__CU_THREADS),
					 MR__CU_THREADS, 0, cu->stream>>>(dwpe, (const T *)dout, B,
									 T_, C);
	return mr__cuda_launched(cu, "encoder_bwd");
}

extern "C" int mr_cuda_encoder_bwd(struct mr_cuda *cu, float *dwte, float *dwpe,
				   const void *dout, const int *tok_host, int B, int T, int C,
				   int V)
{
	int N = B * T, nb = 0, rc;
	size_t nint;

	if (B <= 0 || T <= 0 || C <= 0 || V <= 0)
		return mr__cuda_inval(cu, "encoder_bwd");
	if (!dwte)
		return MR__BY_ACT(cu, encoder_dw, cu, dwte, dwpe, dout, 0, B, T, C);
	if (table_ints(N) > cu->bucket_dev_n) {
		void *p = NULL;
		if ((rc = mr__cuda_no_capture(cu, "encoder_bwd table growth")))
			return rc;
		if (cu->bucket_dev)
			cudaFreeAsync(cu->bucket_dev, cu->stream);
		cu->bucket_dev = NULL;
		cu->bucket_dev_n = 0;
		rc = mr__cuda_check(cu, cudaMallocAsync(&p, table_ints(N) * sizeof(int), cu->stream),
				    "encoder_bwd buckets");
		if (rc)
			return rc;
		cu->bucket_dev = (int *)p;
		cu->bucket_dev_n = table_ints(N);
	}
	if (cu->capturing) {
		if ((rc = bucket_captured(cu, tok_host, N)))
			return rc;
		return MR__BY_ACT(cu, encoder_dw, cu, dwte, dwpe, dout, N, B, T, C);
	}
	/* the host node's table, for a capture to come */
	if ((nb = bucket(cu, tok_host, N, V)) < 0 || (rc = bucket_job_for(cu, N)))
		return nb < 0 ? nb : rc;
	nint = 2 * (size_t)nb + 2 + (size_t)N;
	/* Pageable source: the call returns once the data is staged, so the
	 * host buffer may be refilled by the next call. */
	if (nb > 0 &&
	    (rc = mr__cuda_check(cu, cudaMemcpyAsync(cu->bucket_dev, cu->bucket_host,
						     nint * sizeof(int), cudaMemcpyHostToDevice,
						     cu->stream),
				 "encoder_bwd upload")))
		return rc;
	return MR__BY_ACT(cu, encoder_dw, cu, dwte, dwpe, dout, nb, B, T, C);
}
