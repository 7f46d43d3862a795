/*
 * diag_int.h - internals shared by diag.c (who waits for whom: the reports
 * of a job sorted by group, findings, culprits' scores) and diag_reply.c
 * (the reply: names, sentences, JSON). See diag.c for the rule.
 */
#ifndef MR_CTL_DIAG_INT_H
#define MR_CTL_DIAG_INT_H

#include <jansson.h>
#include <stdint.h>

#include "diag.h"
#include "state/names.h"
#include "state/state.h"
#include "mr_mesh.h"

#define MAX_FINDINGS 4096
#define MAX_LISTED 16 /* culprits, groups and ranks per list in the reply */
#define NLIST 8       /* ranks kept per finding */

enum ftype { F_NOT_ENTERED, F_P2P, F_MISMATCH, F_ALL_IN, F_P2P_BOTH, F_SILENT };

struct rk {
	struct ctl_member *m;     /* the rank's member (reported or by node rank) */
	const struct ctl_prank *r; /* NULL: no report */
	uint32_t score;           /* ranks waiting for it */
	int32_t best;             /* the finding that names it with most waiters */
	uint32_t best_w;
	uint8_t inflight;         /* in an unfinished operation somewhere */
	uint8_t blocked;          /* ... that waits for another rank (or is stuck) */
	uint8_t mismatch;         /* in another collective than its group */
	uint8_t silent;           /* its node stopped beating: its report is old */
};

struct tup {
	int32_t kind, id, rank;
	const struct ctl_pgroup *g;
};

/* A group someone waits in (or a p2p wait). */
struct finding {
	uint8_t type, kind, op, op2;
	int32_t id;
	uint64_t seq;
	uint32_t nwait, nlag, nmiss;
	int64_t since_ms; /* the longest-waiting rank's entry */
	int32_t waiter;   /* p2p: the waiting rank; mismatch: one of the majority */
	int32_t lag[NLIST], miss[NLIST];
};

/* One diagnosis: rk by rank, t the (rank, group) reports sorted by group,
 * f the findings. */
struct diag {
	struct ctl *ctl;
	struct ctl_job *job;
	struct mr_mesh mesh;
	int have_mesh;
	int32_t world;
	struct rk *rk;
	struct tup *t;
	size_t nt;
	struct finding *f;
	size_t nf;
	uint32_t dropped;
	int moving;   /* the job progresses: describe the waits, name no cause */
};

/* ms since m's node was last heard from, when more than half the
 * heartbeat timeout (two beats missed); else 0. */
int64_t mr__diag_silent_ms(const struct diag *dg, const struct ctl_member *m);
/* Appends rank to list (at most NLIST kept), counting every one in *n. */
void mr__diag_note(int32_t *list, uint32_t *n, int32_t rank);
/* Culprits, groups, ranks without a report and the one-line message into
 * o and msg (diag_reply.c); the findings get sorted. 0 or MR_ENOMEM. */
int mr__diag_build(struct diag *dg, json_t *o, char *msg, size_t cap);
json_t *mr__diag_stragglers_json(const struct ctl_jdiag *d);

#endif
