/*
 * topo.c - topology paths: their check, their natural order, and the rank
 * order of nodes that the controller and the planner share (mr_topo.h).
 */
#include <stdlib.h>
#include <string.h>

#include "mr_topo.h"

static int seg_char(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == '-';
}

int mr_topo_check(const char *path, const char *field, struct mr_errbuf *eb)
{
	size_t len = path ? strlen(path) : 0, seg = 0;
	int levels = 1;

	if (!len)
		return mr_errf_field(eb, MR_EINVAL, field, "'%s' is empty", field);
	if (len > MR_TOPO_MAX_LEN)
		return mr_errf_field(eb, MR_EINVAL, field, "'%s' is longer than %d bytes", field,
				     MR_TOPO_MAX_LEN);
	for (size_t i = 0; i <= len; i++) {
		int c = (unsigned char)path[i];

		if (c == '/' || c == 0) {
			if (!seg)
				return mr_errf_field(eb, MR_EINVAL, field,
						     "'%s': '%.255s' has an empty segment", field,
						     path);
			if (c == '/' && ++levels > MR_TOPO_MAX_LEVELS)
				return mr_errf_field(eb, MR_EINVAL, field,
						     "'%s': '%.255s' has more than %d levels",
						     field, path, MR_TOPO_MAX_LEVELS);
			seg = 0;
		} else if (!seg_char(c)) {
			return mr_errf_field(eb, MR_EINVAL, field,
					     "'%s': '%.255s' has '%c' at byte %zu (segments are "
					     "[A-Za-z0-9._-] joined by '/')",
					     field, path, c >= 32 && c < 127 ? c : '?', i);
		} else if (++seg > MR_TOPO_MAX_SEG) {
			return mr_errf_field(eb, MR_EINVAL, field,
					     "'%s': '%.255s' has a segment longer than %d bytes",
					     field, path, MR_TOPO_MAX_SEG);
		}
	}
	return 0;
}

/* Natural order of two segments (ends at '/' or NUL): digit runs compare
 * as numbers, the rest bytewise. */
static int seg_cmp(const char **pa, const char **pb)
{
	const char *a = *pa, *b = *pb;
	int r = 0;

	while (!r) {
		int ea = !*a || *a == '/', eb = !*b || *b == '/';

		if (ea || eb) {
			r = ea && eb ? 0 : ea ? -1 : 1;
			break;
		}
		if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
			const char *sa, *sb;
			size_t na, nb;

			while (*a == '0' && a[1] >= '0' && a[1] <= '9')
				a++;
			while (*b == '0' && b[1] >= '0' && b[1] <= '9')
				b++;
			for (sa = a; *a >= '0' && *a <= '9'; a++)
				;
			for (sb = b; *b >= '0' && *b <= '9'; b++)
				;
			na = (size_t)(a - sa);
			nb = (size_t)(b - sb);
			r = na != nb ? (na < nb ? -1 : 1) : memcmp(sa, sb, na);
			r = r < 0 ? -1 : r > 0;
		} else {
			r = *a != *b ? ((unsigned char)*a < (unsigned char)*b ? -1 : 1) : 0;
			a++;
			b++;
		}
	}
	*pa = a;
	*pb = b;
	return r;
}

int mr_topo_cmp(const char *a, const char *b)
{
	a = a ? a : "";
	b = b ? b : "";
	for (;;) {
		int r;

		if (!*a || !*b)
			return !*a && !*b ? 0 : !*a ? -1 : 1;
		if ((r = seg_cmp(&a, &b)))
			return r;
		/* both at the end of a segment */
		if (*a == '/')
			a++;
		if (*b == '/')
			b++;
	}
}

int mr_topo_shared(const char *a, const char *b)
{
	int n = 0;

	if (!a || !b)
		return 0;
	while (*a && *b) {
		size_t la = strcspn(a, "/"), lb = strcspn(b, "/");

		if (la != lb || memcmp(a, b, la))
			break;
		n++;
		a += la;
		b += lb;
		if (*a != *b)
			break;
		if (*a) {
			a++;
			b++;
		}
	}
	return n;
}

int mr_topo_node_cmp(const struct mr_topo_node *a, const struct mr_topo_node *b, int by_pod)
{
	int r = mr_topo_cmp(a->path, b->path);

	if (r)
		return r;
	if (by_pod && a->pod_index != b->pod_index)
		return a->pod_index < b->pod_index ? -1 : 1;
	return strcmp(a->id ? a->id : "", b->id ? b->id : "");
}

/* qsort has no context: the node and the flags travel with each index */
struct keyed {
	struct mr_topo_node node; /* path NULL unless ordering by path */
	int index, by_pod;
};

static int keyed_cmp(const void *x, const void *y)
{
	const struct keyed *a = x, *b = y;

	return mr_topo_node_cmp(&a->node, &b->node, a->by_pod);
}

int mr_topo_order(const struct mr_topo_node *nodes, int n, int by_path, int *order)
{
	struct keyed *k = n > 0 ? malloc((size_t)n * sizeof(*k)) : NULL;
	int by_pod = 1;

	if (n > 0 && !k)
		return MR_ENOMEM;
	for (int i = 0; i < n; i++)
		by_pod &= nodes[i].pod_index >= 0;
	for (int i = 0; i < n; i++) {
		k[i].node = nodes[i];
		if (!by_path)
			k[i].node.path = NULL;
		k[i].index = i;
		k[i].by_pod = by_pod;
	}
	if (n > 1)
		qsort(k, (size_t)n, sizeof(*k), keyed_cmp);
	for (int i = 0; i < n; i++)
		order[i] = k[i].index;
	free(k);
	return 0;
}
