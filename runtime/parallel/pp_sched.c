/*
 * pp_sched.c - the pipeline schedules' action lists, the transfers they
 * imply, and the simulator (see mr_pp_sched.h for the definitions).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/mr_pp_sched.h"

static const char *const kind_names[MR_PP__KIND_COUNT] = { "gpipe", "1f1b", "interleaved",
							   "zb-h1" };

const char *mr_pp_kind_name(enum mr_pp_kind k)
{
	return k >= 0 && k < MR_PP__KIND_COUNT ? kind_names[k] : "?";
}

int mr_pp_kind_parse(const char *name, enum mr_pp_kind *out, struct mr_errbuf *eb)
{
	for (int k = 0; name && k < MR_PP__KIND_COUNT; k++) {
		if (!strcmp(name, kind_names[k])) {
			*out = (enum mr_pp_kind)k;
			return 0;
		}
	}
	return mr_errf_field(eb, MR_EINVAL, "pp_schedule",
			     "'pp_schedule' must be one of \"gpipe\", \"1f1b\", \"interleaved\", "
			     "\"zb-h1\", got \"%s\"",
			     name ? name : "(null)");
}

int mr_pp_check(const struct mr_pp_spec *sp, struct mr_errbuf *eb)
{
	const char *kn = mr_pp_kind_name(sp->kind);

	if (sp->kind < 0 || sp->kind >= MR_PP__KIND_COUNT)
		return mr_errf_field(eb, MR_EINVAL, "pp_schedule", "'pp_schedule' %d is no schedule",
				     (int)sp->kind);
	if (sp->p < 1 || sp->p > MR_PP_MAX_STAGES)
		return mr_errf_field(eb, MR_EINVAL, "pp", "'pp' must be in 1..%d, got %d",
				     MR_PP_MAX_STAGES, sp->p);
	if (sp->m < 1 || sp->m > MR_PP_MAX_MICRO)
		return mr_errf_field(eb, MR_EINVAL, "grad_accum",
				     "'grad_accum' (micro-batches) must be in 1..%d, got %d",
				     MR_PP_MAX_MICRO, sp->m);
	if (sp->kind != MR_PP_INTERLEAVED) {
		if (sp->v != 1)
			return mr_errf_field(eb, MR_EINVAL, "pp_virtual",
					     "'pp_virtual' must be 1 with pp_schedule \"%s\" "
					     "(only \"interleaved\" runs chunks), got %d",
					     kn, sp->v);
		return 0;
	}
	if (sp->v < 2 || sp->v > MR_PP_MAX_VIRTUAL)
		return mr_errf_field(eb, MR_EINVAL, "pp_virtual",
				     "'pp_virtual' must be in 2..%d with pp_schedule "
				     "\"interleaved\", got %d",
				     MR_PP_MAX_VIRTUAL, sp->v);
	if (sp->p < 2)
		return mr_errf_field(eb, MR_EINVAL, "pp_virtual",
				     "'pp_virtual' %d needs pp >= 2: interleaving chunks on one "
				     "stage has no bubble to shrink",
				     sp->v);
	if ((long)sp->p * sp->v > MR_PP_MAX_VSTAGES)
		return mr_errf_field(eb, MR_EINVAL, "pp_virtual",
				     "'pp_virtual' %d gives pp x pp_virtual = %ld virtual stages, "
				     "more than %d",
				     sp->v, (long)sp->p * sp->v, MR_PP_MAX_VSTAGES);
	if (sp->m % sp->p)
		return mr_errf_field(eb, MR_EINVAL, "grad_accum",
				     "'grad_accum' (micro-batches) must be a multiple of pp %d with "
				     "pp_schedule \"interleaved\", got %d",
				     sp->p, sp->m);
	return 0;
}

int mr_pp_len(const struct mr_pp_spec *sp, struct mr_errbuf *eb)
{
	int rc = mr_pp_check(sp, eb);

	if (rc < 0)
		return rc;
	return sp->kind == MR_PP_ZBH1 ? 3 * sp->m : 2 * sp->m * sp->v;
}

/* ---- the lists ------------------------------------------------------- */

static void put(struct mr_pp_action *out, int *n, enum mr_pp_op op, int mb, int chunk)
{
	out[*n] = (struct mr_pp_action){ .op = op, .mb = mb, .chunk = chunk };
	(*n)++;
}

