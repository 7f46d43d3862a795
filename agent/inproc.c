/*
 * inproc.c - in-process ranks: one thread per local rank that runs the
 * workload itself, or (process mode) starts a worker process running it
 * and relays its stats (rankproc.c); see inproc.h.
 */
#include "inproc.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mr_log.h"
#include "rankproc.h"

long long mr__inproc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int mr__rank_run(const struct mr_worker_ops *ops, const struct mr_worker_env *env,
		 const struct mr_rdzv_opts *kvopts, const atomic_int *aborting,
		 const struct mr__rank_sink *sink, char *err, size_t cap)
{
	struct mr_worker_stats st;
	struct mr_errbuf eb = {0};
	struct mr_kv_http kvh = {0};
	struct mr_kv kv;
	struct mr_worker_env e = *env; /* with the KV; lives until destroy() */
	void *state = NULL;
	int rc, code, created = 0;

	mr_log_set_rank(env->rank);
	memset(&st, 0, sizeof(st));
	st.val_loss = NAN; /* mr_worker.h: NaN until an evaluation */
	err[0] = '\0';
	rc = mr_kv_http_open(&kvh, &kv, kvopts, env->generation, &eb);
	if (!rc) {
		e.kv = &kv;
		rc = ops->create(&state, &e, &eb);
	}
	if (!rc) {
		created = 1;
		sink->state(sink->arg, state);
		if (atomic_load(aborting))
			ops->abort(state);
		for (;;) {
			rc = ops->step(state, &st, &eb);
			sink->stats(sink->arg, &st);
			if (rc != MR_WORKER_MORE)
				break;
		}
		sink->state(sink->arg, NULL); /* abort() must not touch it any more */
		ops->destroy(state);
	}
	/* once the agent aborts the ranks, one rank's abort reaches another as
	 * a failed peer (MR_EPEER) before its own abort lands: part of the stop */
	if (rc < 0 && created && atomic_load(aborting))
		rc = MR_EABORTED;
	if (rc == MR_WORKER_DONE) {
		code = 0;
	} else if (rc == MR_WORKER_STOPPED) {
		code = 128 + SIGTERM; /* stopped as asked, checkpoint written */
	} else {
		code = rc == MR_EABORTED ? 128 + SIGTERM : 1;
		/* a workload that rejects its config at create (or cannot find its
		 * data file, or cannot allocate its model) fails the same way on
		 * every run: exit 2, permanent under the exit-code policy */
		if (!created && (rc == MR_EINVAL || rc == MR_ERANGE || rc == MR_ECORRUPT ||
				 rc == MR_ENOTSUP || rc == MR_ENOTFOUND || rc == MR_ELIMIT ||
				 rc == MR_ENOMEM))
			code = 2;
		snprintf(err, cap, "%s", eb.msg[0] ? eb.msg : mr_strerror(rc));
		if (rc != MR_EABORTED)
			mr_log_error("worker_failed", "err=%s msg=%s", mr_err_name(rc),
				     mr_log_q(err));
	}
	mr_kv_http_close(&kvh);
	return code;
}

/* The rank thread's sink: what it publishes stays under the rank's lock. */
static void thread_state(void *arg, void *state)
{
	struct mr_inproc_rank *r = arg;

	pthread_mutex_lock(&r->lock);
	r->state = state;
	pthread_mutex_unlock(&r->lock);
}

static void thread_stats(void *arg, const struct mr_worker_stats *st)
{
	struct mr_inproc_rank *r = arg;

	pthread_mutex_lock(&r->lock);
	r->stats = *st;
	pthread_mutex_unlock(&r->lock);
}

static void *rank_main(void *arg)
{
	struct mr_inproc_rank *r = arg;
	const struct mr__rank_sink sink = { r, thread_state, thread_stats };

	if (r->owner->process)
		r->code = mr__rankproc_run(r);
	else
		r->code = mr__rank_run(r->owner->ops, &r->env, &r->owner->kvopts,
				       &r->owner->aborting, &sink, r->err, sizeof(r->err));
	atomic_store(&r->done, 1);
	return NULL;
}

