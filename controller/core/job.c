/*
 * job.c - jobs and members of the controller core (rounds, generations and
 * timers are in round.c).
 *
 * A job is stored by name in ctl->jobs; its members by node id in
 * job->members and, for heartbeat expiry, in a list ordered by last_seen.
 * The apply functions here are shared by the live paths and journal
 * replay. Every member state change goes through mr__ctl_set_state() so the
 * per-state counters and the last-call window stay right.
 *
 * Non-goals: rounds (round.c), KV (kv.c), waiters (waiter.c), replies
 * (reply.c), state names (state/names.c), HTTP.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"
#include "mr_log.h"

int64_t mr__ctl_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int mr__ctl_job_over(const struct ctl_job *job)
{
	return job->state == CTL_JOB_FAILED || job->state == CTL_JOB_SUCCEEDED;
}

void mr__ctl_set_reason(struct ctl_job *job, const char *reason)
{
	size_t n = reason ? strlen(reason) : 0;

	if (n > CTL_MAX_REASON - 1) { /* cut on a UTF-8 character boundary */
		n = CTL_MAX_REASON - 1;
		while (n > 0 && ((unsigned char)reason[n] & 0xc0) == 0x80)
			n--;
	}
	free(job->reason);
	job->reason = reason ? strndup(reason, n) : NULL;
}

/* ---- lifecycle ---------------------------------------------------------- */

void mr__ctl_init(struct ctl *ctl, const struct ctl_limits *lim)
{
	memset(ctl, 0, sizeof(*ctl));
	ctl->lim = *lim;
	mr_dict_init(&ctl->jobs, 0);
	ctl->now_ms = mr__ctl_now_ms();
}

static void member_free(struct ctl_member *m)
{
	if (!m)
		return;
	free(m->node_id);
	free(m->host);
	free(m->host_id);
	free(m->ports);
	free(m->topology);
	free(m->prog);
	free(m);
}

static void job_free(struct ctl *ctl, struct ctl_job *job)
{
	struct ctl_member *m = job->lru_head;

	while (job->waiters) {
		struct ctl_waiter *w = job->waiters;
		void (*wake)(struct ctl *, void *, struct ctl_res *) = ctl->wake;
		struct ctl_res res;

		memset(&res, 0, sizeof(res));
		ctl->wake = NULL; /* dropped, not answered */
		mr__ctl_waiter_finish(ctl, w, &res);
		ctl->wake = wake;
	}
	while (m) {
		struct ctl_member *next = m->lru_next;

		member_free(m);
		m = next;
	}
	mr_dict_release(&job->members, NULL);
	mr__ctl_kv_clear(ctl, job);
	mr_dict_release(&job->kv, NULL);
	mr_dict_release(&job->kvwait, free);
	mr__ctl_diag_free(job);
	free(job->reason);
	free(job->name);
	free(job);
}

void mr__ctl_release(struct ctl *ctl)
{
	size_t cur = 0;
	void *v;

	while (mr_dict_next(&ctl->jobs, &cur, NULL, &v))
		job_free(ctl, v);
	mr_dict_release(&ctl->jobs, NULL);
	free(ctl->heap);
	ctl->heap = NULL;
	ctl->heap_len = ctl->heap_cap = 0;
}

/* ---- members ------------------------------------------------------------ */

static void lru_unlink(struct ctl_job *job, struct ctl_member *m)
{
	if (m->lru_prev)
		m->lru_prev->lru_next = m->lru_next;
	else
		job->lru_head = m->lru_next;
	if (m->lru_next)
		m->lru_next->lru_prev = m->lru_prev;
	else
		job->lru_tail = m->lru_prev;
	m->lru_prev = m->lru_next = NULL;
}

static void lru_append(struct ctl_job *job, struct ctl_member *m)
{
	m->lru_prev = job->lru_tail;
	m->lru_next = NULL;
	if (job->lru_tail)
		job->lru_tail->lru_next = m;
	else
		job->lru_head = m;
	job->lru_tail = m;
}

void mr__ctl_member_touch(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m)
{
	m->last_seen_ms = ctl->now_ms;
	m->heard = 1;
	if (job->lru_tail != m) {
		lru_unlink(job, m);
		lru_append(job, m);
	}
}

void mr__ctl_update_min(struct ctl *ctl, struct ctl_job *job)
{
	if (job->state != CTL_JOB_FORMING ||
	    job->count[CTL_M_WAITING] < (uint32_t)job->spec.min_nodes)
		job->min_reached_ms = 0;
	else if (!job->min_reached_ms)
		job->min_reached_ms = ctl->now_ms;
}