static int min_int(int a, int b)
{
	return a < b ? a : b;
}

static int gpipe(const struct mr_pp_spec *sp, struct mr_pp_action *out)
{
	int n = 0;

	for (int i = 0; i < sp->m; i++)
		put(out, &n, MR_PP_F, i, 0);
	for (int i = 0; i < sp->m; i++)
		put(out, &n, MR_PP_B, i, 0);
	return n;
}

/* A backward; with split (zb-h1) also the W it releases: W of micro-batch
 * mb - s right after the B of mb (B's come in micro-batch order). */
static void put_b(struct mr_pp_action *out, int *n, int mb, int s, int split)
{
	put(out, n, MR_PP_B, mb, 0);
	if (split && mb >= s)
		put(out, n, MR_PP_W, mb - s, 0);
}

/* Megatron-Core's forward_backward_pipelining_without_interleaving; with
 * split, ZB-H1: the same F/B order, stage s deferring its W's by s
 * micro-batches, the last s W's (those with no later B) at the end. */
static int one_f_one_b(const struct mr_pp_spec *sp, int s, int split, struct mr_pp_action *out)
{
	int warm = min_int(sp->p - s - 1, sp->m), n = 0;

	for (int i = 0; i < warm; i++)
		put(out, &n, MR_PP_F, i, 0);
	for (int i = 0; i < sp->m - warm; i++) {
		put(out, &n, MR_PP_F, warm + i, 0);
		put_b(out, &n, i, s, split);
	}
	for (int i = sp->m - warm; i < sp->m; i++)
		put_b(out, &n, i, s, split);
	for (int j = sp->m - s > 0 ? sp->m - s : 0; split && j < sp->m; j++)
		put(out, &n, MR_PP_W, j, 0);
	return n;
}

/* Megatron-Core's forward_backward_pipelining_with_interleaving, with
 * microbatch_group_size_per_vp_stage = p. */
static void interleaved_pass(const struct mr_pp_spec *sp, int k, int forward, int *mb, int *chunk)
{
	int group = sp->p * sp->v, c = (k % group) / sp->p;

	*chunk = forward ? c : sp->v - 1 - c;
	*mb = (k / group) * sp->p + k % sp->p;
}

static int interleaved(const struct mr_pp_spec *sp, int s, struct mr_pp_action *out)
{
	int total = sp->m * sp->v, n = 0, mb, c;
	int warm = min_int(2 * (sp->p - s - 1) + (sp->v - 1) * sp->p, total);

	for (int k = 0; k < warm; k++) {
		interleaved_pass(sp, k, 1, &mb, &c);
		put(out, &n, MR_PP_F, mb, c);
	}
	for (int k = 0; k < total - warm; k++) {
		interleaved_pass(sp, k + warm, 1, &mb, &c);
		put(out, &n, MR_PP_F, mb, c);
		interleaved_pass(sp, k, 0, &mb, &c);
		put(out, &n, MR_PP_B, mb, c);
	}
	for (int k = total - warm; k < total; k++) {
		interleaved_pass(sp, k, 0, &mb, &c);
		put(out, &n, MR_PP_B, mb, c);
	}
	return n;
}

int mr_pp_actions(const struct mr_pp_spec *sp, int stage, struct mr_pp_action *out, int cap,
		  struct mr_errbuf *eb)
{
	int len = mr_pp_len(sp, eb);

	if (len < 0)
		return len;
	if (stage < 0 || stage >= sp->p)
		return mr_errf(eb, MR_EINVAL, "pipeline stage %d is not in 0..%d", stage,
			       sp->p - 1);
	if (cap < len)
		return mr_errf(eb, MR_ERANGE, "pipeline schedule \"%s\" needs %d actions, room for %d",
			       mr_pp_kind_name(sp->kind), len, cap);
	switch (sp->kind) {
	case MR_PP_GPIPE:
		return gpipe(sp, out);
	case MR_PP_1F1B:
		return one_f_one_b(sp, stage, 0, out);
	case MR_PP_INTERLEAVED:
		return interleaved(sp, stage, out);
	case MR_PP_ZBH1:
		return one_f_one_b(sp, stage, 1, out);
	default:
		return MR_EINVAL; /* mr_pp_check refused it */
	}
}

