/*
 * kv_http.h - a struct mr_kv (mr_kv.h) over the controller's per-job,
 * per-generation KV routes, for communicator bootstrap in in-process mode.
 *
 * A 409 (the generation moved on) is MR_ESTALE; the wait of get() is one
 * long-poll on the controller (no client-side polling).
 *
 * Thread safety: each struct mr_kv_http owns its own rendezvous client
 * (connection), so every rank thread opens its own; its calls are
 * serialised by a lock, so the rank's checkpoint writer thread may fence
 * with it too (mr_ckpt_opts.fence).
 * Ownership: mr_kv_http_close() frees what open() made; kv points at k.
 * Non-goals: caching, batching.
 */
#ifndef MR_KV_HTTP_H
#define MR_KV_HTTP_H

#include <pthread.h>

#include "mr_kv.h"
#include "rdzv.h"

struct mr_kv_http {
	struct mr_rdzv *r;
	int generation;
	pthread_mutex_t mu;
};

/* Connects a KV of generation gen (o->spec is not needed) and fills kv to
 * use k; k must stay valid as long as kv is used. */
int mr_kv_http_open(struct mr_kv_http *k, struct mr_kv *kv, const struct mr_rdzv_opts *o,
		    int generation, struct mr_errbuf *eb);
/* NULL-safe; frees the client. */
void mr_kv_http_close(struct mr_kv_http *k);

#endif
