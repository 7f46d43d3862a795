/*
 * pp.c - a pipeline stage at run time (see mr_pp.h): the plan of a step
 * (action list, transfers, slot of every micro-batch), the loop that runs
 * it, the tied embeddings' gradient sum and the forward-only evaluation.
 * The slots themselves are pp_slots.c's.
 *
 * Transfers stay host-synced, also on a stream-ordered backend (nccl: see
 * mr_comm_stream_ordered): every action is synced anyway to time it
 * (busy_s: the stage's share of the step and the bubble the step line and
 * the straggler diagnosis report), so a send follows a sync, and a wait
 * for a transfer is the host's (mr_comm_wait_host) - a stream-ordered one
 * would let the host run into the next action before the timing is
 * taken, gaining nothing the action's own sync does not cost already.
 * The tied embeddings' sum is an ordinary collective (mr_dev_comm_sync).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/mr_comm.h"
#include "device/mr_dev_comm.h"
#include "mr_pp.h"
#include "mr_pp_slots.h"

/* The schedule of one step with m micro-batches, as this stage runs it. */
struct plan {
	int m, n, ncomm, nslots;
	struct mr_pp_action *act;   /* (n) */
	struct mr_pp_comm *comm;    /* (ncomm) receive before / send after each action */
	int *recv_of;               /* (n) index in comm of the action's receive, -1 */
	int *send_of;               /* (n) of its send, -1 */
	int *slot_of;               /* (m) the micro-batch's slot */
	int *free_after;            /* (m) last action of the slot's previous occupant, -1 */
	int *first, *last;          /* (m) the micro-batch's first and last action */
};

struct mr_pp {
	struct mr_gpt *m;
	struct mr_pp_config c;
	struct mr_pp_spec spec;      /* m set per plan */
	int stage;
	struct plan plan;
	struct mr_pp_slots slots;    /* as many as the plans so far kept in flight */
	struct mr_comm_req **rreq;   /* (ncomm) posted receives */
	struct mr_comm_req **sreq;   /* (nslots * 2v) pending sends of each slot */
	int *nsreq;                  /* (nslots) */
	int *speer;                  /* (nslots * 2v) the stage each pending send goes to */
	int failed_peer;             /* the stage a failed transfer was with, -1 */
	int deferred;                /* paired: the send waiting for the next receive, -1 */
	const mr_act *deferred_buf;
	struct mr_pp_stats st;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int comm_dtype(const struct mr_gpt *m)
{
	return m->dev->act == MR_DT_BF16 ? MR_COMM_BF16 : MR_COMM_F32;
}

/* Elements of the rows between stages. */
static size_t rows_n(const struct mr_gpt *m)
{
	return (size_t)mr_tp_local_rows(&m->par.tp) * (size_t)m->cfg.d_model;
}

void mr_pp_dp_config(struct mr_dp_config *dc)
{
	if (dc->zero > 1)
		dc->zero = 1;
	dc->overlap = 0;
}

static void plan_free(struct plan *pl)
{
	free(pl->act);
	free(pl->comm);
	free(pl->recv_of);
	free(pl->slot_of);
	memset(pl, 0, sizeof(*pl));
}

/* Slots in order of first use, lowest free first; a slot is free again
 * after its occupant's last action. */
static int assign_slots(struct plan *pl)
{
	int *occupant = malloc(sizeof(int) * (size_t)pl->m);
	int *last_of_slot = malloc(sizeof(int) * (size_t)pl->m);
	int i, k, used = 0;

	if (!occupant || !last_of_slot) {
		free(occupant);
		free(last_of_slot);
		return MR_ENOMEM;
	}
	for (k = 0; k < pl->m; k++) {
		occupant[k] = -1;
		last_of_slot[k] = -1;
	}
	for (i = 0; i < pl->n; i++) {
		int mb = pl->act[i].mb;
		if (pl->first[mb] == i) {
			for (k = 0; occupant[k] >= 0; k++)
				;
			occupant[k] = mb;
			pl->slot_of[mb] = k;
			pl->free_after[mb] = last_of_slot[k];
			used = k + 1 > used ? k + 1 : used;
		}
		if (pl->last[mb] == i) {
			occupant[pl->slot_of[mb]] = -1;
			last_of_slot[pl->slot_of[mb]] = i;
		}
	}
	pl->nslots = used;
	free(occupant);
	free(last_of_slot);
	return 0;
}

/* The plan of a step with m micro-batches; acts NULL: the schedule's
 * list, else the caller's n actions (evaluation). */
static int plan_make(struct mr_pp *pp, int m, const struct mr_pp_action *acts, int n,
		     struct mr_errbuf *eb)
{
	struct plan *pl = &pp->plan;
	struct mr_pp_spec sp = pp->spec;
	int i, cap, rc;

