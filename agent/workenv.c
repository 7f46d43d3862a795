/*
 * workenv.c - build the environment of an exec-mode worker; see workenv.h.
 *
 * Non-goals: deciding values (the supervisor does), coordinates maths
 * (common mesh module).
 */
#include "workenv.h"

#include "mr_mesh.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t key_len(const char *entry)
{
	const char *eq = strchr(entry, '=');

	return eq ? (size_t)(eq - entry) : strlen(entry);
}

static long find(const struct mr_workenv *e, const char *key)
{
	size_t kl = strlen(key);

	for (size_t i = 0; i < e->n; i++)
		if (key_len(e->v[i]) == kl && !strncmp(e->v[i], key, kl))
			return (long)i;
	return -1;
}

static int put_entry(struct mr_workenv *e, char *entry, const char *key)
{
	long at = find(e, key);

	if (at >= 0) {
		free(e->v[at]);
		e->v[at] = entry;
		return 0;
	}
	if (e->n + 2 > e->cap) {
		size_t cap = e->cap ? e->cap * 2 : 64;
		char **v;

		if (e->n + 1 >= MR_WORKENV_MAX) {
			free(entry);
			return MR_ELIMIT;
		}
		v = realloc(e->v, cap * sizeof(*v));
		if (!v) {
			free(entry);
			return MR_ENOMEM;
		}
		e->v = v;
		e->cap = cap;
	}
	e->v[e->n++] = entry;
	e->v[e->n] = NULL;
	return 0;
}

int mr_workenv_init(struct mr_workenv *e, char *const *base)
{
	memset(e, 0, sizeof(*e));
	e->v = calloc(64, sizeof(*e->v));
	if (!e->v)
		return MR_ENOMEM;
	e->cap = 64;
	for (size_t i = 0; base && base[i]; i++) {
		char key[256];
		size_t kl = key_len(base[i]);
		char *copy;
		int err;

		if (kl == 0 || kl >= sizeof(key) || !strchr(base[i], '='))
			continue;
		memcpy(key, base[i], kl);
		key[kl] = '\0';
		copy = strdup(base[i]);
		if (!copy)
			return MR_ENOMEM;
		err = put_entry(e, copy, key);
		if (err)
			return err;
	}
	return 0;
}

void mr_workenv_release(struct mr_workenv *e)
{
	for (size_t i = 0; i < e->n; i++)
		free(e->v[i]);
	free(e->v);
	memset(e, 0, sizeof(*e));
}

int mr_workenv_set(struct mr_workenv *e, const char *key, const char *fmt, ...)
{
	char val[MR_WORKENV_ENTRY_MAX];
	size_t need;
	char *entry;
	va_list ap;
	int n;

	if (!key[0] || strchr(key, '='))
		return MR_EINVAL;
	va_start(ap, fmt);
	n = vsnprintf(val, sizeof(val), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(val))
		return MR_ELIMIT;
	need = strlen(key) + 1 + (size_t)n + 1;
	if (need > MR_WORKENV_ENTRY_MAX)
		return MR_ELIMIT;
	entry = malloc(need);
	if (!entry)
		return MR_ENOMEM;
	memcpy(entry, key, strlen(key));
	entry[strlen(key)] = '=';
	memcpy(entry + strlen(key) + 1, val, (size_t)n + 1);
	return put_entry(e, entry, key);
}

void mr_workenv_unset(struct mr_workenv *e, const char *key)
{
	long at = find(e, key);

	if (at < 0)
		return;
	free(e->v[at]);
	memmove(&e->v[at], &e->v[at + 1], (e->n - (size_t)at) * sizeof(*e->v));
	e->n--;
}

const char *mr_workenv_get(const struct mr_workenv *e, const char *key)
{
	long at = find(e, key);

	return at < 0 ? NULL : e->v[at] + strlen(key) + 1;
}

int mr_workenv_torchrun(struct mr_workenv *e, const struct mr_worker_env *w,
			const struct mr_workenv_extra *x)
{
	struct mr_mesh mesh;
	struct mr_mesh_coord c;
	int err;

	err = mr_mesh_init(&mesh, w->world_size, w->tp, w->pp, w->cp, w->ep, w->dp, NULL);
	if (!err)
		err = mr_mesh_coord(&mesh, w->rank, &c);
	if (err)
		return err;
#define SET(k, ...)                                          \
	do {                                                 \
		if (!err)                                    \
			err = mr_workenv_set(e, k, __VA_ARGS__); \
	} while (0)
	SET("RANK", "%d", w->rank);
	SET("LOCAL_RANK", "%d", w->local_rank);
	SET("WORLD_SIZE", "%d", w->world_size);
	SET("LOCAL_WORLD_SIZE", "%d", w->local_world_size);
	SET("GROUP_RANK", "%d", w->node_rank);
	SET("GROUP_WORLD_SIZE", "%d", w->num_nodes);
	SET("ROLE_NAME", "%s", x->role ? x->role : "default");
	SET("ROLE_RANK", "%d", w->rank);
	SET("ROLE_WORLD_SIZE", "%d", w->world_size);
	SET("MASTER_ADDR", "%s", x->master_addr ? x->master_addr : "127.0.0.1");
	SET("MASTER_PORT", "%d", x->master_port);
	SET("TORCHELASTIC_RESTART_COUNT", "%d", w->restart_count);
	SET("TORCHELASTIC_MAX_RESTARTS", "%d", x->max_restarts);
	SET("TORCHELASTIC_RUN_ID", "%s", w->run_id ? w->run_id : "none");
	if (w->local_world_size > 1 && !mr_workenv_get(e, "OMP_NUM_THREADS"))
		SET("OMP_NUM_THREADS", "1");
	SET("MESHRUN_JOB", "%s", w->job ? w->job : "");
	SET("MESHRUN_GENERATION", "%d", w->generation);
	SET("MESHRUN_NODE_RANK", "%d", w->node_rank);
	SET("MESHRUN_HOST_ID", "%s", w->host_id ? w->host_id : "");
	SET("MESHRUN_TP", "%d", w->tp);
	SET("MESHRUN_PP", "%d", w->pp);
	SET("MESHRUN_CP", "%d", w->cp);
	SET("MESHRUN_EP", "%d", w->ep);
	SET("MESHRUN_DP", "%d", mesh.dp);
	SET("MESHRUN_TP_RANK", "%d", c.tp);
	SET("MESHRUN_PP_RANK", "%d", c.pp);
	SET("MESHRUN_CP_RANK", "%d", c.cp);
	SET("MESHRUN_DP_RANK", "%d", c.dp);
	SET("MESHRUN_EP_RANK", "%d", c.ep);
#undef SET
	return err;
}
