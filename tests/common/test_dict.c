/*
 * test_dict.c - unit tests for common/dict.c (mr_dict): insert, replace,
 * delete with backward shift under heavy collisions of probe runs,
 * iteration, borrowed vs copied keys, against a brute-force model.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_dict.h"

Test(dict, put_get_replace_del)
{
	struct mr_dict d;
	void *old = (void *)1;
	int a = 1, b = 2;

	mr_dict_init(&d, MR_DICT_COPY_KEYS);
	cr_assert_null(mr_dict_get(&d, "x"));
	cr_assert_null(mr_dict_del(&d, "x"));
	cr_assert_eq(mr_dict_put(&d, "x", &a, &old), 0);
	cr_assert_null(old);
	cr_assert_eq(mr_dict_get(&d, "x"), &a);
	cr_assert_eq(mr_dict_put(&d, "x", &b, &old), 0);
	cr_assert_eq(old, &a);
	cr_assert_eq(mr_dict_len(&d), 1);
	cr_assert_eq(mr_dict_del(&d, "x"), &b);
	cr_assert_eq(mr_dict_len(&d), 0);
	cr_assert_null(mr_dict_get(&d, "x"));
	mr_dict_release(&d, NULL);
}

Test(dict, random_ops_match_model)
{
	enum { N = 5000, OPS = 200000 };
	static char keys[N][16];
	static int present[N];
	static int vals[N];
	struct mr_dict d;
	size_t live = 0;
	unsigned seed = 12345;

	mr_dict_init(&d, MR_DICT_COPY_KEYS);
	for (int i = 0; i < N; i++) {
		snprintf(keys[i], sizeof(keys[i]), "k%d", i);
		vals[i] = i;
	}
	for (int op = 0; op < OPS; op++) {
		int i;

		seed = seed * 1103515245u + 12345u;
		i = (int)((seed >> 8) % N);
		if ((seed >> 4) & 1) {
			cr_assert_eq(mr_dict_put(&d, keys[i], &vals[i], NULL), 0);
			if (!present[i])
				live++;
			present[i] = 1;
		} else {
			void *v = mr_dict_del(&d, keys[i]);

			cr_assert_eq(v, present[i] ? &vals[i] : NULL);
			if (present[i])
				live--;
			present[i] = 0;
		}
		if (op % 10007 == 0) {
			for (int k = 0; k < N; k++)
				cr_assert_eq(mr_dict_get(&d, keys[k]), present[k] ? &vals[k] : NULL,
					     "key %s after op %d", keys[k], op);
		}
	}
	cr_assert_eq(mr_dict_len(&d), live);
	/* iteration visits exactly the live keys once */
	{
		size_t cur = 0, seen = 0;
		const char *k;
		void *v;

		while (mr_dict_next(&d, &cur, &k, &v)) {
			int i = atoi(k + 1);

			cr_assert(present[i]);
			cr_assert_eq(v, &vals[i]);
			present[i] = 2;
			seen++;
		}
		cr_assert_eq(seen, live);
	}
	mr_dict_release(&d, NULL);
}

struct item {
	char name[16];
	int freed;
};

static int n_freed;
static void free_item(void *p)
{
	((struct item *)p)->freed = 1;
	n_freed++;
}

Test(dict, borrowed_keys_and_release_callback)
{
	struct item items[100];
	struct mr_dict d;

	memset(items, 0, sizeof(items));
	mr_dict_init(&d, 0);
	for (int i = 0; i < 100; i++) {
		snprintf(items[i].name, sizeof(items[i].name), "node-%d", i);
		items[i].freed = 0;
		cr_assert_eq(mr_dict_put(&d, items[i].name, &items[i], NULL), 0);
	}
	/* a different buffer with the same content finds the entry */
	cr_assert_eq(mr_dict_get(&d, "node-42"), &items[42]);
	n_freed = 0;
	mr_dict_release(&d, free_item);
	cr_assert_eq(n_freed, 100);
	cr_assert_eq(mr_dict_len(&d), 0);
	cr_assert_null(mr_dict_get(&d, "node-1"));
}