	plan_free(pl);
	sp.m = m;
	if ((rc = mr_pp_check(&sp, eb)) < 0)
		return rc;
	if (!acts)
		n = mr_pp_len(&sp, eb);
	cap = 2 * n;
	pl->m = m;
	pl->n = n;
	pl->act = malloc(sizeof(*pl->act) * (size_t)n);
	pl->comm = malloc(sizeof(*pl->comm) * (size_t)cap);
	pl->recv_of = malloc(sizeof(int) * (size_t)(2 * n));
	pl->slot_of = malloc(sizeof(int) * (size_t)(4 * m));
	if (!pl->act || !pl->comm || !pl->recv_of || !pl->slot_of) {
		plan_free(pl);
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the pipeline plan (%d actions)",
			       n);
	}
	pl->send_of = pl->recv_of + n;
	pl->free_after = pl->slot_of + m;
	pl->first = pl->free_after + m;
	pl->last = pl->first + m;
	if (acts)
		memcpy(pl->act, acts, sizeof(*acts) * (size_t)n);
	else if ((rc = mr_pp_actions(&sp, pp->stage, pl->act, n, eb)) < 0)
		goto fail;
	if ((rc = mr_pp_comms(&sp, pp->stage, pl->act, n, pl->comm, cap, eb)) < 0)
		goto fail;
	pl->ncomm = rc;
	for (i = 0; i < n; i++)
		pl->recv_of[i] = pl->send_of[i] = -1;
	for (i = 0; i < pl->ncomm; i++)
		(pl->comm[i].send ? pl->send_of : pl->recv_of)[pl->comm[i].action] = i;
	for (i = 0; i < m; i++)
		pl->first[i] = pl->last[i] = -1;
	for (i = 0; i < n; i++) {
		int mb = pl->act[i].mb;
		if (pl->first[mb] < 0)
			pl->first[mb] = i;
		pl->last[mb] = i;
	}
	if ((rc = assign_slots(pl)) < 0)
		goto fail;
	if (!acts) { /* the planner sizes memory by the schedule's count: the same */
		int slots, pairs;
		if ((rc = mr_pp_in_flight(&sp, pp->stage, &slots, &pairs, eb)) < 0)
			goto fail;
		if (slots != pl->nslots) {
			rc = mr_errf(eb, MR_ESTATE,
				     "pipeline stage %d uses %d micro-batch slots, its schedule "
				     "counts %d",
				     pp->stage, pl->nslots, slots);
			goto fail;
		}
	}
	free(pp->rreq);
	free(pp->sreq);
	free(pp->nsreq);
	free(pp->speer);
	pp->rreq = calloc((size_t)pl->ncomm + 1, sizeof(*pp->rreq));
	pp->sreq = calloc((size_t)pl->nslots * 2 * (size_t)sp.v + 1, sizeof(*pp->sreq));
	pp->speer = calloc((size_t)pl->nslots * 2 * (size_t)sp.v + 1, sizeof(int));
	pp->nsreq = calloc((size_t)pl->nslots + 1, sizeof(int));
	if (!pp->rreq || !pp->sreq || !pp->nsreq || !pp->speer) {
		rc = MR_ENOMEM;
		goto fail;
	}
	if ((rc = mr_pp_slots_grow(&pp->slots, pl->nslots, eb)) < 0)
		goto fail;
	pp->st.slots = pl->nslots;
	return 0;
fail:
	plan_free(pl);
	return rc == MR_ENOMEM ? mr_errf(eb, rc, "unable to allocate the pipeline plan") : rc;
}

