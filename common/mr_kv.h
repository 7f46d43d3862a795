/*
 * mr_kv.h - the key/value interface used to bootstrap communicators.
 *
 * Ranks exchange small values (a TCP address, a shared-memory segment name,
 * an NCCL unique id) before they can talk to each other. In a job these go
 * through the controller's per-job, per-generation KV store (an
 * implementation over mr_httpc lives beside the agent's rendezvous client);
 * tests may use any other implementation with the same semantics.
 *
 * Semantics: put overwrites; get with wait_ms > 0 blocks until the key
 * exists or the wait expires (MR_ETIMEDOUT), with wait_ms == 0 answers
 * MR_ENOTFOUND at once. Values are opaque bytes up to the store's limit.
 * Every call may fail with MR_ESTALE (the generation moved on) or
 * MR_EABORTED; callers treat both as "stop and rejoin".
 *
 * Thread safety: an implementation documents its own; the runtime calls a
 * given struct mr_kv from one thread at a time.
 */
#ifndef MR_KV_H
#define MR_KV_H

#include <stddef.h>

#include "mr_err.h"

struct mr_kv_ops {
	int (*put)(void *ctx, const char *key, const void *val, size_t len);
	/* Copies at most cap bytes into buf; *len gets the full value size. */
	int (*get)(void *ctx, const char *key, void *buf, size_t cap, size_t *len,
		   long wait_ms);
	/* Atomically adds delta to a decimal counter (absent = 0); *out gets
	 * the new value. */
	int (*add)(void *ctx, const char *key, long long delta, long long *out);
};

struct mr_kv {
	const struct mr_kv_ops *ops;
	void *ctx;
};

static inline int mr_kv_put(const struct mr_kv *kv, const char *key, const void *val, size_t len)
{
	return kv->ops->put(kv->ctx, key, val, len);
}

static inline int mr_kv_get(const struct mr_kv *kv, const char *key, void *buf, size_t cap,
			    size_t *len, long wait_ms)
{
	return kv->ops->get(kv->ctx, key, buf, cap, len, wait_ms);
}

static inline int mr_kv_add(const struct mr_kv *kv, const char *key, long long delta,
			    long long *out)
{
	return kv->ops->add(kv->ctx, key, delta, out);
}

#endif
