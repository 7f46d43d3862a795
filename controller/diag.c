/*
 * diag.c - who is stuck: the diagnosis of a job from its ranks' progress
 * (docs/DIAGNOSIS.md), on request (GET /v1/jobs/{job}/diagnosis) and once
 * when a job made no progress for hang_timeout_ms (progress.c).
 *
 * The rule, per group (one communicator: a kind and an id every member
 * reports alike). Its members number their operations alike, so the
 * highest number entered and not completed is the collective the group is
 * in; members that entered a lower number have not reached it, and the
 * others wait for them. A point-to-point operation waits for its one peer
 * instead (numbers differ between the ends of a pipeline). A rank that
 * others wait for and that is itself in no unfinished operation is a
 * culprit - stuck in compute, stopped, dead, or not reporting; culprits
 * are ranked by how many ranks wait for them, and a rank that waits in
 * turn is only a link of the chain. What is left is named too: a group
 * whose members all entered and none completes (a transport problem,
 * mismatched sizes), ranks of one group in different collectives at the
 * same number (a program bug), a pair of p2p ranks stuck with each other,
 * and waits in a circle. A rank whose node has been silent for half the
 * heartbeat timeout (frozen, cut off) reported last what it did before:
 * it counts as a culprit wherever others wait for it, and as the one that
 * holds up a group whose members are all in.
 *
 * Cost: O(ranks x groups) time and memory per call, on the loop thread;
 * the hang report runs it once per hang.
 *
 * Non-goals: storing progress (progress.c), deciding when to run it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "comm/mr_comm.h"
#include "ctl.h"
#include "mr_mesh.h"

#define MAX_FINDINGS 4096
#define MAX_LISTED 16 /* culprits, groups and ranks per list in the reply */
#define NLIST 8       /* ranks kept per finding */
#define KIND_HSDP_SHARD 64
#define KIND_HSDP_REPLICA 65

enum ftype { F_NOT_ENTERED, F_P2P, F_MISMATCH, F_ALL_IN, F_P2P_BOTH, F_SILENT };
static const char *const ftype_name[] = { "not_entered", "p2p", "mismatch", "all_in",
					  "p2p_both", "silent" };

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

struct finding {
	uint8_t type, kind, op, op2;
	int32_t id;
	uint64_t seq;
	uint32_t nwait, nlag, nmiss;
	int64_t since_ms; /* the longest-waiting rank's entry */
	int32_t waiter;   /* p2p: the waiting rank; mismatch: one of the majority */
	int32_t lag[NLIST], miss[NLIST];
};

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
};

/* ---- names ---- */

static const char *kind_name(int kind, char *buf, size_t cap)
{
	if (kind < MR_GROUP__COUNT)
		return mr_mesh_group_name((enum mr_mesh_group)kind);
	if (kind == KIND_HSDP_SHARD)
		return "hsdp_shard";
	if (kind == KIND_HSDP_REPLICA)
		return "hsdp_replica";
	snprintf(buf, cap, "kind%d", kind);
	return buf;
}

static void group_text(const struct diag *dg, int kind, int32_t id, char *buf, size_t cap)
{
	char k[16];

	if (kind < MR_GROUP__COUNT && dg->have_mesh &&
	    mr_mesh_group_label(&dg->mesh, (enum mr_mesh_group)kind, id, buf, cap) == 0)
		return;
	snprintf(buf, cap, "%s[first=%d]", kind_name(kind, k, sizeof(k)), id);
}

static void coords_text(const struct diag *dg, int32_t rank, char *buf, size_t cap)
{
	struct mr_mesh_coord c;

	buf[0] = '\0';
	if (!dg->have_mesh || mr_mesh_coord(&dg->mesh, rank, &c) < 0)
		return;
	snprintf(buf, cap, ", tp %d cp %d dp %d pp %d", c.tp, c.cp, c.dp, c.pp);
	if (dg->mesh.ep > 1)
		snprintf(buf + strlen(buf), cap - strlen(buf), " ep %d", c.ep);
}

