/*
 * plan_search.c - evaluating a mesh (the worst stage's memory, the step)
 * and the search over every mesh the inputs allow: enumerate, check
 * (plan_rules.c), evaluate, rank; and, when nothing fits, what limits the
 * closest plan.
 *
 * Enumeration: tp over the divisors of the heads up to a node; cp over the
 * divisors of seq_len / 2 up to 64; pp from 1 to the layers, where
 * tp*cp*pp divides the GPUs; ep over the divisors of the experts that
 * divide dp*cp; the micro-batch over the powers of two (and the fixed one)
 * dividing the batch per replica; ZeRO 0-3, sp on and off, the four
 * schedules (interleaved with 2 chunks), recomputation and offload (for
 * meshrun in a second pass, when nothing fits without: run_choice) -
 * each unless fixed. meshrun runs ZeRO-2/3 as ZeRO-1 under a pipeline, so those are
 * not enumerated twice. The split of the layers is computed once per (pp,
 * v) and shared.
 *
 * Non-goals: pruning by bounds (every candidate is evaluated: the 1T
 * model's 190,000 candidates on 3,072 GPUs take a few seconds).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_int.h"

static int eval_split(const struct mr_plan_input *in, const struct mr_plan_mesh *mesh,
		      const int *split, struct mr_plan *out, struct mr_errbuf *eb)
{
	double avail = in->cluster.mem_bytes - in->cluster.reserve_bytes;
	int rc;

	memset(out, 0, sizeof(*out));
	out->mesh = *mesh;
	out->mem.total = -1;
	for (int s = 0; s < mesh->pp; s++) {
		struct mr_plan_mem mm;
		if ((rc = mr__plan_mem(in, mesh, split, s, &mm, eb)) < 0)
			return rc;
		if (mm.total > out->mem.total)
			out->mem = mm;
	}
	if ((rc = mr__plan_time(in, mesh, split, &out->time, eb)) < 0)
		return rc;
	out->fits = out->mem.total <= avail;
	return 0;
}

int mr_plan_eval(const struct mr_plan_input *in, const struct mr_plan_mesh *mesh,
		 struct mr_plan *out, struct mr_errbuf *eb)
{
	int *split, rc;

	if ((rc = mr__plan_split(in, mesh, &split, eb)) < 0)
		return rc;
	rc = eval_split(in, mesh, split, out, eb);
	free(split);
	return rc;
}

/* ---- search ----------------------------------------------------------------- */

struct split_cache {
	int pp, v;
	int *split;
};

struct search {
	const struct mr_plan_input *in;
	struct mr_plan_result *res;
	struct split_cache *sc;
	int nsc, capsc;
	struct mr_errbuf *eb;
	int wide;             /* the pass with recomputation and offload */
};

static int push(struct search *s, const struct mr_plan *p)
{
	struct mr_plan_result *r = s->res;

	if (r->n == r->cap) {
		int cap = r->cap ? 2 * r->cap : 256;
		struct mr_plan *g = realloc(r->plan, sizeof(*g) * (size_t)cap);
		if (!g)
			return mr_errf(s->eb, MR_ENOMEM, "out of memory");
		r->plan = g;
		r->cap = cap;
	}
	r->plan[r->n++] = *p;
	r->fitting += p->fits;
	return 0;
}

static int split_of(struct search *s, const struct mr_plan_mesh *m, const int **out)
{
	int rc;

	*out = NULL;
	if (m->pp == 1)
		return 0;
	for (int i = 0; i < s->nsc; i++)
		if (s->sc[i].pp == m->pp && s->sc[i].v == m->v) {
			*out = s->sc[i].split;
			return 0;
		}
	if (s->nsc == s->capsc) {
		int cap = s->capsc ? 2 * s->capsc : 16;
		struct split_cache *g = realloc(s->sc, sizeof(*g) * (size_t)cap);
		if (!g)
			return mr_errf(s->eb, MR_ENOMEM, "out of memory");
		s->sc = g;
		s->capsc = cap;
	}
	if ((rc = mr__plan_split(s->in, m, &s->sc[s->nsc].split, s->eb)) < 0)
		return rc;
	s->sc[s->nsc].pp = m->pp;
	s->sc[s->nsc].v = m->v;
	*out = s->sc[s->nsc++].split;
	return 0;
}

