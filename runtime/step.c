/*
 * step.c - the step driver (see mr_step.h): begin, schedule, finish the
 * gradients, norm and loss over the job, clip + AdamW; the sequential
 * micro-batch schedule; and the device graphs of a step.
 *
 * Device graphs (a device with graph_run: cuda): after MR_STEP_WARMUP
 * eager steps, where nothing in the passes talks to another rank or
 * needs the host (mr_step.h says where), a micro-batch's forward and
 * backward is one graph and the AdamW update a second. Around them, on
 * the host: the micro-batch's tokens are uploaded before the launch
 * (mr_gpt_set_batch) and its loss read after it (mr_gpt_read_results);
 * the gradient norm is taken before the update and the update's scalars
 * uploaded before its launch (mr_dp_update_args). A capture that fails
 * - an operation that needs the host, such as a MoE layer's counts - is
 * discarded, its work run eagerly, and graphs stay off for the job; both
 * that and an ineligible configuration are logged once (cuda_graph_off
 * with the reason). A step marked eager (the worker's profiled step,
 * whose operations are timed one by one) runs without them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_log.h"
#include "mr_step.h"

/* The step's device graphs (graph_run keys). */
enum { GRAPH_MICRO, GRAPH_UPDATE };

/* Why this configuration's passes or update cannot be graphs; NULL when
 * they can. */
static const char *graph_obstacle(const struct mr_step *s)
{
	const struct mr_place *p = &s->m->place;
	const char *why;

	if (s->pp)
		return "pipeline parallel: a stage's passes send and receive activations";
	if (mr_place_size(p, MR_AXIS_TP) > 1)
		return "tensor parallel: the passes hold its collectives";
	if (mr_place_size(p, MR_AXIS_CP) > 1)
		return "context parallel: the passes hold its ring exchange";
	if (mr_place_size(p, MR_AXIS_EP) > 1)
		return "expert parallel: the passes hold its all-to-all";
	if (!mr_dp_graph_safe(s->dp, &why))
		return why;
	return NULL;
}

/* Graphs off for the job, said once with the reason; the step's graphs
 * are forgotten. */
static void graphs_off(struct mr_step *s, const char *why)
{
	struct mr_dev *d = s->m->dev;

	s->graphs = MR_STEP_GRAPHS_OFF;
	d->ops->graph_drop(d, GRAPH_MICRO);
	d->ops->graph_drop(d, GRAPH_UPDATE);
	mr_log_info("cuda_graph_off", "reason=%s", mr_log_q(why));
}

/* Whether the step's device work runs as graphs now: wanted, a device
 * that has them, past the warm-up, an eligible configuration (checked
 * once). */
static int graphs_live(struct mr_step *s)
{
	const char *why;

	if (s->graphs == MR_STEP_GRAPHS_OFF || !s->m->dev->ops->graph_run ||
	    s->warm < MR_STEP_WARMUP || s->eager)
		return 0;
	if (s->graphs == MR_STEP_GRAPHS_WANTED) {
		if ((why = graph_obstacle(s))) {
			graphs_off(s, why);
			return 0;
		}
		s->graphs = MR_STEP_GRAPHS_ON;
	}
	return 1;
}

/* fn's device work as graph key; a capture that fails turns graphs off
 * and runs fn itself. */
static int device_work(struct mr_step *s, int key, int (*fn)(void *ctx), void *ctx,
		       struct mr_errbuf *eb)
{
	struct mr_dev *d = s->m->dev;
	struct mr_errbuf why = { { 0 }, { 0 } };
	int rc = d->ops->graph_run(d, key, fn, ctx, &why);

	if (rc < 0)
		return mr_errf(eb, rc, "%s", why.msg);
	if (rc == 0)
		return 0;
	graphs_off(s, why.msg);
	return fn(ctx);
}

/* A micro-batch's forward and backward over the batch on the device. */
struct micro {
	struct mr_gpt *m;
	float dscale;
};

static int micro_work(void *ctx)
{
	const struct micro *c = ctx;
	int rc = mr_gpt_forward_passes(c->m);

	return rc < 0 ? rc : mr_gpt_backward(c->m, c->dscale);
}

/* rc of a micro-batch's passes as the step's error: which passes, the
 * step, and the device's fault where it has one. */
static int passes_failed(const struct mr_step *s, int rc, const char *what,
			 struct mr_errbuf *eb)
{
	const struct mr_dev *d = s->m->dev;

	return mr_errf(eb, rc, "%s failed at step %ld: %s", what, mr_dp_steps(s->dp),
		       d->fault[0] ? d->fault : mr_strerror(rc));
}

/* One micro-batch as a graph: the batch up, the launch, the loss back. */
static int micro_graph(struct mr_step *s, const int *inputs, const int *targets, float dscale,
		       struct mr_errbuf *eb)
{
	struct micro c = { s->m, dscale };
	int rc;