static void rank_text(const struct diag *dg, int32_t rank, char *buf, size_t cap)
{
	const struct ctl_member *m = rank >= 0 && rank < dg->world ? dg->rk[rank].m : NULL;
	char co[96];

	coords_text(dg, rank, co, sizeof(co));
	snprintf(buf, cap, "rank %d (node %s%s)", rank, m ? m->node_id : "?", co);
}

static double secs(const struct diag *dg, int64_t since_ms)
{
	return (double)(dg->ctl->now_ms - since_ms) / 1e3;
}

static void since_text(const struct diag *dg, int64_t since_ms, char *buf, size_t cap)
{
	double s = secs(dg, since_ms);

	snprintf(buf, cap, s < 10 ? "%.1f s" : "%.0f s", s);
}

/* ms since the rank's node was last heard from, when more than half the
 * heartbeat timeout (two beats missed); else 0. */
static int64_t silent_ms(const struct diag *dg, const struct ctl_member *m)
{
	int64_t ago = m ? dg->ctl->now_ms - m->last_seen_ms : 0;

	return ago > dg->job->spec.heartbeat_timeout_ms / 2 ? ago : 0;
}

/* ---- collecting ---- */

static int cmp_tup(const void *a, const void *b)
{
	const struct tup *x = a, *y = b;

	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return (x->rank > y->rank) - (x->rank < y->rank);
}

static int collect(struct diag *dg)
{
	struct ctl_job *job = dg->job;
	int32_t np = job->spec.nproc_per_node;
	size_t k = 0;

	dg->world = job->world_size;
	dg->have_mesh = dg->world > 0 && mr_mesh_init(&dg->mesh, dg->world, job->spec.tp,
						      job->spec.pp, job->spec.cp, job->spec.ep,
						      0, NULL) == 0;
	dg->rk = calloc((size_t)(dg->world > 0 ? dg->world : 1), sizeof(*dg->rk));
	if (!dg->rk)
		return MR_ENOMEM;
	for (int32_t i = 0; i < dg->world; i++)
		dg->rk[i].best = -1;
	for (struct ctl_member *m = job->lru_head; m; m = m->lru_next) {
		if (m->state != CTL_M_RUNNING || m->node_rank < 0)
			continue;
		for (int32_t i = 0; i < np; i++)
			if (m->node_rank * np + i < dg->world) {
				dg->rk[m->node_rank * np + i].m = m;
				dg->rk[m->node_rank * np + i].silent = silent_ms(dg, m) > 0;
			}
		for (uint16_t i = 0; m->prog && i < m->prog->nr; i++) {
			const struct ctl_prank *r = &m->prog->r[i];

			if (r->rank < dg->world) {
				dg->rk[r->rank].r = r;
				dg->nt += r->ngroups;
			}
		}
	}
	dg->t = malloc((dg->nt ? dg->nt : 1) * sizeof(*dg->t));
	dg->f = malloc(MAX_FINDINGS * sizeof(*dg->f));
	if (!dg->t || !dg->f)
		return MR_ENOMEM;
	for (int32_t i = 0; i < dg->world; i++) {
		const struct ctl_prank *r = dg->rk[i].r;
		const struct ctl_pgroup *g;

		if (!r)
			continue;
		g = dg->rk[i].m->prog->g + r->goff;
		for (uint8_t j = 0; j < r->ngroups && k < dg->nt; j++) {
			dg->t[k++] = (struct tup){ g[j].kind, g[j].id, i, &g[j] };
			if (g[j].gap)
				dg->rk[i].inflight = 1;
		}
	}
	dg->nt = k;
	qsort(dg->t, dg->nt, sizeof(*dg->t), cmp_tup);
	return 0;
}

/* ---- findings ---- */

