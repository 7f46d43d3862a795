/*
 * device.cu - the CUDA context (stream, cuBLAS/cuBLASLt handles, GEMM
 * workspace, scratch, activation type; the cuDNN attention state is
 * cudnn_attn.cu's), device memory helpers, copies, bf16 conversions and
 * device graphs (stream capture, instantiate, launch).
 *
 * Graphs are captured in cudaStreamCaptureModeThreadLocal: the capturing
 * thread's own unsafe calls (a cudaMalloc, a synchronization) fail the
 * capture, while other threads - the other ranks of an agent, each with
 * its own context and stream - keep allocating and syncing untouched
 * (Global mode would fail their calls too; Relaxed would let ours through
 * and bake an allocation into the graph). Nothing is meant to allocate
 * inside a capture anyway: the cuBLASLt workspace and plans, cuDNN's
 * plans and workspace, the scratch and every runtime buffer exist after
 * the warm-up steps, and the calls that would grow or need the host
 * refuse first (mr__cuda_no_capture), so a capture that cannot work
 * fails fast and names the call.
 *
 * Non-goals: a caching allocator (the runtime allocates its few big
 * buffers once), peer access, multiple streams, graph update in place
 * (cudaGraphExecUpdate: a graph whose arguments change is not one).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_int.cuh"

#define GEMM_WS_BYTES (32u << 20)

int mr__cuda_check(struct mr_cuda *cu, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return 0;
	if (cu)
		snprintf(cu->err, sizeof(cu->err), "%s: %s", what, cudaGetErrorString(e));
	return MR_ESYS;
}

int mr__cuda_no_capture(struct mr_cuda *cu, const char *what)
{
	if (!cu->capturing)
		return 0;
	snprintf(cu->err, sizeof(cu->err), "'%s' needs the host", what);
	return MR_ENEEDHOST;
}

int mr__cuda_launched(struct mr_cuda *cu, const char *what)
{
	return mr__cuda_check(cu, cudaGetLastError(), what);
}

int mr__cuda_inval(struct mr_cuda *cu, const char *what)
{
	snprintf(cu->err, sizeof(cu->err), "unsupported shape for '%s'", what);
	return MR_EINVAL;
}

int mr__cuda_scratch(struct mr_cuda *cu, size_t bytes, float **out)
{
	void *p = NULL;
	int rc;

	if (bytes <= cu->scratch_bytes) {
		*out = cu->scratch;
		return 0;
	}
	if ((rc = mr__cuda_no_capture(cu, "scratch growth")))
		return rc;
	/* Stream-ordered: the old buffer is released after queued work. */
	if (cu->scratch)
		cudaFreeAsync(cu->scratch, cu->stream);
	cu->scratch = NULL;
	cu->scratch_bytes = 0;
	rc = mr__cuda_check(cu, cudaMallocAsync(&p, bytes, cu->stream), "scratch");
	if (rc)
		return rc;
	cu->scratch = (float *)p;
	cu->scratch_bytes = bytes;
	*out = cu->scratch;
	return 0;
}

int mr__cuda_grow_host(struct mr_cuda *cu, int **p, size_t *cap, size_t n)
{
	int *q;

	if (n <= *cap)
		return 0;
	q = (int *)realloc(*p, n * sizeof(int));
	if (!q) {
		snprintf(cu->err, sizeof(cu->err), "out of host memory (%zu ints)", n);
		return MR_ENOMEM;
	}
	*p = q;
	*cap = n;
	return 0;
}

extern "C" int mr_cuda_is_device_ptr(const void *p)
{
	cudaPointerAttributes a;

	if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
		cudaGetLastError(); /* an unknown host pointer is not an error to keep */
		return 0;
	}
	return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

extern "C" int mr_cuda_nccl_capable(void)
{
	return 1;
}

extern "C" int mr_cuda_device_count(struct mr_errbuf *eb)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		mr_errf(eb, MR_ENOTSUP, "no cuda device: %s", cudaGetErrorString(e));
		cudaGetLastError(); /* clear the sticky-free error */
		return 0;
	}
	if (n <= 0) {
		mr_errf(eb, MR_ENOTSUP, "no cuda device: driver reports 0 devices");
		return 0;
	}
	return n;
}

