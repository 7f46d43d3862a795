/*
 * cudnn_attn.cu - the whole-layer causal attention (mr_cuda_attn_layer_fwd
 * and _bwd) on tensor cores: cuDNN 9's fused flash attention in bf16,
 * reached through cuDNN's backend (graph) API in libcudnn.so.9, opened at
 * run time (dlopen) the first time a layer considers it - the plugin has
 * no link-time dependency on cuDNN. attention.cu's layer entries call in
 * here first and run their own kernels when this path does not take the
 * call.
 *
 * The graphs (cudnn_attn.h: Q (B,NH,T,hs), K and V (B,NKV,T,hs) read in
 * place from the packed qkv rows, O (B,NH,T,hs) from out's rows, the
 * statistics (B,NH,T,1) fp32; S and P (B,NH,T,T) are virtual, never in
 * memory) - the operations cuDNN's runtime-fusion engines recognise as
 * scaled dot-product attention, in the order and with the types cuDNN's
 * own frontend lowers its SDPA nodes to:
 *   forward  S = Q K^T (matmul; K^T is K's view with the last two dims
 *            swapped); S *= scale; causal mask: row = index(axis 2), col =
 *            index(axis 3), keep = row >= col, S = keep ? S : -inf; softmax
 *            with statistics: M = max(S), E = exp(S - M), Z = sum(E),
 *            Stats = M + log(Z) (the lse of the scaled scores, natural log:
 *            what mr_attn_layer_fwd keeps), P = E / Z (bf16); O = P V.
 *   backward Dsum = sum(dO * O) * 1 (fp32, in the workspace); S = Q K^T *
 *            scale - Stats; the same mask; P = exp(S); dV = P^T dO (P^T a
 *            reshape, bf16); dS = (dO V^T - Dsum) * P * scale; dK = dS^T Q;
 *            dQ = dS K (K a reshape of K^T). With NKV < NH (grouped-query
 *            attention: query head h reads key/value head h / (NH/NKV)) dK
 *            and dV are (B,NH,T,hs) then a sum over each group of heads.
 * dQ is written by its matmul, with no fp32 dQ accumulator tensor: the
 * graph cuDNN's frontend builds when asked for the deterministic algorithm
 * on Hopper (its dP-workspace decomposition, whose workspace grows as
 * B*NH*T*T*2 bytes; the accumulator form adds dQ with atomics). The
 * engines' numerical notes do not tell the two apart (cuDNN 9.19 notes
 * only TENSOR_CORE for both), so determinism rests on the graph's form
 * and is checked on a GPU (test_cuda_attention.c runs the backward twice
 * for the same bits). Among the engine configs cuDNN's heuristics offer,
 * the first whose plan builds is taken - one that does not note itself
 * nondeterministic if any builds; the log line says which.
 *
 * cuDNN 9.10.2 or later (MR__DNN_MIN_VERSION), built for this plugin's
 * CUDA major version: cuDNN's frontend refuses its bf16 SDPA on 9.10.0 and
 * 9.10.1 (known bugs) and masks with -inf (what these graphs do) only from
 * 9.10 on; every attribute used here exists since 9.0. Before 9.15.1 the
 * backward needs T a multiple of 128 (the frontend adds a padding mask
 * there to work around a cuDNN bug; this path refuses those shapes).
 * Head sizes: multiples of 8 up to 128 (the layer entries' own rule -
 * multiples of 32 up to 128 - comes first).
 *
 * Per context (struct mr__dnn): one cuDNN handle on the context's stream,
 * a plan per shape (B, T, NH, NKV, hs, direction, activation type) made
 * the first time the shape runs - the decision (take it, or refuse it and
 * why) made once and logged once (event attn_cudnn, or attn_fallback
 * with the reason) - and one workspace grown stream-ordered as shapes
 * need. Each call that the path does not take while it is on (not
 * MESHRUN_CUDNN=0, not mr_cuda_disable_cudnn) is counted
 * (mr_cuda_attn_fallbacks); each it runs too (mr_cuda_attn_fast_calls).
 *
 * Non-goals: fp32 attention (the own kernels keep it exact), dropout,
 * bias, padding masks, the context-parallel slices (they stay on
 * attention.cu's kernels), cuDNN's frontend or any vendored code.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph.h>

#include "cuda/cudnn_attn.h"
#include "cuda_int.cuh"

extern "C" {
#include "mr_log.h"
}

typedef cudnnBackendDescriptor_t desc_t;

/* ---- libcudnn.so.9, opened once per process ---------------------------- */

/* The functions called through the table (cudnn<Name>); the header's own
 * declarations give their types, so a wrong signature cannot compile. */
#define DNN_FUNCS(X)                                                              \
	X(GetVersion) X(GetCudartVersion) X(GetErrorString) X(Create) X(Destroy)  \
	X(SetStream) X(BackendCreateDescriptor) X(BackendDestroyDescriptor)       \
	X(BackendSetAttribute) X(BackendGetAttribute) X(BackendFinalize)          \
	X(BackendExecute)

static struct {
#define DNN_MEMBER(f) decltype(&cudnn##f) f;
	DNN_FUNCS(DNN_MEMBER)
#undef DNN_MEMBER
	decltype(&cudnnGetLastErrorString) GetLastErrorString; /* NULL: none */
} dnn;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_rc = -1;
static long load_version;
static char load_why[256];

