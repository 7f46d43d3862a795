/*
 * progress.c - the ranks' progress as agents report it with their
 * heartbeats (docs/API.md, "Progress"), and straggler detection.
 *
 * A running member keeps one allocation holding its ranks (step,
 * micro-batch, busy time) and, per rank, its communicators (group, last
 * operation entered, how many unfinished). A report costs O(its ranks x
 * groups); nothing here walks the job. The job keeps the time any rank
 * last changed (the hang timer; diag/diag.c decides who is stuck) and a
 * histogram of its ranks' busy times in 5 % bins, so each report compares
 * a rank with the job's median in O(1): a rank above straggler_pct % of
 * the median (and at least CTL_STRAGGLER_MIN_MS above it) in
 * CTL_STRAGGLER_REPORTS reports in a row is flagged (an event, the job
 * view, a metric), and cleared the same way.
 *
 * Progress is volatile: never journaled. After a controller restart the
 * agents' next full reports (sent every few beats) bring it back.
 *
 * Non-goals: the diagnosis (diag/), HTTP (api/handlers.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "diag/diag.h"
#include "mr_json.h"
#include "mr_log.h"

#define MAX_REPORT_RANKS 1024
#define MAX_SEQ (((uint64_t)1 << 56) - 1)
#define HIST_MIN_MS 0.01
#define HIST_STEP 1.05
#define MEDIAN_EVERY_MS 250

/* ---- the shape of a report ---- */

static int bad(struct ctl_res *res, const char *field, const char *msg)
{
	mr__res_err(res, 400, "invalid_field", field, "%s", msg);
	return MR_EINVAL;
}

/* [kind, id, size, entered, op, peer, completed], all integers in range. */
static int check_group(const json_t *t, char *field, size_t cap, size_t i, size_t j,
		       struct ctl_res *res)
{
	static const int64_t lo[7] = { 0, 0, 1, 0, 0, -1, 0 };
	static const int64_t hi[7] = { 255, INT32_MAX, INT32_MAX, (int64_t)MAX_SEQ, 255,
				       INT32_MAX, (int64_t)MAX_SEQ };
	int64_t v[7];

	snprintf(field, cap, "progress[%zu].g[%zu]", i, j);
	if (!json_is_array(t) || json_array_size(t) != 7)
		return bad(res, field, "a group is [kind, id, size, entered, op, peer, completed]");
	for (size_t k = 0; k < 7; k++) {
		const json_t *e = json_array_get(t, k);

		if (!json_is_integer(e) || json_integer_value(e) < lo[k] ||
		    json_integer_value(e) > hi[k])
			return bad(res, field,
				   "a group is [kind, id, size, entered, op, peer, completed] "
				   "of integers in range");
		v[k] = json_integer_value(e);
	}
	if (v[6] > v[3])
		return bad(res, field, "'completed' is above 'entered'");
	if (v[5] >= v[2])
		return bad(res, field, "'peer' is not an index in the group");
	return 0;
}