static struct finding *new_finding(struct diag *dg, int type, const struct ctl_pgroup *g,
				   int32_t kind, int32_t id)
{
	struct finding *f;

	if (dg->nf >= MAX_FINDINGS) {
		dg->dropped++;
		return NULL;
	}
	f = &dg->f[dg->nf++];
	memset(f, 0, sizeof(*f));
	f->type = (uint8_t)type;
	f->kind = (uint8_t)kind;
	f->id = id;
	f->op = g->op;
	f->seq = g->entered;
	f->waiter = -1;
	f->since_ms = dg->ctl->now_ms;
	return f;
}

/* rank is waited for by w ranks in finding f. */
static void credit(struct diag *dg, int32_t rank, const struct finding *f, uint32_t w)
{
	struct rk *x;

	if (rank < 0 || rank >= dg->world)
		return;
	x = &dg->rk[rank];
	x->score += w;
	if (f && w > x->best_w) {
		x->best_w = w;
		x->best = (int32_t)(f - dg->f);
	}
}

static void note(int32_t *list, uint32_t *n, int32_t rank)
{
	if (*n < NLIST)
		list[*n] = rank;
	(*n)++;
}

/* Index of rank's tuple in t[a, b) (sorted by rank), or -1. */
static ssize_t find_rank(const struct diag *dg, size_t a, size_t b, int32_t rank)
{
	while (a < b) {
		size_t mid = a + (b - a) / 2;

		if (dg->t[mid].rank == rank)
			return (ssize_t)mid;
		if (dg->t[mid].rank < rank)
			a = mid + 1;
		else
			b = mid;
	}
	return -1;
}

static void p2p_group(struct diag *dg, size_t a, size_t b)
{
	int32_t kind = dg->t[a].kind, id = dg->t[a].id;

	if (kind >= MR_GROUP__COUNT || !dg->have_mesh)
		return; /* peers are indices in a group the mesh cannot list */
	for (size_t i = a; i < b; i++) {
		const struct ctl_pgroup *g = dg->t[i].g;
		int32_t w = dg->t[i].rank, p, widx = -1;
		struct finding *f;
		ssize_t j;

		if (!g->gap)
			continue;
		dg->rk[w].blocked = 1; /* it waits for its peer (or is stuck with it) */
		if (!mr_comm_op_is_p2p(g->op))
			continue;
		p = mr_mesh_group_member(&dg->mesh, (enum mr_mesh_group)kind, id, g->peer);
		if (p < 0)
			continue;
		mr_mesh_group(&dg->mesh, (enum mr_mesh_group)kind, w, NULL, &widx);
		j = find_rank(dg, a, b, p);
		if (j >= 0 && dg->t[j].g->gap && mr_comm_op_is_p2p(dg->t[j].g->op) &&
		    dg->t[j].g->peer == widx) {
			/* both ends are in: report the pair once */
			if (p < w || !(f = new_finding(dg, F_P2P_BOTH, g, kind, id)))
				continue;
			f->waiter = w;
			f->op2 = dg->t[j].g->op;
			f->nwait = 2;
			note(f->lag, &f->nlag, p);
			f->since_ms = dg->rk[w].r->changed_ms < dg->rk[p].r->changed_ms
					      ? dg->rk[w].r->changed_ms
					      : dg->rk[p].r->changed_ms;
			continue;
		}
		f = new_finding(dg, F_P2P, g, kind, id);
		if (f) {
			f->waiter = w;
			f->nwait = 1;
			f->since_ms = dg->rk[w].r->changed_ms;
			if (dg->rk[p].r)
				note(f->lag, &f->nlag, p);
			else
				note(f->miss, &f->nmiss, p);
		}
		credit(dg, p, f, 1);
	}
}

