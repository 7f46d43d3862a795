/*
 * plan_topo.c - the planner's view of the cluster's network topology
 * (`meshrun plan --topology-file`): which node each node rank lands on
 * under rank_order "topology" (mr_topo_order, the controller's own
 * order), and which narrowest domain (rack, block) each node is in, so
 * that a group whose ranks span domains is priced at the cross-domain
 * link (plan_comm.c).
 *
 * The file is either one path per node, in pod-index order:
 *
 *   block-0/rack-0/node-0
 *   block-0/rack-1/node-7
 *
 * or counts per level, widest first, the last counting nodes per
 * narrowest domain ("block 2", "rack 4", "node 8": 64 nodes, numbered
 * in that order). '#' starts a comment.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_plan.h"
#include "mr_topo.h"

void mr_plan_topo_release(struct mr_plan_topo *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->nodes && t->paths; i++)
		free(t->paths[i]);
	free(t->paths);
	free(t->order);
	free(t->domain);
	memset(t, 0, sizeof(*t));
}

/* The narrowest domain of a path: all but its last segment. */
static size_t parent_len(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? (size_t)(slash - path) : 0;
}

int mr_plan_topo_init(struct mr_plan_topo *t, const char *const *paths, int n,
		      struct mr_errbuf *eb)
{
	struct mr_topo_node *nodes;
	int rc = MR_ENOMEM;

	memset(t, 0, sizeof(*t));
	if (n < 1)
		return mr_errf_field(eb, MR_EINVAL, "topology_file", "the topology has no node");
	nodes = calloc((size_t)n, sizeof(*nodes));
	t->paths = calloc((size_t)n, sizeof(*t->paths));
	t->order = calloc((size_t)n, sizeof(*t->order));
	t->domain = calloc((size_t)n, sizeof(*t->domain));
	t->nodes = n;
	if (!nodes || !t->paths || !t->order || !t->domain)
		goto out;
	for (int i = 0; i < n; i++) {
		char field[48];

		snprintf(field, sizeof(field), "topology_file line for node %d", i);
		if ((rc = mr_topo_check(paths[i], field, eb)) < 0)
			goto out;
		if (!(t->paths[i] = strdup(paths[i]))) {
			rc = MR_ENOMEM;
			goto out;
		}
		nodes[i] = (struct mr_topo_node){ t->paths[i], i, "" };
	}
	if ((rc = mr_topo_order(nodes, n, 1, t->order)) < 0)
		goto out;
	/* domains in rank order: a new id where the parent path changes */
	for (int r = 0; r < n; r++) {
		const char *p = t->paths[t->order[r]], *q = r ? t->paths[t->order[r - 1]] : NULL;
		size_t lp = parent_len(p);

		t->domain[r] = !q ? 0
				  : t->domain[r - 1] + (lp != parent_len(q) || memcmp(p, q, lp));
	}
	t->domains = t->domain[n - 1] + 1;
	rc = 0;
out:
	free(nodes);
	if (rc < 0)
		mr_plan_topo_release(t);
	return rc;
}

/* Counts per level ("rack 4" lines) into paths "rack-0/node-3", ... */
static int expand_counts(char names[][64], const long *counts, int levels, char ***out, int *n,
			 struct mr_errbuf *eb)
{
	long total = 1;
	char **p;

	for (int l = 0; l < levels; l++) {
		total *= counts[l];
		if (total > (1 << 20))
			return mr_errf_field(eb, MR_EINVAL, "topology_file",
					     "topology_file: more than %d nodes", 1 << 20);
	}
	if (!(p = calloc((size_t)total, sizeof(*p))))
		return MR_ENOMEM;
	for (long i = 0; i < total; i++) {
		char buf[MR_TOPO_MAX_LEN + 1];
		size_t len = 0;
		long rest = i, div = total;

		for (int l = 0; l < levels; l++) {
			div /= counts[l];
			len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s%s-%ld",
						l ? "/" : "", names[l], rest / div);
			rest %= div;
			if (len >= sizeof(buf))
				len = sizeof(buf) - 1;
		}
		if (!(p[i] = strdup(buf))) {
			for (long j = 0; j < i; j++)
				free(p[j]);
			free(p);
			return MR_ENOMEM;
		}
	}
	*out = p;
	*n = (int)total;
	return 0;
}

int mr_plan_topo_read(const char *file, struct mr_plan_topo *t, struct mr_errbuf *eb)
{
	FILE *f = fopen(file, "r");
	char line[512], names[MR_TOPO_MAX_LEVELS][64];
	long counts[MR_TOPO_MAX_LEVELS];
	char **paths = NULL;
	int n = 0, cap = 0, levels = 0, lineno = 0, rc = 0;

	if (!f)
		return mr_errf_field(eb, MR_EIO, "topology_file", "topology_file: cannot open '%s'",
				     file);
	while (rc == 0 && fgets(line, sizeof(line), f)) {
		char *s = line, *hash = strchr(line, '#'), name[64];
		long count;
		int used = 0;

		lineno++;
		if (hash)
			*hash = 0;
		s += strspn(s, " \t");
		s[strcspn(s, "\r\n")] = 0;
		for (size_t e = strlen(s); e > 0 && (s[e - 1] == ' ' || s[e - 1] == '\t'); e--)
			s[e - 1] = 0;
		if (!*s)
			continue;
		if (strchr(s, ' ') || strchr(s, '\t')) { /* "LEVEL COUNT" */
			if (n || sscanf(s, "%63s %ld%n", name, &count, &used) != 2 || s[used] ||
			    count < 1 || levels == MR_TOPO_MAX_LEVELS)
				rc = mr_errf_field(eb, MR_EINVAL, "topology_file",
						   "%s:%d: '%.200s' is neither a path nor 'LEVEL "
						   "COUNT' (at most %d levels, counts >= 1, not "
						   "mixed with paths)",
						   file, lineno, s, MR_TOPO_MAX_LEVELS);
			else if ((rc = mr_topo_check(name, "topology_file level", eb)) == 0) {
				memcpy(names[levels], name, sizeof(name));
				counts[levels++] = count;
			}
			continue;
		}
		if (levels) {
			rc = mr_errf_field(eb, MR_EINVAL, "topology_file",
					   "%s:%d: a path after 'LEVEL COUNT' lines", file, lineno);
		} else if (n == cap) {
			char **np = realloc(paths, (size_t)(cap = cap ? 2 * cap : 64) * sizeof(*np));

			if (!np)
				rc = MR_ENOMEM;
			else
				paths = np;
		}
		if (rc == 0 && !(paths[n++] = strdup(s)))
			rc = MR_ENOMEM;
	}
	fclose(f);
	if (rc == 0 && levels)
		rc = expand_counts(names, counts, levels, &paths, &n, eb);
	if (rc == 0)
		rc = mr_plan_topo_init(t, (const char *const *)paths, n, eb);
	for (int i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
	return rc;
}
