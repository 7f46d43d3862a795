/*
 * diag_reply.c - the diagnosis as people and programs read it (see diag.c
 * for the rule, docs/API.md for the fields): group labels ("tp[dp=1]"),
 * the culprits ranked by how many wait for them, each with its sentence,
 * the groups someone waits in, the job's one-line message.
 *
 * Non-goals: deciding who waits for whom (diag.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_names.h"
#include "diag_int.h"

static const char *const ftype_name[] = { "not_entered", "p2p", "mismatch", "all_in",
					  "p2p_both", "silent" };

/* ---- names ---- */

static const char *kind_name(int kind, char *buf, size_t cap)
{
	const char *n = mr_groups_kind_name(kind);

	if (n)
		return n;
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
	int64_t quiet = mr__diag_silent_ms(dg, x->m);

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
	int64_t quiet = mr__diag_silent_ms(dg, x->m);

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
		snprintf(buf, cap, "all %u ranks of group %s are in %s #%llu since %s%s", f->nwait,
			 grp, mr_comm_op_name(f->op), (unsigned long long)f->seq, since,
			 dg->moving ? "" : " and none completes: a transport problem or "
					   "mismatched message sizes");
		break;
	case F_P2P_BOTH:
		rank_text(dg, f->waiter, a, sizeof(a));
		rank_text(dg, f->lag[0], b, sizeof(b));
		snprintf(buf, cap, "%s (%s) and %s (%s) wait for each other on group %s since %s%s",
			 a, mr_comm_op_name(f->op), b, mr_comm_op_name(f->op2), grp, since,
			 dg->moving ? "" : " and neither completes: both send or both receive, or "
					   "the sizes or tags differ");
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

json_t *mr__diag_stragglers_json(const struct ctl_jdiag *d)
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
int mr__diag_build(struct diag *dg, json_t *o, char *msg, size_t cap)
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
			mr__diag_note(silent, &nsil, r);
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