/* One candidate: checked, then evaluated. An invalid one is not an error. */
static int try_mesh(struct search *s, struct mr_plan_mesh m)
{
	struct mr_errbuf why = { { 0 }, { 0 } };
	struct mr_plan p;
	const int *split;
	int rc;

	s->res->considered++;
	if (mr_plan_mesh_check(s->in, &m, &why) < 0) {
		if (!s->res->refused[0] || s->res->n == 0)
			snprintf(s->res->refused, sizeof(s->res->refused), "%.250s", why.msg);
		return 0;
	}
	if ((rc = split_of(s, &m, &split)) < 0)
		return rc;
	if ((rc = eval_split(s->in, &m, split, &p, s->eb)) < 0)
		return rc;
	return push(s, &p);
}

static int pick(int fixed, int v)
{
	return fixed <= 0 || fixed == v;
}

/* Micro-batch sizes to try for `per` sequences per replica: the fixed
 * one, else the powers of two that divide it. */
static int batches(int per, int fixed, int *out)
{
	int n = 0;

	if (fixed > 0) {
		out[0] = fixed;
		return 1;
	}
	for (int b = 1; b <= per && n < 30; b *= 2)
		if (per % b == 0)
			out[n++] = b;
	return n;
}

/* Recomputation and offload trade step time for memory. Megatron's
 * recompute is searched with the rest (its papers' setting), offload not
 * (a rule refuses it). meshrun's search is lean: the first pass tries
 * neither unless the inputs fix them, and only when nothing fits does a
 * second (wide) pass try the candidates that use a free one - offload
 * only on GPUs (on cpu ranks it changes nothing). */
static int run_choice(const struct search *s, int r, int off)
{
	const struct mr_plan_input *in = s->in;
	const struct mr_plan_mesh *f = &in->fix;
	int free_r = f->recompute < 0, free_o = f->offload < 0;

	if ((!free_r && r != f->recompute) || (!free_o && off != f->offload))
		return 0;
	if (free_o && off && (in->cluster.cpu || in->impl == MR_PLAN_MEGATRON))
		return 0;
	if (in->impl == MR_PLAN_MEGATRON)
		return 1;
	return s->wide == ((free_r && r) || (free_o && off));
}

/* The pipeline and run-time choices of a mesh whose sizes are set; the
 * micro-batching and the schedule outermost, so the candidates that share
 * a schedule's walk (plan_stage.c) come one after another. */
static int choose_run(struct search *s, struct mr_plan_mesh m)
{
	const struct mr_plan_input *in = s->in;
	const struct mr_plan_mesh *f = &in->fix;
	int bs[32], nb = batches(in->global_batch / m.dp, f->micro_batch, bs), rc;
	int kinds = m.pp > 1 ? MR_PP__KIND_COUNT : 1;

	for (int i = 0; i < nb; i++)
		for (int k = 0; k < kinds; k++) {
			if (m.pp > 1 && f->schedule >= 0 && k != f->schedule)
				continue;
			for (int zero = 0; zero <= 3; zero++) {
				if (f->zero >= 0 ? zero != f->zero
						 : in->impl == MR_PLAN_MESHRUN && m.pp > 1 && zero > 1)
					continue;
				for (int sp = 0; sp <= (m.tp > 1 ? 1 : 0); sp++) {
					if (f->sp >= 0 && sp != f->sp)
						continue;
					for (int r = 0; r < MR_PLAN__RCS * MR_PLAN__OFFS; r++) {
						if (!run_choice(s, r % MR_PLAN__RCS, r / MR_PLAN__RCS))
							continue;
						m.zero = zero;
						m.sp = sp;
						m.recompute = r % MR_PLAN__RCS;
						m.offload = r / MR_PLAN__RCS;
						m.micro_batch = bs[i];
						m.schedule = m.pp > 1 ? k : MR_PP_1F1B;
						m.v = f->v > 0 ? f->v : 0;
						if ((rc = try_mesh(s, m)) < 0)
							return rc;
					}
				}
			}
		}
	return 0;
}

