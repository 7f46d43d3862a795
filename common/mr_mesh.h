/*
 * mr_mesh.h - the parallel mesh: rank <-> coordinates <-> process groups.
 *
 * A pure function of (world, tp, pp, cp, ep, dp), shared by the agent, the
 * runtime and the planner so that every part agrees on who talks to whom.
 * Rank order follows Megatron-Core's RankGenerator "tp-cp-ep-dp-pp": tp
 * varies fastest, then cp, then dp, then pp:
 *
 *   rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))
 *
 * Expert parallel groups are carved from the dp*cp ranks sharing (pp, tp),
 * as Megatron-Core's expert RankGenerator ("tp-ep-dp-pp" with expert
 * tensor parallel = tp) does: with j = dp_i * cp + cp_i in [0, dp*cp),
 *
 *   ep_i = j % ep,   edp_i = j / ep,   edp = dp * cp / ep
 *
 * so rank = tp_i + tp * (ep_i + ep * (edp_i + edp * pp_i)) too.
 *
 * A group kind fixes some coordinates and varies the others; the groups of
 * one kind partition the world, all of one size. Members are listed in
 * ascending rank order; a rank's index in its group is its position there.
 * Group ids run 0..count-1 in order of each group's lowest rank.
 *
 * Non-goals: virtual pipeline stages (a runtime concern: stage = pp_i +
 * pp * chunk), embedding groups, node placement (ranks are given).
 */
#ifndef MR_MESH_H
#define MR_MESH_H

#include <stdio.h>

#include "mr_err.h"

struct mr_mesh {
	int world;
	int tp, cp, dp, pp; /* dense dimensions, tp fastest */
	int ep, edp;        /* expert dimensions: ep * edp == dp * cp */
};

struct mr_mesh_coord {
	int tp, cp, dp, pp;
	int ep, edp; /* derived; mr_mesh_rank() ignores them */
};

/* Append-only: numbers may be logged and used in KV keys. */
enum mr_mesh_group {
	MR_GROUP_WORLD = 0, /* everyone */
	MR_GROUP_TP,        /* tensor parallel: varies tp */
	MR_GROUP_CP,        /* context parallel: varies cp */
	MR_GROUP_DP,        /* data parallel (without cp): varies dp */
	MR_GROUP_PP,        /* pipeline: varies pp, index = stage */
	MR_GROUP_EP,        /* expert parallel: varies ep (within dp x cp) */
	MR_GROUP_EDP,       /* expert data parallel: varies edp */
	MR_GROUP_DP_CP,     /* dense gradient reduction when cp > 1 */
	MR_GROUP_TP_CP,     /* tensor x context (attention with cp) */
	MR_GROUP_MP,        /* model parallel tp x pp: dense grad-norm */
	MR_GROUP_TP_EP_PP,  /* expert model parallel: expert grad-norm */
	MR_GROUP__COUNT
};

/*
 * Validates and fills m. world = 0 derives it from dp (world = tp*pp*cp*dp);
 * dp = 0 derives dp from world. Every size must be >= 1 (world and dp may
 * be 0 as said), world divisible by tp*pp*cp, dp consistent with world,
 * dp*cp divisible by ep. Errors MR_EINVAL / MR_ERANGE with eb->field set to
 * the offending field ("tp", "dp", "ep", "world") and a message naming the
 * values, e.g. "world 12 is not divisible by tp*pp*cp = 8".
 */
int mr_mesh_init(struct mr_mesh *m, int world, int tp, int pp, int cp, int ep, int dp,
		 struct mr_errbuf *eb);

/* Coordinates of rank; MR_ERANGE if rank is outside [0, world). */
int mr_mesh_coord(const struct mr_mesh *m, int rank, struct mr_mesh_coord *c);
/* Rank of (tp, cp, dp, pp); MR_ERANGE if a coordinate is out of range. */
int mr_mesh_rank(const struct mr_mesh *m, const struct mr_mesh_coord *c);

/* "world", "tp", "cp", "dp", "pp", "ep", "edp", "dp_cp", "tp_cp", "mp",
 * "tp_ep_pp"; "?" for an unknown kind. */
const char *mr_mesh_group_name(enum mr_mesh_group g);
/* Members per group, or MR_EINVAL for an unknown kind. */
int mr_mesh_group_size(const struct mr_mesh *m, enum mr_mesh_group g);
/* Number of groups of kind g (world / size), or MR_EINVAL. */
int mr_mesh_group_count(const struct mr_mesh *m, enum mr_mesh_group g);
/* Id (0..count-1) of rank's group of kind g, or a negative MR_E* code. */
int mr_mesh_group_id(const struct mr_mesh *m, enum mr_mesh_group g, int rank);

/*
 * The group of kind g containing rank: writes its members, ascending, to
 * ranks_out (room for mr_mesh_group_size() ints; may be NULL) and rank's
 * position among them to *index (may be NULL). Returns the group size or a
 * negative MR_E* code.
 */
int mr_mesh_group(const struct mr_mesh *m, enum mr_mesh_group g, int rank, int *ranks_out,
		  int *index);
/* Members of group id of kind g, ascending; returns the size or an error. */
int mr_mesh_group_members(const struct mr_mesh *m, enum mr_mesh_group g, int id,
			  int *ranks_out);

/* The member at position index (0..size-1) of group id of kind g, O(1);
 * or a negative MR_E* code. */
int mr_mesh_group_member(const struct mr_mesh *m, enum mr_mesh_group g, int id, int index);
/*
 * A group for people: its kind and the coordinates its members share,
 * slowest first, leaving out axes of size 1 - "dp[pp=2,tp=1]", "tp[dp=3]",
 * "world", "dp" (pure data parallel). 0, MR_ERANGE (id out of range, or
 * cap too small: buf holds a truncated label) or MR_EINVAL.
 */
int mr_mesh_group_label(const struct mr_mesh *m, enum mr_mesh_group g, int id, char *buf,
			size_t cap);
/* "world=16 tp=2 cp=1 dp=2 pp=4 ep=1 edp=2" into buf; returns snprintf's
 * result. */
int mr_mesh_describe(const struct mr_mesh *m, char *buf, size_t size);
/* A human-readable table, one line per rank: coordinates and group ids
 * (for `meshrun mesh` and `meshrun plan --explain`). 0 or MR_EIO. */
int mr_mesh_format_table(const struct mr_mesh *m, FILE *out);

#endif