/* ---- transfers ------------------------------------------------------- */

int mr_pp_comms_bound(const struct mr_pp_spec *sp, struct mr_errbuf *eb)
{
	int len = mr_pp_len(sp, eb);

	return len < 0 ? len : 2 * len;
}

static int tag(const struct mr_pp_spec *sp, enum mr_pp_msg what, int mb, int k_dst)
{
	return (mb * sp->p * sp->v + k_dst) * 2 + (int)what;
}

int mr_pp_comms(const struct mr_pp_spec *sp, int stage, const struct mr_pp_action *acts,
		int n, struct mr_pp_comm *out, int cap, struct mr_errbuf *eb)
{
	int rc = mr_pp_check(sp, eb), q = sp->p * sp->v, cnt = 0;

	if (rc < 0)
		return rc;
	if (stage < 0 || stage >= sp->p)
		return mr_errf(eb, MR_EINVAL, "pipeline stage %d is not in 0..%d", stage,
			       sp->p - 1);
	for (int i = 0; i < n; i++) {
		const struct mr_pp_action *a = &acts[i];
		int k = a->chunk * sp->p + stage, recv_from = -1, send_to = -1;
		enum mr_pp_msg what = a->op == MR_PP_F ? MR_PP_ACT : MR_PP_GRAD;

		if (a->mb < 0 || a->mb >= sp->m || a->chunk < 0 || a->chunk >= sp->v ||
		    a->op < MR_PP_F || a->op > MR_PP_W)
			return mr_errf(eb, MR_EINVAL,
				       "pipeline action %d of stage %d is out of range (op %d, "
				       "micro-batch %d, chunk %d)",
				       i, stage, (int)a->op, a->mb, a->chunk);
		if (a->op == MR_PP_F) {
			recv_from = k > 0 ? k - 1 : -1;
			send_to = k < q - 1 ? k + 1 : -1;
		} else if (a->op == MR_PP_B) {
			recv_from = k < q - 1 ? k + 1 : -1;
			send_to = k > 0 ? k - 1 : -1;
		}
		for (int send = 0; send < 2; send++) {
			int other = send ? send_to : recv_from;

			if (other < 0)
				continue;
			if (cnt == cap)
				return mr_errf(eb, MR_ERANGE,
					       "pipeline transfers of stage %d need more than %d "
					       "entries",
					       stage, cap);
			out[cnt++] = (struct mr_pp_comm){
				.send = send,
				.what = what,
				.peer = other % sp->p,
				.mb = a->mb,
				.chunk = a->chunk,
				.action = i,
				.tag = tag(sp, what, a->mb, send ? other : k),
			};
		}
	}
	return cnt;
}

/* ---- simulation ------------------------------------------------------ */

static const char op_char[] = { 'F', 'B', 'W' };

/* What a simulation keeps per (op, virtual stage, micro-batch): the end
 * time, NAN until done. */
struct simstate {
	int p, v, m, q;
	double *end; /* (3, q, m) */
};

static double *end_at(const struct simstate *st, enum mr_pp_op op, int k, int mb)
{
	return &st->end[((size_t)op * st->q + k) * st->m + mb];
}

/* Checks list s: every (F, B) of each (mb, chunk) once, W for all or none.
 * Sets *split when the list has W. */
static int check_list(int s, int v, int m, const struct mr_pp_action *a, int n, int *split,
		      unsigned char *seen, struct mr_errbuf *eb)
{
	int nw = 0, want;

	memset(seen, 0, (size_t)3 * v * m);
	for (int i = 0; i < n; i++) {
		if (a[i].op < MR_PP_F || a[i].op > MR_PP_W || a[i].mb < 0 || a[i].mb >= m ||
		    a[i].chunk < 0 || a[i].chunk >= v)
			return mr_errf(eb, MR_EINVAL,
				       "stage %d: action %d is out of range (op %d, micro-batch "
				       "%d, chunk %d)",
				       s, i, (int)a[i].op, a[i].mb, a[i].chunk);
		if (seen[((size_t)a[i].op * v + a[i].chunk) * m + a[i].mb]++)
			return mr_errf(eb, MR_EINVAL,
				       "stage %d: action %d %c(micro-batch %d, chunk %d) runs twice",
				       s, i, op_char[a[i].op], a[i].mb, a[i].chunk);
		nw += a[i].op == MR_PP_W;
	}
	*split = nw > 0;
	want = (*split ? 3 : 2) * v * m;
	if (n == want)
		return 0;
	for (int op = 0; op < (*split ? 3 : 2); op++)
		for (int c = 0; c < v; c++)
			for (int mb = 0; mb < m; mb++)
				if (!seen[((size_t)op * v + c) * m + mb])
					return mr_errf(eb, MR_EINVAL,
						       "stage %d: %c(micro-batch %d, chunk %d) is "
						       "missing",
						       s, op_char[op], mb, c);
	return mr_errf(eb, MR_EINVAL, "stage %d: %d actions, expected %d", s, n, want);
}

