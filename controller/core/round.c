/*
 * round.c - rounds, generations, member operations and timers of the
 * controller core.
 *
 * A job's current round is the set of members in state waiting (forming)
 * or running (closed). The round closes when max_nodes are waiting, or
 * min_nodes are and last_call_ms has passed since the min-th join; ranks
 * are then assigned by pod index (when every member has one) or node id,
 * after the topology path for a job whose rank_order is "topology"
 * (mr_topo.h: the planner orders the same way).
 * Every membership change of a running job (death, leave, failure, a
 * restarted pod, an elastic join) bumps the generation: every member
 * becomes stale and must join again, the KV store is cleared and every
 * parked long-poll is answered 409 at once.
 *
 * Heartbeat expiry is O(1) amortised per member: a job keeps its members in
 * a list ordered by last_seen (touch = move to tail) and the tick expires
 * from the head. A member parked in a long-poll counts as alive.
 *
 * Non-goals: job/member storage (job.c), KV (kv.c), waiters (waiter.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "json_write.h"
#include "mr_log.h"
#include "mr_topo.h"

#define SCAN_EVERY_MS 10

/* ---- rounds ----------------------------------------------------------------- */

/* 200 with m's rank in the closed round (json_write.c writes it). */
static void res_round(struct ctl_res *res, const struct ctl_job *job, const struct ctl_member *m)
{
	size_t len = 0;
	char *t = mr__json_write_round(job, m, &len);

	mr__res_text(res, t, len);
}

/* 200 {"generation":G,"state":state} */
static void res_state(struct ctl_res *res, const struct ctl_job *job, const char *state)
{
	size_t len = 0;
	char *t = mr__json_write_state(job, state, &len);

	mr__res_text(res, t, len);
}

/* How a round's members compare: mr_topo_node_cmp, the planner's order
 * (mr_topo_order) - by path when the job orders by topology, then pod
 * index when every member has one, else node id. */
struct order_by {
	int path, pod;
};

static int member_cmp(const void *x, const void *y, void *ctx)
{
	const struct ctl_member *a = *(struct ctl_member *const *)x;
	const struct ctl_member *b = *(struct ctl_member *const *)y;
	const struct order_by *by = ctx;
	struct mr_topo_node na = { by->path ? a->topology : NULL, a->pod_index, a->node_id };
	struct mr_topo_node nb = { by->path ? b->topology : NULL, b->pod_index, b->node_id };

	return mr_topo_node_cmp(&na, &nb, by->pod);
}

/* arr[0..k) in the job's rank order. */
static void rank_order(const struct ctl_job *job, struct ctl_member **arr, size_t k)
{
	struct order_by by = { job->spec.rank_order == CTL_ORDER_TOPOLOGY, 1 };

	for (size_t i = 0; i < k; i++)
		by.pod &= arr[i]->pod_index >= 0;
	qsort_r(arr, k, sizeof(*arr), member_cmp, &by);
}

