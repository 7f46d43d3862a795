/*
 * inproc.c - one thread per local rank driving struct mr_worker_ops; see
 * inproc.h.
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

static long long mr__now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *rank_main(void *arg)
{
	struct mr_inproc_rank *r = arg;
	const struct mr_worker_ops *ops = r->owner->ops;
	struct mr_worker_stats st;
	struct mr_errbuf eb = {0};
	void *state = NULL;
	int rc, created = 0;

	mr_log_set_rank(r->env.rank);
	memset(&st, 0, sizeof(st));
	rc = mr_kv_http_open(&r->kvh, &r->kv, &r->owner->kvopts, r->env.generation, &eb);
	if (!rc) {
		r->env.kv = &r->kv;
		rc = ops->create(&state, &r->env, &eb);
	}
	if (!rc) {
		created = 1;
		pthread_mutex_lock(&r->lock);
		r->state = state;
		pthread_mutex_unlock(&r->lock);
		if (atomic_load(&r->owner->aborting))
			ops->abort(state);
		for (;;) {
			rc = ops->step(state, &st, &eb);
			pthread_mutex_lock(&r->lock);
			r->stats = st;
			if (rc != MR_WORKER_MORE)
				r->state = NULL; /* abort() must not touch it any more */
			pthread_mutex_unlock(&r->lock);
			if (rc != MR_WORKER_MORE)
				break;
		}
		ops->destroy(state);
	}
	/* once the agent aborts the ranks, one rank's abort reaches another as
	 * a failed peer (MR_EPEER) before its own abort lands: part of the stop */
	if (rc < 0 && created && atomic_load(&r->owner->aborting))
		rc = MR_EABORTED;
	if (rc == MR_WORKER_DONE) {
		r->code = 0;
	} else if (rc == MR_WORKER_STOPPED) {
		r->code = 128 + SIGTERM; /* stopped as asked, checkpoint written */
	} else {
		r->code = rc == MR_EABORTED ? 128 + SIGTERM : 1;
		/* a workload that rejects its config at create (or cannot find its
		 * data file, or cannot allocate its model) fails the same way on
		 * every run: exit 2, permanent under the exit-code policy */
		if (!created && (rc == MR_EINVAL || rc == MR_ERANGE || rc == MR_ECORRUPT ||
				 rc == MR_ENOTSUP || rc == MR_ENOTFOUND || rc == MR_ELIMIT ||
				 rc == MR_ENOMEM))
			r->code = 2;
		snprintf(r->err, sizeof(r->err), "%s", eb.msg[0] ? eb.msg : mr_strerror(rc));
		if (rc != MR_EABORTED)
			mr_log_error("worker_failed", "err=%s msg=%s", mr_err_name(rc),
				     mr_log_q(r->err));
	}
	mr_kv_http_close(&r->kvh);
	atomic_store(&r->done, 1);
	return NULL;
}

int mr_inproc_start(struct mr_inproc *ip, const struct mr_worker_ops *ops,
		    const struct mr_worker_env *envs, int n, const struct mr_rdzv_opts *kvopts,
		    struct mr_errbuf *eb)
{
	memset(ip, 0, sizeof(*ip));
	ip->ops = ops;
	ip->kvopts = *kvopts;
	ip->rank = calloc((size_t)n, sizeof(*ip->rank));
	if (!ip->rank)
		return mr_errf(eb, MR_ENOMEM, "out of memory for %d workers", n);
	ip->n = n;
	for (int i = 0; i < n; i++) {
		struct mr_inproc_rank *r = &ip->rank[i];

		r->owner = ip;
		r->env = envs[i];
		r->env.cancel = &ip->aborting;
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

void mr_inproc_abort(struct mr_inproc *ip)
{
	atomic_store(&ip->aborting, 1);
	for (int i = 0; i < ip->n; i++) {
		struct mr_inproc_rank *r = &ip->rank[i];

		pthread_mutex_lock(&r->lock);
		if (r->state)
			ip->ops->abort(r->state);
		pthread_mutex_unlock(&r->lock);
	}
}

void mr_inproc_preempt(struct mr_inproc *ip, int grace_ms)
{
	long long end;

	for (int i = 0; i < ip->n; i++) {
		struct mr_inproc_rank *r = &ip->rank[i];

		pthread_mutex_lock(&r->lock);
		if (r->state)
			(ip->ops->preempt ? ip->ops->preempt : ip->ops->abort)(r->state);
		pthread_mutex_unlock(&r->lock);
	}
	end = mr__now_ms() + grace_ms;
	for (;;) {
		int running = 0;
		for (int i = 0; i < ip->n; i++)
			running += !atomic_load(&ip->rank[i].done);
		if (!running || mr__now_ms() >= end)
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
	if (r->state && ip->ops->progress) {
		ip->ops->progress(r->state, out);
		rc = 0;
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}
