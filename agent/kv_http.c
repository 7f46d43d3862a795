/*
 * kv_http.c - struct mr_kv over the controller KV routes; see kv_http.h.
 */
#include "kv_http.h"

static int kv_put(void *ctx, const char *key, const void *val, size_t len)
{
	struct mr_kv_http *k = ctx;
	struct mr_errbuf eb = {0};
	int err;

	pthread_mutex_lock(&k->mu);
	err = mr_rdzv_kv_put(k->r, k->generation, key, val, len, &eb);
	pthread_mutex_unlock(&k->mu);
	return err;
}

static int kv_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len, long wait_ms)
{
	struct mr_kv_http *k = ctx;
	struct mr_errbuf eb = {0};
	int err;

	pthread_mutex_lock(&k->mu);
	err = mr_rdzv_kv_get(k->r, k->generation, key, buf, cap, len, wait_ms, &eb);
	pthread_mutex_unlock(&k->mu);
	if (err == MR_ENOTFOUND && wait_ms > 0)
		err = MR_ETIMEDOUT;
	return err;
}

static int kv_add(void *ctx, const char *key, long long delta, long long *out)
{
	struct mr_kv_http *k = ctx;
	struct mr_errbuf eb = {0};
	int err;

	pthread_mutex_lock(&k->mu);
	err = mr_rdzv_kv_add(k->r, k->generation, key, delta, out, &eb);
	pthread_mutex_unlock(&k->mu);
	return err;
}

static const struct mr_kv_ops kv_http_ops = {
	.put = kv_put,
	.get = kv_get,
	.add = kv_add,
};

int mr_kv_http_open(struct mr_kv_http *k, struct mr_kv *kv, const struct mr_rdzv_opts *o,
		    int generation, struct mr_errbuf *eb)
{
	struct mr_rdzv_opts ko = *o;
	int err;

	ko.spec = NULL;
	k->generation = generation;
	kv->ops = &kv_http_ops;
	kv->ctx = k;
	pthread_mutex_init(&k->mu, NULL);
	err = mr_rdzv_new(&k->r, &ko, eb);
	if (err)
		pthread_mutex_destroy(&k->mu);
	return err;
}

void mr_kv_http_close(struct mr_kv_http *k)
{
	if (!k || !k->r)
		return;
	mr_rdzv_free(k->r);
	k->r = NULL;
	pthread_mutex_destroy(&k->mu);
}