int mr__ctl_progress_check(const json_t *p, int32_t max_ranks, struct ctl_res *res)
{
	static const char *const keys[] = { "rank", "step", "micro", "busy_ms", "step_ms", "g",
					    NULL };
	char field[192];
	size_t n = json_array_size(p);

	if (max_ranks > MAX_REPORT_RANKS)
		max_ranks = MAX_REPORT_RANKS;
	if (!json_is_array(p))
		return bad(res, "progress", "'progress' must be an array of ranks");
	if (n > (size_t)max_ranks) {
		mr__res_err(res, 400, "invalid_field", "progress",
			    "'progress' has %zu ranks, more than %d", n, max_ranks);
		return MR_EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		const json_t *o = json_array_get(p, i), *g;
		struct mr_errbuf eb = { { 0 }, { 0 } };
		int64_t x;
		double d;

		snprintf(field, sizeof(field), "progress[%zu]", i);
		if (!json_is_object(o))
			return bad(res, field, "a rank's progress must be an object");
		if (mr_json_check_keys(o, keys, &eb) ||
		    mr_json_get_int(o, "rank", 1, 0, INT32_MAX, &x, &eb) ||
		    mr_json_get_int(o, "step", 1, 0, INT64_MAX, &x, &eb) ||
		    mr_json_get_int(o, "micro", 0, -1, INT32_MAX, &x, &eb) ||
		    mr_json_get_double(o, "busy_ms", 0, 0, 1e12, &d, &eb) ||
		    mr_json_get_double(o, "step_ms", 0, 0, 1e12, &d, &eb)) {
			snprintf(field, sizeof(field), "progress[%zu].%s", i,
				 eb.field[0] ? eb.field : "");
			return bad(res, field, eb.msg);
		}
		g = json_object_get(o, "g");
		if (!g)
			continue;
		snprintf(field, sizeof(field), "progress[%zu].g", i);
		if (!json_is_array(g) || json_array_size(g) > CTL_MAX_PGROUPS) {
			mr__res_err(res, 400, "invalid_field", field,
				    "'g' must be an array of at most %d groups", CTL_MAX_PGROUPS);
			return MR_EINVAL;
		}
		for (size_t j = 0; j < json_array_size(g); j++)
			if (check_group(json_array_get(g, j), field, sizeof(field), i, j, res))
				return MR_EINVAL;
	}
	return 0;
}

/* ---- busy-time histogram and stragglers ---- */

static uint16_t bin_of(double ms)
{
	double b = ms > HIST_MIN_MS ? log(ms / HIST_MIN_MS) / log(HIST_STEP) : 0.0;

	return (uint16_t)(b < CTL_HIST_BINS - 1 ? b : CTL_HIST_BINS - 1);
}

static void hist_move(struct ctl_jdiag *d, struct ctl_prank *r, uint16_t nb)
{
	if (r->hbin == nb)
		return;
	if (r->hbin < CTL_HIST_BINS) {
		d->hist[r->hbin]--;
		d->hist_n--;
	}
	if (nb < CTL_HIST_BINS) {
		d->hist[nb]++;
		d->hist_n++;
	}
	r->hbin = nb;
	d->hist_dirty = 1;
}

/* Lower median (the ceil(n/2)-th smallest): with two ranks, the faster
 * one, so a slow rank of two stands out. The bin's geometric centre. */
static void median(struct ctl *ctl, struct ctl_jdiag *d)
{
	uint32_t k = (d->hist_n + 1) / 2, seen = 0;

	d->median_ms = 0.0f;
	for (int b = 0; b < CTL_HIST_BINS && d->hist_n; b++) {
		seen += d->hist[b];
		if (seen >= k) {
			d->median_ms = (float)(HIST_MIN_MS * pow(HIST_STEP, b + 0.5));
			break;
		}
	}
	d->hist_dirty = 0;
	d->median_at_ms = ctl->now_ms;
}

static struct ctl_straggler *listed(struct ctl_jdiag *d, const struct ctl_member *m,
				    int32_t rank)
{
	for (uint32_t i = 0; i < d->nlisted; i++)
		if (d->strag[i].m == m && d->strag[i].rank == rank)
			return &d->strag[i];
	return NULL;
}

static void unlist(struct ctl_jdiag *d, const struct ctl_member *m, int32_t rank)
{
	struct ctl_straggler *s = listed(d, m, rank);

	if (s)
		*s = d->strag[--d->nlisted];
}

static void note_straggler(struct ctl_jdiag *d, struct ctl_member *m, const struct ctl_prank *r)
{
	struct ctl_straggler *s = listed(d, m, r->rank);

	if (!s && d->nlisted < CTL_MAX_STRAGGLERS)
		s = &d->strag[d->nlisted++];
	if (s)
		*s = (struct ctl_straggler){ m, r->rank, r->busy_ms, d->median_ms };
}

/* A new busy time for rank r of m: histogram, then the comparison with
 * the job's median, CTL_STRAGGLER_REPORTS in a row to change its flag. */
static void busy_report(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m,
			struct ctl_prank *r, double busy)
{
	struct ctl_jdiag *d = job->diag;
	int pct = job->spec.straggler_pct, above;