void mr__ctl_apply_close(struct ctl *ctl, struct ctl_job *job, int32_t n)
{
	size_t nw = job->count[CTL_M_WAITING], k = 0;
	struct ctl_member **arr = NULL, *m, *next;

	if (nw)
		arr = malloc(nw * sizeof(*arr));
	if (nw && !arr) {
		mr_log_error("round_close_oom", "job=%s", mr_log_q(job->name));
		return;
	}
	for (m = job->lru_head; m; m = next) {
		next = m->lru_next;
		if (m->state == CTL_M_WAITING && k < nw)
			arr[k++] = m;
		else if (m->state == CTL_M_STALE)
			mr__ctl_apply_member_delete(ctl, job, m);
	}
	if (n > (int32_t)k)
		n = (int32_t)k;
	if (k > 1)
		rank_order(job, arr, k);
	job->state = CTL_JOB_RUNNING;
	for (size_t i = 0; i < k; i++) {
		mr__ctl_set_state(ctl, job, arr[i], (int32_t)i < n ? CTL_M_RUNNING : CTL_M_STANDBY);
		arr[i]->confirmed = 0;
		arr[i]->node_rank = (int32_t)i < n ? (int32_t)i : -1;
	}
	job->num_nodes = n;
	job->world_size = n * job->spec.nproc_per_node;
	job->dp = 0;
	mr__ctl_mesh_fits(&job->spec, n, &job->dp);
	job->rounds++;
	job->min_reached_ms = 0;
	ctl->stats.rounds++;
	mr__rec_close(ctl, job, n);
	job->gen_seq = mr__rec_seq(ctl);
	if (!ctl->replaying)
		mr_log_info("round_closed", "job=%s gen=%llu nodes=%d world=%d",
			    mr_log_q(job->name), (unsigned long long)job->generation, n,
			    job->world_size);
	for (int32_t i = 0; i < n; i++) {
		struct ctl_res res;

		if (!arr[i]->waiter)
			continue;
		memset(&res, 0, sizeof(res));
		res_round(&res, job, arr[i]);
		arr[i]->confirmed = 1;
		mr__ctl_waiter_finish(ctl, arr[i]->waiter, &res);
	}
	free(arr);
}

/* A member the controller may carry into the next round: parked in a
 * wait, or heard from within half the heartbeat timeout (an agent beats
 * every quarter of it by default; a member that missed two beats - as one
 * that died with the lost one does - joins again if it is alive). Not
 * heard from since the controller started: its last_seen is the start's
 * grace, no sign of life. */
static int live(const struct ctl *ctl, const struct ctl_job *job, const struct ctl_member *m)
{
	return m->waiter ||
	       (m->heard && ctl->now_ms - m->last_seen_ms <= job->spec.heartbeat_timeout_ms / 2);
}

/* Every parked call of the job gets 409 with the new generation; one whose
 * member was carried (a wait, or a KV GET naming its node) also gets
 * "member" (waiting). Two bodies, each shared by its replies. */
static void answer_stale(struct ctl *ctl, struct ctl_job *job)
{
	size_t plen = 0, clen = 0;
	char *plain = mr__json_write_stale(job, NULL, &plen);
	char *carried = NULL;

	while (job->waiters) {
		struct ctl_waiter *w = job->waiters;
		struct ctl_member *m = w->kind == CTL_W_ROUND ? w->member
				       : w->node ? mr_dict_get(&job->members, w->node)
						 : NULL;
		int c = m && m->state == CTL_M_WAITING;
		struct ctl_res res;

		if (c && !carried) /* every carried member's: "member":{"generation":G,"state":"waiting"} */
			carried = mr__json_write_stale(job, m, &clen);
		memset(&res, 0, sizeof(res));
		mr__res_err(&res, 409, "stale_generation", "generation", "%s",
			    "the generation moved on");
		res.text_len = c ? clen : plen;
		res.text = res.text_len ? malloc(res.text_len) : NULL;
		if (res.text)
			memcpy(res.text, c ? carried : plain, res.text_len);
		else
			res.text_len = 0;
		mr__ctl_waiter_finish(ctl, w, &res);
	}
	free(plain);
	free(carried);
}