static void load(void)
{
	void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
	const char *e;
	size_t rt;

	if (!h) {
		e = dlerror();
		snprintf(load_why, sizeof(load_why), "unable to load libcudnn.so.9: %s",
			 e ? e : "unknown error");
		return;
	}
#define DNN_RESOLVE(f)                                                                 \
	if (!(dnn.f = reinterpret_cast<decltype(dnn.f)>(dlsym(h, "cudnn" #f)))) {     \
		snprintf(load_why, sizeof(load_why), "libcudnn.so.9 has no 'cudnn%s'", #f); \
		goto fail;                                                             \
	}
	DNN_FUNCS(DNN_RESOLVE)
#undef DNN_RESOLVE
	dnn.GetLastErrorString =
		reinterpret_cast<decltype(dnn.GetLastErrorString)>(dlsym(h, "cudnnGetLastErrorString"));
	load_version = (long)dnn.GetVersion();
	rt = dnn.GetCudartVersion();
	if (load_version < MR__DNN_MIN_VERSION) {
		snprintf(load_why, sizeof(load_why),
			 "cuDNN %ld is older than %ld, the oldest the fast attention takes",
			 load_version, MR__DNN_MIN_VERSION);
		goto fail;
	}
	if ((long)(rt / 1000) != CUDART_VERSION / 1000) {
		snprintf(load_why, sizeof(load_why),
			 "libcudnn.so.9 (cuDNN %ld) is built for CUDA %zu.%zu, this plugin for %d.%d",
			 load_version, rt / 1000, rt % 1000 / 10, CUDART_VERSION / 1000,
			 CUDART_VERSION % 1000 / 10);
		goto fail;
	}
	load_rc = 0;
	return;
fail:
	memset(&dnn, 0, sizeof(dnn));
	load_version = 0;
	dlclose(h);
}

extern "C" int mr__dnn_load(char *why, size_t n)
{
	if (pthread_once(&load_once, load) != 0) {
		if (why)
			snprintf(why, n, "unable to load libcudnn.so.9: pthread_once failed");
		return -1;
	}
	if (load_rc && why)
		snprintf(why, n, "%s", load_why);
	return load_rc;
}

extern "C" long mr__dnn_version(void)
{
	return mr__dnn_load(NULL, 0) ? 0 : load_version;
}

/* "what: status: cuDNN's last message" (one line) into why. */
static void dnn_err(char *why, size_t n, const char *what, cudnnStatus_t st)
{
	char last[256] = "";

	if (dnn.GetLastErrorString)
		dnn.GetLastErrorString(last, sizeof(last));
	for (char *c = last; *c; c++)
		if (*c == '\n' || *c == '\r')
			*c = ' ';
	snprintf(why, n, "%s: %s%s%s", what, dnn.GetErrorString(st), last[0] ? ": " : "", last);
}

extern "C" int mr__dnn_refuses(const struct mr__dnn_shape *s, long version, char *why, size_t n)
{
	if (version < MR__DNN_MIN_VERSION) {
		snprintf(why, n, "cuDNN %ld is older than %ld", version, MR__DNN_MIN_VERSION);
		return 1;
	}
	if (s->hs % 8 || s->hs > 128) {
		snprintf(why, n, "head size %d: cuDNN's fused attention takes multiples of 8 "
				 "up to 128", s->hs);
		return 1;
	}
	if (s->dir == MR__DNN_BWD && s->T < 2) {
		snprintf(why, n, "T %d: cuDNN's attention backward needs T >= 2", s->T);
		return 1;
	}
	if (s->dir == MR__DNN_BWD && s->T % 128 && version < 91501) {
		snprintf(why, n, "T %d: cuDNN %ld's attention backward needs T a multiple of 128 "
				 "(before 9.15.1)", s->T, version);
		return 1;
	}
	return 0;
}

/* ---- the graph's descriptors ---------------------------------------------- */

/* A graph being built: the first failure stops every later step. */
struct build {
	struct mr__dnn_ops *g;
	char *why;
	size_t n;
};

static int ok(const struct build *b)
{
	return !b->g->failed;
}

static void fail(struct build *b, const char *what, cudnnStatus_t st)
{
	if (!b->g->failed)
		dnn_err(b->why, b->n, what, st);
	b->g->failed = 1;
}

/* Checks st of step `what` of the thing named `name`. */
static void ck(struct build *b, cudnnStatus_t st, const char *name, const char *what)
{
	char w[160];

	if (st == CUDNN_STATUS_SUCCESS || b->g->failed)
		return;
	snprintf(w, sizeof(w), "'%s' %s", name, what);
	fail(b, w, st);
}

static desc_t make(struct build *b, cudnnBackendDescriptorType_t t, const char *name)
{
	desc_t d = NULL;

	if (!ok(b))
		return NULL;
	if (b->g->ndesc == MR__DNN_MAX_DESC) {
		snprintf(b->why, b->n, "'%s': more than %d descriptors", name, MR__DNN_MAX_DESC);
		b->g->failed = 1;
		return NULL;
	}
	ck(b, dnn.BackendCreateDescriptor(t, &d), name, "create");
	if (ok(b))
		b->g->desc[b->g->ndesc++] = d;
	return ok(b) ? d : NULL;
}

static void set(struct build *b, desc_t d, cudnnBackendAttributeName_t a,
		cudnnBackendAttributeType_t t, int64_t count, const void *v, const char *name,
		const char *what)
{
	if (ok(b))
		ck(b, dnn.BackendSetAttribute(d, a, t, count, v), name, what);
}

static void finalize(struct build *b, desc_t d, const char *name)
{
	if (ok(b))
		ck(b, dnn.BackendFinalize(d), name, "finalize");
}

/* Flags of a tensor. */
enum { T_VIRTUAL = 1, T_BY_VALUE = 2 };

static desc_t tensor(struct build *b, const char *name, cudnnDataType_t type, const int64_t *dim,
		     const int64_t *stride, int64_t uid, int flags)
{
	desc_t d = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
	int64_t align = 16;
	bool virt = (flags & T_VIRTUAL) != 0, by_value = (flags & T_BY_VALUE) != 0;

	set(b, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, name, "data type");
	set(b, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, name, "dimensions");
	set(b, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, name, "strides");
	set(b, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, name, "unique id");
	set(b, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, name,
	    "alignment");
	if (virt)
		set(b, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, name,
		    "virtual");
	if (by_value)
		set(b, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, name,
		    "by value");
	finalize(b, d, name);
	return ok(b) ? d : NULL;
}

/* A tensor of the variant pack, in its slot (unique id slot + 1). */
static desc_t io(struct build *b, enum mr__dnn_io slot, const char *name, cudnnDataType_t type,
		 const int64_t *dim, const int64_t *stride, int flags)
{
	desc_t d = tensor(b, name, type, dim, stride, (int64_t)slot + 1, flags);

	b->g->io[slot] = d;
	return d;
}

/* A virtual (never in memory) tensor. */
static desc_t virt(struct build *b, const char *name, cudnnDataType_t type, const int64_t *dim,
		   const int64_t *stride)
{
	return tensor(b, name, type, dim, stride, b->g->next_uid++, T_VIRTUAL);
}

static void add_op(struct build *b, desc_t op, const char *name)
{
	finalize(b, op, name);
	if (!ok(b))
		return;
	if (b->g->nops == MR__DNN_MAX_OPS) {
		snprintf(b->why, b->n, "'%s': more than %d operations", name, MR__DNN_MAX_OPS);
		b->g->failed = 1;
		return;
	}
	b->g->op_name[b->g->nops] = name;
	b->g->ops[b->g->nops++] = op;
}

/* y = mode(x, bb, t) computed in prec; bb and t may be NULL (unary and
 * binary modes); axis: GEN_INDEX's. Returns y. */
static desc_t pw(struct build *b, const char *name, cudnnPointwiseMode_t mode,
		 cudnnDataType_t prec, desc_t x, desc_t bb, desc_t t, desc_t y, int64_t axis)
{
	desc_t p = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name), op;
	float alpha = 1.0f;

	set(b, p, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, name, "mode");
	set(b, p, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, name,
	    "precision");
	if (mode == CUDNN_POINTWISE_GEN_INDEX)
		set(b, p, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, name, "axis");
	finalize(b, p, name);
	op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name);
	set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
	    &p, name, "pointwise");
	set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x,
	    name, "x");
	if (bb)
		set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
		    &bb, name, "b");
	if (t)
		set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
		    &t, name, "t");
	set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y,
	    name, "y");
	set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &alpha, name,
	    "alpha1");
	set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha, name,
	    "alpha2");
	add_op(b, op, name);
	return y;
}