extern "C" int mr_cuda_device_name(int device, char *buf, size_t n)
{
	cudaDeviceProp p;

	if (cudaGetDeviceProperties(&p, device) != cudaSuccess) {
		cudaGetLastError();
		snprintf(buf, n, "unknown GPU");
		return MR_ENOTSUP;
	}
	snprintf(buf, n, "%s", p.name);
	return 0;
}

extern "C" int mr_cuda_create(struct mr_cuda **out, int device, struct mr_errbuf *eb)
{
	struct mr_cuda *cu;
	const char *env = getenv("MESHRUN_CUBLASLT"), *dnn_env = getenv("MESHRUN_CUDNN");
	struct mr_errbuf why = { { 0 }, { 0 } };
	int n = mr_cuda_device_count(&why), rc = MR_ESYS;

	*out = NULL;
	if (device < 0 || device >= n)
		return mr_errf(eb, MR_ENOTSUP, "cuda device '%d' not available (%d found%s%s)",
			       device, n, why.msg[0] ? "; " : "", why.msg);
	cu = (struct mr_cuda *)calloc(1, sizeof(*cu));
	if (!cu)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the cuda context");
	cu->device = device;
	cu->use_lt = !(env && env[0] == '0');
	cu->use_dnn = !(dnn_env && dnn_env[0] == '0');
	if (mr__cuda_check(cu, cudaSetDevice(device), "cudaSetDevice") ||
	    mr__cuda_check(cu, cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking),
			   "cudaStreamCreate") ||
	    mr__cuda_check(cu, cudaMalloc(&cu->gemm_ws, GEMM_WS_BYTES), "gemm workspace") ||
	    mr__cuda_check(cu, cudaMallocHost((void **)&cu->sum_host, sizeof(double)),
			   "pinned result"))
		goto fail;
	cu->gemm_ws_bytes = GEMM_WS_BYTES;
	if (cublasCreate(&cu->blas) != CUBLAS_STATUS_SUCCESS) {
		snprintf(cu->err, sizeof(cu->err), "cublasCreate failed");
		goto fail;
	}
	cublasSetStream(cu->blas, cu->stream);
	/* Exact fp32 for the fp32 GEMMs: no TF32. */
	cublasSetMathMode(cu->blas, CUBLAS_DEFAULT_MATH);
	cublasSetWorkspace(cu->blas, cu->gemm_ws, cu->gemm_ws_bytes);
	if (cublasLtCreate(&cu->lt) != CUBLAS_STATUS_SUCCESS) {
		cu->lt = NULL;
		cu->use_lt = 0; /* the cuBLAS fallback still works */
	}
	/* without room for plans every GEMM plans per call: slower, not wrong */
	cu->plans = (struct mr__lt_plan *)calloc(MR__LT_PLANS, mr__cuda_lt_plan_size());
	*out = cu;
	return 0;
fail:
	mr_errf(eb, rc, "unable to set up cuda device '%d': %s", device, cu->err);
	mr_cuda_free(cu);
	return rc;
}

extern "C" void mr_cuda_free(struct mr_cuda *cu)
{
	if (!cu)
		return;
	if (cu->stream)
		cudaStreamSynchronize(cu->stream);
	mr__dnn_free(cu);
	mr__cuda_lt_plans_free(cu);
	mr_cuda_marks(cu, 0);
	if (cu->lt)
		cublasLtDestroy(cu->lt);
	if (cu->blas)
		cublasDestroy(cu->blas);
	cudaFree(cu->gemm_ws);
	cudaFree(cu->scratch);
	cudaFree(cu->adamw_tab);
	cudaFree(cu->adamw_args);
	free(cu->adamw_tab_host);
	mr__cuda_bucket_free(cu);
	cudaFree(cu->bucket_dev);
	cudaFreeHost(cu->sum_host);
	if (cu->stream)
		cudaStreamDestroy(cu->stream);
	free(cu->bucket_host);
	free(cu->count_host);
	free(cu->moe_host);
	free(cu);
}

extern "C" void mr_cuda_set_act(struct mr_cuda *cu, enum mr_cuda_dtype t)
{
	cu->act = t;
}

extern "C" const char *mr_cuda_errmsg(const struct mr_cuda *cu)
{
	return cu ? cu->err : "no cuda context";
}