void mr__ctl_apply_bump(struct ctl *ctl, struct ctl_job *job, uint64_t gen, int32_t restarts,
			int failed, const char *reason, int carry)
{
	job->generation = gen;
	job->restarts = restarts;
	job->state = failed ? CTL_JOB_FAILED : CTL_JOB_FORMING;
	mr__ctl_set_reason(job, failed ? (reason ? reason : "max_restarts exceeded") : NULL);
	job->num_nodes = job->world_size = job->dp = 0;
	job->min_reached_ms = 0;
	carry = carry && !failed;
	mr__rec_bump(ctl, job, carry);
	/* Without carry everybody joins the new round again, standby members
	 * included: each learns of it through a 409, so nobody is put in a
	 * round it has not asked for. With carry the live members of the
	 * round go on waiting in the new one (a 409 tells them so) and only
	 * the others must join; a carried member that is in fact gone is
	 * dropped when silent for the heartbeat timeout, or declared dead
	 * (another bump) if the round closed with it. */
	for (struct ctl_member *m = job->lru_head; m; m = m->lru_next) {
		int was = m->state;

		if (was == CTL_M_STALE)
			continue;
		if (carry && (was == CTL_M_RUNNING || was == CTL_M_STANDBY) &&
		    (ctl->replaying || live(ctl, job, m))) {
			mr__ctl_set_state(ctl, job, m, CTL_M_WAITING);
			continue;
		}
		mr__ctl_set_state(ctl, job, m, CTL_M_STALE);
		if (carry && (was == CTL_M_RUNNING || was == CTL_M_STANDBY))
			mr__rec_member(ctl, job, m); /* replay carried it: not so */
	}
	mr__ctl_kv_clear(ctl, job);
	mr__ctl_diag_reset(job);
	job->gen_seq = job->member_seq = mr__rec_seq(ctl);
	if (failed) {
		struct ctl_res r;

		memset(&r, 0, sizeof(r));
		mr__res_over(&r, job);
		mr__ctl_waiters_fail(ctl, job, r.status, r.code, "job", r.body, r.msg);
	} else {
		answer_stale(ctl, job);
	}
}

void mr__ctl_apply_end(struct ctl *ctl, struct ctl_job *job, int state, const char *reason)
{
	struct ctl_res r;

	job->state = (uint8_t)state;
	job->min_reached_ms = 0;
	mr__ctl_set_reason(job, reason);
	mr__rec_end(ctl, job);
	job->gen_seq = mr__rec_seq(ctl);
	memset(&r, 0, sizeof(r));
	mr__res_over(&r, job);
	mr__ctl_waiters_fail(ctl, job, r.status, r.code, "job", r.body, r.msg);
	if (!ctl->replaying)
		mr_log(state == CTL_JOB_FAILED ? MR_LOG_WARN : MR_LOG_INFO,
		       state == CTL_JOB_FAILED ? "job_failed" : "job_succeeded",
		       "job=%s gen=%llu reason=%s", mr_log_q(job->name),
		       (unsigned long long)job->generation, mr_log_q(job->reason ? job->reason : ""));
}

/* why: what ended the generation (also the reason if the job fails);
 * carry: the live members go on in the next round (not after a failure
 * report: a worker fails most often because a peer was lost, and that peer
 * may not look lost yet - everybody joins again instead). */
static void bump(struct ctl *ctl, struct ctl_job *job, int failure, const char *why,
		 const char *node_id, int carry)
{
	int32_t restarts = job->restarts + (failure ? 1 : 0);
	int failed = restarts > job->spec.max_restarts;
	char reason[CTL_MAX_REASON];

	snprintf(reason, sizeof(reason), "max_restarts (%d) exceeded: %s of node '%s'",
		 job->spec.max_restarts, why, node_id);
	ctl->stats.bumps++;
	mr__ctl_apply_bump(ctl, job, job->generation + 1, restarts, failed,
			   failed ? reason : NULL, carry);
	mr_log(failed ? MR_LOG_WARN : MR_LOG_INFO, failed ? "job_failed" : "generation_bumped",
	       "job=%s gen=%llu reason=%s node=%s restarts=%d carried=%u", mr_log_q(job->name),
	       (unsigned long long)job->generation, why, mr_log_q(node_id), restarts,
	       job->count[CTL_M_WAITING]);
}