/* c = a b over the last two dims (fp32 accumulation), batched over the
 * first two (a head dim of 1 side broadcasts over the other's groups). */
static desc_t mm(struct build *b, const char *name, desc_t a, desc_t bb, desc_t c)
{
	desc_t m = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, name), op;
	cudnnDataType_t comp = CUDNN_DATA_FLOAT;

	set(b, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, name, "compute");
	finalize(b, m, name);
	op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
	set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, name,
	    "a");
	set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bb, name,
	    "b");
	set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, name,
	    "c");
	set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, name,
	    "matmul");
	add_op(b, op, name);
	return c;
}

/* y = x reduced (mode) over the dims where y's is smaller, in fp32. */
static desc_t red(struct build *b, const char *name, cudnnReduceTensorOp_t mode, desc_t x,
		  desc_t y)
{
	desc_t r = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name), op;
	cudnnDataType_t comp = CUDNN_DATA_FLOAT;

	set(b, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, name, "compute");
	set(b, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, name,
	    "operator");
	finalize(b, r, name);
	op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
	set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name,
	    "x");
	set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name,
	    "y");
	set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r, name,
	    "reduction");
	add_op(b, op, name);
	return y;
}

/* y = x seen with y's dims, strides and type (a transpose here). */
static desc_t reshape(struct build *b, const char *name, desc_t x, desc_t y)
{
	desc_t op = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);

	set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, name,
	    "x");
	set(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, name,
	    "y");
	add_op(b, op, name);
	return y;
}

/* The dims and strides of a graph's tensors. */
struct layout {
	int64_t q[4], q_st[4];     /* Q, dQ (B,NH,T,hs) in the qkv rows */
	int64_t kt[4], kt_st[4];   /* K^T, V^T (B,NKV,hs,T) in the qkv rows */
	int64_t kv[4], kv_st[4];   /* K, V, dK, dV (B,NKV,T,hs) in the qkv rows */
	int64_t o[4], o_st[4];     /* O, dO (B,NH,T,hs) in out's rows */
	int64_t r[4], r_st[4];     /* per query row (B,NH,T,1): Stats, M, Z, Dsum */
	int64_t s[4], s_st[4];     /* scores (B,NH,T,T) */
	int64_t st[4], st_st[4];   /* scores transposed (B,NH,T,T) for P^T, dS^T */
	int64_t full[4], full_st[4]; /* dK, dV per query head (B,NH,T,hs) */
	int64_t dotmul[4], dotmul_st[4]; /* dO * O (the frontend's strides) */
	int64_t one[4];            /* scalars (1,1,1,1) */
};

#define SET4(a, x0, x1, x2, x3) \
	((a)[0] = (x0), (a)[1] = (x1), (a)[2] = (x2), (a)[3] = (x3))

static void layout_of(const struct mr__dnn_shape *s, struct layout *l)
{
	int64_t B = s->B, T = s->T, H = s->NH, KV = s->NKV, D = s->hs;
	int64_t row = (H + 2 * KV) * D, C = H * D;

	SET4(l->q, B, H, T, D);
	SET4(l->q_st, T * row, D, row, 1);
	SET4(l->kt, B, KV, D, T);
	SET4(l->kt_st, T * row, D, 1, row);
	SET4(l->kv, B, KV, T, D);
	SET4(l->kv_st, T * row, D, row, 1);
	SET4(l->o, B, H, T, D);
	SET4(l->o_st, T * C, D, C, 1);
	SET4(l->r, B, H, T, 1);
	SET4(l->r_st, H * T, T, 1, 1);
	SET4(l->s, B, H, T, T);
	SET4(l->s_st, H * T * T, T * T, T, 1);
	SET4(l->st, B, H, T, T);
	SET4(l->st_st, H * T * T, T * T, 1, T);
	SET4(l->full, B, H, T, D);
	SET4(l->full_st, H * T * D, T * D, D, 1);
	SET4(l->dotmul, B, H, T, D);
	SET4(l->dotmul_st, H * T * D, T * D, H * D, 1);
	SET4(l->one, 1, 1, 1, 1);
}

