/*
 * cudnn_attn.cu - the whole-layer causal attention (mr_cuda_attn_layer_fwd
 * and _bwd) on tensor cores: cuDNN 9's fused flash attention in bf16
 * (cudnn_graph.cu builds its graphs and talks to libcudnn.so.9), decided,
 * planned and run per shape in the context. attention.cu's layer entries
 * call in here first and run their own kernels when this path does not
 * take the call.
 *
 * Per context (struct mr__dnn): one cuDNN handle on the context's stream,
 * a plan per shape (B, T, NH, NKV, hs, direction, activation type) made
 * the first time the shape runs - the decision (take it, or refuse it and
 * why: fp32 activations, no usable cuDNN, a refused shape, no engine or
 * plan, later a failed launch or workspace) made once and logged once
 * (event attn_cudnn with the engine and workspace, or attn_fallback with
 * the reason) - and one workspace, [our Dsum | cuDNN's], grown
 * stream-ordered as shapes need. Each call that the path does not take
 * while it is on (not MESHRUN_CUDNN=0, not mr_cuda_disable_cudnn) is
 * counted (mr_cuda_attn_fallbacks, with the first reason); each it runs
 * too (mr_cuda_attn_fast_calls). Among the engine configs cuDNN's
 * heuristics offer for a shape, the first whose plan builds is taken -
 * one that does not note itself nondeterministic if any builds; the log
 * line says which.
 *
 * Non-goals: fp32 attention (the own kernels keep it exact), dropout,
 * bias, padding masks, the context-parallel slices (they stay on
 * attention.cu's kernels).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cudnn_graph.h"
#include "cuda_int.cuh"

extern "C" {
#include "mr_log.h"
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
	void *graph, *cfg, *plan; /* the operation graph, engine config, plan */
	int64_t ws;              /* cuDNN's workspace bytes */
	size_t front;            /* our bytes in front of it (bwd: Dsum) */
	int64_t engine;          /* the engine's global index (-1: unknown) */
	int nondet;              /* the engine notes itself nondeterministic */
	float scale, neg_inf, one; /* the by-value scalars */
};

struct mr__dnn {
	void *handle;            /* cudnnHandle_t */
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

/* The context's cuDNN handle, made the first time (on its device and
 * stream); 0, or -1 with why (the same reason every later time). */
static int handle_of(struct mr_cuda *cu, struct mr__dnn *d, char *why, size_t n)
{
	cudaError_t e;

	if (d->handle_state == 0) {
		d->handle_state = -1;
		if ((e = cudaSetDevice(cu->device)) != cudaSuccess) {
			cudaGetLastError();
			snprintf(d->handle_why, sizeof(d->handle_why), "cudaSetDevice: %s",
				 cudaGetErrorString(e));
		} else if (!mr__dnn_handle(&d->handle, cu->stream, d->handle_why,
					   sizeof(d->handle_why))) {
			d->handle_state = 1;
		}
	}
	if (d->handle_state < 0) {
		snprintf(why, n, "%s", d->handle_why);
		return -1;
	}
	return 0;
}

/* Builds p's graph, operation graph and plan (p->key decided to run);
 * 0, or -1 with the reason in p->why (p's descriptors then released). */
static int plan_build(struct mr_cuda *cu, struct mr__dnn *d, struct dnn_plan *p)
{
	void *cfgs[MAX_CFGS] = { NULL };
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
		void *plan;
		int64_t index, ws;
		int nondet;

		mr__dnn_engine_info(cfgs[i], &index, &nondet);
		if (chosen >= 0 && nondet)
			continue; /* no better than the one we have */
		tried++;
		if (mr__dnn_plan(d->handle, cfgs[i], &plan, &ws, p->why, sizeof(p->why)))
			continue; /* the reason kept if none builds */
		mr__dnn_destroy(p->plan); /* replaced by a better one */
		p->plan = plan;
		p->ws = ws;
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

/* The one line that says why shape s runs on the block-wise kernels. */
static void log_refusal(const struct mr__dnn_shape *s, const char *why)
{
	mr_log_warn("attn_fallback", "dir=%s B=%d T=%d NH=%d NKV=%d hs=%d reason=%s",
		    dir_name(s->dir), s->B, s->T, s->NH, s->NKV, s->hs, mr_log_q(why));
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
			log_refusal(s, p->why);
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
		log_refusal(s, p->why);
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
	if (cu->capturing) { /* a warm-up call sized it; a graph allocates nothing */
		snprintf(why, n, "cudnn workspace growth while capturing a graph");
		return -1;
	}
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
			if (!d->unaligned_logged++) /* once per context */
				log_refusal(s, "a tensor is not 16-byte aligned");
			return fallback(cu, "a tensor is not 16-byte aligned");
		}
		ptrs[np++] = ptr[i]; /* Dsum: set below, once the workspace is there */
	}
	if (workspace(cu, d, p->front + (size_t)p->ws, p->why, sizeof(p->why))) {
		p->ok = 0; /* refused from now on: logged once */
		log_refusal(s, p->why);
		return fallback(cu, p->why);
	}
	for (int i = 0; i < np; i++)
		if (uids[i] == MR__DNN_DSUM + 1)
			ptrs[i] = d->ws;
	cws = p->ws > 0 ? (char *)d->ws + p->front : NULL;
	if (mr__dnn_execute(d->handle, p->plan, np, uids, ptrs, cws, p->why, sizeof(p->why))) {
		p->ok = 0; /* refused from now on: logged once */
		log_refusal(s, p->why);
		return fallback(cu, p->why);
	}
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
	mr__dnn_handle_free(d->handle);
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