int mr_inproc_start(struct mr_inproc *ip, const struct mr_worker_ops *ops,
		    const struct mr_worker_env *envs, int n, const struct mr_rdzv_opts *kvopts,
		    const struct mr_inproc_opts *o, struct mr_errbuf *eb)
{
	memset(ip, 0, sizeof(*ip));
	ip->ops = ops;
	ip->kvopts = *kvopts;
	if (o) {
		ip->process = o->process;
		ip->kill_ms = o->kill_ms;
	}
	if (ip->process && mr__rankproc_prepare(ip, eb) < 0)
		return MR_ESYS;
	ip->rank = calloc((size_t)n, sizeof(*ip->rank));
	if (!ip->rank)
		return mr_errf(eb, MR_ENOMEM, "out of memory for %d workers", n);
	ip->n = n;
	for (int i = 0; i < n; i++) {
		struct mr_inproc_rank *r = &ip->rank[i];

		r->owner = ip;
		r->env = envs[i];
		r->env.cancel = &ip->aborting;
		r->sock = -1;
		pthread_mutex_init(&r->lock, NULL);
		r->stats.val_loss = NAN; /* mr_worker.h: NaN until an evaluation */
		if (pthread_create(&r->thread, NULL, rank_main, r) != 0) {
			mr_inproc_stop(ip);
			return mr_errf(eb, MR_ESYS, "unable to start the thread of local rank %d",
				       i);
		}
		r->started = 1;
	}
	return 0;
}

void mr_inproc_poll(struct mr_inproc *ip, struct mr_exec_status *st)
{
	memset(st, 0, sizeof(*st));
	st->first_failed_rank = -1;
	for (int i = 0; i < ip->n; i++) {
		struct mr_inproc_rank *r = &ip->rank[i];

		if (!atomic_load(&r->done)) {
			st->running++;
			continue;
		}
		st->exited++;
		if (r->code) {
			st->failed++;
			if (st->first_failed_rank < 0) {
				st->first_failed_rank = r->env.rank;
				st->first_failed_code = r->code;
			}
		}
	}
}

/* Asks every rank to abort ('a') or preempt ('p'). */
static void tell_all(struct mr_inproc *ip, char what)
{
	for (int i = 0; i < ip->n; i++) {
		struct mr_inproc_rank *r = &ip->rank[i];

		pthread_mutex_lock(&r->lock);
		if (ip->process)
			mr__rankproc_tell(r, what);
		else if (r->state && what == 'p' && ip->ops->preempt)
			ip->ops->preempt(r->state);
		else if (r->state)
			ip->ops->abort(r->state);
		pthread_mutex_unlock(&r->lock);
	}
}

void mr_inproc_abort(struct mr_inproc *ip)
{
	atomic_store(&ip->aborting, 1);
	tell_all(ip, 'a');
}

void mr_inproc_preempt(struct mr_inproc *ip, int grace_ms)
{
	long long end;

	tell_all(ip, 'p');
	end = mr__inproc_now_ms() + grace_ms;
	for (;;) {
		int running = 0;
		for (int i = 0; i < ip->n; i++)
			running += !atomic_load(&ip->rank[i].done);
		if (!running || mr__inproc_now_ms() >= end)
			break;
		usleep(20 * 1000);
	}
}

void mr_inproc_join(struct mr_inproc *ip)
{
	if (!ip->rank)
		return;
	mr_inproc_abort(ip);
	for (int i = 0; i < ip->n; i++) {
		if (ip->rank[i].started)
			pthread_join(ip->rank[i].thread, NULL);
		ip->rank[i].started = 0;
	}
}

void mr_inproc_stop(struct mr_inproc *ip)
{
	if (!ip->rank)
		return;
	mr_inproc_join(ip);
	for (int i = 0; i < ip->n; i++)
		pthread_mutex_destroy(&ip->rank[i].lock);
	free(ip->rank);
	ip->rank = NULL;
	ip->n = 0;
}

int mr_inproc_stats(struct mr_inproc *ip, int i, struct mr_worker_stats *out)
{
	if (i < 0 || i >= ip->n)
		return MR_ERANGE;
	pthread_mutex_lock(&ip->rank[i].lock);
	*out = ip->rank[i].stats;
	pthread_mutex_unlock(&ip->rank[i].lock);
	return 0;
}

int mr_inproc_progress(struct mr_inproc *ip, int i, struct mr_worker_progress *out)
{
	struct mr_inproc_rank *r;
	int rc = MR_ENOTFOUND;

	if (i < 0 || i >= ip->n)
		return MR_ERANGE;
	r = &ip->rank[i];
	pthread_mutex_lock(&r->lock); /* the state lives while it is set */
	if (ip->process && r->has_progress) {
		*out = r->progress; /* the worker process's latest report */
		rc = 0;
	} else if (!ip->process && r->state && ip->ops->progress) {
		ip->ops->progress(r->state, out);
		rc = 0;
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}