void mr__ctl_set_state(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m, int st)
{
	if (st != CTL_M_RUNNING)
		mr__ctl_progress_drop(ctl, job, m);
	job->count[m->state]--;
	job->count[st]++;
	m->state = (uint8_t)st;
	if (st != CTL_M_RUNNING)
		m->node_rank = -1;
	mr__ctl_update_min(ctl, job);
}

static int set_str(char **dst, const char *src)
{
	char *c = NULL;

	if (src && *dst && strcmp(*dst, src) == 0)
		return 0;
	if (src) {
		c = strdup(src);
		if (!c)
			return MR_ENOMEM;
	}
	free(*dst);
	*dst = c;
	return 0;
}

struct ctl_member *mr__ctl_apply_member(struct ctl *ctl, struct ctl_job *job,
					const struct ctl_join *who, int state, int32_t node_rank)
{
	const char *node_id = who->node_id;
	struct ctl_member *m = mr_dict_get(&job->members, node_id);

	if (!m) {
		m = calloc(1, sizeof(*m));
		if (!m || !(m->node_id = strdup(node_id)) ||
		    mr_dict_put(&job->members, m->node_id, m, NULL)) {
			member_free(m);
			return NULL;
		}
		m->state = (uint8_t)state;
		job->count[state]++;
		lru_append(job, m);
	}
	if (set_str(&m->host, who->host) || set_str(&m->host_id, who->host_id) ||
	    set_str(&m->ports, who->ports) || set_str(&m->topology, who->topology))
		mr_log_warn("member_oom", "node=%s", mr_log_q(node_id));
	m->pod_index = who->pod_index;
	mr__ctl_set_state(ctl, job, m, state);
	m->node_rank = state == CTL_M_RUNNING ? node_rank : -1;
	mr__ctl_member_touch(ctl, job, m);
	mr__rec_member(ctl, job, m);
	job->member_seq = mr__rec_seq(ctl);
	return m;
}

void mr__ctl_apply_member_delete(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m)
{
	if (m->waiter) {
		struct ctl_res res;

		memset(&res, 0, sizeof(res));
		mr__res_err(&res, 404, "not_member", "node_id", "node '%.253s' left the job",
			    m->node_id);
		mr__ctl_waiter_finish(ctl, m->waiter, &res);
	}
	mr__rec_member_delete(ctl, job, m->node_id);
	job->member_seq = mr__rec_seq(ctl);
	mr__ctl_progress_drop(ctl, job, m);
	lru_unlink(job, m);
	job->count[m->state]--;
	mr_dict_del(&job->members, m->node_id);
	member_free(m);
	mr__ctl_update_min(ctl, job);
}

json_t *mr__ctl_member_json(const struct ctl_member *m)
{
	json_t *o = json_pack("{ss ss}", "node_id", m->node_id, "state",
			      mr__ctl_member_state_name(m->state));
	json_t *ports = NULL;

	if (!o)
		return NULL;
	if (m->host)
		json_object_set_new(o, "host", json_string(m->host));
	if (m->host_id)
		json_object_set_new(o, "host_id", json_string(m->host_id));
	if (m->ports)
		ports = json_loads(m->ports, 0, NULL);
	if (ports)
		json_object_set_new(o, "ports", ports);
	if (m->pod_index >= 0)
		json_object_set_new(o, "pod_index", json_integer(m->pod_index));
	if (m->topology)
		json_object_set_new(o, "topology", json_string(m->topology));
	if (m->node_rank >= 0)
		json_object_set_new(o, "node_rank", json_integer(m->node_rank));
	return o;
}

/* ---- jobs ----------------------------------------------------------------- */

struct ctl_job *mr__ctl_job(struct ctl *ctl, const char *name)
{
	return mr_dict_get(&ctl->jobs, name);
}

struct ctl_job *mr__ctl_apply_job(struct ctl *ctl, const char *name, const struct ctl_spec *spec,
				  uint64_t gen, int state, int32_t restarts, uint64_t rounds,
				  uint64_t kv_seq, int32_t num_nodes)
{
	struct ctl_job *job = mr_dict_get(&ctl->jobs, name);

	if (!job) {
		job = calloc(1, sizeof(*job));
		if (!job || !(job->name = strdup(name)))
			goto oom;
		mr_dict_init(&job->members, 0);
		mr_dict_init(&job->kv, 0);
		mr_dict_init(&job->kvwait, 0);
		if (mr_dict_put(&ctl->jobs, job->name, job, NULL))
			goto oom;
	}
	job->spec = *spec;
	job->generation = gen;
	job->state = (uint8_t)state;
	job->restarts = restarts;
	job->rounds = rounds;
	job->kv_seq = kv_seq;
	job->num_nodes = num_nodes;
	job->world_size = num_nodes * spec->nproc_per_node;
	job->dp = 0;
	if (num_nodes)
		mr__ctl_mesh_fits(spec, num_nodes, &job->dp);
	mr__ctl_update_min(ctl, job);
	mr__rec_job(ctl, job);
	job->gen_seq = mr__rec_seq(ctl);
	return job;
oom:
	if (job)
		free(job->name);
	free(job);
	return NULL;
}

