/*
 * cudnn_graph.cu - everything that touches libcudnn.so.9 for the layer
 * attention (cudnn_attn.cu is the policy): the library opened at run time
 * (dlopen, the first time a layer considers it - the plugin has no
 * link-time dependency on cuDNN) and the handful of functions resolved
 * from it; the rules that refuse a shape or a version; the fused flash
 * attention's backend graphs; the operation graph, cuDNN's heuristics,
 * plans and execution (cudnn_graph.h).
 *
 * The graphs (Q (B,NH,T,hs), K and V (B,NKV,T,hs) read in place from the
 * packed qkv rows, O (B,NH,T,hs) from out's rows, the statistics
 * (B,NH,T,1) fp32; S and P (B,NH,T,T) are virtual, never in memory) -
 * the operations cuDNN's runtime-fusion engines recognise as scaled
 * dot-product attention, in the order and with the types cuDNN's own
 * frontend lowers its SDPA nodes to:
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
 * for the same bits).
 *
 * cuDNN 9.10.2 or later (MR__DNN_MIN_VERSION), built for this plugin's
 * CUDA major version: cuDNN's frontend refuses its bf16 SDPA on 9.10.0 and
 * 9.10.1 (known bugs) and masks with -inf (what these graphs do) only from
 * 9.10 on; every attribute used here exists since 9.0 (the device
 * properties of mr__dnn_devprop, a test's, since 9.8). Before 9.15.1 the
 * backward needs T a multiple of 128 (the frontend adds a padding mask
 * there to work around a cuDNN bug; these shapes are refused). Head
 * sizes: multiples of 8 up to 128.
 *
 * Every cuDNN call's status is checked; a failure becomes a message naming
 * the step, cuDNN's status and its last error string. Destroying a
 * descriptor is the exception: a failed destroy leaves nothing to do.
 *
 * Non-goals: plans per shape, workspaces, logging and counting (that is
 * cudnn_attn.cu), cuDNN's frontend or any vendored code.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

#include "cuda/cudnn_graph.h"

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


extern "C" int mr__dnn_handle(void **handle, void *stream, char *why, size_t n)
{
	cudnnHandle_t h = NULL;
	cudnnStatus_t st;

	*handle = NULL;
	if (mr__dnn_load(why, n))
		return -1;
	if ((st = dnn.Create(&h)) != CUDNN_STATUS_SUCCESS) {
		dnn_err(why, n, "cudnnCreate", st);
		return -1;
	}
	if ((st = dnn.SetStream(h, (cudaStream_t)stream)) != CUDNN_STATUS_SUCCESS) {
		dnn_err(why, n, "cudnnSetStream", st);
		dnn.Destroy(h); /* cleanup of the failed set-up */
		return -1;
	}
	*handle = h;
	return 0;
}

extern "C" void mr__dnn_handle_free(void *handle)
{
	if (handle)
		dnn.Destroy((cudnnHandle_t)handle); /* cleanup: nothing to do if it fails */
}

extern "C" int mr__dnn_plan(void *handle, void *cfg, void **plan, int64_t *ws, char *why,
			    size_t n)
{
	cudnnHandle_t h = (cudnnHandle_t)handle;
	cudnnStatus_t st;
	desc_t p = NULL;
	int64_t k = 0;

	*plan = NULL;
	*ws = 0;
	if ((st = dnn.BackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p)) ||
	    (st = dnn.BackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
					  &h)) ||
	    (st = dnn.BackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
					  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg)) ||
	    (st = dnn.BackendFinalize(p))) {
		dnn_err(why, n, "execution plan", st);
		mr__dnn_destroy(p);
		return -1;
	}
	if ((st = dnn.BackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
					  CUDNN_TYPE_INT64, 1, &k, ws))) {
		dnn_err(why, n, "workspace size", st);
		mr__dnn_destroy(p);
		return -1;
	}
	if (*ws < 0)
		*ws = 0;
	*plan = p;
	return 0;
}

extern "C" int mr__dnn_execute(void *handle, void *plan, int count, const int64_t *uids,
			       void **ptrs, void *ws, char *why, size_t n)
{
	cudnnStatus_t st;
	desc_t vp = NULL;
	int rc = 0;

	if ((st = dnn.BackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp)) ||
	    (st = dnn.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
					  count, uids)) ||
	    (st = dnn.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
					  CUDNN_TYPE_VOID_PTR, count, ptrs)) ||
	    (st = dnn.BackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
					  1, &ws)) ||
	    (st = dnn.BackendFinalize(vp)) ||
	    (st = dnn.BackendExecute((cudnnHandle_t)handle, plan, vp))) {
		dnn_err(why, n, "cudnnBackendExecute", st);
		rc = -1;
	}
	mr__dnn_destroy(vp); /* the launch has its arguments */
	return rc;
}