static void coll_group(struct diag *dg, size_t a, size_t b)
{
	int32_t kind = dg->t[a].kind, id = dg->t[a].id;
	uint32_t nwait = 0, count[256] = { 0 }, nmis = 0, nlag = 0, ndone = 0;
	const struct ctl_pgroup *front = NULL;
	uint64_t s = 0, lo = UINT64_MAX;
	uint8_t op = 0;
	struct finding *f;
	int missing = 0;

	for (size_t i = a; i < b; i++) {
		if (dg->t[i].g->entered > s)
			s = dg->t[i].g->entered;
		if (dg->t[i].g->entered < lo)
			lo = dg->t[i].g->entered;
	}
	if (kind < MR_GROUP__COUNT && dg->have_mesh)
		missing = (size_t)mr_mesh_group_size(&dg->mesh, (enum mr_mesh_group)kind) > b - a;
	/* an unfinished operation waits for another rank only while someone has
	 * not entered it; else it can finish (an asynchronous operation not yet
	 * waited for, or a report older than the rank) */
	for (size_t i = a; i < b; i++)
		if (dg->t[i].g->gap && (dg->t[i].g->entered > lo || missing))
			dg->rk[dg->t[i].rank].blocked = 1;
	for (size_t i = a; i < b; i++) {
		const struct ctl_pgroup *g = dg->t[i].g;

		if (g->entered == s && g->gap) {
			nwait++;
			if (++count[g->op] > count[op])
				op = g->op;
		}
		nlag += g->entered < s;
		ndone += g->entered == s && !g->gap;
	}
	/* nobody inside an operation of this group; or it finished for some
	 * (the others have not waited for it yet) and nobody lags */
	if (!nwait || (ndone && !nlag))
		return;
	for (size_t i = a; i < b; i++)
		if (dg->t[i].g->entered == s && dg->t[i].g->gap && dg->t[i].g->op == op) {
			front = dg->t[i].g;
			break;
		}
	f = new_finding(dg, F_ALL_IN, front, kind, id);
	if (!f)
		return;
	f->nwait = nwait;
	for (size_t i = a; i < b; i++) {
		const struct ctl_pgroup *g = dg->t[i].g;
		int32_t r = dg->t[i].rank;

		if (g->entered < s) {
			note(f->lag, &f->nlag, r);
		} else if (g->gap && g->op != op) {
			nmis++;
			dg->rk[r].mismatch = 1;
			f->op2 = g->op;
		} else if (g->gap && dg->rk[r].r->changed_ms < f->since_ms) {
			f->since_ms = dg->rk[r].r->changed_ms;
			f->waiter = r;
		}
	}
	if (kind < MR_GROUP__COUNT && dg->have_mesh) { /* members without a report */
		int n = mr_mesh_group_size(&dg->mesh, (enum mr_mesh_group)kind);

		for (int k = 0; k < n; k++) {
			int32_t r = mr_mesh_group_member(&dg->mesh, (enum mr_mesh_group)kind, id, k);

			if (r >= 0 && r < dg->world && !dg->rk[r].r)
				note(f->miss, &f->nmiss, r);
		}
	}
	if (f->nlag || f->nmiss) {
		f->type = F_NOT_ENTERED;
		f->nwait -= nmis;
		for (size_t i = a; i < b; i++)
			if (dg->t[i].g->entered < s)
				credit(dg, dg->t[i].rank, f, f->nwait);
		for (uint32_t k = 0; k < f->nmiss && k < NLIST; k++)
			credit(dg, f->miss[k], f, f->nwait);
	} else if (!nmis) {
		/* all in: a silent node holds it up, if any */
		uint32_t nsil = 0;

		for (size_t i = a; i < b; i++)
			if (dg->rk[dg->t[i].rank].silent) {
				note(f->lag, &f->nlag, dg->t[i].rank);
				nsil++;
			}
		for (size_t i = a; i < b; i++)
			if (dg->t[i].g->gap)
				dg->rk[dg->t[i].rank].blocked = 1; /* stuck in it */
		if (nsil && nsil < f->nwait) {
			f->type = F_SILENT;
			f->nwait -= nsil;
			for (size_t i = a; i < b; i++)
				if (dg->rk[dg->t[i].rank].silent)
					credit(dg, dg->t[i].rank, f, f->nwait);
		} else {
			f->nlag = 0;
		}
	} else {
		f->type = F_MISMATCH;
		f->nwait -= nmis;
		for (size_t i = a; i < b; i++)
			if (dg->t[i].g->gap)
				dg->rk[dg->t[i].rank].blocked = 1; /* stuck in it */
		f->nlag = 0;
		for (size_t i = a; i < b; i++) {
			const struct ctl_pgroup *g = dg->t[i].g;

			if (g->entered == s && g->gap && g->op != op) {
				note(f->lag, &f->nlag, dg->t[i].rank);
				credit(dg, dg->t[i].rank, f, f->nwait);
			}
		}
	}
}

