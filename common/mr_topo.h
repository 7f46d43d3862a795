/*
 * mr_topo.h - where a node sits in the cluster's network, and the rank
 * order that follows it.
 *
 * A topology path names a node's domains from the widest to the node
 * itself, slash-separated: "block-2/rack-7/node-31" (Kueue TAS levels,
 * Volcano HyperNode tiers, or zone + hostname). A job whose rank order is
 * "topology" numbers its nodes by path, then pod index, then node id:
 * nodes of one domain get consecutive node ranks, and since the mesh puts
 * tp, then cp, then dp on consecutive ranks (mr_mesh.h), the innermost
 * groups fall inside the narrowest domains and pp crosses the widest. The
 * controller (round close) and the planner (`meshrun plan
 * --topology-file`) order by this one comparison, so they agree.
 *
 * Segments compare in natural order (digit runs as numbers: rack-9 before
 * rack-10), so the order is the one a person reads.
 *
 * Non-goals: obtaining the path (the agent: --topology, or its Node's
 * labels, agent/k8s_node.c), link figures (the planner's cluster).
 */
#ifndef MR_TOPO_H
#define MR_TOPO_H

#include <stddef.h>

#include "mr_err.h"

#define MR_TOPO_MAX_LEN 255  /* bytes of a path */
#define MR_TOPO_MAX_LEVELS 8 /* segments of a path */
#define MR_TOPO_MAX_SEG 63   /* bytes of a segment (a label value) */

/* 0 if path is 1..8 segments of [A-Za-z0-9._-]{1,63}, at most 255 bytes;
 * else MR_EINVAL with eb naming `field` and what is wrong. */
int mr_topo_check(const char *path, const char *field, struct mr_errbuf *eb);

/* Segment by segment, natural order; NULL sorts as "" (first). */
int mr_topo_cmp(const char *a, const char *b);

/* The number of leading segments a and b share (0 for NULL). */
int mr_topo_shared(const char *a, const char *b);

/* A node to place: its path (may be NULL), pod index (-1 = none) and id. */
struct mr_topo_node {
	const char *path;
	int pod_index;
	const char *id;
};

/* The rank order of nodes: by path, then pod index when every node has
 * one, else node id. */
int mr_topo_node_cmp(const struct mr_topo_node *a, const struct mr_topo_node *b,
		     int by_pod);

/* order[0..n) gets the node indexes in rank order (by_path 0: pod index or
 * id only, today's default order). 0, or MR_ENOMEM. */
int mr_topo_order(const struct mr_topo_node *nodes, int n, int by_path, int *order);

#endif