/* Every tp, cp, pp, ep within the rules and the inputs' constraints. */
static int search_meshes(struct search *s)
{
	const struct mr_plan_input *in = s->in;
	const struct mr_plan_model *md = &in->model;
	const struct mr_plan_mesh *f = &in->fix;
	struct mr_plan_result *res = s->res;
	int world = in->cluster.gpus, rc = 0;

	for (int tp = 1; tp <= md->n_head && rc == 0; tp++) {
		if (md->n_head % tp || world % tp || !pick(f->tp, tp) ||
		    tp > in->cluster.gpus_per_node)
			continue;
		for (int cp = 1; cp <= 64 && rc == 0; cp++) {
			if ((cp > 1 && md->seq_len % (2 * cp)) || world % (tp * cp) || !pick(f->cp, cp))
				continue;
			for (int pp = 1; pp <= md->n_layer && rc == 0; pp++) {
				struct mr_plan_mesh m = *f;
				if (world % (tp * cp * pp) || !pick(f->pp, pp))
					continue;
				m.tp = tp;
				m.cp = cp;
				m.pp = pp;
				m.dp = world / (tp * cp * pp);
				if (!pick(f->dp, m.dp))
					continue;
				if (in->global_batch % m.dp) {
					if (!res->refused[0])
						snprintf(res->refused, sizeof(res->refused),
							 "dp %d (tp %d, cp %d, pp %d) does not divide "
							 "the global batch %d", m.dp, tp, cp, pp,
							 in->global_batch);
					continue;
				}
				for (int ep = 1; ep <= (md->moe_every ? md->n_experts : 1) && rc == 0;
				     ep++) {
					if ((md->moe_every && md->n_experts % ep) || !pick(f->ep, ep) ||
					    (m.dp * cp) % ep)
						continue;
					m.ep = ep;
					rc = choose_run(s, m);
				}
			}
		}
	}
	return rc;
}

static int by_plan(const void *a, const void *b)
{
	const struct mr_plan *x = a, *y = b;

	if (x->fits != y->fits)
		return y->fits - x->fits;
	if (x->fits && x->time.step_s != y->time.step_s)
		return x->time.step_s < y->time.step_s ? -1 : 1;
	if (x->mem.total != y->mem.total)
		return x->mem.total < y->mem.total ? -1 : 1;
	return x->time.step_s < y->time.step_s ? -1 : x->time.step_s > y->time.step_s;
}

int mr_plan_search(const struct mr_plan_input *in, struct mr_plan_result *res,
		   struct mr_errbuf *eb)
{
	const struct mr_plan_model *md = &in->model;
	const struct mr_plan_mesh *f = &in->fix;
	struct search s = { in, res, NULL, 0, 0, eb, 0 };
	int world = in->cluster.gpus, rc = 0;

	memset(res, 0, sizeof(*res));
	if ((rc = mr_plan_check(in, eb)) < 0)
		return rc;
	if (f->tp > 0 && (md->n_head % f->tp || f->tp > in->cluster.gpus_per_node))
		snprintf(res->refused, sizeof(res->refused),
			 "tp %d must divide the %d heads and fit a node of %d GPUs", f->tp,
			 md->n_head, in->cluster.gpus_per_node);
	rc = search_meshes(&s);
	/* meshrun: recomputation and offload when nothing fits without */
	if (rc == 0 && !res->fitting && in->impl == MR_PLAN_MESHRUN &&
	    (f->recompute < 0 || (f->offload < 0 && !in->cluster.cpu))) {
		s.wide = 1;
		rc = search_meshes(&s);
	}
	for (int i = 0; i < s.nsc; i++)
		free(s.sc[i].split);
	free(s.sc);
	if (rc < 0) {
		mr_plan_result_release(res);
		return rc;
	}
	if (res->n == 0 && !res->refused[0])
		snprintf(res->refused, sizeof(res->refused),
			 "no tp x cp x pp divides %d GPUs within the rules (tp divides the %d "
			 "heads and fits a node of %d, pp <= %d layers, 2 cp divides seq_len %d)",
			 world, md->n_head, in->cluster.gpus_per_node, md->n_layer, md->seq_len);
	if (res->n > 1)
		qsort(res->plan, (size_t)res->n, sizeof(*res->plan), by_plan);
	return 0;
}