static void find_all(struct diag *dg)
{
	for (size_t a = 0, b; a < dg->nt; a = b) {
		int p2p = 0;

		for (b = a; b < dg->nt && dg->t[b].kind == dg->t[a].kind && dg->t[b].id == dg->t[a].id;
		     b++)
			p2p |= dg->t[b].g->gap && mr_comm_op_is_p2p(dg->t[b].g->op);
		if (p2p)
			p2p_group(dg, a, b);
		else
			coll_group(dg, a, b);
	}
}

/* ---- the reply ---- */

static int32_t *culprits(const struct diag *dg, uint32_t *n)
{
	int32_t *c = malloc(MAX_LISTED * sizeof(*c));

	*n = 0;
	if (!c)
		return NULL;
	for (int32_t r = 0; r < dg->world; r++) {
		const struct rk *x = &dg->rk[r];
		uint32_t i;

		if (!x->score || (x->blocked && !x->mismatch && !x->silent && x->r))
			continue; /* a link of a chain: it waits in turn */
		/* insertion into the top MAX_LISTED by score, then rank */
		for (i = *n; i > 0 && dg->rk[c[i - 1]].score < x->score; i--)
			if (i < MAX_LISTED)
				c[i] = c[i - 1];
		if (i < MAX_LISTED) {
			c[i] = r;
			if (*n < MAX_LISTED)
				(*n)++;
		}
	}
	return c;
}

static const char *waits(uint32_t n)
{
	return n == 1 ? "rank is" : "ranks are";
}

/* The message naming culprit rank r through its finding. */
static void culprit_text(const struct diag *dg, int32_t r, char *buf, size_t cap)
{
	const struct rk *x = &dg->rk[r];
	const struct finding *f = x->best >= 0 ? &dg->f[x->best] : NULL;
	char who[256], grp[96], since[32], wt[256];
	size_t len;
	int64_t quiet = silent_ms(dg, x->m);

	rank_text(dg, r, who, sizeof(who));
	if (!f) {
		snprintf(buf, cap, "%s: %u ranks wait for it", who, x->score);
		return;
	}
	group_text(dg, f->kind, f->id, grp, sizeof(grp));
	since_text(dg, f->since_ms, since, sizeof(since));
	if (f->type == F_P2P) {
		rank_text(dg, f->waiter, wt, sizeof(wt));
		snprintf(buf, cap, "%s has not entered the %s that %s waits for in %s #%llu on group "
			 "%s since %s", who, f->op == MR_COMM_OP_SEND ? "recv" : "send", wt,
			 mr_comm_op_name(f->op), (unsigned long long)f->seq, grp, since);
	} else if (f->type == F_SILENT) {
		snprintf(buf, cap, "%s is in %s #%llu on group %s with %u other %s since %s and "
			 "none completes: its node stopped reporting", who, mr_comm_op_name(f->op),
			 (unsigned long long)f->seq, grp, f->nwait,
			 f->nwait == 1 ? "rank" : "ranks", since);
	} else if (f->type == F_MISMATCH) {
		snprintf(buf, cap, "%s is in %s #%llu on group %s while %u other %s in %s #%llu "
			 "since %s: the ranks issue different collectives", who,
			 mr_comm_op_name(f->op2), (unsigned long long)f->seq, grp, f->nwait,
			 waits(f->nwait), mr_comm_op_name(f->op), (unsigned long long)f->seq, since);
	} else {
		snprintf(buf, cap, "%s has not entered %s #%llu on group %s; %u other %s waiting "
			 "in it since %s", who, mr_comm_op_name(f->op), (unsigned long long)f->seq,
			 grp, f->nwait, waits(f->nwait), since);
	}
	len = strlen(buf);
	if (!x->r)
		snprintf(buf + len, cap - len, "; it reports no progress");
	else if (!x->blocked && !x->silent)
		snprintf(buf + len, cap - len, "; it is at step %lld%s, %s",
			 (long long)x->r->step, x->r->micro >= 0 ? ", in a micro-batch" : "",
			 x->inflight ? "waiting for no other rank" : "outside communication");
	len = strlen(buf);
	if (quiet)
		snprintf(buf + len, cap - len, "; node %s silent for %.0f s", x->m->node_id,
			 (double)quiet / 1e3);
}

