/*
 * cudnn_graph.h - the C interface of cudnn_graph.cu, everything that
 * touches libcudnn.so.9 for the layer attention: loading it, the rules
 * that refuse a shape, the fused flash attention's backend graph (forward
 * or backward) built as descriptors, the operation graph, cuDNN's
 * heuristics, plans and execution. cudnn_attn.cu (plans per shape in the
 * context) calls it, and tests/gpu/test_cudnn_graph.c builds and
 * finalizes the very descriptors the device runs, and asks cuDNN's
 * engines about them with a GPU described rather than present, on a
 * machine without one.
 *
 * The graph (B batch, T time, NH query heads, NKV key/value heads of hs
 * channels; qkv rows of (NH + 2*NKV)*hs bf16, out (B,T,NH*hs) bf16, the
 * statistics (B,NH,T) fp32 = lse of the scaled scores) is what cuDNN's
 * runtime-fusion engines recognise as scaled dot-product attention; the
 * operation order is in cudnn_graph.cu's header.
 *
 * Descriptors (cudnnBackendDescriptor_t) and the handle (cudnnHandle_t)
 * are void * here, so C includes no cuDNN header.
 *
 * Non-goals: anything the device layer calls (that is mr_cuda.h), plans
 * per shape, workspaces, logging (cudnn_attn.cu).
 */
#ifndef MR_CUDNN_GRAPH_H
#define MR_CUDNN_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The oldest cuDNN the fast path takes (cudnnGetVersion: 9.10.2). */
#define MR__DNN_MIN_VERSION 91002L

enum mr__dnn_dir { MR__DNN_FWD, MR__DNN_BWD };

/* One layer's shape: what a graph (and a plan) is built for. */
struct mr__dnn_shape {
	int B, T, NH, NKV, hs;
	enum mr__dnn_dir dir;
};

/* The graph's tensors that hold memory (the variant pack's), by slot;
 * slot s has the unique id s + 1. Which exist depends on the direction:
 * fwd Q K V SCALE NEG_INF O STATS; bwd Q K V O DO STATS SCALE NEG_INF ONE
 * DSUM DQ DK DV. SCALE, NEG_INF, ONE are fp32 scalars passed by value
 * (host pointers in the pack); DSUM is the backward's rowsum(dO * O)
 * (B,NH,T) fp32 in the workspace. */
enum mr__dnn_io {
	MR__DNN_Q, MR__DNN_K, MR__DNN_V, MR__DNN_O, MR__DNN_STATS, MR__DNN_DO,
	MR__DNN_DQ, MR__DNN_DK, MR__DNN_DV, MR__DNN_SCALE, MR__DNN_NEG_INF, MR__DNN_ONE,
	MR__DNN_DSUM, MR__DNN_NIO
};

#define MR__DNN_MAX_DESC 96
#define MR__DNN_MAX_OPS 32

/* A graph's descriptors (cudnnBackendDescriptor_t), all finalized. */
struct mr__dnn_ops {
	void *desc[MR__DNN_MAX_DESC]; /* every one made, in order (released in reverse) */
	int ndesc;
	void *ops[MR__DNN_MAX_OPS];   /* the operations, in graph order */
	const char *op_name[MR__DNN_MAX_OPS];
	int nops;
	void *io[MR__DNN_NIO];        /* the tensors of the variant pack; NULL: not in it */
	int64_t next_uid;             /* virtual tensors' ids, from 100 */
	int failed;                   /* a step failed: the rest are skipped */
};

/* Opens libcudnn.so.9 once per process (thread-safe) and resolves the
 * functions cudnn_graph.cu calls; 0, or -1 with the reason (dlerror, a
 * missing symbol, a cuDNN older than MR__DNN_MIN_VERSION or built for
 * another CUDA major version) in why. Later calls return the first
 * answer. */
int mr__dnn_load(char *why, size_t n);
/* cudnnGetVersion() of the loaded library; 0 when none is loaded. */
long mr__dnn_version(void);

/* 0 when cuDNN `version` takes shape s, else 1 with the reason in why
 * (head size not a multiple of 8 or above 128; a version with known
 * attention bugs; the backward's limits). The layer's own checks (NKV
 * divides NH, ...) come first and are not repeated here. */
int mr__dnn_refuses(const struct mr__dnn_shape *s, long version, char *why, size_t n);

/* Builds and finalizes every tensor, sub-descriptor and operation of s's
 * graph into g (zeroed first); 0, or -1 with the failing step and
 * cuDNN's message in why (g then holds what was made: release it).
 * Needs mr__dnn_load. */
int mr__dnn_ops_build(struct mr__dnn_ops *g, const struct mr__dnn_shape *s, char *why, size_t n);
/* Destroys every descriptor of g; g may be zeroed or partly built. */
void mr__dnn_ops_release(struct mr__dnn_ops *g);
/* A tensor descriptor's data type (cudnnDataType_t), dimensions and
 * strides as cuDNN holds them (4 each); 0 or -1. */
int mr__dnn_tensor_get(void *tensor, int *dtype, int64_t dim[4], int64_t stride[4]);

/* The operation graph of g's operations, finalized into *graph, on the
 * device of `handle` (a cudnnHandle_t), or with no handle (NULL: cuDNN
 * 9.8 and later; heuristics then need device properties); 0, or -1 with
 * the reason in why. */
int mr__dnn_graph(struct mr__dnn_ops *g, void *handle, void **graph, char *why, size_t n);
/* cuDNN's heuristics (mode A) for graph: up to max engine configs, in
 * cuDNN's order of preference, into cfgs (the caller destroys them);
 * devprop: a device-properties descriptor (mr__dnn_devprop) for a graph
 * without a handle, else NULL. Their number, 0 (why: cuDNN's message) or
 * -1 (why). */
int mr__dnn_engine_configs(void *graph, void *devprop, void **cfgs, int max, char *why,
			   size_t n);
/* An engine config's engine: its global index and whether it notes itself
 * nondeterministic; 0, or -1 when cuDNN cannot say (index -1, nondet 1). */
int mr__dnn_engine_info(void *cfg, int64_t *index, int *nondet);
/* A device-properties descriptor from its JSON form (cuDNN 9.8 and later;
 * CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION): a GPU described, not
 * present - for checking graphs against cuDNN's engines without one; NULL
 * with the reason in why. */
void *mr__dnn_devprop(const char *json, char *why, size_t n);
/* Destroys a descriptor these functions returned; NULL is a no-op. */
void mr__dnn_destroy(void *desc);

/* A cuDNN handle on the calling thread's current device, its work queued
 * on stream (a cudaStream_t); 0, or -1 with why (no GPU: cudnnCreate
 * fails). mr__dnn_handle_free(NULL) is a no-op. */
int mr__dnn_handle(void **handle, void *stream, char *why, size_t n);
void mr__dnn_handle_free(void *handle);
/* The execution plan of engine config cfg on handle's device (kernels
 * compiled and loaded here: seconds for a runtime-compiled engine), with
 * its workspace bytes; 0, or -1 with why. */
int mr__dnn_plan(void *handle, void *cfg, void **plan, int64_t *ws, char *why, size_t n);
/* Queues plan on handle's stream with the count tensors uids[i] at
 * ptrs[i] (device pointers; host pointers for by-value scalars) and the
 * workspace ws (NULL when the plan needs none); 0, or -1 with why. */
int mr__dnn_execute(void *handle, void *plan, int count, const int64_t *uids, void **ptrs,
		    void *ws, char *why, size_t n);

#ifdef __cplusplus
}
#endif

#endif