/* The causal mask of x (scores, fp32): x where key <= query, else -inf. */
static desc_t causal(struct build *b, const struct layout *l, desc_t x, desc_t neg_inf)
{
	desc_t row = virt(b, "row index", CUDNN_DATA_INT32, l->s, l->s_st);
	desc_t col = virt(b, "col index", CUDNN_DATA_INT32, l->s, l->s_st);
	desc_t keep = virt(b, "keep", CUDNN_DATA_BOOLEAN, l->s, l->s_st);
	desc_t y = virt(b, "masked", CUDNN_DATA_FLOAT, l->s, l->s_st);

	pw(b, "gen row index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, row, 2);
	pw(b, "gen col index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, col, 3);
	pw(b, "row >= col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
	return pw(b, "causal select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf,
		  keep, y, -1);
}

#define F32 CUDNN_DATA_FLOAT
#define BF16 CUDNN_DATA_BFLOAT16

static void build_fwd(struct build *b, const struct layout *l)
{
	desc_t q = io(b, MR__DNN_Q, "Q", BF16, l->q, l->q_st, 0);
	desc_t kt = io(b, MR__DNN_K, "K^T", BF16, l->kt, l->kt_st, 0);
	desc_t v = io(b, MR__DNN_V, "V", BF16, l->kv, l->kv_st, 0);
	desc_t scale = io(b, MR__DNN_SCALE, "scale", F32, l->one, l->one, T_BY_VALUE);
	desc_t neg_inf = io(b, MR__DNN_NEG_INF, "-inf", F32, l->one, l->one, T_BY_VALUE);
	desc_t o = io(b, MR__DNN_O, "O", BF16, l->o, l->o_st, 0);
	desc_t stats = io(b, MR__DNN_STATS, "Stats", F32, l->r, l->r_st, 0);
	desc_t s, m, e, z;

	s = mm(b, "Q K^T", q, kt, virt(b, "S", F32, l->s, l->s_st));
	s = pw(b, "S * scale", CUDNN_POINTWISE_MUL, F32, s, scale, NULL,
	       virt(b, "S scaled", F32, l->s, l->s_st), -1);
	s = causal(b, l, s, neg_inf);
	m = red(b, "max", CUDNN_REDUCE_TENSOR_MAX, s, virt(b, "M", F32, l->r, l->r_st));
	s = pw(b, "S - M", CUDNN_POINTWISE_SUB, F32, s, m, NULL,
	       virt(b, "S - M", F32, l->s, l->s_st), -1);
	e = pw(b, "exp", CUDNN_POINTWISE_EXP, F32, s, NULL, NULL, virt(b, "E", F32, l->s, l->s_st),
	       -1);
	z = red(b, "sum", CUDNN_REDUCE_TENSOR_ADD, e, virt(b, "Z", F32, l->r, l->r_st));
	pw(b, "M + log Z", CUDNN_POINTWISE_ADD, F32, m,
	   pw(b, "log", CUDNN_POINTWISE_LOG, F32, z, NULL, NULL,
	      virt(b, "log Z", F32, l->r, l->r_st), -1),
	   NULL, stats, -1);
	e = pw(b, "E / Z", CUDNN_POINTWISE_DIV, F32, e, z, NULL, virt(b, "P", BF16, l->s, l->s_st),
	       -1);
	mm(b, "P V", e, v, o);
}

static void build_bwd(struct build *b, const struct layout *l, int gqa)
{
	desc_t q = io(b, MR__DNN_Q, "Q", BF16, l->q, l->q_st, 0);
	desc_t kt = io(b, MR__DNN_K, "K^T", BF16, l->kt, l->kt_st, 0);
	desc_t vt = io(b, MR__DNN_V, "V^T", BF16, l->kt, l->kt_st, 0);
	desc_t o = io(b, MR__DNN_O, "O", BF16, l->o, l->o_st, 0);
	desc_t d_o = io(b, MR__DNN_DO, "dO", BF16, l->o, l->o_st, 0);
	desc_t stats = io(b, MR__DNN_STATS, "Stats", F32, l->r, l->r_st, 0);
	desc_t scale = io(b, MR__DNN_SCALE, "scale", F32, l->one, l->one, T_BY_VALUE);
	desc_t neg_inf = io(b, MR__DNN_NEG_INF, "-inf", F32, l->one, l->one, T_BY_VALUE);
	desc_t one = io(b, MR__DNN_ONE, "one", F32, l->one, l->one, T_BY_VALUE);
	desc_t dsum = io(b, MR__DNN_DSUM, "Dsum", F32, l->r, l->r_st, 0);
	desc_t dq = io(b, MR__DNN_DQ, "dQ", BF16, l->q, l->q_st, 0);
	desc_t dk = io(b, MR__DNN_DK, "dK", BF16, l->kv, l->kv_st, 0);
	desc_t dv = io(b, MR__DNN_DV, "dV", BF16, l->kv, l->kv_st, 0);
	desc_t t, s, p, ds;

	/* Dsum = rowsum(dO * O): what the fused kernels subtract from dP */
	t = pw(b, "dO * O", CUDNN_POINTWISE_MUL, F32, d_o, o, NULL,
	       virt(b, "dO * O", F32, l->dotmul, l->dotmul_st), -1);
	t = red(b, "rowsum dO * O", CUDNN_REDUCE_TENSOR_ADD, t,
		virt(b, "rowsum", F32, l->r, l->r_st));
	pw(b, "Dsum", CUDNN_POINTWISE_MUL, F32, t, one, NULL, dsum, -1);

	/* P = exp(S * scale - Stats), masked */
	s = mm(b, "Q K^T", q, kt, virt(b, "S", F32, l->s, l->s_st));
	s = pw(b, "S * scale", CUDNN_POINTWISE_MUL, F32, s, scale, NULL,
	       virt(b, "S scaled", F32, l->s, l->s_st), -1);
	s = pw(b, "S - Stats", CUDNN_POINTWISE_SUB, F32, s, stats, NULL,
	       virt(b, "S - Stats", F32, l->s, l->s_st), -1);
	s = causal(b, l, s, neg_inf);
	p = pw(b, "exp", CUDNN_POINTWISE_EXP, F32, s, NULL, NULL, virt(b, "P", F32, l->s, l->s_st),
	       -1);

	/* dV = P^T dO (summed over each key/value head's group) */
	t = reshape(b, "P^T", p, virt(b, "P^T", BF16, l->st, l->st_st));
	if (!gqa) {
		mm(b, "P^T dO", t, d_o, dv);
	} else {
		t = mm(b, "P^T dO", t, d_o, virt(b, "dV per head", BF16, l->full, l->full_st));
		red(b, "dV group sum", CUDNN_REDUCE_TENSOR_ADD, t, dv);
	}

	/* dS = (dO V^T - Dsum) * P * scale */
	ds = mm(b, "dO V^T", d_o, vt, virt(b, "dP", F32, l->s, l->s_st));
	ds = pw(b, "dP - Dsum", CUDNN_POINTWISE_SUB, F32, ds, dsum, NULL,
		virt(b, "dP - Dsum", F32, l->s, l->s_st), -1);
	ds = pw(b, "* P", CUDNN_POINTWISE_MUL, F32, ds, p, NULL,
		virt(b, "dS unscaled", F32, l->s, l->s_st), -1);
	ds = pw(b, "dS * scale", CUDNN_POINTWISE_MUL, F32, ds, scale, NULL,
		virt(b, "dS", F32, l->s, l->s_st), -1);

	/* dK = dS^T Q (summed over each group) */
	t = reshape(b, "dS^T", ds, virt(b, "dS^T", BF16, l->st, l->st_st));
	if (!gqa) {
		mm(b, "dS^T Q", t, q, dk);
	} else {
		t = mm(b, "dS^T Q", t, q, virt(b, "dK per head", BF16, l->full, l->full_st));
		red(b, "dK group sum", CUDNN_REDUCE_TENSOR_ADD, t, dk);
	}

	/* dQ = dS K, written (no fp32 accumulator: the deterministic form) */
	t = reshape(b, "K", kt, virt(b, "K", F32, l->kv, l->kv_st));
	mm(b, "dS K", ds, t, dq);
}

extern "C" int mr__dnn_ops_build(struct mr__dnn_ops *g, const struct mr__dnn_shape *s, char *why,
				 size_t n)
{
	struct build b = { g, why, n };
	struct layout l;

	memset(g, 0, sizeof(*g));
	g->next_uid = 100;
	if (mr__dnn_load(why, n)) {
		g->failed = 1;
		return -1;
	}
	if (s->B <= 0 || s->T <= 0 || s->NH <= 0 || s->NKV <= 0 || s->hs <= 0 ||
	    s->NH % s->NKV) {
		snprintf(why, n, "bad attention shape B %d T %d NH %d NKV %d hs %d", s->B, s->T,
			 s->NH, s->NKV, s->hs);
		g->failed = 1;
		return -1;
	}
	layout_of(s, &l);
	if (s->dir == MR__DNN_FWD)
		build_fwd(&b, &l);
	else
		build_bwd(&b, &l, s->NKV != s->NH);
	return ok(&b) ? 0 : -1;
}

extern "C" void mr__dnn_ops_release(struct mr__dnn_ops *g)
{
	/* cleanup: a destroy that fails leaves nothing for us to do */
	while (g->ndesc > 0)
		dnn.BackendDestroyDescriptor(g->desc[--g->ndesc]);
	g->nops = 0;
	memset(g->io, 0, sizeof(g->io));
}

extern "C" int mr__dnn_tensor_get(void *tensor, int *dtype, int64_t dim[4], int64_t stride[4])
{
	cudnnDataType_t t;
	int64_t n = 0, nd = 0, ns = 0;

	if (mr__dnn_load(NULL, 0) ||
	    dnn.BackendGetAttribute(tensor, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
				    &n, &t) != CUDNN_STATUS_SUCCESS ||
	    dnn.BackendGetAttribute(tensor, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, &nd,
				    dim) != CUDNN_STATUS_SUCCESS ||
	    dnn.BackendGetAttribute(tensor, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, &ns,
				    stride) != CUDNN_STATUS_SUCCESS ||
	    n != 1 || nd != 4 || ns != 4)
		return -1;
	*dtype = (int)t;
	return 0;
}

/* ---- plans per shape, in the context ---------------------------------- */

#define MR__DNN_PLANS 32
#define MAX_CFGS 8

/* A shape's decision, and when taken its graph and plan. */
struct dnn_plan {
	struct mr__dnn_shape key;
	enum mr_cuda_dtype act;  /* the activation type it was decided for */
	int ok;                  /* 1: runs through cuDNN; 0: refused (why) */
	char why[224];
	struct mr__dnn_ops ops;
	desc_t graph, cfg, plan; /* the operation graph, engine config, plan */
	int64_t ws;              /* cuDNN's workspace bytes */
	size_t front;            /* our bytes in front of it (bwd: Dsum) */
	int64_t engine;          /* the engine's global index (-1: unknown) */
	int nondet;              /* the engine notes itself nondeterministic */
	float scale, neg_inf, one; /* the by-value scalars */
};

struct mr__dnn {
	cudnnHandle_t handle;
	int handle_state;        /* 0: not made yet; 1: made; -1: failed (handle_why) */
	char handle_why[224];
	struct dnn_plan plans[MR__DNN_PLANS];
	int nplans;
	struct dnn_plan full;    /* the answer once plans is full */
	void *ws;                /* workspace: [front | cuDNN's], stream-ordered */
	size_t ws_bytes;
	int unaligned_logged;
};

static void plan_release(struct dnn_plan *p)
{
	/* cleanup: a destroy that fails leaves nothing for us to do */
	mr__dnn_destroy(p->plan);
	mr__dnn_destroy(p->cfg);
	mr__dnn_destroy(p->graph);
	p->plan = p->cfg = p->graph = NULL;
	mr__dnn_ops_release(&p->ops);
}

static int handle_of(struct mr_cuda *cu, struct mr__dnn *d, char *why, size_t n)
{
	cudnnStatus_t st;
	cudaError_t e;

	if (d->handle_state == 0) {
		d->handle_state = -1;
		if ((e = cudaSetDevice(cu->device)) != cudaSuccess) {
			cudaGetLastError();
			snprintf(d->handle_why, sizeof(d->handle_why), "cudaSetDevice: %s",
				 cudaGetErrorString(e));
		} else if ((st = dnn.Create(&d->handle)) != CUDNN_STATUS_SUCCESS) {
			dnn_err(d->handle_why, sizeof(d->handle_why), "cudnnCreate", st);
			d->handle = NULL;
		} else if ((st = dnn.SetStream(d->handle, cu->stream)) != CUDNN_STATUS_SUCCESS) {
			dnn_err(d->handle_why, sizeof(d->handle_why), "cudnnSetStream", st);
			dnn.Destroy(d->handle); /* cleanup of the failed set-up */
			d->handle = NULL;
		} else {
			d->handle_state = 1;
		}
	}
	if (d->handle_state < 0) {
		snprintf(why, n, "%s", d->handle_why);
		return -1;
	}
	return 0;
}

extern "C" void mr__dnn_destroy(void *desc)
{
	if (desc)
		dnn.BackendDestroyDescriptor(desc); /* cleanup: nothing to do if it fails */
}

extern "C" void *mr__dnn_devprop(const char *json, char *why, size_t n)
{
	desc_t d = NULL;
	cudnnStatus_t st;

	if (mr__dnn_load(why, n))
		return NULL;
	if ((st = dnn.BackendCreateDescriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &d)) ||
	    (st = dnn.BackendSetAttribute(d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
					  CUDNN_TYPE_CHAR, (int64_t)strlen(json), json)) ||
	    (st = dnn.BackendFinalize(d))) {
		dnn_err(why, n, "device properties", st);
		mr__dnn_destroy(d);
		return NULL;
	}
	return d;
}

extern "C" int mr__dnn_graph(struct mr__dnn_ops *g, void *handle, void **graph, char *why,
			     size_t n)
{
	cudnnHandle_t h = (cudnnHandle_t)handle;
	desc_t d = NULL;
	cudnnStatus_t st;

	*graph = NULL;
	if ((st = dnn.BackendCreateDescriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &d)) ||
	    (st = dnn.BackendSetAttribute(d, CUDNN_ATTR_OPERATIONGRAPH_OPS,
					  CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops)) ||
	    (h && (st = dnn.BackendSetAttribute(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
						CUDNN_TYPE_HANDLE, 1, &h))) ||
	    (st = dnn.BackendFinalize(d))) {
		dnn_err(why, n, "operation graph", st);
		mr__dnn_destroy(d);
		return -1;
	}
	*graph = d;
	return 0;
}

extern "C" int mr__dnn_engine_configs(void *graph, void *devprop, void **cfgs, int max, char *why,
				      size_t n)
{
	cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
	cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
	int64_t count = 0, got = 0;
	desc_t heur = NULL;
	int made = 0;

	for (int i = 0; i < max; i++)
		cfgs[i] = NULL;
	if ((st = dnn.BackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur)) ||
	    (st = dnn.BackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
					  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph)) ||
	    (st = dnn.BackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
					  &mode)) ||
	    (devprop && (st = dnn.BackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP,
						      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
						      &devprop))) ||
	    (st = dnn.BackendFinalize(heur)) ||
	    (st = dnn.BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
					  CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL)))
		goto fail;
	if (count > max)
		count = max;
	for (; made < count; made++)
		if ((st = dnn.BackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[made])))
			goto fail;
	if (count > 0 &&
	    (st = dnn.BackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
					  CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs)))
		goto fail;
	if (got > count)
		got = count;
	for (int i = (int)got; i < made; i++) { /* the ones cuDNN did not fill */
		mr__dnn_destroy(cfgs[i]);
		cfgs[i] = NULL;
	}
	mr__dnn_destroy(heur);
	if (got == 0) /* cuDNN's own message says why (an engine's missing prerequisite...) */
		dnn_err(why, n, "cuDNN's heuristics offer no engine for this attention graph",
			CUDNN_STATUS_NOT_SUPPORTED);
	return (int)got;