/* 1 when every dependency of action a on virtual stage k is done, *ready
 * then the latest one's end; 0 when one is not, *dep_op and *dep_k then
 * naming it. */
static int deps_met(const struct simstate *st, const struct mr_pp_action *a, int k,
		    double *ready, enum mr_pp_op *dep_op, int *dep_k)
{
	enum mr_pp_op dop[2];
	int dk[2], nd = 0;

	if (a->op == MR_PP_F && k > 0) {
		dop[nd] = MR_PP_F;
		dk[nd++] = k - 1;
	} else if (a->op == MR_PP_B) {
		dop[nd] = MR_PP_F;
		dk[nd++] = k;
		if (k < st->q - 1) {
			dop[nd] = MR_PP_B;
			dk[nd++] = k + 1;
		}
	} else if (a->op == MR_PP_W) {
		dop[nd] = MR_PP_B;
		dk[nd++] = k;
	}
	*ready = 0.0;
	for (int d = 0; d < nd; d++) {
		double t = *end_at(st, dop[d], dk[d], a->mb);

		if (isnan(t)) {
			*dep_op = dop[d];
			*dep_k = dk[d];
			return 0;
		}
		if (t > *ready)
			*ready = t;
	}
	return 1;
}

static double cost_of(const struct mr_pp_cost *c, enum mr_pp_op op, int split)
{
	return op == MR_PP_F ? c->f : op == MR_PP_W ? c->w : split ? c->b : c->b + c->w;
}

/* Peak (mb, chunk) activations alive on one list: from F until B
 * (*peak) and until the last pass that reads them (*peak_w). */
static void peaks(const struct mr_pp_action *a, int n, int split, int *peak, int *peak_w)
{
	int alive = 0, alive_w = 0;

	*peak = *peak_w = 0;
	for (int i = 0; i < n; i++) {
		if (a[i].op == MR_PP_F) {
			alive++;
			alive_w++;
		} else if (a[i].op == MR_PP_B) {
			alive--;
			alive_w -= !split;
		} else {
			alive_w--;
		}
		if (alive > *peak)
			*peak = alive;
		if (alive_w > *peak_w)
			*peak_w = alive_w;
	}
}

static int check_costs(const struct mr_pp_cost *c, struct mr_errbuf *eb)
{
	if (!(isfinite(c->f) && isfinite(c->b) && isfinite(c->w) && c->f >= 0 && c->b >= 0 &&
	      c->w >= 0))
		return mr_errf(eb, MR_EINVAL,
			       "pipeline costs must be finite and >= 0, got F %g B %g W %g", c->f,
			       c->b, c->w);
	return 0;
}

/* Runs every list to the end or reports the deadlock. */
static int run_lists(struct simstate *st, const struct mr_pp_action *const *lists, const int *n,
		     const struct mr_pp_cost *c, int split, int *pos, double *t_free, double *start,
		     int stride, struct mr_errbuf *eb)
{
	long left = 0;

	for (int s = 0; s < st->p; s++)
		left += n[s];
	while (left > 0) {
		int moved = 0;

		for (int s = 0; s < st->p; s++) {
			while (pos[s] < n[s]) {
				const struct mr_pp_action *a = &lists[s][pos[s]];
				int k = a->chunk * st->p + s, dk;
				enum mr_pp_op dop;
				double ready;

				if (!deps_met(st, a, k, &ready, &dop, &dk))
					break;
				if (ready < t_free[s])
					ready = t_free[s];
				if (start)
					start[(size_t)s * stride + pos[s]] = ready;
				t_free[s] = ready + cost_of(c, a->op, split);
				*end_at(st, a->op, k, a->mb) = t_free[s];
				pos[s]++;
				left--;
				moved = 1;
			}
		}
		if (moved)
			continue;
		for (int s = 0; s < st->p; s++) {
			const struct mr_pp_action *a;
			int k, dk = 0;
			enum mr_pp_op dop = MR_PP_F;
			double ready;

			if (pos[s] == n[s])
				continue;
			a = &lists[s][pos[s]];
			k = a->chunk * st->p + s;
			deps_met(st, a, k, &ready, &dop, &dk);
			return mr_errf(eb, MR_ESTATE,
				       "pipeline schedule deadlocks: stage %d's action %d "
				       "%c(micro-batch %d, chunk %d) waits for %c(micro-batch %d) "
				       "on virtual stage %d (stage %d), which can never run",
				       s, pos[s], op_char[a->op], a->mb, a->chunk, op_char[dop],
				       a->mb, dk, dk % st->p);
		}
	}
	return 0;
}