extern "C" void *mr_cuda_stream(struct mr_cuda *cu)
{
	return (void *)cu->stream;
}

extern "C" int mr_cuda_sync(struct mr_cuda *cu)
{
	int rc = mr__cuda_no_capture(cu, "sync");

	if (rc || (rc = mr__cuda_check(cu, cudaStreamSynchronize(cu->stream), "cuda stream")))
		return rc;
	return mr__cuda_bucket_failed(cu);
}

/* ---- device graphs (see mr_cuda.h) ---------------------------------------- */

struct mr_cuda_graph {
	cudaGraphExec_t exec;
};

extern "C" int mr_cuda_capturing(const struct mr_cuda *cu)
{
	return cu->capturing;
}

/* Ends the capture in every case (the stream leaves capture mode) and
 * instantiates what it holds when fn succeeded (rc 0); a failure keeps
 * fn's message, the first cause. */
static int end_capture(struct mr_cuda *cu, int rc, cudaGraphExec_t *exec)
{
	cudaGraph_t graph = NULL;
	cudaError_t e = cudaStreamEndCapture(cu->stream, &graph);

	if (rc == 0)
		rc = mr__cuda_check(cu, e, "cudaStreamEndCapture");
	if (rc == 0)
		rc = mr__cuda_check(cu, cudaGraphInstantiateWithFlags(exec, graph, 0),
				    "cudaGraphInstantiateWithFlags");
	/* the executable graph holds what it needs of the captured one */
	if (graph && (e = cudaGraphDestroy(graph)) != cudaSuccess && rc == 0) {
		rc = mr__cuda_check(cu, e, "cudaGraphDestroy");
		cudaGraphExecDestroy(*exec);
	}
	if (rc)
		cudaGetLastError(); /* an invalidated capture's error is not sticky */
	return rc;
}

extern "C" int mr_cuda_graph_capture(struct mr_cuda *cu, mr_cuda_work fn, void *ctx,
				     struct mr_cuda_graph **out)
{
	struct mr_cuda_graph *g;
	int rc;

	*out = NULL;
	if ((rc = mr__cuda_no_capture(cu, "graph_capture"))) /* no nesting */
		return rc;
	if (!(g = (struct mr_cuda_graph *)calloc(1, sizeof(*g)))) {
		snprintf(cu->err, sizeof(cu->err), "out of host memory (graph)");
		return MR_ENOMEM;
	}
	rc = mr__cuda_check(cu,
			    cudaStreamBeginCapture(cu->stream, cudaStreamCaptureModeThreadLocal),
			    "cudaStreamBeginCapture");
	if (rc == 0) {
		cu->capturing = 1;
		rc = fn(ctx);
		cu->capturing = 0;
		rc = end_capture(cu, rc, &g->exec);
	}
	if (rc) {
		free(g);
		return rc;
	}
	*out = g;
	return 0;
}

extern "C" int mr_cuda_graph_launch(struct mr_cuda *cu, struct mr_cuda_graph *g, mr_cuda_work fn,
				    void *ctx)
{
	(void)fn; /* the graph replays without the host */
	(void)ctx;
	return mr__cuda_check(cu, cudaGraphLaunch(g->exec, cu->stream), "cudaGraphLaunch");
}

extern "C" void mr_cuda_graph_free(struct mr_cuda *cu, struct mr_cuda_graph *g)
{
	if (!g)
		return;
	cudaStreamSynchronize(cu->stream); /* a launch in flight still runs it */
	cudaGraphExecDestroy(g->exec);
	free(g);
}

extern "C" int mr_cuda_stream_wait(struct mr_cuda *cu, void *ev)
{
	int rc;

	if (!ev)
		return 0;
	/* an event recorded outside a capture cannot join it: not captured */
	if ((rc = mr__cuda_no_capture(cu, "stream_wait")))
		return rc;
	return mr__cuda_check(cu, cudaStreamWaitEvent(cu->stream, (cudaEvent_t)ev, 0),
			      "cuda stream wait");
}