/* Closes the forming round if it may close now. */
static void maybe_close(struct ctl *ctl, struct ctl_job *job)
{
	int32_t w = (int32_t)job->count[CTL_M_WAITING];
	int32_t top;

	if (job->state != CTL_JOB_FORMING || w < job->spec.min_nodes)
		return;
	if (w < job->spec.max_nodes &&
	    !(job->min_reached_ms && ctl->now_ms >= job->min_reached_ms + job->spec.last_call_ms))
		return;
	top = w < job->spec.max_nodes ? w : job->spec.max_nodes;
	for (int32_t n = top; n >= job->spec.min_nodes; n--) {
		if (mr__ctl_mesh_fits(&job->spec, n, NULL)) {
			mr__ctl_apply_close(ctl, job, n);
			return;
		}
	}
}

void mr__ctl_stale_member(const struct ctl_job *job, const char *node_id,
			  struct ctl_res *res)
{
	const struct ctl_member *m = job && node_id ? mr_dict_get(&job->members, node_id) : NULL;
	size_t len = 0;
	char *t;

	if (!m || res->status != 409 || !res->code || strcmp(res->code, "stale_generation") ||
	    (m->state != CTL_M_WAITING && m->state != CTL_M_RUNNING &&
	     m->state != CTL_M_STANDBY))
		return;
	t = mr__json_write_stale(job, m, &len);
	if (!t)
		return; /* no memory: a plain 409 (the member joins) */
	free(res->text);
	res->text = t;
	res->text_len = len;
	/* a waiting or standby member's state may come from a join after the
	 * bump: the reply shows that member record too */
	if (m->state != CTL_M_RUNNING && job->member_seq > res->dep_seq)
		res->dep_seq = job->member_seq;
}

struct ctl_job *mr__ctl_job_for_member(struct ctl *ctl, const char *name, int64_t gen,
				       const char *node_id, struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job_for(ctl, name, gen, res);
	struct ctl_member *m;

	if (!job && node_id && res->status == 409)
		mr__ctl_stale_member(mr__ctl_job(ctl, name), node_id, res);
	/* a running member calling in its round knows its rank (it may have
	 * learned it from a 409): from now on its join is a restart */
	if (job && node_id && job->state == CTL_JOB_RUNNING &&
	    (m = mr_dict_get(&job->members, node_id)) && m->state == CTL_M_RUNNING)
		m->confirmed = 1;
	return job;
}

/* ---- operations ------------------------------------------------------------- */

void mr__ctl_join(struct ctl *ctl, const char *name, const struct ctl_join *j,
		  struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job(ctl, name);
	struct ctl_member *m;
	int st = CTL_M_WAITING;

	if (!job && j->spec) {
		mr__ctl_job_create(ctl, name, j->spec, res);
		mr__res_release(res);
		if (res->code)
			return;
		job = mr__ctl_job(ctl, name);
	}
	if (!job || mr__ctl_job_over(job)) {
		mr__ctl_job_for(ctl, name, -1, res);
		return;
	}
	m = mr_dict_get(&job->members, j->node_id);
	if (!m && mr_dict_len(&job->members) >= ctl->lim.max_members) {
		mr__res_err(res, 429, "too_many_members", "node_id", "job '%s' has %u members",
			    name, ctl->lim.max_members);
		return;
	}
	if (job->state == CTL_JOB_RUNNING) {
		if (m && m->state == CTL_M_RUNNING && !m->confirmed) {
			/* a retried join (its reply was lost) before the member ever
			 * learned its rank: nothing ran yet, so nothing to restart */
			mr__ctl_member_touch(ctl, job, m);
			mr__res_ok(res, json_pack("{sI ss si}", "generation",
						  (json_int_t)job->generation, "state", "running",
						  "node_rank", m->node_rank));
			return;
		} else if (m && m->state == CTL_M_RUNNING) {
			bump(ctl, job, 1, "rejoin", j->node_id, 1); /* the pod restarted */
		} else if (m && m->state == CTL_M_STANDBY) {
			st = CTL_M_STANDBY;
		} else if (job->count[CTL_M_RUNNING] < (uint32_t)job->spec.max_nodes) {
			bump(ctl, job, 0, "scale_up", j->node_id, 1);
		} else {
			st = CTL_M_STANDBY;
		}
		if (job->state == CTL_JOB_FAILED) {
			mr__ctl_job_for(ctl, name, -1, res);
			return;
		}
	}
	m = mr__ctl_apply_member(ctl, job, j, st, -1);
	if (!m) {
		mr__res_err(res, 503, "out_of_memory", NULL, "out of memory");
		return;
	}
	ctl->stats.joins++;
	maybe_close(ctl, job);
	mr__res_ok(res, json_pack("{sI ss}", "generation", (json_int_t)job->generation, "state",
				  mr__ctl_member_state_name(m->state)));
	if (m->state == CTL_M_RUNNING)
		json_object_set_new(res->body, "node_rank", json_integer(m->node_rank));
}

