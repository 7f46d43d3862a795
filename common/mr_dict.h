/*
 * mr_dict.h - a small string-keyed hash table (open addressing, linear
 * probing, backward-shift deletion, power-of-two capacity).
 *
 * Values are opaque pointers owned by the caller. Keys are either copied
 * (MR_DICT_COPY_KEYS: the dict owns and frees its copies) or borrowed (0:
 * the caller guarantees each key string outlives its entry; typical when
 * the key lives inside the value, as a member's node_id does). Lookups,
 * inserts and deletes are O(1) expected; growth doubles the table.
 *
 * Iteration with mr_dict_next() visits each entry once as long as the dict
 * is not modified; collect keys first if you need to delete while walking.
 *
 * Non-goals: ordering, thread safety, incremental rehash, binary keys.
 */
#ifndef MR_DICT_H
#define MR_DICT_H

#include <stddef.h>
#include <stdint.h>

#define MR_DICT_COPY_KEYS 1

struct mr_dict_entry {
	char *key;   /* NULL = empty slot */
	void *val;
	uint64_t hash;
};

struct mr_dict {
	struct mr_dict_entry *tab;
	size_t cap;  /* 0 or a power of two */
	size_t len;
	int flags;
};

void mr_dict_init(struct mr_dict *d, int flags);
/* Frees the table (and copied keys); calls free_val(val) on every value
 * when free_val is not NULL. The dict is empty and reusable afterwards. */
void mr_dict_release(struct mr_dict *d, void (*free_val)(void *val));
static inline size_t mr_dict_len(const struct mr_dict *d) { return d->len; }

uint64_t mr_dict_hash(const char *key);
/* NULL if absent. */
void *mr_dict_get(const struct mr_dict *d, const char *key);
/* Inserts or replaces. *old (may be NULL) gets the replaced value or NULL.
 * MR_ENOMEM leaves the dict unchanged. */
int mr_dict_put(struct mr_dict *d, const char *key, void *val, void **old);
/* Removes key; returns its value, NULL if absent. */
void *mr_dict_del(struct mr_dict *d, const char *key);
/* Iteration: start with *cursor = 0; returns 0 at the end, 1 with
 * key and val set (either pointer may be NULL). */
int mr_dict_next(const struct mr_dict *d, size_t *cursor, const char **key, void **val);

#endif