int mr_pp_simulate_lists(int p, int v, int m, const struct mr_pp_action *const *lists,
			 const int *n, const struct mr_pp_cost *c, struct mr_pp_sim *out,
			 struct mr_errbuf *eb)
{
	struct simstate st = { .p = p, .v = v, .m = m };
	unsigned char *seen = NULL;
	int *pos = NULL, split = -1, stride = 0, rc;
	double *t_free = NULL;

	if (p < 1 || p > MR_PP_MAX_STAGES || v < 1 || v > MR_PP_MAX_VIRTUAL || m < 1 ||
	    m > MR_PP_MAX_MICRO)
		return mr_errf(eb, MR_EINVAL,
			       "pipeline simulation needs 1 <= p <= %d, 1 <= v <= %d, "
			       "1 <= m <= %d, got p %d v %d m %d",
			       MR_PP_MAX_STAGES, MR_PP_MAX_VIRTUAL, MR_PP_MAX_MICRO, p, v, m);
	if ((rc = check_costs(c, eb)) < 0)
		return rc;
	st.q = p * v;
	seen = malloc((size_t)3 * v * m);
	pos = calloc((size_t)p, sizeof(*pos));
	t_free = calloc((size_t)p, sizeof(*t_free));
	st.end = malloc((size_t)3 * st.q * m * sizeof(*st.end));
	if (!seen || !pos || !t_free || !st.end) {
		rc = mr_errf(eb, MR_ENOMEM, "pipeline simulation: out of memory");
		goto out;
	}
	for (int s = 0; s < p; s++) {
		int sp_s = 0;

		if ((rc = check_list(s, v, m, lists[s], n[s], &sp_s, seen, eb)) < 0)
			goto out;
		if (split >= 0 && sp_s != split) {
			rc = mr_errf(eb, MR_EINVAL,
				     "stage %d %s W actions while stage 0 %s: every stage splits "
				     "the backward or none does",
				     s, sp_s ? "has" : "has no", split ? "has" : "has none");
			goto out;
		}
		split = sp_s;
		if (n[s] > stride)
			stride = n[s];
	}
	for (size_t i = 0; i < (size_t)3 * st.q * m; i++)
		st.end[i] = NAN;
	if ((rc = run_lists(&st, lists, n, c, split, pos, t_free, out->start, stride, eb)) < 0)
		goto out;
	out->makespan = 0.0;
	out->busy_total = 0.0;
	out->peak_max = 0;
	for (int s = 0; s < p; s++) {
		double busy = 0.0;
		int pk, pkw;

		for (int i = 0; i < n[s]; i++)
			busy += cost_of(c, lists[s][i].op, split);
		peaks(lists[s], n[s], split, &pk, &pkw);
		if (t_free[s] > out->makespan)
			out->makespan = t_free[s];
		out->busy_total += busy;
		if (pk > out->peak_max)
			out->peak_max = pk;
		if (out->busy)
			out->busy[s] = busy;
		if (out->peak)
			out->peak[s] = pk;
		if (out->peak_w)
			out->peak_w[s] = pkw;
	}
	out->bubble = out->busy_total > 0.0
			      ? (p * out->makespan - out->busy_total) / out->busy_total
			      : 0.0;
	rc = 0;
out:
	free(seen);
	free(pos);
	free(t_free);
	free(st.end);
	return rc;
}