void mr_plan_result_release(struct mr_plan_result *res)
{
	free(res->plan);
	res->plan = NULL;
	res->n = res->cap = 0;
}

/* ---- what limits a plan -------------------------------------------------------- */

/* What the inputs fixed may be raised (or lowered) to save memory: the
 * search already tried every free choice, so only a fixed one, a bigger
 * cluster or bigger GPUs can help. */
void mr_plan_limit(const struct mr_plan_input *in, const struct mr_plan *p, char *buf,
		   size_t cap)
{
	const struct mr_plan_mesh *m = &p->mesh, *f = &in->fix;
	const struct mr_plan_cluster *c = &in->cluster;
	double avail = c->mem_bytes - c->reserve_bytes;
	double states = p->mem.bytes[MR_MEM_PARAMS] + p->mem.bytes[MR_MEM_GRADS] +
			p->mem.bytes[MR_MEM_OPTIM];
	double acts = p->mem.bytes[MR_MEM_ACTS];
	int tp_max = c->gpus_per_node < in->model.n_head ? c->gpus_per_node : in->model.n_head;
	int zero_ok = !(in->impl == MR_PLAN_MESHRUN && (m->pp > 1 || m->ep > 1));
	char hint[200] = "";
	size_t n = 0;

#define HINT(...) (n += (size_t)snprintf(hint + n, n < sizeof(hint) ? sizeof(hint) - n : 0, \
					 __VA_ARGS__))
	if (p->fits) {
		snprintf(buf, cap, "fits: %.1f GB per GPU of %.1f", p->mem.total / 1e9, avail / 1e9);
		return;
	}
	/* phrases joined by " or ", "raise" said once: "raise pp or the ZeRO stage" */
#define RAISE(what) HINT("%s%s", n ? " or " : "raise ", what)
	if (states >= acts) {
		if (f->pp > 0 && m->pp < in->model.n_layer)
			RAISE("pp");
		if (f->zero >= 0 && m->zero < 3 && zero_ok)
			RAISE("the ZeRO stage");
		if (f->tp > 0 && m->tp < tp_max)
			RAISE("tp");
		if (f->offload >= 0 && m->offload != MR_PLAN_OFF_MASTER && !c->cpu &&
		    in->impl == MR_PLAN_MESHRUN && in->prec != MR_PLAN_FP32)
			HINT("%soffload the optimizer state", n ? " or " : "");
	} else {
		if (f->tp > 0 && m->tp < tp_max)
			RAISE("tp");
		if (f->cp > 0 && in->model.seq_len % (4 * m->cp) == 0)
			RAISE("cp");
		if (f->pp > 0 && m->pp < in->model.n_layer)
			RAISE("pp");
		if (f->micro_batch > 1)
			HINT("%slower the micro-batch", n ? " or " : "");
		if (f->recompute >= 0 && (m->recompute != MR_PLAN_RC_FULL || m->recompute_layers))
			HINT("%srecompute activations", n ? " or " : "");
		if (f->sp == 0 && m->tp > 1)
			HINT("%sturn on sequence parallel", n ? " or " : "");
	}
#undef RAISE
	if (!n) /* every mesh was tried: the model states shrink with the GPUs */
		HINT("use more GPUs (about %d) or GPUs with more memory",
		     (int)ceil(c->gpus * p->mem.total / avail / c->gpus_per_node) *
			     c->gpus_per_node);
#undef HINT
	snprintf(buf, cap,
		 "needs %.1f GB per GPU, %.1f available (parameters %.1f, gradients %.1f, "
		 "optimizer %.1f, activations %.1f, workspace %.1f): %s",
		 p->mem.total / 1e9, avail / 1e9, p->mem.bytes[MR_MEM_PARAMS] / 1e9,
		 p->mem.bytes[MR_MEM_GRADS] / 1e9, p->mem.bytes[MR_MEM_OPTIM] / 1e9, acts / 1e9,
		 p->mem.bytes[MR_MEM_WORKSPACE] / 1e9, hint);
}

/* ---- a mesh as text ------------------------------------------------------------- */