int mr_pp_create(struct mr_pp **out, struct mr_gpt *m, const struct mr_pp_config *c,
		 struct mr_errbuf *eb)
{
	struct mr_pp *pp;
	int v = mr_place_chunks(&m->place), rc;

	*out = NULL;
	if (c->v != v)
		return mr_errf_field(eb, MR_EINVAL, "pp_virtual",
				     "'pp_virtual' is %d but the stage holds %d model chunks", c->v,
				     v);
	if (!(pp = calloc(1, sizeof(*pp))))
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the pipeline stage");
	pp->m = m;
	pp->c = *c;
	pp->stage = mr_place_index(&m->place, MR_AXIS_PP);
	pp->spec.kind = c->kind;
	pp->spec.p = mr_place_size(&m->place, MR_AXIS_PP);
	pp->spec.v = v;
	/* before the slots grow: every slot gets a stash */
	if (c->kind == MR_PP_ZBH1 && (rc = mr_gpt_split_bwd(m)) < 0) {
		free(pp);
		return mr_errf(eb, rc, "unable to allocate the split backward's stash");
	}
	if ((rc = mr_pp_slots_init(&pp->slots, m, eb)) < 0) {
		free(pp);
		return rc;
	}
	*out = pp;
	return 0;
}

void mr_pp_free(struct mr_pp *pp)
{
	if (!pp)
		return;
	plan_free(&pp->plan);
	mr_pp_slots_release(&pp->slots);
	free(pp->rreq);
	free(pp->sreq);
	free(pp->nsreq);
	free(pp->speer);
	free(pp);
}

void mr_pp_stats(const struct mr_pp *pp, struct mr_pp_stats *st)
{
	*st = pp->st;
}

/* ---- the step ---- */

/* Waits for a transfer with stage peer (remembered if it fails). */
static int wait_req(struct mr_pp *pp, struct mr_comm_req **req, int peer)
{
	double t0;
	int rc;

	if (!*req)
		return 0;
	t0 = now();
	rc = mr_comm_wait_host(*req);
	*req = NULL;
	pp->st.wait_s += now() - t0;
	if (rc < 0 && pp->failed_peer < 0)
		pp->failed_peer = peer;
	return rc;
}

/* Waits for the sends still pending from slot k (before it is reused). */
static int settle_slot(struct mr_pp *pp, int k)
{
	size_t base = (size_t)k * 2 * (size_t)pp->spec.v;
	int i, rc = 0, rc2;

	for (i = 0; i < pp->nsreq[k]; i++)
		if ((rc2 = wait_req(pp, &pp->sreq[base + i], pp->speer[base + i])) < 0 && rc == 0)
			rc = rc2;
	pp->nsreq[k] = 0;
	return rc;
}

/* The buffer transfer x of the plan moves: the slot's received input or
 * gradient of the chunk (the send buffers are given by the loop). */
static mr_act *recv_buf(struct mr_pp *pp, const struct mr_pp_comm *x)
{
	return mr_pp_slots_recv_buf(&pp->slots, pp->plan.slot_of[x->mb], x->what, x->chunk);
}

/* Posts receive x (plan comm index k) into its slot. */
static int post_recv(struct mr_pp *pp, int k)
{
	const struct mr_pp_comm *x = &pp->plan.comm[k];

	pp->st.recvs++;
	return mr_comm_irecv(pp->c.pp, recv_buf(pp, x), rows_n(pp->m), comm_dtype(pp->m), x->peer,
			     x->tag, &pp->rreq[k]);
}

/* Posts, in order, the receives whose slot has no earlier occupant left
 * once the actions before `at` are done. *next: the first not posted. */