int mr_pp_simulate(const struct mr_pp_spec *sp, const struct mr_pp_cost *c,
		   struct mr_pp_sim *out, struct mr_errbuf *eb)
{
	const struct mr_pp_action **lists = NULL;
	struct mr_pp_action *all = NULL;
	int *n = NULL, len = mr_pp_len(sp, eb), rc;

	if (len < 0)
		return len;
	lists = calloc((size_t)sp->p, sizeof(*lists));
	n = calloc((size_t)sp->p, sizeof(*n));
	all = malloc((size_t)sp->p * len * sizeof(*all));
	if (!lists || !n || !all) {
		rc = mr_errf(eb, MR_ENOMEM, "pipeline simulation: out of memory");
		goto out;
	}
	for (int s = 0; s < sp->p; s++) {
		struct mr_pp_action *l = all + (size_t)s * len;

		if ((rc = mr_pp_actions(sp, s, l, len, eb)) < 0)
			goto out;
		lists[s] = l;
		n[s] = rc;
	}
	rc = mr_pp_simulate_lists(sp->p, sp->v, sp->m, lists, n, c, out, eb);
out:
	free(lists);
	free(n);
	free(all);
	return rc;
}

/* ---- what a schedule keeps and costs --------------------------------------- */

int mr_pp_in_flight(const struct mr_pp_spec *sp, int stage, int *slots, int *pairs,
		    struct mr_errbuf *eb)
{
	struct mr_pp_spec w = *sp;
	struct mr_pp_action *a;
	int *first, *last, n, i, live = 0, lp = 0, rc;

	*slots = *pairs = 1;
	if ((rc = mr_pp_check(sp, eb)) < 0)
		return rc;
	if (stage < 0 || stage >= sp->p)
		return mr_errf(eb, MR_EINVAL, "stage %d of %d", stage, sp->p);
	if (sp->p == 1)
		return 0;
	if (sp->kind == MR_PP_GPIPE) { /* every forward before any backward */
		*slots = sp->m;
		*pairs = sp->m * sp->v;
		return 0;
	}
	if (sp->kind == MR_PP_1F1B) {
		*slots = *pairs = sp->p - stage < sp->m ? sp->p - stage : sp->m;
		return 0;
	}
	/* 2pv is a multiple of p (interleaved) and covers every warm-up: the
	 * counts of any longer step equal its (test_pp_sched.c checks them
	 * against whole lists) */
	if (w.m > 2 * w.p * w.v)
		w.m = 2 * w.p * w.v;
	if ((n = mr_pp_len(&w, eb)) < 0)
		return n;
	a = malloc(sizeof(*a) * (size_t)n);
	first = malloc(sizeof(int) * 2 * (size_t)w.m);
	if (!a || !first) {
		free(a);
		free(first);
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	}
	last = first + w.m;
	if ((n = mr_pp_actions(&w, stage, a, n, eb)) < 0)
		goto out;
	for (i = 0; i < w.m; i++)
		first[i] = last[i] = -1;
	for (i = 0; i < n; i++) {
		if (first[a[i].mb] < 0)
			first[a[i].mb] = i;
		last[a[i].mb] = i;
	}
	*slots = *pairs = 0;
	for (i = 0; i < n; i++) {
		if (first[a[i].mb] == i && ++live > *slots)
			*slots = live;
		if (a[i].op == MR_PP_F && ++lp > *pairs)
			*pairs = lp;
		if (a[i].op == MR_PP_B)
			lp--;
		if (last[a[i].mb] == i)
			live--;
	}
	n = 0;
out:
	free(a);
	free(first);
	return n;
}

double mr_pp_makespan(const struct mr_pp_spec *sp, double f, double b, double w)
{
	double m = sp->m, p = sp->p, step = f + b + w;

	if (sp->p == 1)
		return m * step;
	switch (sp->kind) {
	case MR_PP_INTERLEAVED:
		return m * step + (p - 1) * step / sp->v;
	case MR_PP_ZBH1:
		return m * step + (p - 1) * fmax(f + b - w, fmax(f, b));
	default: /* gpipe, 1f1b */
		return (m + p - 1) * step;
	}
}

double mr_pp_weight_share(enum mr_pp_kind kind)
{
	return kind == MR_PP_ZBH1 ? 0.5 : 0.0;
}