static const char *reason_of(const struct diag *dg, int32_t r)
{
	const struct rk *x = &dg->rk[r];
	const struct finding *f = x->best >= 0 ? &dg->f[x->best] : NULL;

	if (!x->r)
		return "no_report";
	if (f && f->type == F_MISMATCH)
		return "mismatch";
	if (f && f->type == F_SILENT)
		return "silent";
	if (f && f->type == F_P2P)
		return "p2p_peer";
	return "not_entered";
}

static json_t *culprit_json(const struct diag *dg, int32_t r)
{
	const struct rk *x = &dg->rk[r];
	const struct finding *f = x->best >= 0 ? &dg->f[x->best] : NULL;
	char msg[1024], grp[96], k[16];
	struct mr_mesh_coord c;
	json_t *o;
	int64_t quiet = silent_ms(dg, x->m);

	culprit_text(dg, r, msg, sizeof(msg));
	o = json_pack("{si ss ss si sb ss}", "rank", r, "node", x->m ? x->m->node_id : "?",
		      "reason", reason_of(dg, r), "waiting", (int)x->score, "in_communication",
		      x->blocked, "message", msg);
	if (!o)
		return NULL;
	if (dg->have_mesh && mr_mesh_coord(&dg->mesh, r, &c) == 0)
		json_object_set_new(o, "coords", json_pack("{si si si si si}", "tp", c.tp, "cp", c.cp,
							   "dp", c.dp, "pp", c.pp, "ep", c.ep));
	if (x->r) {
		json_object_set_new(o, "step", json_integer(x->r->step));
		json_object_set_new(o, "micro", json_integer(x->r->micro));
	}
	if (quiet)
		json_object_set_new(o, "node_silent_s", json_real((double)quiet / 1e3));
	if (f) {
		group_text(dg, f->kind, f->id, grp, sizeof(grp));
		json_object_set_new(o, "group", json_string(grp));
		json_object_set_new(o, "group_kind", json_string(kind_name(f->kind, k, sizeof(k))));
		json_object_set_new(o, "group_id", json_integer(f->id));
		json_object_set_new(o, "op", json_string(mr_comm_op_name(f->op)));
		json_object_set_new(o, "seq", json_integer((json_int_t)f->seq));
		json_object_set_new(o, "waiting_since_s", json_real(secs(dg, f->since_ms)));
	}
	return o;
}

static json_t *ranks_json(const int32_t *r, uint32_t n)
{
	json_t *a = json_array();

	for (uint32_t i = 0; i < n && i < NLIST; i++)
		json_array_append_new(a, json_integer(r[i]));
	return a;
}