static int post_receives(struct mr_pp *pp, int at, int *next)
{
	struct plan *pl = &pp->plan;
	int rc;

	for (; *next < pl->ncomm; (*next)++) {
		const struct mr_pp_comm *x = &pl->comm[*next];
		if (x->send)
			continue;
		if (pl->free_after[x->mb] >= at)
			return 0; /* its slot is still the previous micro-batch's */
		/* a micro-batch not started yet: the previous occupant's sends */
		if (pl->first[x->mb] >= at && (rc = settle_slot(pp, pl->slot_of[x->mb])) < 0)
			return rc;
		if ((rc = post_recv(pp, *next)) < 0)
			return rc;
	}
	return 0;
}

static int post_send(struct mr_pp *pp, const struct mr_pp_comm *x, const mr_act *buf)
{
	struct mr_dev *d = pp->m->dev;
	int k = pp->plan.slot_of[x->mb], rc;
	size_t at = (size_t)k * 2 * (size_t)pp->spec.v + (size_t)pp->nsreq[k]++;

	if ((rc = d->ops->sync(d)) < 0)
		return rc;
	pp->st.sends++;
	pp->speer[at] = x->peer;
	rc = mr_comm_isend(pp->c.pp, buf, rows_n(pp->m), comm_dtype(pp->m), x->peer, x->tag,
			   &pp->sreq[at]);
	/* under a busy core the progress thread would take it up only later;
	 * the receiver is often waiting for it right now */
	if (rc == 0 && !pp->c.paired)
		mr_comm_kick(pp->c.pp);
	return rc;
}

/* Paired transfers (an in-order backend, mr_comm_p2p_in_order): the send
 * the previous action deferred and this action's receive, as one group -
 * Megatron's batched send_forward_recv_backward and the like. */
static int exchange(struct mr_pp *pp, int i)
{
	const struct plan *pl = &pp->plan;
	int rc, rc2;

	if (pp->deferred < 0 && pl->recv_of[i] < 0)
		return 0;
	if ((rc = mr_comm_group_start(pp->c.pp)) < 0)
		return rc;
	if (pp->deferred >= 0)
		rc = post_send(pp, &pl->comm[pp->deferred], pp->deferred_buf);
	pp->deferred = -1;
	if (rc == 0 && pl->recv_of[i] >= 0)
		rc = post_recv(pp, pl->recv_of[i]);
	rc2 = mr_comm_group_end(pp->c.pp);
	return rc < 0 ? rc : rc2;
}

/* The send of action i: posted now, or (paired) with the next receive. */
static int send_of(struct mr_pp *pp, int i, const mr_act *buf)
{
	if (!pp->c.paired)
		return post_send(pp, &pp->plan.comm[pp->plan.send_of[i]], buf);
	pp->deferred = pp->plan.send_of[i];
	pp->deferred_buf = buf;
	return 0;
}