	r->busy_ms = (float)busy;
	hist_move(d, r, bin_of(busy));
	if (d->median_ms <= 0.0f && d->hist_n >= 2)
		median(ctl, d);
	if (pct <= 0 || d->hist_n < 2 || d->median_ms <= 0.0f)
		return;
	above = busy > (double)d->median_ms * pct / 100.0 &&
		busy - (double)d->median_ms >= CTL_STRAGGLER_MIN_MS;
	if (above != r->flagged)
		r->streak = r->streak < 255 ? r->streak + 1 : 255;
	else
		r->streak = 0;
	if (r->flagged)
		note_straggler(d, m, r);
	if (r->streak < CTL_STRAGGLER_REPORTS)
		return;
	r->streak = 0;
	r->flagged = (uint8_t)above;
	if (above) {
		d->nstragglers++;
		ctl->stats.stragglers++;
		note_straggler(d, m, r);
		mr_log_warn("straggler",
			    "job=%s gen=%llu rank=%d node=%s busy_ms=%.1f median_ms=%.1f ratio=%.2f "
			    "limit=%.2f",
			    mr_log_q(job->name), (unsigned long long)job->generation, r->rank,
			    mr_log_q(m->node_id), busy, d->median_ms, busy / d->median_ms,
			    pct / 100.0);
	} else {
		d->nstragglers--;
		unlist(d, m, r->rank);
		mr_log_info("straggler_cleared",
			    "job=%s gen=%llu rank=%d node=%s busy_ms=%.1f median_ms=%.1f",
			    mr_log_q(job->name), (unsigned long long)job->generation, r->rank,
			    mr_log_q(m->node_id), busy, d->median_ms);
	}
}

/* ---- reports ---- */

static struct ctl_jdiag *diag_of(struct ctl_job *job)
{
	if (!job->diag) {
		job->diag = calloc(1, sizeof(*job->diag));
		if (job->diag)
			job->diag->stuck_rank = -1;
	}
	return job->diag;
}

void mr__ctl_progress_drop(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m)
{
	struct ctl_mprog *mp = m->prog;
	struct ctl_jdiag *d = job->diag;

	(void)ctl;
	if (!mp)
		return;
	for (uint16_t i = 0; d && i < mp->nr; i++) {
		hist_move(d, &mp->r[i], CTL_HIST_BINS);
		if (mp->r[i].flagged) {
			d->nstragglers--;
			unlist(d, m, mp->r[i].rank);
		}
	}
	if (d)
		d->ranks -= mp->nr;
	free(mp);
	m->prog = NULL;
}

/* 1 when the stored shape (ranks and their group counts, in order) is
 * the report's. */
static int same_shape(const struct ctl_mprog *mp, const json_t *p)
{
	size_t nr = json_array_size(p);

	if (!mp || mp->nr != nr)
		return 0;
	for (size_t i = 0; i < nr; i++) {
		const json_t *o = json_array_get(p, i);

		if (mp->r[i].rank != (int32_t)json_integer_value(json_object_get(o, "rank")) ||
		    mp->r[i].ngroups != json_array_size(json_object_get(o, "g")))
			return 0;
	}
	return 1;
}

static struct ctl_mprog *new_prog(const json_t *p)
{
	size_t nr = json_array_size(p), ng = 0, off = 0;
	struct ctl_mprog *mp;

	for (size_t i = 0; i < nr; i++)
		ng += json_array_size(json_object_get(json_array_get(p, i), "g"));
	mp = calloc(1, sizeof(*mp) + nr * sizeof(mp->r[0]) + ng * sizeof(struct ctl_pgroup));
	if (!mp)
		return NULL;
	mp->nr = (uint16_t)nr;
	mp->ng = (uint16_t)ng;
	mp->g = (struct ctl_pgroup *)(void *)&mp->r[nr];
	for (size_t i = 0; i < nr; i++) {
		const json_t *o = json_array_get(p, i);
		struct ctl_prank *r = &mp->r[i];

		r->rank = (int32_t)json_integer_value(json_object_get(o, "rank"));
		r->step = -1;
		r->busy_ms = r->step_ms = -1.0f;
		r->hbin = CTL_HIST_BINS;
		r->goff = (uint16_t)off;
		r->ngroups = (uint8_t)json_array_size(json_object_get(o, "g"));
		off += r->ngroups;
	}
	return mp;
}