static void finding_text(const struct diag *dg, const struct finding *f, char *buf, size_t cap)
{
	char grp[96], since[32], a[256], b[256];

	group_text(dg, f->kind, f->id, grp, sizeof(grp));
	since_text(dg, f->since_ms, since, sizeof(since));
	switch (f->type) {
	case F_ALL_IN:
		snprintf(buf, cap, "all %u ranks of group %s are in %s #%llu since %s and none "
			 "completes: a transport problem or mismatched message sizes", f->nwait,
			 grp, mr_comm_op_name(f->op), (unsigned long long)f->seq, since);
		break;
	case F_P2P_BOTH:
		rank_text(dg, f->waiter, a, sizeof(a));
		rank_text(dg, f->lag[0], b, sizeof(b));
		snprintf(buf, cap, "%s (%s) and %s (%s) wait for each other on group %s since %s "
			 "and neither completes: both send or both receive, or the sizes or tags "
			 "differ", a, mr_comm_op_name(f->op), b, mr_comm_op_name(f->op2), grp, since);
		break;
	default:
		snprintf(buf, cap, "%u %s waiting in %s #%llu on group %s since %s", f->nwait,
			 waits(f->nwait), mr_comm_op_name(f->op), (unsigned long long)f->seq, grp,
			 since);
	}
}

static json_t *finding_json(const struct diag *dg, const struct finding *f)
{
	char grp[96], k[16], msg[768];
	json_t *o;

	group_text(dg, f->kind, f->id, grp, sizeof(grp));
	finding_text(dg, f, msg, sizeof(msg));
	o = json_pack("{ss ss si ss ss sI si sf ss}", "group", grp, "kind",
		      kind_name(f->kind, k, sizeof(k)), "id", f->id, "type", ftype_name[f->type],
		      "op", mr_comm_op_name(f->op), "seq", (json_int_t)f->seq, "waiting",
		      (int)f->nwait, "waiting_since_s", secs(dg, f->since_ms), "message", msg);
	if (!o)
		return NULL;
	if (f->waiter >= 0)
		json_object_set_new(o, "waiter", json_integer(f->waiter));
	json_object_set_new(o, "not_entered", json_integer(f->nlag));
	json_object_set_new(o, "not_entered_ranks", ranks_json(f->lag, f->nlag));
	json_object_set_new(o, "no_report", json_integer(f->nmiss));
	json_object_set_new(o, "no_report_ranks", ranks_json(f->miss, f->nmiss));
	return o;
}

static int cmp_finding(const void *a, const void *b)
{
	const struct finding *x = a, *y = b;

	if (x->nwait != y->nwait)
		return x->nwait > y->nwait ? -1 : 1;
	return (x->since_ms > y->since_ms) - (x->since_ms < y->since_ms);
}

static json_t *stragglers_json(const struct ctl_jdiag *d)
{
	json_t *a = json_array();

	for (uint32_t i = 0; d && i < d->nlisted; i++)
		json_array_append_new(a, json_pack("{si ss sf sf sf}", "rank", d->strag[i].rank,
						   "node", d->strag[i].m->node_id, "busy_ms",
						   (double)d->strag[i].busy_ms, "median_ms",
						   (double)d->strag[i].median_ms, "ratio",
						   d->strag[i].median_ms > 0
							   ? (double)(d->strag[i].busy_ms /
								      d->strag[i].median_ms)
							   : 0.0));
	return a;
}

/* Everything but the verdict: culprits, groups, ranks without a report,
 * and the one-line message. */