/* One action of the plan: its receive waited, the pass, its send posted. */
static int run_action(struct mr_pp *pp, int i, const int *inputs, const int *targets,
		      float dscale, double loss[2], struct mr_errbuf *eb)
{
	struct plan *pl = &pp->plan;
	struct mr_gpt *m = pp->m;
	const struct mr_pp_action *a = &pl->act[i];
	size_t N = (size_t)m->B * m->T;
	int v = pp->spec.v, vstage0 = a->chunk == 0 && m->first_stage, rc;
	int head = a->chunk == v - 1 && m->last_stage;
	double t0;
	mr_act *in;

	if (pp->c.paired && (rc = exchange(pp, i)) < 0)
		return rc;
	if (pl->recv_of[i] >= 0 &&
	    (rc = wait_req(pp, &pp->rreq[pl->recv_of[i]], pl->comm[pl->recv_of[i]].peer)) < 0)
		return rc;
	if (pl->first[a->mb] == i && (rc = settle_slot(pp, pl->slot_of[a->mb])) < 0)
		return rc;
	if ((rc = mr_pp_slots_use(&pp->slots, pl->slot_of[a->mb])) < 0)
		return rc;
	in = vstage0 ? NULL : m->xin[a->chunk];
	t0 = now();
	if (a->op == MR_PP_F) {
		if (pl->first[a->mb] == i &&
		    (rc = mr_gpt_set_batch(m, m->first_stage ? inputs + a->mb * N : NULL,
					   m->last_stage && targets ? targets + a->mb * N : NULL,
					   eb)) < 0)
			return rc;
		if ((rc = mr_gpt_chunk_fwd(m, a->chunk, in)) < 0)
			return rc;
		if (head)
			loss[0] += m->loss;
		if (a->chunk == v - 1)
			loss[1] += m->aux_loss;
	} else if (a->op == MR_PP_B) {
		if (!head && (rc = m->dev->ops->copy(m->dev, m->dres, m->xgrad[a->chunk],
						     mr_dev_act_bytes(m->dev, rows_n(m)))) < 0)
			return rc;
		rc = mr_gpt_chunk_bwd(m, a->chunk, in, dscale,
				      pp->spec.kind == MR_PP_ZBH1 ? MR_GPT_BWD_INPUT
								   : MR_GPT_BWD_ALL);
		/* the gradient of the chunk's input goes back from the slot */
		if (rc == 0 && pl->send_of[i] >= 0)
			rc = m->dev->ops->copy(m->dev, m->xgrad[a->chunk], m->dres,
					       mr_dev_act_bytes(m->dev, rows_n(m)));
		if (rc < 0)
			return rc;
	} else if ((rc = mr_gpt_chunk_bwd(m, a->chunk, in, dscale, MR_GPT_BWD_WEIGHT)) < 0) {
		return rc;
	}
	if ((rc = m->dev->ops->sync(m->dev)) < 0)
		return rc;
	pp->st.busy_s += now() - t0;
	if (pl->send_of[i] < 0)
		return 0;
	return send_of(pp, i, a->op == MR_PP_F ? mr_gpt_chunk_out(m, a->chunk) : m->xgrad[a->chunk]);
}

/* Runs the plan; on failure the requests still posted are waited (the
 * communicator is broken then, so they fail promptly). */
static int run_plan(struct mr_pp *pp, struct mr_dp *dp, const int *inputs, const int *targets,
		    float dscale, double loss[2], _Atomic int *micro, struct mr_errbuf *eb)
{
	struct plan *pl = &pp->plan;
	int i, k, next = 0, at = 0, rc = 0, rc2;
	double t0 = now();

	pp->st.busy_s = pp->st.wait_s = 0.0;
	pp->st.sends = pp->st.recvs = 0;
	pp->failed_peer = -1;
	pp->deferred = -1;
	for (i = 0; i < pl->n && rc == 0; i++) {
		const struct mr_pp_action *a = &pl->act[i];
		at = i;
		if (micro)
			atomic_store_explicit(micro, a->mb, memory_order_relaxed);
		if (dp)
			mr_dp_micro_batch(dp, a->mb == pl->m - 1);
		if (!pp->c.paired)
			rc = post_receives(pp, i, &next);
		if (rc == 0)
			rc = run_action(pp, i, inputs, targets, dscale, loss, eb);
	}
	if (rc == 0 && pp->deferred >= 0)
		rc = post_send(pp, &pl->comm[pp->deferred], pp->deferred_buf);
	pp->deferred = -1;
	for (i = 0; i < pl->ncomm; i++)
		if ((rc2 = wait_req(pp, &pp->rreq[i], pl->comm[i].peer)) < 0 && rc == 0)
			rc = rc2;
	for (k = 0; k < pl->nslots; k++)
		if ((rc2 = settle_slot(pp, k)) < 0 && rc == 0)
			rc = rc2;
	if (micro)
		atomic_store_explicit(micro, -1, memory_order_relaxed);
	pp->st.wall_s = now() - t0;
	if (rc < 0 && !eb->msg[0]) {
		const struct mr_pp_action *a = &pl->act[at];
		char peer[48] = "";
		if (pp->failed_peer >= 0)
			snprintf(peer, sizeof(peer), " (transfer with stage %d)", pp->failed_peer);
		mr_errf(eb, rc, "pipeline stage %d failed at %c of micro-batch %d (chunk %d, action "
				"%d of %d)%s: %s",
			pp->stage, "FBW"[a->op], a->mb, a->chunk, at, pl->n, peer, mr_strerror(rc));
	}
	return rc;
}

