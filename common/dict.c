/*
 * dict.c - string-keyed open-addressing hash table (see mr_dict.h).
 *
 * Non-goals: shrinking (a dict keeps its peak capacity until released).
 */
#include "mr_dict.h"

#include <stdlib.h>
#include <string.h>

#include "mr_err.h"

#define MIN_CAP 8

void mr_dict_init(struct mr_dict *d, int flags)
{
	memset(d, 0, sizeof(*d));
	d->flags = flags;
}

void mr_dict_release(struct mr_dict *d, void (*free_val)(void *val))
{
	for (size_t i = 0; i < d->cap; i++) {
		struct mr_dict_entry *e = &d->tab[i];

		if (!e->key)
			continue;
		if (free_val)
			free_val(e->val);
		if (d->flags & MR_DICT_COPY_KEYS)
			free(e->key);
	}
	free(d->tab);
	d->tab = NULL;
	d->cap = 0;
	d->len = 0;
}

/* FNV-1a with a final avalanche (splitmix64 finaliser). */
uint64_t mr_dict_hash(const char *key)
{
	uint64_t h = 1469598103934665603ULL;

	for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
		h ^= *p;
		h *= 1099511628211ULL;
	}
	h ^= h >> 30;
	h *= 0xbf58476d1ce4e5b9ULL;
	h ^= h >> 27;
	h *= 0x94d049bb133111ebULL;
	h ^= h >> 31;
	return h;
}

static size_t find_slot(const struct mr_dict *d, const char *key, uint64_t h)
{
	size_t mask = d->cap - 1;
	size_t i = (size_t)h & mask;

	for (;;) {
		const struct mr_dict_entry *e = &d->tab[i];

		if (!e->key || (e->hash == h && strcmp(e->key, key) == 0))
			return i;
		i = (i + 1) & mask;
	}
}

static int grow(struct mr_dict *d)
{
	size_t ncap = d->cap ? d->cap * 2 : MIN_CAP;
	struct mr_dict_entry *ntab;
	struct mr_dict_entry *old = d->tab;
	size_t ocap = d->cap;

	if (ncap < d->cap)
		return MR_ENOMEM;
	ntab = calloc(ncap, sizeof(*ntab));
	if (!ntab)
		return MR_ENOMEM;
	d->tab = ntab;
	d->cap = ncap;
	for (size_t i = 0; i < ocap; i++) {
		if (old[i].key)
			d->tab[find_slot(d, old[i].key, old[i].hash)] = old[i];
	}
	free(old);
	return 0;
}

void *mr_dict_get(const struct mr_dict *d, const char *key)
{
	size_t i;

	if (!d->cap)
		return NULL;
	i = find_slot(d, key, mr_dict_hash(key));
	return d->tab[i].key ? d->tab[i].val : NULL;
}

int mr_dict_put(struct mr_dict *d, const char *key, void *val, void **old)
{
	uint64_t h = mr_dict_hash(key);
	struct mr_dict_entry *e;
	size_t i;
	int err;

	if (old)
		*old = NULL;
	if (d->cap) {
		i = find_slot(d, key, h);
		if (d->tab[i].key) {
			if (old)
				*old = d->tab[i].val;
			d->tab[i].val = val;
			return 0;
		}
	}
	/* keep the load factor at or below 3/4 */
	if ((d->len + 1) * 4 > d->cap * 3) {
		err = grow(d);
		if (err)
			return err;
	}
	i = find_slot(d, key, h);
	e = &d->tab[i];
	if (d->flags & MR_DICT_COPY_KEYS) {
		e->key = strdup(key);
		if (!e->key)
			return MR_ENOMEM;
	} else {
		e->key = (char *)key;
	}
	e->val = val;
	e->hash = h;
	d->len++;
	return 0;
}

void *mr_dict_del(struct mr_dict *d, const char *key)
{
	size_t mask, i, j;
	void *val;

	if (!d->cap)
		return NULL;
	mask = d->cap - 1;
	i = find_slot(d, key, mr_dict_hash(key));
	if (!d->tab[i].key)
		return NULL;
	val = d->tab[i].val;
	if (d->flags & MR_DICT_COPY_KEYS)
		free(d->tab[i].key);
	d->tab[i].key = NULL;
	d->len--;
	/* backward shift: pull later members of the probe run into the hole */
	j = i;
	for (;;) {
		size_t home;

		j = (j + 1) & mask;
		if (!d->tab[j].key)
			break;
		home = (size_t)d->tab[j].hash & mask;
		/* entry j may move to i only if its home is not in (i, j] */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			d->tab[i] = d->tab[j];
			d->tab[j].key = NULL;
			i = j;
		}
	}
	return val;
}

int mr_dict_next(const struct mr_dict *d, size_t *cursor, const char **key, void **val)
{
	while (*cursor < d->cap) {
		const struct mr_dict_entry *e = &d->tab[(*cursor)++];

		if (e->key) {
			if (key)
				*key = e->key;
			if (val)
				*val = e->val;
			return 1;
		}
	}
	return 0;
}