extern "C" int mr_cuda_query(struct mr_cuda *cu, void *ev)
{
	cudaError_t e;
	int rc;

	/* a query of a capturing stream would invalidate the capture */
	if ((rc = mr__cuda_no_capture(cu, "query")))
		return rc;
	e = ev ? cudaEventQuery((cudaEvent_t)ev) : cudaStreamQuery(cu->stream);
	if (e == cudaErrorNotReady)
		return 0;
	return mr__cuda_check(cu, e, ev ? "cuda event query" : "cuda stream query") < 0 ? MR_ESYS
										   : 1;
}

extern "C" void mr_cuda_event_free(struct mr_cuda *cu, void *ev)
{
	if (ev)
		mr__cuda_check(cu, cudaEventDestroy((cudaEvent_t)ev), "cuda event destroy");
}

extern "C" int mr_cuda_using_lt(const struct mr_cuda *cu)
{
	return cu->use_lt;
}

extern "C" long mr_cuda_lt_fallbacks(const struct mr_cuda *cu, const char **why)
{
	if (why)
		*why = cu->lt_why;
	return cu->lt_fallbacks;
}

extern "C" void mr_cuda_disable_lt(struct mr_cuda *cu)
{
	cu->use_lt = 0;
}

extern "C" int mr_cuda_marks(struct mr_cuda *cu, int n)
{
	int i;

	for (i = 0; i < cu->nmarks; i++)
		cudaEventDestroy(cu->marks[i]);
	free(cu->marks);
	cu->marks = NULL;
	cu->nmarks = cu->marks_used = 0;
	if (n <= 0)
		return 0;
	cu->marks = (cudaEvent_t *)calloc((size_t)n, sizeof(*cu->marks));
	if (!cu->marks) {
		snprintf(cu->err, sizeof(cu->err), "out of host memory (%d timing marks)", n);
		return MR_ENOMEM;
	}
	for (i = 0; i < n; i++)
		if (mr__cuda_check(cu, cudaEventCreate(&cu->marks[i]), "cudaEventCreate") < 0)
			break;
	cu->nmarks = i; /* the ones made are destroyed next time */
	return i == n ? 0 : MR_ESYS;
}

extern "C" int mr_cuda_mark(struct mr_cuda *cu)
{
	/* a mark captured into a graph would time nothing readable */
	if (cu->capturing || cu->marks_used >= cu->nmarks ||
	    cudaEventRecord(cu->marks[cu->marks_used], cu->stream) != cudaSuccess)
		return -1;
	return cu->marks_used++;
}

extern "C" int mr_cuda_marks_read(struct mr_cuda *cu, double *ms, int n)
{
	int i, used = cu->marks_used < n ? cu->marks_used : n;
	float f;

	if (mr__cuda_no_capture(cu, "marks_read"))
		return MR_ENEEDHOST;
	cu->marks_used = 0;
	if (used == 0)
		return 0;
	if (mr__cuda_check(cu, cudaEventSynchronize(cu->marks[used - 1]), "timing marks") < 0)
		return MR_ESYS;
	for (i = 0; i < used; i++) {
		if (mr__cuda_check(cu, cudaEventElapsedTime(&f, cu->marks[0], cu->marks[i]),
				   "timing marks") < 0)
			return MR_ESYS;
		ms[i] = f;
	}
	return used;
}

extern "C" int mr_cuda_alloc(struct mr_cuda *cu, void **p, size_t bytes)
{
	*p = NULL;
	if (mr__cuda_no_capture(cu, "alloc"))
		return MR_ENEEDHOST;
	return mr__cuda_check(cu, cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc");
}

extern "C" void mr_cuda_dfree(struct mr_cuda *cu, void *p)
{
	/* while capturing: kept (the caller was told by mr_cuda_capturing) */
	if (!p || mr__cuda_no_capture(cu, "dfree"))
		return;
	cudaStreamSynchronize(cu->stream);
	cudaFree(p);
}

extern "C" int mr_cuda_host_alloc(struct mr_cuda *cu, void **p, size_t bytes)
{
	*p = NULL;
	if (mr__cuda_no_capture(cu, "host_alloc"))
		return MR_ENEEDHOST;
	return mr__cuda_check(cu, cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault),
			      "cudaHostAlloc");
}