void mr__ctl_apply_job_delete(struct ctl *ctl, struct ctl_job *job)
{
	mr__ctl_waiters_fail(ctl, job, 410, "job_deleted", "job", NULL, "the job was deleted");
	mr__rec_job_delete(ctl, job->name);
	mr_dict_del(&ctl->jobs, job->name);
	job_free(ctl, job);
}

json_t *mr__ctl_job_json(const struct ctl_job *job)
{
	json_t *o = json_pack("{ss ss sI si sI si si}", "name", job->name, "state",
			      mr__ctl_job_state_name(job->state), "generation",
			      (json_int_t)job->generation, "restarts", job->restarts, "rounds",
			      (json_int_t)job->rounds, "num_nodes", job->num_nodes, "world_size",
			      job->world_size);

	if (!o)
		return NULL;
	json_object_set_new(o, "spec", mr__ctl_spec_json(&job->spec));
	json_object_set_new(o, "members",
			    json_pack("{sI sI sI sI sI sI}", "total",
				      (json_int_t)mr_dict_len(&job->members), "waiting",
				      (json_int_t)job->count[CTL_M_WAITING], "running",
				      (json_int_t)job->count[CTL_M_RUNNING], "standby",
				      (json_int_t)job->count[CTL_M_STANDBY], "stale",
				      (json_int_t)job->count[CTL_M_STALE], "done",
				      (json_int_t)job->count[CTL_M_DONE]));
	json_object_set_new(o, "kv", json_pack("{sI sI}", "keys", (json_int_t)mr_dict_len(&job->kv),
					       "bytes", (json_int_t)job->kv_bytes));
	if (job->dp)
		json_object_set_new(o, "dp", json_integer(job->dp));
	if (job->reason)
		json_object_set_new(o, "reason", json_string(job->reason));
	return o;
}

void mr__ctl_job_create(struct ctl *ctl, const char *name, const struct ctl_spec *spec,
			struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job(ctl, name);

	if (job) {
		if (memcmp(&job->spec, spec, sizeof(*spec)) != 0) {
			mr__res_err(res, 409, "job_exists", "name",
				    "job '%s' exists with a different spec", name);
			return;
		}
		mr__res_ok(res, mr__ctl_job_json(job));
		return;
	}
	if (mr_dict_len(&ctl->jobs) >= ctl->lim.max_jobs) {
		mr__res_err(res, 429, "too_many_jobs", "name", "the controller holds %u jobs",
			    ctl->lim.max_jobs);
		return;
	}
	job = mr__ctl_apply_job(ctl, name, spec, 1, CTL_JOB_FORMING, 0, 0, 0, 0);
	if (!job) {
		mr__res_err(res, 503, "out_of_memory", NULL, "out of memory");
		return;
	}
	mr_log_info("job_created", "job=%s min=%d max=%d", mr_log_q(name), spec->min_nodes,
		    spec->max_nodes);
	mr__res_ok(res, mr__ctl_job_json(job));
	res->status = 201;
}

void mr__ctl_job_delete(struct ctl *ctl, const char *name, struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job(ctl, name);

	if (!job) {
		mr__res_err(res, 404, "job_not_found", "job", "job '%s' does not exist", name);
		return;
	}
	mr__ctl_apply_job_delete(ctl, job);
	mr_log_info("job_deleted", "job=%s", mr_log_q(name));
	mr__res_ok(res, json_pack("{sb}", "deleted", 1));
}

struct ctl_job *mr__ctl_job_for(struct ctl *ctl, const char *name, int64_t gen,
				struct ctl_res *res)
{
	struct ctl_job *job = mr__ctl_job(ctl, name);

	if (!job) {
		mr__res_err(res, 404, "job_not_found", "job", "job '%s' does not exist", name);
		return NULL;
	}
	if (mr__ctl_job_over(job)) {
		mr__res_over(res, job);
		return NULL;
	}
	if (gen >= 0 && (uint64_t)gen != job->generation) {
		mr__res_stale(res, job);
		return NULL;
	}
	return job;
}