fail:
	dnn_err(why, n, "engine heuristics", st);
	for (int i = 0; i < made; i++) {
		mr__dnn_destroy(cfgs[i]);
		cfgs[i] = NULL;
	}
	mr__dnn_destroy(heur);
	return -1;
}

extern "C" int mr__dnn_engine_info(void *cfg, int64_t *index, int *nondet)
{
	cudnnBackendNumericalNote_t notes[16];
	desc_t eng = NULL;
	int64_t n = 0;
	int rc = -1;

	*index = -1;
	*nondet = 1;
	if (dnn.BackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) !=
	    CUDNN_STATUS_SUCCESS)
		return -1;
	if (dnn.BackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
				    CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) ==
		    CUDNN_STATUS_SUCCESS &&
	    dnn.BackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
				    CUDNN_TYPE_NUMERICAL_NOTE, 16, &n, notes) ==
		    CUDNN_STATUS_SUCCESS) {
		*nondet = 0;
		for (int64_t i = 0; i < n && i < 16; i++)
			if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)
				*nondet = 1;
		if (dnn.BackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
					    &n, index) != CUDNN_STATUS_SUCCESS)
			*index = -1;
		rc = 0;
	}
	mr__dnn_destroy(eng);
	return rc;
}

/* Builds p's graph, operation graph and plan (p->key decided to run);
 * 0, or -1 with the reason in p->why (p's descriptors then released). */