/* Copies one rank's report into r and its groups; 1 if anything the hang
 * timer watches changed. */
static int update_rank(struct ctl_prank *r, struct ctl_pgroup *g, const json_t *o)
{
	const json_t *gs = json_object_get(o, "g"), *mj = json_object_get(o, "micro");
	int64_t step = json_integer_value(json_object_get(o, "step"));
	int32_t micro = mj ? (int32_t)json_integer_value(mj) : -1;
	int changed = r->step != step || r->micro != micro;

	r->step = step;
	r->micro = micro;
	for (uint8_t j = 0; j < r->ngroups; j++) {
		const json_t *t = json_array_get(gs, j);
		uint64_t e = (uint64_t)json_integer_value(json_array_get(t, 3));
		uint64_t c = (uint64_t)json_integer_value(json_array_get(t, 6));
		struct ctl_pgroup n = {
			.entered = e,
			.gap = e - c > UINT32_MAX ? UINT32_MAX : (uint32_t)(e - c),
			.id = (int32_t)json_integer_value(json_array_get(t, 1)),
			.peer = (int32_t)json_integer_value(json_array_get(t, 5)),
			.kind = (uint8_t)json_integer_value(json_array_get(t, 0)),
			.op = (uint8_t)json_integer_value(json_array_get(t, 4)),
		};

		if (g[j].entered != n.entered || g[j].gap != n.gap || g[j].id != n.id ||
		    g[j].peer != n.peer || g[j].kind != n.kind || g[j].op != n.op) {
			g[j] = n;
			changed = 1;
		}
	}
	return changed;
}

int mr__ctl_progress_apply(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m,
			   const json_t *p, struct ctl_res *res)
{
	int32_t np = job->spec.nproc_per_node, lo = m->node_rank * np;
	size_t nr = json_array_size(p);
	uint64_t seen[MAX_REPORT_RANKS / 64] = { 0 };
	struct ctl_jdiag *d;
	int changed = 0;

	if (m->state != CTL_M_RUNNING || job->state != CTL_JOB_RUNNING || m->node_rank < 0)
		return 0; /* a report from before the round: nothing to compare */
	for (size_t i = 0; i < nr; i++) {
		int32_t rk = (int32_t)json_integer_value(json_object_get(json_array_get(p, i), "rank"));
		char field[48];

		snprintf(field, sizeof(field), "progress[%zu].rank", i);
		if (rk < lo || rk >= lo + np || np > MAX_REPORT_RANKS) {
			mr__res_err(res, 400, "invalid_field", field,
				    "rank %d is not one of node '%.200s''s ranks %d..%d", rk,
				    m->node_id, lo, lo + np - 1);
			return MR_EINVAL;
		}
		if (seen[(rk - lo) / 64] & (1ull << ((rk - lo) % 64))) {
			mr__res_err(res, 400, "invalid_field", field, "rank %d is reported twice",
				    rk);
			return MR_EINVAL;
		}
		seen[(rk - lo) / 64] |= 1ull << ((rk - lo) % 64);
	}
	d = diag_of(job);
	if (!d)
		return 0; /* out of memory: progress is best effort */
	if (!same_shape(m->prog, p)) {
		struct ctl_mprog *mp = new_prog(p);

		if (!mp)
			return 0;
		mr__ctl_progress_drop(ctl, job, m);
		m->prog = mp;
		d->ranks += mp->nr;
		changed = 1;
	}
	for (size_t i = 0; i < nr; i++) {
		const json_t *o = json_array_get(p, i), *b = json_object_get(o, "busy_ms");
		const json_t *st = json_object_get(o, "step_ms");
		struct ctl_prank *r = &m->prog->r[i];

		if (update_rank(r, m->prog->g + r->goff, o)) {
			r->changed_ms = ctl->now_ms;
			changed = 1;
		}
		if (st)
			r->step_ms = (float)json_number_value(st);
		if (b)
			busy_report(ctl, job, m, r, json_number_value(b));
	}
	if (!changed)
		return 0;
	d->progress_ms = ctl->now_ms;
	if (d->stuck_ms) {
		mr_log_info("job_resumed", "job=%s gen=%llu stuck_s=%.1f", mr_log_q(job->name),
			    (unsigned long long)job->generation,
			    (double)(ctl->now_ms - d->stuck_ms) / 1e3);
		d->stuck_ms = 0;
		d->stuck_rank = -1;
		d->stuck_group[0] = '\0';
	}
	return 0;
}

