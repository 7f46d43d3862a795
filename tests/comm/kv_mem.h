/*
 * kv_mem.h - test-only struct mr_kv implementations for communicator
 * bootstrap (header-only; include it from one test file).
 *
 *   kv_mem   in-process store for ranks that are threads: one mutex +
 *            condition variable, thread-safe, put/get-with-wait/add.
 *   kv_dir   a directory of files for ranks that are forked processes:
 *            put writes a temporary file and renames it (atomic), get
 *            polls every millisecond, add is serialised with flock.
 *
 * Non-goals: speed, bounded memory (tests store a few hundred keys). The
 * real store is the controller's per-job KV behind the same interface.
 */
#ifndef MR_TEST_KV_MEM_H
#define MR_TEST_KV_MEM_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "mr_kv.h"

#define KV_MEM_MAX 4096

struct kv_mem {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n;
	char *key[KV_MEM_MAX];
	char *val[KV_MEM_MAX];
	size_t len[KV_MEM_MAX];
};

static inline int kv_mem_find(struct kv_mem *m, const char *key)
{
	for (int i = 0; i < m->n; i++)
		if (!strcmp(m->key[i], key))
			return i;
	return -1;
}

static inline int kv_mem_set_locked(struct kv_mem *m, const char *key, const void *val, size_t len)
{
	int i = kv_mem_find(m, key);
	char *v = malloc(len ? len : 1);

	if (!v)
		return MR_ENOMEM;
	memcpy(v, val, len);
	if (i < 0) {
		if (m->n == KV_MEM_MAX) {
			free(v);
			return MR_ELIMIT;
		}
		i = m->n++;
		m->key[i] = strdup(key);
	} else {
		free(m->val[i]);
	}
	m->val[i] = v;
	m->len[i] = len;
	pthread_cond_broadcast(&m->cv);
	return 0;
}

static inline int kv_mem_put(void *ctx, const char *key, const void *val, size_t len)
{
	struct kv_mem *m = ctx;
	int rc;

	pthread_mutex_lock(&m->mu);
	rc = kv_mem_set_locked(m, key, val, len);
	pthread_mutex_unlock(&m->mu);
	return rc;
}

static inline int kv_mem_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len,
		      long wait_ms)
{
	struct kv_mem *m = ctx;
	struct timespec dl;
	int i, rc = 0;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += wait_ms / 1000;
	dl.tv_nsec += (wait_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&m->mu);
	while ((i = kv_mem_find(m, key)) < 0) {
		if (wait_ms <= 0) {
			rc = MR_ENOTFOUND;
			break;
		}
		if (pthread_cond_timedwait(&m->cv, &m->mu, &dl) == ETIMEDOUT &&
		    kv_mem_find(m, key) < 0) {
			rc = MR_ETIMEDOUT;
			break;
		}
	}
	if (i >= 0) {
		memcpy(buf, m->val[i], m->len[i] < cap ? m->len[i] : cap);
		*len = m->len[i];
	}
	pthread_mutex_unlock(&m->mu);
	return rc;
}

static inline int kv_mem_add(void *ctx, const char *key, long long delta, long long *out)
{
	struct kv_mem *m = ctx;
	char num[32];
	long long v = 0;
	int i, rc;

	pthread_mutex_lock(&m->mu);
	i = kv_mem_find(m, key);
	if (i >= 0)
		v = strtoll(m->val[i], NULL, 10);
	v += delta;
	snprintf(num, sizeof(num), "%lld", v);
	rc = kv_mem_set_locked(m, key, num, strlen(num) + 1);
	pthread_mutex_unlock(&m->mu);
	*out = v;
	return rc;
}

static const struct mr_kv_ops kv_mem_ops = { kv_mem_put, kv_mem_get, kv_mem_add };

static inline struct kv_mem *kv_mem_new(struct mr_kv *kv)
{
	struct kv_mem *m = calloc(1, sizeof(*m));

	pthread_mutex_init(&m->mu, NULL);
	pthread_cond_init(&m->cv, NULL);
	kv->ops = &kv_mem_ops;
	kv->ctx = m;
	return m;
}

static inline void kv_mem_free(struct kv_mem *m)
{
	for (int i = 0; i < m->n; i++) {
		free(m->key[i]);
		free(m->val[i]);
	}
	pthread_mutex_destroy(&m->mu);
	pthread_cond_destroy(&m->cv);
	free(m);
}

/* ---- directory-backed, for processes ---- */

struct kv_dir {
	char dir[200];
};

static inline void kv_dir_path(struct kv_dir *d, const char *key, char *out, size_t cap)
{
	size_t n = (size_t)snprintf(out, cap, "%s/", d->dir);

	for (; *key && n + 1 < cap; key++)
		out[n++] = *key == '/' ? '#' : *key;
	out[n] = 0;
}

static inline int kv_dir_put(void *ctx, const char *key, const void *val, size_t len)
{
	struct kv_dir *d = ctx;
	char path[512], tmp[560];
	FILE *f;

	kv_dir_path(d, key, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
	f = fopen(tmp, "wb");
	if (!f)
		return MR_EIO;
	if (fwrite(val, 1, len, f) != len) {
		fclose(f);
		return MR_EIO;
	}
	fclose(f);
	return rename(tmp, path) == 0 ? 0 : MR_EIO;
}

static inline int kv_dir_get(void *ctx, const char *key, void *buf, size_t cap, size_t *len,
		      long wait_ms)
{
	struct kv_dir *d = ctx;
	char path[512];
	long waited = 0;
	FILE *f;

	kv_dir_path(d, key, path, sizeof(path));
	while (!(f = fopen(path, "rb"))) {
		if (waited >= wait_ms)
			return wait_ms > 0 ? MR_ETIMEDOUT : MR_ENOTFOUND;
		usleep(1000);
		waited++;
	}
	*len = fread(buf, 1, cap, f);
	fclose(f);
	return 0;
}

static inline int kv_dir_add(void *ctx, const char *key, long long delta, long long *out)
{
	struct kv_dir *d = ctx;
	char path[512], lock[520], num[32] = "0";
	size_t len = 0;
	int fd, rc;

	kv_dir_path(d, key, path, sizeof(path));
	snprintf(lock, sizeof(lock), "%s/.lock", d->dir);
	fd = open(lock, O_CREAT | O_RDWR, 0600);
	if (fd < 0)
		return MR_EIO;
	flock(fd, LOCK_EX);
	if (kv_dir_get(ctx, key, num, sizeof(num) - 1, &len, 0) == 0)
		num[len] = 0;
	*out = strtoll(num, NULL, 10) + delta;
	snprintf(num, sizeof(num), "%lld", *out);
	rc = kv_dir_put(ctx, key, num, strlen(num) + 1);
	flock(fd, LOCK_UN);
	close(fd);
	return rc;
}

static const struct mr_kv_ops kv_dir_ops = { kv_dir_put, kv_dir_get, kv_dir_add };

/* Creates a fresh temporary directory; 0 or -1. */
static inline int kv_dir_init(struct kv_dir *d, struct mr_kv *kv)
{
	snprintf(d->dir, sizeof(d->dir), "/tmp/mr-kv-XXXXXX");
	if (!mkdtemp(d->dir))
		return -1;
	kv->ops = &kv_dir_ops;
	kv->ctx = d;
	return 0;
}

static inline void kv_dir_remove(struct kv_dir *d)
{
	char cmd[260];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "kv_dir: unable to remove '%s'\n", d->dir);
}

#endif