static int plan_build(struct mr_cuda *cu, struct mr__dnn *d, struct dnn_plan *p)
{
	void *cfgs[MAX_CFGS] = { NULL };
	desc_t plan = NULL;
	cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
	int64_t n = 0;
	int got = 0, chosen = -1, rc = -1, tried = 0;

	if (handle_of(cu, d, p->why, sizeof(p->why)) ||
	    mr__dnn_ops_build(&p->ops, &p->key, p->why, sizeof(p->why)) ||
	    mr__dnn_graph(&p->ops, d->handle, &p->graph, p->why, sizeof(p->why)) ||
	    (got = mr__dnn_engine_configs(p->graph, NULL, cfgs, MAX_CFGS, p->why,
					  sizeof(p->why))) <= 0)
		goto out;
	/* the first engine whose plan builds, one without a nondeterminism
	 * note if any builds */
	for (int i = 0; i < got && (chosen < 0 || p->nondet); i++) {
		int64_t index;
		int nondet;

		mr__dnn_engine_info(cfgs[i], &index, &nondet);
		if (chosen >= 0 && nondet)
			continue; /* no better than the one we have */
		tried++;
		if ((st = dnn.BackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
						      &plan)) ||
		    (st = dnn.BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
						  CUDNN_TYPE_HANDLE, 1, &d->handle)) ||
		    (st = dnn.BackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
						  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i])) ||
		    (st = dnn.BackendFinalize(plan))) {
			dnn_err(p->why, sizeof(p->why), "execution plan", st); /* kept if none builds */
			mr__dnn_destroy(plan);
			plan = NULL;
			continue;
		}
		mr__dnn_destroy(p->plan); /* replaced by a better one */
		p->plan = plan;
		plan = NULL;
		chosen = i;
		p->engine = index;
		p->nondet = nondet;
	}
	if (chosen < 0) {
		char w[sizeof(p->why)];

		snprintf(w, sizeof(w), "no plan of %d engine(s) builds (last: %s)", tried, p->why);
		snprintf(p->why, sizeof(p->why), "%s", w);
		goto out;
	}
	p->cfg = cfgs[chosen];
	cfgs[chosen] = NULL;
	if ((st = dnn.BackendGetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
					  CUDNN_TYPE_INT64, 1, &n, &p->ws))) {
		dnn_err(p->why, sizeof(p->why), "workspace size", st);
		goto out;
	}
	if (p->ws < 0)
		p->ws = 0;
	p->front = p->key.dir == MR__DNN_BWD
			   ? ((size_t)p->key.B * p->key.NH * p->key.T * sizeof(float) + 255) &
				     ~(size_t)255
			   : 0;
	p->scale = 1.0f / sqrtf((float)p->key.hs);
	p->neg_inf = -INFINITY;
	p->one = 1.0f;
	rc = 0;