static struct ctl_member *member_for(struct ctl_job *job, const char *node_id,
				     struct ctl_res *res)
{
	struct ctl_member *m = mr_dict_get(&job->members, node_id);

	if (!m) {
		mr__res_err(res, 404, "not_member", "node_id",
			    "node '%.253s' is not a member of job '%s'", node_id, job->name);
		return NULL;
	}
	if (m->state == CTL_M_STALE) {
		mr__res_stale(res, job);
		return NULL;
	}
	return m;
}

void mr__ctl_wait(struct ctl *ctl, const char *name, const char *node_id, int64_t gen,
		  int64_t timeout_ms, void *req, struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job_for_member(ctl, name, gen, node_id, res);
	struct ctl_member *m = job ? member_for(job, node_id, res) : NULL;
	struct ctl_waiter *w;

	if (!m)
		return;
	mr__ctl_member_touch(ctl, job, m);
	if (m->state == CTL_M_RUNNING) {
		m->confirmed = 1;
		res_round(res, job, m);
		mr__res_dep_round(res, job); /* the rank is the close's */
		return;
	}
	if (timeout_ms <= 0 || !req) {
		res_state(res, job, mr__ctl_member_state_name(m->state));
		return;
	}
	if (m->waiter) { /* a newer wait of the same member supersedes the older */
		struct ctl_res old;

		memset(&old, 0, sizeof(old));
		mr__res_err(&old, 409, "superseded", "node_id",
			    "a newer wait of node '%.253s' replaced this one", node_id);
		mr__ctl_waiter_finish(ctl, m->waiter, &old);
	}
	w = mr__ctl_waiter_add(ctl, job, req, CTL_W_ROUND, timeout_ms);
	if (!w) {
		mr__res_err(res, 503, "out_of_memory", NULL, "out of memory");
		return;
	}
	w->member = m;
	m->waiter = w;
	res->suspended = 1;
}

void mr__ctl_heartbeat(struct ctl *ctl, const char *name, const char *node_id, int64_t gen,
		       const json_t *progress, struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job_for_member(ctl, name, gen, node_id, res);
	struct ctl_member *m = job ? member_for(job, node_id, res) : NULL;

	if (!m)
		return;
	if (progress && mr__ctl_progress_apply(ctl, job, m, progress, res))
		return;
	mr__ctl_member_touch(ctl, job, m);
	if (m->state == CTL_M_RUNNING)
		m->confirmed = 1;
	res_state(res, job, mr__ctl_member_state_name(m->state));
	if (m->state == CTL_M_RUNNING && !progress && !res->code)
		mr__res_dep_round(res, job); /* running: the close's state */
}

void mr__ctl_leave(struct ctl *ctl, const char *name, const char *node_id, int64_t gen,
		   int failure, struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job_for_member(ctl, name, gen, node_id, res);
	struct ctl_member *m = job ? member_for(job, node_id, res) : NULL;

	if (!m)
		return;
	if (m->state == CTL_M_RUNNING && job->state == CTL_JOB_RUNNING) {
		if (!failure)
			mr__ctl_apply_member_delete(ctl, job, m);
		bump(ctl, job, failure, failure ? "fail" : "leave", node_id, !failure);
	} else {
		mr__ctl_apply_member_delete(ctl, job, m);
	}
	mr__res_ok(res, json_pack("{sI ss}", "generation", (json_int_t)job->generation, "state",
				  mr__ctl_job_state_name(job->state)));
}

