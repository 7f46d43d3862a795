/*
 * diag.c - who is stuck: the diagnosis of a job from its ranks' progress
 * (docs/DIAGNOSIS.md), on request (GET /v1/jobs/{job}/diagnosis) and once
 * when a job made no progress for hang_timeout_ms (core/progress.c).
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
 * Non-goals: storing progress (core/progress.c), deciding when to run it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "mr_names.h"
#include "diag_int.h"

int64_t mr__diag_silent_ms(const struct diag *dg, const struct ctl_member *m)
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
				dg->rk[m->node_rank * np + i].silent = mr__diag_silent_ms(dg, m) > 0;
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

void mr__diag_note(int32_t *list, uint32_t *n, int32_t rank)
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
			mr__diag_note(f->lag, &f->nlag, p);
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
				mr__diag_note(f->lag, &f->nlag, p);
			else
				mr__diag_note(f->miss, &f->nmiss, p);
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
			mr__diag_note(f->lag, &f->nlag, r);
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
				mr__diag_note(f->miss, &f->nmiss, r);
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
				mr__diag_note(f->lag, &f->nlag, dg->t[i].rank);
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
				mr__diag_note(f->lag, &f->nlag, dg->t[i].rank);
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
	dg.moving = !strcmp(verdict, "progressing");
	if (!strcmp(verdict, "stuck") || dg.moving) {
		if (collect(&dg) < 0 || (find_all(&dg), mr__diag_build(&dg, o, line, sizeof(line)) < 0)) {
			json_decref(o);
			o = NULL;
		}
	}
	if (o && !strcmp(verdict, "progressing")) {
		/* who waits for whom is a snapshot of a healthy job here, not a
		 * hang: say so first */
		char now[sizeof(line)];

		snprintf(now, sizeof(now),
			 "not stuck: the last progress was %.1f s ago; right now %.900s", stalled,
			 line);
		snprintf(line, sizeof(line), "%s", now);
	}
	if (o) {
		json_object_set_new(o, "message", json_string(line));
		json_object_set_new(o, "stragglers", mr__diag_stragglers_json(d));
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