	if ((rc = mr_gpt_set_batch(s->m, inputs, targets, eb)) < 0)
		return rc;
	if ((rc = device_work(s, GRAPH_MICRO, micro_work, &c, eb)) < 0 ||
	    (rc = mr_gpt_read_results(s->m)) < 0)
		return passes_failed(s, rc, "forward and backward", eb);
	return 0;
}

/* One micro-batch, eagerly. */
static int micro_eager(struct mr_step *s, const int *inputs, const int *targets, float dscale,
		       struct mr_errbuf *eb)
{
	struct mr_gpt *m = s->m;
	int rc = mr_gpt_forward(m, inputs, targets, eb);

	if (rc < 0)
		return rc;
	rc = mr_gpt_backward(m, dscale);
	return rc < 0 ? passes_failed(s, rc, "backward pass", eb) : 0;
}

static int sequential_run(struct mr_step *s, const int *inputs, const int *targets, int accum,
			  double loss[2], struct mr_errbuf *eb)
{
	struct mr_gpt *m = s->m;
	size_t N = (size_t)m->B * m->T;
	float dscale = 1.0f / (float)accum;
	int i, rc;

	for (i = 0; i < accum; i++) {
		atomic_store_explicit(&s->micro, i, memory_order_relaxed);
		mr_dp_micro_batch(s->dp, i == accum - 1);
		rc = graphs_live(s)
			     ? micro_graph(s, inputs + i * N, targets + i * N, dscale, eb)
			     : micro_eager(s, inputs + i * N, targets + i * N, dscale, eb);
		if (rc < 0)
			return rc;
		/* a non-finite loss is reported after the reduction over the
		 * job, so every rank fails the step together */
		loss[0] += m->loss;
		loss[1] += m->aux_loss;
	}
	atomic_store_explicit(&s->micro, -1, memory_order_relaxed);
	return 0;
}

/* AdamW's device work (mr_dp_update_apply), for a graph. */
static int update_work(void *dp)
{
	return mr_dp_update_apply(dp);
}

/* Clipping and AdamW: the scalars, then the update (a graph when live). */
static int update(struct mr_step *s, double norm, float lr, struct mr_errbuf *eb)
{
	int rc = mr_dp_update_args(s->dp, norm, lr);

	if (rc < 0)
		return rc;
	if (!graphs_live(s))
		return mr_dp_update_apply(s->dp);
	return device_work(s, GRAPH_UPDATE, update_work, s->dp, eb);
}

const struct mr_step_sched mr_sched_sequential = { "sequential", sequential_run };

static int pipeline_run(struct mr_step *s, const int *inputs, const int *targets, int accum,
			double loss[2], struct mr_errbuf *eb)
{
	return mr_pp_run(s->pp, s->dp, inputs, targets, accum, loss, &s->micro, eb);
}

const struct mr_step_sched mr_sched_pipeline = { "pipeline", pipeline_run };

int mr_step_pipeline(struct mr_step *s, const struct mr_pp_config *c, struct mr_errbuf *eb)
{
	int rc = mr_pp_create(&s->pp, s->m, c, eb);

	if (rc == 0)
		s->sched = &mr_sched_pipeline;
	return rc;
}

int mr_step_eval(struct mr_step *s, const int *inputs, const int *targets, int n, double *loss,
		 struct mr_errbuf *eb)
{
	size_t N = (size_t)s->m->B * s->m->T;
	double sum = 0.0;
	int i, rc;

	if (s->pp)
		return mr_pp_eval(s->pp, inputs, targets, n, loss, eb);
	for (i = 0; i < n; i++) {
		if ((rc = mr_gpt_forward(s->m, inputs + i * N, targets + i * N, eb)) < 0)
			return rc;
		sum += s->m->loss;
	}
	*loss = sum / n;
	return 0;
}

int mr_step_init(struct mr_step *s, struct mr_gpt *m, const struct mr_adamw_config *oc,
		 const struct mr_dp_config *dc, const struct mr_dp_comms *c, uint64_t seed,
		 struct mr_errbuf *eb)
{
	struct mr_dp_config ddp = { 0, 0, 1, MR_DP_OFFLOAD_NONE };
	struct mr_dp_comms one = { NULL, NULL, m->par.tp.comm, NULL };

	const char *graphs = getenv("MESHRUN_CUDA_GRAPHS");

	memset(s, 0, sizeof(*s));
	atomic_init(&s->micro, -1);
	atomic_init(&s->request, 0);
	s->m = m;
	s->graphs = graphs && graphs[0] == '0' ? MR_STEP_GRAPHS_OFF : MR_STEP_GRAPHS_WANTED;
	s->sched = &mr_sched_sequential;
	return mr_dp_create(&s->dp, m, oc, dc ? dc : &ddp, c ? c : &one, seed, eb);
}