void mr__ctl_fail_job(struct ctl *ctl, const char *name, const char *node_id,
		      const char *reason, struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job_for(ctl, name, -1, res);
	struct ctl_member *m = job ? mr_dict_get(&job->members, node_id) : NULL;
	char why[CTL_MAX_REASON];

	if (!job)
		return;
	if (!m) {
		mr__res_err(res, 404, "not_member", "node_id",
			    "node '%.253s' is not a member of job '%s'", node_id, job->name);
		return;
	}
	snprintf(why, sizeof(why), "node '%s' failed permanently%s%s", node_id,
		 reason && *reason ? ": " : "", reason ? reason : "");
	mr__ctl_apply_end(ctl, job, CTL_JOB_FAILED, why);
	mr__res_ok(res, json_pack("{sI ss ss}", "generation", (json_int_t)job->generation, "state",
				  mr__ctl_job_state_name(job->state), "reason", job->reason));
}

void mr__ctl_complete(struct ctl *ctl, const char *name, const char *node_id, int64_t gen,
		      struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job_for_member(ctl, name, gen, node_id, res);
	struct ctl_member *m = job ? member_for(job, node_id, res) : NULL;

	if (!m)
		return;
	if (m->state != CTL_M_DONE && (m->state != CTL_M_RUNNING || job->state != CTL_JOB_RUNNING)) {
		mr__res_err(res, 409, "not_running", "node_id",
			    "node '%.253s' is %s, not running", node_id,
			    mr__ctl_member_state_name(m->state));
		return;
	}
	mr__ctl_member_touch(ctl, job, m);
	if (m->state == CTL_M_RUNNING) {
		mr__ctl_set_state(ctl, job, m, CTL_M_DONE);
		mr__rec_member(ctl, job, m);
		if (!ctl->replaying)
			mr_log_info("member_done", "job=%s node=%s running=%u", mr_log_q(job->name),
				    mr_log_q(node_id), job->count[CTL_M_RUNNING]);
	}
	if (job->count[CTL_M_RUNNING] == 0) {
		char why[128];

		snprintf(why, sizeof(why), "all %d nodes of generation %llu completed",
			 job->num_nodes, (unsigned long long)job->generation);
		mr__ctl_apply_end(ctl, job, CTL_JOB_SUCCEEDED, why);
	}
	mr__res_ok(res, json_pack("{sI ss}", "generation", (json_int_t)job->generation, "state",
				  mr__ctl_job_state_name(job->state)));
}

/* ---- timers --------------------------------------------------------------------- */

/*
 * Every running member of a job silent past the heartbeat timeout at once
 * is what a controller cut off from the pod network sees (its own link
 * down), not what dying pods look like: pods fail one by one. Declaring
 * them all dead would restart a job that trains on undisturbed, as it does
 * while the controller process is down. So while no running member of a
 * job of several was heard within the timeout, nobody is expired; the
 * members' next heartbeats (the link back) end it. Past ISOLATED_TIMEOUTS
 * timeouts of silence the members are expired as usual: the pods are gone.
 *
 * Members beat at different moments (every quarter timeout by default),
 * so the first of them to time out is up to a beat ahead of the last, on
 * the way down as on the way back: expiry already waits while nobody was
 * heard for half a timeout (a live member beats in that time), and when
 * one member is heard after all were silent, every running member's
 * silence counts anew from then, so that the others' first beats after
 * the link's return are not late. A member that died meanwhile expires one
 * timeout later. (The clocks restart only after a silence of all past the
 * timeout, which members alive do not keep up: no member lost for good
 * can hide behind them.)
 */
#define ISOLATED_TIMEOUTS 10