int mr_plan_mesh_format(const struct mr_plan_mesh *m, char *buf, size_t cap)
{
	char run[64] = "", mem[96] = "";

	if (m->pp > 1)
		snprintf(run, sizeof(run), " %s%s", mr_pp_kind_name((enum mr_pp_kind)m->schedule),
			 m->v > 1 ? (m->v == 2 ? "/v2" : "/v4+") : "");
	if (m->recompute > 0 && m->recompute_layers > 0)
		snprintf(mem, sizeof(mem), " recompute=%s recompute_layers=%d",
			 mr_plan_rc_name(m->recompute), m->recompute_layers);
	else if (m->recompute > 0)
		snprintf(mem, sizeof(mem), " recompute=%s", mr_plan_rc_name(m->recompute));
	if (m->offload > 0)
		snprintf(mem + strlen(mem), sizeof(mem) - strlen(mem), " offload=%s",
			 mr_plan_offload_name(m->offload));
	return snprintf(buf, cap, "tp=%d cp=%d pp=%d dp=%d ep=%d%s zero=%d mb=%dx%d%s%s%s",
			m->tp, m->cp, m->pp, m->dp, m->ep, m->sp ? " sp" : "", m->zero,
			m->micro_batch, m->micro_batches, run, mem,
			m->hsdp_shard > 0 ? " hsdp" : "");
}

int mr_plan_mesh_parse(const char *text, struct mr_plan_mesh *out, struct mr_errbuf *eb)
{
	char buf[256], *save = NULL, *tok;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	out->sp = out->zero = out->schedule = out->recompute = out->offload = -1;
	if (!text || strlen(text) >= sizeof(buf))
		return mr_errf_field(eb, MR_EINVAL, "mesh", "mesh: '%s' is empty or too long",
				     text ? text : "");
	snprintf(buf, sizeof(buf), "%s", text);
	for (tok = strtok_r(buf, ", ", &save); tok && rc == 0; tok = strtok_r(NULL, ", ", &save)) {
		char *eq = strchr(tok, '='), *end;
		long v;
		int *dst = NULL;
		if (!eq)
			return mr_errf_field(eb, MR_EINVAL, "mesh",
					     "mesh: '%s' is not key=value (e.g. tp=8,pp=16,dp=12)",
					     tok);
		*eq++ = '\0';
		if (!strcmp(tok, "schedule")) {
			enum mr_pp_kind k;
			if ((rc = mr_pp_kind_parse(eq, &k, eb)) == 0)
				out->schedule = (int)k;
			continue;
		}
		if (!strcmp(tok, "recompute")) {
			rc = mr_plan_name_parse("recompute", eq, &out->recompute, eb);
			continue;
		}
		if (!strcmp(tok, "offload")) {
			rc = mr_plan_name_parse("offload", eq, &out->offload, eb);
			continue;
		}
		if (!strcmp(tok, "cp_algo")) {
			rc = mr_plan_cp_algo_parse(eq, &out->cp_algo, eb);
			continue;
		}
		dst = !strcmp(tok, "tp")		   ? &out->tp
		      : !strcmp(tok, "cp")		   ? &out->cp
		      : !strcmp(tok, "pp")		   ? &out->pp
		      : !strcmp(tok, "dp")		   ? &out->dp
		      : !strcmp(tok, "ep")		   ? &out->ep
		      : !strcmp(tok, "sp")		   ? &out->sp
		      : !strcmp(tok, "zero")		   ? &out->zero
		      : !strcmp(tok, "hsdp")		   ? &out->hsdp_shard
		      : !strcmp(tok, "mb")		   ? &out->micro_batch
		      : !strcmp(tok, "v")		   ? &out->v
		      : !strcmp(tok, "recompute_layers") ? &out->recompute_layers
							   : NULL;
		if (!dst)
			return mr_errf_field(eb, MR_EINVAL, "mesh",
					     "mesh: unknown key '%s' (tp, cp, pp, dp, ep, sp, zero, "
					     "hsdp, mb, v, schedule, recompute, recompute_layers, offload, "
					     "cp_algo)",
					     tok);
		v = strtol(eq, &end, 10);
		if (!*eq || *end || v < 0 || v > (1 << 20))
			return mr_errf_field(eb, MR_EINVAL, tok, "mesh: %s: '%s' is not a count", tok,
					     eq);
		*dst = (int)v;
	}
	return rc;
}