static int build(struct diag *dg, json_t *o, char *msg, size_t cap)
{
	uint32_t nc = 0, nsil = 0;
	int32_t *c = culprits(dg, &nc), silent[NLIST];
	json_t *cj = json_array(), *gj = json_array();
	size_t nspecial = 0;

	if (!c)
		return MR_ENOMEM;
	for (uint32_t i = 0; i < nc; i++)
		json_array_append_new(cj, culprit_json(dg, c[i]));
	for (int32_t r = 0; r < dg->world; r++)
		if (!dg->rk[r].r)
			note(silent, &nsil, r);
	/* groups: the worst first */
	qsort(dg->f, dg->nf, sizeof(*dg->f), cmp_finding);
	for (size_t i = 0; i < dg->nf && i < MAX_LISTED; i++)
		json_array_append_new(gj, finding_json(dg, &dg->f[i]));
	for (size_t i = 0; i < dg->nf; i++)
		nspecial += dg->f[i].type == F_ALL_IN || dg->f[i].type == F_P2P_BOTH;
	if (nc) {
		/* culprit_json already rendered with the findings in place */
		snprintf(msg, cap, "%s",
			 json_string_value(json_object_get(json_array_get(cj, 0), "message")));
		if (nc > 1)
			snprintf(msg + strlen(msg), cap - strlen(msg), " (and %u other rank%s)",
				 nc - 1, nc > 2 ? "s" : "");
	} else if (nspecial) {
		for (size_t i = 0; i < dg->nf; i++)
			if (dg->f[i].type == F_ALL_IN || dg->f[i].type == F_P2P_BOTH) {
				finding_text(dg, &dg->f[i], msg, cap);
				break;
			}
	} else if (dg->nf) {
		snprintf(msg, cap, "every rank that is waited for waits in turn (%zu groups): the "
			 "ranks enter their groups in different orders", dg->nf);
	} else {
		snprintf(msg, cap, "no rank is waiting in communication");
	}
	json_object_set_new(o, "culprits", cj);
	json_object_set_new(o, "groups", gj);
	json_object_set_new(o, "groups_total", json_integer((json_int_t)dg->nf + dg->dropped));
	json_object_set_new(o, "ranks_not_reporting", json_integer(nsil));
	json_object_set_new(o, "ranks_not_reporting_list", ranks_json(silent, nsil));
	free(c);
	return 0;
}

json_t *mr__ctl_diagnose(struct ctl *ctl, struct ctl_job *job, char *msg, size_t cap)
{
	const struct ctl_jdiag *d = job->diag;
	struct diag dg = { .ctl = ctl, .job = job };
	char line[1024] = "";
	const char *verdict;
	json_t *o;
	double stalled = d && d->progress_ms ? (double)(ctl->now_ms - d->progress_ms) / 1e3 : 0.0;
	int stuck = d && d->progress_ms && job->spec.hang_timeout_ms > 0 &&
		    stalled * 1e3 >= job->spec.hang_timeout_ms;

	if (job->state != CTL_JOB_RUNNING) {
		verdict = "not_running";
		snprintf(line, sizeof(line), "the job is %s", mr__ctl_job_state_name(job->state));
	} else if (!d || !d->ranks) {
		verdict = "unknown";
		snprintf(line, sizeof(line), "no rank reports progress (in-process workers do; "
					     "exec-mode workers are opaque)");
	} else {
		verdict = stuck ? "stuck" : "progressing";
	}
	o = json_pack("{ss sI ss si si sf sf}", "job", job->name, "generation",
		      (json_int_t)job->generation, "verdict", verdict, "world_size",
		      job->world_size, "ranks_reporting", d ? (int)d->ranks : 0, "stalled_s",
		      stalled, "hang_timeout_s", job->spec.hang_timeout_ms / 1e3);
	if (!o)
		return NULL;
	if (!strcmp(verdict, "stuck") || !strcmp(verdict, "progressing")) {
		if (collect(&dg) < 0 || (find_all(&dg), build(&dg, o, line, sizeof(line)) < 0)) {
			json_decref(o);
			o = NULL;
		}
	}
	if (o) {
		json_object_set_new(o, "message", json_string(line));
		json_object_set_new(o, "stragglers", stragglers_json(d));
		json_object_set_new(o, "stragglers_total", json_integer(d ? d->nstragglers : 0));
		json_object_set_new(o, "median_busy_ms", json_real(d ? d->median_ms : 0.0));
	}
	if (msg)
		snprintf(msg, cap, "%s", line);
	free(dg.rk);
	free(dg.t);
	free(dg.f);
	return o;
}