void mr_step_release(struct mr_step *s)
{
	struct mr_dev *d = s->m ? s->m->dev : NULL;

	if (d && d->ops->graph_drop) {
		d->ops->graph_drop(d, GRAPH_MICRO);
		d->ops->graph_drop(d, GRAPH_UPDATE);
	}
	mr_pp_free(s->pp);
	mr_dp_free(s->dp);
	s->pp = NULL;
	s->dp = NULL;
}

/* " on pipeline stage N" for messages of a stage; "" otherwise. */
static const char *on_stage(const struct mr_step *s, char *buf, size_t cap)
{
	buf[0] = 0;
	if (s->pp)
		snprintf(buf, cap, " on pipeline stage %d", mr_place_index(&s->m->place, MR_AXIS_PP));
	return buf;
}

static int nonfinite_loss(struct mr_step *s, long step, double loss, struct mr_errbuf *eb)
{
	char st[40];
	const struct mr_gpt *m = s->m;
	struct mr_dev *d = m->dev;
	const char *p = mr_dp_first_nonfinite(s->dp, 0);
	size_t i, n = (size_t)m->B * m->T * (size_t)mr_tp_vocab_rows(&m->par.tp);
	float *host;
	int bad = 0;

	if (p)
		return mr_errf(eb, MR_ENONFINITE,
			       "loss is %g at step %ld: first non-finite tensor 'params.%s'%s", loss,
			       step, p, on_stage(s, st, sizeof(st)));
	/* the logits to the host (an fp32 device: the model opens on no other) */
	host = d->act == MR_DT_F32 && m->last_stage ? malloc(n * sizeof(float)) : NULL;
	if (host && d->ops->download(d, host, m->logits, n * sizeof(float)) == 0)
		for (i = 0; i < n && !bad; i++)
			bad = !isfinite(host[i]);
	free(host);
	if (bad)
		return mr_errf(eb, MR_ENONFINITE,
			       "loss is %g at step %ld: first non-finite tensor 'logits'%s", loss,
			       step, on_stage(s, st, sizeof(st)));
	return mr_errf(eb, MR_ENONFINITE,
		       "loss is %g at step %ld: no non-finite parameter or logit on this rank%s",
		       loss, step, on_stage(s, st, sizeof(st)));
}

int mr_step_run(struct mr_step *s, const int *inputs, const int *targets, int accum,
		struct mr_step_result *r, struct mr_errbuf *eb)
{
	long step = mr_dp_steps(s->dp);
	double v[MR_DP_NSTATS] = { 0.0, 0.0, 0.0, 0.0 }, loss[2] = { 0.0, 0.0 }, norm;
	int pp = mr_place_size(&s->m->place, MR_AXIS_PP);
	char st[40];
	const char *g;
	int rc;

	if (accum < 1)
		return mr_errf_field(eb, MR_EINVAL, "accum", "'accum' must be >= 1, got %d", accum);
	mr_dp_begin(s->dp);
	if ((rc = s->sched->run(s, inputs, targets, accum, loss, eb)) < 0)
		return rc;
	if ((rc = mr_dp_finish_grads(s->dp)) < 0)
		return mr_errf(eb, rc, "gradient reduction failed at step %ld: %s", step,
			       mr_strerror(rc));
	if (s->pp && (rc = mr_pp_finish(s->pp, s->dp, eb)) < 0)
		return rc;
	/* the mean over the job divides by every rank; a stage holds its
	 * share of the aux loss and the last one all of the loss */
	v[1] = loss[0] / accum * pp;
	v[2] = loss[1] / accum * pp;
	v[3] = atomic_load(&s->request) ? 1.0 : 0.0;
	if ((rc = mr_dp_reduce_stats(s->dp, v)) < 0)
		return mr_errf(eb, rc, "grad norm reduction failed at step %ld: %s", step,
			       mr_strerror(rc));
	if (!isfinite(v[1]) || !isfinite(v[2]))
		return nonfinite_loss(s, step, !isfinite(v[1]) ? v[1] : v[2], eb);
	norm = sqrt(v[0]);
	if (!isfinite(norm)) {
		g = mr_dp_first_nonfinite(s->dp, 1);
		return mr_errf(eb, MR_ENONFINITE,
			       "gradient norm is %g at step %ld: first non-finite tensor "
			       "'grads.%s'%s", norm, step, g ? g : "? (on another rank)",
			       g ? on_stage(s, st, sizeof(st)) : "");
	}
	r->loss = (float)v[1];
	r->aux_loss = (float)v[2];
	r->grad_norm = (float)norm;
	r->lr = mr_lr_at(mr_dp_adamw(s->dp), step);
	r->requested = v[3] > 0.0;
	if ((rc = update(s, norm, r->lr, eb)) < 0)
		return mr_errf(eb, rc, "parameter all-gather failed at step %ld: %s", step,
			       mr_strerror(rc));
	if (s->warm < MR_STEP_WARMUP)
		s->warm++;
	return 0;
}