extern "C" int mr_cuda_host_free(struct mr_cuda *cu, void *p)
{
	int rc;

	if (!p)
		return 0;
	if ((rc = mr__cuda_no_capture(cu, "host_free")))
		return rc;
	rc = mr__cuda_check(cu, cudaStreamSynchronize(cu->stream), "cudaFreeHost sync");
	if (mr__cuda_check(cu, cudaFreeHost(p), "cudaFreeHost") < 0)
		rc = rc ? rc : MR_ESYS;
	return rc;
}

extern "C" int mr_cuda_memset0(struct mr_cuda *cu, void *p, size_t bytes)
{
	return mr__cuda_check(cu, cudaMemsetAsync(p, 0, bytes, cu->stream), "cudaMemset");
}

/* A copy between the host and the device on the stream, waited for
 * (refused while capturing: the host reads or reuses its side at once). */
static int copy_waited(struct mr_cuda *cu, void *dst, const void *src, size_t bytes,
		       cudaMemcpyKind kind, const char *what)
{
	int rc = mr__cuda_no_capture(cu, what);

	if (rc)
		return rc;
	rc = mr__cuda_check(cu, cudaMemcpyAsync(dst, src, bytes, kind, cu->stream), what);
	return rc ? rc : mr_cuda_sync(cu);
}

extern "C" int mr_cuda_upload(struct mr_cuda *cu, void *dst, const void *src_host, size_t bytes)
{
	return copy_waited(cu, dst, src_host, bytes, cudaMemcpyHostToDevice, "upload");
}

extern "C" int mr_cuda_download(struct mr_cuda *cu, void *dst_host, const void *src,
				size_t bytes)
{
	return copy_waited(cu, dst_host, src, bytes, cudaMemcpyDeviceToHost, "download");
}

extern "C" int mr_cuda_copy(struct mr_cuda *cu, void *dst, const void *src, size_t bytes)
{
	if (dst == src || !bytes)
		return 0;
	return mr__cuda_check(cu, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
						  cu->stream),
			      "copy");
}

extern "C" int mr_cuda_copy2d(struct mr_cuda *cu, void *dst, size_t dpitch, const void *src,
			      size_t spitch, size_t width, size_t rows)
{
	if (!width || !rows)
		return 0;
	return mr__cuda_check(cu, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
						    cudaMemcpyDeviceToDevice, cu->stream),
			      "copy2d");
}

/* dst[i] = src[i] converted, 8 elements a thread where both buffers are
 * 16-byte aligned (one bf16 pack, two float packs), the tail one by one. */
template <typename D, typename S>
__global__ void convert_kernel(D *dst, const S *src, size_t n, int vec)
{
	size_t np = vec ? n / 8 : 0;
	size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	float f[8];

	for (size_t k = tid; k < np; k += stride) {
		mr__ld_n<16 / sizeof(S)>(f, src + 8 * k);
		if constexpr (sizeof(S) == 4)
			mr__ld_n<4>(f + 4, src + 8 * k + 4);
		mr__st_n<16 / sizeof(D)>(dst + 8 * k, f);
		if constexpr (sizeof(D) == 4)
			mr__st_n<4>(dst + 8 * k + 4, f + 4);
	}
	for (size_t i = np * 8 + tid; i < n; i += stride)
		mr__st(dst + i, mr__ld(src + i));
}

template <typename D, typename S>
static int convert(struct mr_cuda *cu, D *dst, const S *src, size_t n, const char *what)
{
	int vec = mr__aligned16(dst, src, NULL);
	size_t units = vec ? (n + 7) / 8 : n;

	convert_kernel<D, S><<<mr__cu_blocks(units, MR__CU_THREADS), MR__CU_THREADS, 0,
			       cu->stream>>>(dst, src, n, vec);
	return mr__cuda_launched(cu, what);
}

extern "C" int mr_cuda_f32_to_bf16(struct mr_cuda *cu, mr_bf16 *dst, const float *src, size_t n)
{
	if (!n)
		return 0;
	return convert(cu, MR__BF(dst), src, n, "f32_to_bf16");
}

extern "C" int mr_cuda_bf16_to_f32(struct mr_cuda *cu, float *dst, const mr_bf16 *src, size_t n)
{
	if (!n)
		return 0;
	return convert(cu, dst, MR__CBF(src), n, "bf16_to_f32");
}