out:
	for (int i = 0; i < MAX_CFGS; i++) /* the engine configs not taken */
		mr__dnn_destroy(cfgs[i]);
	if (rc)
		plan_release(p);
	return rc;
}

static const char *dir_name(enum mr__dnn_dir dir)
{
	return dir == MR__DNN_FWD ? "fwd" : "bwd";
}

/* The decision for shape s in the context's activation type: found, or
 * made now (and logged). */
static struct dnn_plan *decide(struct mr_cuda *cu, struct mr__dnn *d,
			       const struct mr__dnn_shape *s)
{
	struct dnn_plan *p;
	long version = 0;

	for (int i = 0; i < d->nplans; i++)
		if (!memcmp(&d->plans[i].key, s, sizeof(*s)) && d->plans[i].act == cu->act)
			return &d->plans[i];
	if (d->nplans == MR__DNN_PLANS) {
		p = &d->full;
		if (!p->why[0]) {
			snprintf(p->why, sizeof(p->why),
				 "more than %d attention shapes in one context", MR__DNN_PLANS);
			mr_log_warn("attn_fallback", "dir=%s B=%d T=%d NH=%d NKV=%d hs=%d reason=%s",
				    dir_name(s->dir), s->B, s->T, s->NH, s->NKV, s->hs,
				    mr_log_q(p->why));
		}
		return p;
	}
	p = &d->plans[d->nplans++];
	memset(p, 0, sizeof(*p));
	p->key = *s;
	p->act = cu->act;
	p->engine = -1;
	if (cu->act == MR_CUDA_F32)
		snprintf(p->why, sizeof(p->why),
			 "fp32 activations: cuDNN's fused attention is bf16, the fp32 kernels run");
	else if (!mr__dnn_load(p->why, sizeof(p->why)) &&
		 !mr__dnn_refuses(s, version = mr__dnn_version(), p->why, sizeof(p->why)))
		p->ok = plan_build(cu, d, p) == 0;
	if (p->ok)
		mr_log_info("attn_cudnn",
			    "dir=%s B=%d T=%d NH=%d NKV=%d hs=%d cudnn=%ld engine=%lld "
			    "workspace_MiB=%.1f nondeterministic_note=%s",
			    dir_name(s->dir), s->B, s->T, s->NH, s->NKV, s->hs, version,
			    (long long)p->engine, (double)(p->front + (size_t)p->ws) / 1048576.0,
			    p->nondet ? "yes" : "no");
	else
		mr_log_warn("attn_fallback", "dir=%s B=%d T=%d NH=%d NKV=%d hs=%d reason=%s",
			    dir_name(s->dir), s->B, s->T, s->NH, s->NKV, s->hs, mr_log_q(p->why));
	return p;
}

/* The call is not taken: counted, the first reason kept. Returns 1. */
static int fallback(struct mr_cuda *cu, const char *why)
{
	if (!cu->attn_fallbacks++)
		snprintf(cu->attn_why, sizeof(cu->attn_why), "%s", why);
	return 1;
}

/* Workspace of at least bytes, valid for work queued on the stream. */
static int workspace(struct mr_cuda *cu, struct mr__dnn *d, size_t bytes, char *why, size_t n)
{
	void *p = NULL;
	cudaError_t e;

	if (bytes <= d->ws_bytes)
		return 0;
	/* stream-ordered: the old one is released after the work queued on it */
	if (d->ws && (e = cudaFreeAsync(d->ws, cu->stream)) != cudaSuccess) {
		cudaGetLastError();
		snprintf(why, n, "cudnn workspace free: %s", cudaGetErrorString(e));
		return -1;
	}
	d->ws = NULL;
	d->ws_bytes = 0;
	if ((e = cudaMallocAsync(&p, bytes, cu->stream)) != cudaSuccess) {
		cudaGetLastError();
		snprintf(why, n, "cudnn workspace of %zu bytes: %s", bytes, cudaGetErrorString(e));
		return -1;
	}
	d->ws = p;
	d->ws_bytes = bytes;
	return 0;
}

/* Runs shape s through cuDNN with the variant pack's pointers ptr (by
 * slot; the scalars and Dsum are filled in here). 0: ran; 1: not taken
 * (the caller runs its own kernels). */