static int hold_expiry(struct ctl *ctl, struct ctl_job *job, int64_t hb)
{
	struct ctl_member *newest = job->lru_tail;
	int64_t quiet = newest ? ctl->now_ms - newest->last_seen_ms : 0;
	int several = job->state == CTL_JOB_RUNNING && job->count[CTL_M_RUNNING] > 1 && newest &&
		      newest->state == CTL_M_RUNNING;

	if (several && quiet >= hb / 2 && quiet < ISOLATED_TIMEOUTS * hb) {
		if (quiet >= hb && !job->all_silent)
			mr_log_warn("members_all_silent",
				    "job=%s running=%u silent_ms=%lld action=waiting limit_ms=%lld",
				    mr_log_q(job->name), job->count[CTL_M_RUNNING],
				    (long long)quiet, (long long)(ISOLATED_TIMEOUTS * hb));
		job->all_silent |= quiet >= hb;
		return 1;
	}
	if (several && job->all_silent && quiet < hb / 2) {
		mr_log_info("members_heard_again", "job=%s", mr_log_q(job->name));
		for (struct ctl_member *m = job->lru_head; m; m = m->lru_next)
			m->last_seen_ms = ctl->now_ms;
	}
	job->all_silent = 0;
	return 0;
}

static void expire_members(struct ctl *ctl, struct ctl_job *job)
{
	int64_t hb = job->spec.heartbeat_timeout_ms;

	if (hold_expiry(ctl, job, hb))
		return;

	while (job->lru_head && job->lru_head->last_seen_ms + hb <= ctl->now_ms) {
		struct ctl_member *m = job->lru_head;

		if (m->waiter) {
			mr__ctl_member_touch(ctl, job, m);
			continue;
		}
		if (m->state == CTL_M_RUNNING && job->state == CTL_JOB_RUNNING) {
			char id[CTL_MAX_NODE_ID + 1];

			snprintf(id, sizeof(id), "%s", m->node_id);
			ctl->stats.dead++;
			mr__ctl_apply_member_delete(ctl, job, m);
			bump(ctl, job, 1, "heartbeat_timeout", id, 1);
		} else {
			mr_log_info("member_expired", "job=%s node=%s state=%s",
				    mr_log_q(job->name), mr_log_q(m->node_id),
				    mr__ctl_member_state_name(m->state));
			mr__ctl_apply_member_delete(ctl, job, m);
		}
	}
}

void mr__ctl_tick(struct ctl *ctl)
{
	size_t cur = 0;
	void *v;

	ctl->now_ms = mr__ctl_now_ms() + ctl->skew_ms;
	mr__ctl_waiters_expire(ctl);
	if (ctl->now_ms - ctl->last_scan_ms < SCAN_EVERY_MS)
		return;
	ctl->last_scan_ms = ctl->now_ms;
	while (mr_dict_next(&ctl->jobs, &cur, NULL, &v)) {
		struct ctl_job *job = v;

		if (job->state == CTL_JOB_FORMING && job->min_reached_ms)
			maybe_close(ctl, job);
		expire_members(ctl, job);
		mr__ctl_diag_tick(ctl, job);
	}
}

void mr__ctl_touch_all(struct ctl *ctl)
{
	size_t cur = 0;
	void *v;

	ctl->now_ms = mr__ctl_now_ms();
	while (mr_dict_next(&ctl->jobs, &cur, NULL, &v)) {
		struct ctl_job *job = v;

		/* after a restart nobody knows what members were told: treat
		 * every running member as confirmed, so a rejoin means a restart */
		for (struct ctl_member *m = job->lru_head; m; m = m->lru_next) {
			m->last_seen_ms = ctl->now_ms;
			m->heard = 0; /* a grace, not a sign of life */
			m->confirmed = m->state == CTL_M_RUNNING;
		}
		job->min_reached_ms = 0;
		mr__ctl_update_min(ctl, job);
	}
}