int mr_pp_run(struct mr_pp *pp, struct mr_dp *dp, const int *inputs, const int *targets,
	      int accum, double loss[2], _Atomic int *micro, struct mr_errbuf *eb)
{
	int rc;

	if ((pp->plan.m != accum || !pp->plan.act) && (rc = plan_make(pp, accum, NULL, 0, eb)) < 0)
		return rc;
	return run_plan(pp, dp, inputs, targets, 1.0f / (float)accum, loss, micro, eb);
}

/* x over the stages: *sum and *max of every stage's value (exact: the
 * doubles themselves are gathered). */
static int over_stages(struct mr_pp *pp, double x, double *sum, double *max)
{
	double all[MR_PP_MAX_STAGES];
	int i, p = pp->spec.p, rc;

	*sum = *max = x;
	if (!pp->c.pp)
		return 0;
	if ((rc = mr_comm_allgather(pp->c.pp, &x, all, 1, MR_COMM_I64)) < 0)
		return rc;
	*sum = 0.0;
	for (i = 0; i < p; i++) {
		*sum += all[i];
		*max = all[i] > *max ? all[i] : *max;
	}
	return 0;
}

int mr_pp_finish(struct mr_pp *pp, struct mr_dp *dp, struct mr_errbuf *eb)
{
	struct mr_dev *d = pp->m->dev;
	double sum, span;
	float *g;
	size_t n;
	int rc;

	if (pp->c.embed) {
		mr_dp_unit_grads(dp, 0, &g, &n);
		if ((rc = mr_dev_comm_sync(d, pp->c.embed)) < 0 ||
		    (rc = mr_comm_allreduce(pp->c.embed, g, g, n, MR_COMM_F32, MR_COMM_SUM)) < 0)
			return mr_errf(eb, rc, "pipeline stage %d: summing the tied embeddings' "
					       "gradients with stage %d failed: %s",
				       pp->stage, pp->stage ? 0 : pp->spec.p - 1, mr_strerror(rc));
	}
	if ((rc = over_stages(pp, pp->st.wall_s, &sum, &span)) < 0)
		return mr_errf(eb, rc, "pipeline stage %d: sharing the step's times over the %d "
				       "stages failed: %s",
			       pp->stage, pp->spec.p, mr_strerror(rc));
	pp->st.makespan_s = span;
	pp->st.bubble = pp->st.busy_s > 0 ? (span - pp->st.busy_s) / pp->st.busy_s : 0.0;
	return 0;
}

int mr_pp_eval(struct mr_pp *pp, const int *inputs, const int *targets, int n, double *loss,
	       struct mr_errbuf *eb)
{
	struct mr_pp_spec keep = pp->spec;
	struct mr_pp_action *acts;
	double sum[2] = { 0.0, 0.0 };
	int v = pp->spec.v, p = pp->spec.p, m = n, i, rc;

	/* forward only, micro-batch after micro-batch (a plan of its own) */
	if (v > 1)
		m = (n + p - 1) / p * p; /* interleaved numbers micro-batches in groups of p */
	else
		pp->spec.kind = MR_PP_GPIPE;
	if (!(acts = malloc(sizeof(*acts) * (size_t)n * (size_t)v)))
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the evaluation plan");
	for (i = 0; i < n * v; i++)
		acts[i] = (struct mr_pp_action){ MR_PP_F, i / v, i % v };
	rc = plan_make(pp, m, acts, n * v, eb);
	free(acts);
	pp->spec = keep;
	if (rc == 0)
		rc = run_plan(pp, NULL, inputs, targets, 1.0f, sum, NULL, eb);
	plan_free(&pp->plan); /* the next step makes its own again */
	if (rc == 0)
		rc = over_stages(pp, sum[0], &sum[0], &sum[1]);
	*loss = sum[0] / n;
	return rc;
}