static int run(struct mr_cuda *cu, const struct mr__dnn_shape *s, void *const *ptr)
{
	int64_t uids[MR__DNN_NIO];
	void *ptrs[MR__DNN_NIO], *cws;
	struct dnn_plan *p;
	struct mr__dnn *d;
	desc_t vp = NULL;
	cudnnStatus_t st;
	int np = 0;

	if (!cu->use_dnn)
		return 1;
	if (!cu->dnn && !(cu->dnn = (struct mr__dnn *)calloc(1, sizeof(*cu->dnn))))
		return fallback(cu, "out of host memory for the cuDNN state");
	d = cu->dnn;
	p = decide(cu, d, s);
	if (!p->ok)
		return fallback(cu, p->why);
	for (int i = 0; i < MR__DNN_NIO; i++) {
		if (!p->ops.io[i])
			continue;
		uids[np] = i + 1;
		if (i == MR__DNN_SCALE || i == MR__DNN_NEG_INF || i == MR__DNN_ONE) {
			ptrs[np++] = i == MR__DNN_SCALE ? &p->scale
						       : i == MR__DNN_ONE ? &p->one : &p->neg_inf;
			continue;
		}
		if (i != MR__DNN_DSUM && ((uintptr_t)ptr[i] & 15)) {
			if (!d->unaligned_logged++)
				mr_log_warn("attn_fallback", "dir=%s B=%d T=%d NH=%d NKV=%d hs=%d "
					    "reason=%s", dir_name(s->dir), s->B, s->T, s->NH,
					    s->NKV, s->hs,
					    mr_log_q("a tensor is not 16-byte aligned"));
			return fallback(cu, "a tensor is not 16-byte aligned");
		}
		ptrs[np++] = ptr[i]; /* Dsum: set below, once the workspace is there */
	}
	if (workspace(cu, d, p->front + (size_t)p->ws, p->why, sizeof(p->why))) {
		p->ok = 0; /* refused from now on: logged once */
		mr_log_warn("attn_fallback", "dir=%s B=%d T=%d NH=%d NKV=%d hs=%d reason=%s",
			    dir_name(s->dir), s->B, s->T, s->NH, s->NKV, s->hs, mr_log_q(p->why));
		return fallback(cu, p->why);
	}
	for (int i = 0; i < np; i++)
		if (uids[i] == MR__DNN_DSUM + 1)
			ptrs[i] = d->ws;
	cws = p->ws > 0 ? (char *)d->ws + p->front : NULL;
	if ((st = dnn.BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp)) ||
	    (st = dnn.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
					  np, uids)) ||
	    (st = dnn.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
					  CUDNN_TYPE_VOID_PTR, np, ptrs)) ||
	    (st = dnn.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
					  1, &cws)) ||
	    (st = dnn.BackendFinalize(vp)) ||
	    (st = dnn.BackendExecute(d->handle, p->plan, vp))) {
		dnn_err(p->why, sizeof(p->why), "cudnnBackendExecute", st);
		p->ok = 0; /* refused from now on: logged once */
		mr_log_warn("attn_fallback", "dir=%s B=%d T=%d NH=%d NKV=%d hs=%d reason=%s",
			    dir_name(s->dir), s->B, s->T, s->NH, s->NKV, s->hs, mr_log_q(p->why));
		if (vp)
			dnn.BackendDestroyDescriptor(vp); /* cleanup */
		return fallback(cu, p->why);
	}
	dnn.BackendDestroyDescriptor(vp); /* cleanup: executed */
	cu->attn_fast++;
	return 0;
}

/* Bytes of one element of the context's activation type. */
static size_t act_size(const struct mr_cuda *cu)
{
	return cu->act == MR_CUDA_F32 ? sizeof(float) : sizeof(mr_bf16);
}

int mr__dnn_layer_fwd(struct mr_cuda *cu, void *out, float *lse, const void *qkv, int B, int T,
		      int C, int NH, int NKV)
{
	struct mr__dnn_shape s = { B, T, NH, NKV, C / NH, MR__DNN_FWD };
	size_t esz = act_size(cu), kv = (size_t)NKV * (size_t)(C / NH);
	void *ptr[MR__DNN_NIO] = { NULL };

	ptr[MR__DNN_Q] = (void *)qkv;
	ptr[MR__DNN_K] = (char *)qkv + (size_t)C * esz;
	ptr[MR__DNN_V] = (char *)qkv + ((size_t)C + kv) * esz;
	ptr[MR__DNN_O] = out;
	ptr[MR__DNN_STATS] = lse;
	return run(cu, &s, ptr);
}

int mr__dnn_layer_bwd(struct mr_cuda *cu, void *dqkv, const void *dout, const void *qkv,
		      const void *out, const float *lse, int B, int T, int C, int NH, int NKV)
{
	struct mr__dnn_shape s = { B, T, NH, NKV, C / NH, MR__DNN_BWD };
	size_t esz = act_size(cu), kv = (size_t)NKV * (size_t)(C / NH);
	void *ptr[MR__DNN_NIO] = { NULL };

	ptr[MR__DNN_Q] = (void *)qkv;
	ptr[MR__DNN_K] = (char *)qkv + (size_t)C * esz;
	ptr[MR__DNN_V] = (char *)qkv + ((size_t)C + kv) * esz;
	ptr[MR__DNN_O] = (void *)out;
	ptr[MR__DNN_DO] = (void *)dout;
	ptr[MR__DNN_STATS] = (void *)lse;
	ptr[MR__DNN_DQ] = dqkv;
	ptr[MR__DNN_DK] = (char *)dqkv + (size_t)C * esz;
	ptr[MR__DNN_DV] = (char *)dqkv + ((size_t)C + kv) * esz;
	return run(cu, &s, ptr);
}

void mr__dnn_free(struct mr_cuda *cu)
{
	struct mr__dnn *d = cu->dnn;

	if (!d)
		return;
	for (int i = 0; i < d->nplans; i++)
		plan_release(&d->plans[i]);
	if (d->ws)
		cudaFree(d->ws); /* cleanup: the stream was synced by mr_cuda_free */
	if (d->handle)
		dnn.Destroy(d->handle); /* cleanup */
	free(d);
	cu->dnn = NULL;
}

extern "C" long mr_cuda_attn_fast_calls(const struct mr_cuda *cu)
{
	return cu->attn_fast;
}

extern "C" long mr_cuda_attn_fallbacks(const struct mr_cuda *cu, const char **why)
{
	if (why)
		*why = cu->attn_why;
	return cu->attn_fallbacks;
}

extern "C" void mr_cuda_disable_cudnn(struct mr_cuda *cu)
{
	cu->use_dnn = 0;
}