/* ---- the job's side ---- */

void mr__ctl_diag_reset(struct ctl_job *job)
{
	struct ctl_jdiag *d = job->diag;

	if (!d)
		return;
	d->progress_ms = 0;
	d->stuck_ms = 0;
	d->stuck_rank = -1;
	d->stuck_group[0] = '\0';
	d->median_ms = 0.0f;
}

void mr__ctl_diag_free(struct ctl_job *job)
{
	free(job->diag);
	job->diag = NULL;
}

void mr__ctl_diag_tick(struct ctl *ctl, struct ctl_job *job)
{
	struct ctl_jdiag *d = job->diag;
	char msg[1024];
	json_t *j, *c;

	if (!d || job->state != CTL_JOB_RUNNING)
		return;
	if (d->hist_dirty && ctl->now_ms - d->median_at_ms >= MEDIAN_EVERY_MS)
		median(ctl, d);
	if (d->stuck_ms || !d->progress_ms || job->spec.hang_timeout_ms <= 0 ||
	    ctl->now_ms - d->progress_ms < job->spec.hang_timeout_ms)
		return;
	/* once per hang: O(ranks x groups), then nothing until progress */
	j = mr__ctl_diagnose(ctl, job, msg, sizeof(msg));
	d->stuck_ms = ctl->now_ms;
	c = json_array_get(json_object_get(j, "culprits"), 0);
	if (c) {
		d->stuck_rank = (int32_t)json_integer_value(json_object_get(c, "rank"));
		snprintf(d->stuck_group, sizeof(d->stuck_group), "%s",
			 json_string_value(json_object_get(c, "group"))
				 ? json_string_value(json_object_get(c, "group"))
				 : "");
	}
	ctl->stats.hangs++;
	mr_log_warn("job_stuck", "job=%s gen=%llu stalled_s=%.1f rank=%d group=%s msg=%s",
		    mr_log_q(job->name), (unsigned long long)job->generation,
		    (double)(ctl->now_ms - d->progress_ms) / 1e3, d->stuck_rank,
		    mr_log_q(d->stuck_group), mr_log_q(j ? msg : "out of memory"));
	json_decref(j);
}

json_t *mr__ctl_health_json(const struct ctl *ctl, const struct ctl_job *job)
{
	const struct ctl_jdiag *d = job->diag;
	json_t *o, *s;

	if (!d || job->state != CTL_JOB_RUNNING)
		return NULL;
	s = json_array();
	for (uint32_t i = 0; i < d->nlisted; i++)
		json_array_append_new(s, json_pack("{si ss sf sf}", "rank", d->strag[i].rank, "node",
						   d->strag[i].m->node_id, "busy_ms",
						   (double)d->strag[i].busy_ms, "median_ms",
						   (double)d->strag[i].median_ms));
	o = json_pack("{sb si sf si so}", "stuck", d->stuck_ms != 0, "ranks_reporting",
		      (int)d->ranks, "median_busy_ms", (double)d->median_ms, "stragglers_total",
		      (int)d->nstragglers, "stragglers", s);
	if (o && d->progress_ms)
		json_object_set_new(o, "stalled_s",
				    json_real((double)(ctl->now_ms - d->progress_ms) / 1e3));
	if (o && d->stuck_ms && d->stuck_rank >= 0) {
		json_object_set_new(o, "stuck_rank", json_integer(d->stuck_rank));
		json_object_set_new(o, "stuck_group", json_string(d->stuck_group));
	}
	return o;
}
