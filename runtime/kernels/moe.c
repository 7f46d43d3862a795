/*
 * moe.c - mixture-of-experts MLP forward/backward (see mr_moe.h for every
 * routing choice). Non-goals: see the header.
 */
#include <math.h>
#include <string.h>

#include "kernels/mr_kernels.h"
#include "mr_err.h"
#include "mr_moe.h"

static size_t up16(size_t n)
{
	return (n + 15) & ~(size_t)15;
}

int mr_moe_capacity(int N, int E, int k, float capacity_factor)
{
	double c = ceil((double)capacity_factor * (double)N * (double)k / (double)E);

	if (c < 1.0)
		c = 1.0;
	if (c > (double)N)
		c = (double)N;
	return (int)c;
}

size_t mr_moe_act_floats(const struct mr_moe_shape *s)
{
	size_t ec = (size_t)s->E * (size_t)s->cap;

	return up16((size_t)s->N * s->E) + up16((size_t)s->N * s->k) +
	       up16(ec * s->C) * 2 + up16(ec * mr_moe_fc_cols(s)) + up16(ec * s->H);
}

size_t mr_moe_act_ints(const struct mr_moe_shape *s)
{
	return up16((size_t)s->N * s->k) * 2 + up16((size_t)s->E) * 2;
}

void mr_moe_acts_bind(struct mr_moe_acts *a, const struct mr_moe_shape *s, float *f, int *ip)
{
	size_t ec = (size_t)s->E * (size_t)s->cap;

	a->probs = f;
	f += up16((size_t)s->N * s->E);
	a->gate = f;
	f += up16((size_t)s->N * s->k);
	a->xin = f;
	f += up16(ec * s->C);
	a->yo = f;
	f += up16(ec * s->C);
	a->h = f;
	f += up16(ec * mr_moe_fc_cols(s));
	a->hg = f;
	a->topi = ip;
	ip += up16((size_t)s->N * s->k);
	a->slot = ip;
	ip += up16((size_t)s->N * s->k);
	a->count = ip;
	ip += up16((size_t)s->E);
	a->routed = ip;
	a->aux = 0.0f;
	a->dropped = 0;
	a->stat = NULL; /* the caller's, if any */
	a->stat_on_dev = 0;
}

size_t mr_moe_ws_floats(const struct mr_moe_shape *s)
{
	size_t ec = (size_t)s->E * (size_t)s->cap;

	return up16((size_t)s->N * s->E) + up16(ec * s->C) * 2 + up16(ec * mr_moe_fc_cols(s)) +
	       up16((size_t)s->N * s->k) + (s->swiglu ? up16(ec * s->H) : 0);
}

void mr_moe_ws_bind(struct mr_moe_ws *w, const struct mr_moe_shape *s, float *ws)
{
	size_t ec = (size_t)s->E * (size_t)s->cap;

	w->dprobs = ws;
	w->dyo = w->dprobs + up16((size_t)s->N * s->E);
	w->dxin = w->dyo + up16(ec * s->C);
	w->dh = w->dxin + up16(ec * s->C);
	w->dgate = w->dh + up16(ec * mr_moe_fc_cols(s));
	w->dhg = s->swiglu ? w->dgate + up16((size_t)s->N * s->k) : NULL;
}

static int xchg(const struct mr_moe_xchg *xg, enum mr_moe_phase ph, float *buf,
		const int *counts, const struct mr_moe_shape *s, size_t row)
{
	if (!xg || !xg->fn)
		return 0;
	return xg->fn(xg->ctx, ph, buf, counts, s->E, s->cap, row);
}

void mr_moe_route(const struct mr_moe_shape *s, struct mr_moe_acts *a)
{
	int N = s->N, E = s->E, k = s->k, n, e, j, norm = mr_moe_norm_topk(s);
	double aux = 0.0;

	for (e = 0; e < E; e++)
		a->count[e] = a->routed[e] = 0;
	a->dropped = 0;
	for (n = 0; n < N; n++) {
		float *p = a->probs + (size_t)n * E, mx = p[0], sum = 0.0f, gs = 0.0f;
		int *ti = a->topi + (size_t)n * k;
		for (e = 1; e < E; e++)
			if (p[e] > mx)
				mx = p[e];
		for (e = 0; e < E; e++) {
			p[e] = expf(p[e] - mx);
			sum += p[e];
		}
		for (e = 0; e < E; e++)
			p[e] /= sum;
		for (j = 0; j < k; j++) {
			int best = -1;
			for (e = 0; e < E; e++) {
				if (j == 1 && e == ti[0])
					continue;
				if (best < 0 || p[e] > p[best])
					best = e;
			}
			ti[j] = best;
			gs += p[best];
		}
		for (j = 0; j < k; j++) {
			int ex = ti[j];
			a->gate[(size_t)n * k + j] = norm ? p[ex] / gs : p[ex];
			a->routed[ex]++;
			if (a->count[ex] < s->cap) {
				a->slot[(size_t)n * k + j] = a->count[ex]++;
			} else {
				a->slot[(size_t)n * k + j] = -1;
				a->dropped++;
			}
		}
	}
	(void)aux;
	a->aux = mr_moe_aux(s, a->probs, a->routed, 1);
}

float mr_moe_aux(const struct mr_moe_shape *s, const float *probs, const int *routed,
		 int ranks)
{
	int N = s->N, E = s->E, n, e;
	double aux = 0.0;

	for (e = 0; e < E; e++) {
		double P = 0.0;
		for (n = 0; n < N; n++)
			P += probs[(size_t)n * E + e];
		aux += ((double)routed[e] / ((double)N * ranks * s->k)) * (P / N);
	}
	return (float)(aux * E);
}

/* The sequence split over ranks: routed summed over them, aux from the
 * sums (xg->count_reduce; see mr_moe.h). */
static int sum_routed(const struct mr_moe_xchg *xg, const struct mr_moe_shape *s,
		      struct mr_moe_acts *a)
{
	int rc;

	if (!xg || !xg->count_reduce)
		return 0;
	if ((rc = xg->count_reduce(xg->count_ctx, a->routed, s->E)) < 0)
		return rc;
	a->aux = mr_moe_aux(s, a->probs, a->routed, xg->count_ranks);
	return 0;
}

void mr_moe_dispatch(const struct mr_moe_shape *s, const struct mr_moe_acts *a, float *xin,
		     const float *x)
{
	int n, j, C = s->C, k = s->k;

	for (n = 0; n < s->N; n++)
		for (j = 0; j < k; j++) {
			int sl = a->slot[(size_t)n * k + j], ex = a->topi[(size_t)n * k + j];
			if (sl >= 0)
				memcpy(xin + ((size_t)ex * s->cap + sl) * C, x + (size_t)n * C,
				       sizeof(float) * (size_t)C);
		}
}

void mr_moe_combine(const struct mr_moe_shape *s, const struct mr_moe_acts *a, int gated,
		    float *y, const float *rows)
{
	int n, j, c, C = s->C, k = s->k;

	memset(y, 0, sizeof(float) * (size_t)s->N * C);
	for (n = 0; n < s->N; n++)
		for (j = 0; j < k; j++) {
			int sl = a->slot[(size_t)n * k + j], ex = a->topi[(size_t)n * k + j];
			float g = gated ? a->gate[(size_t)n * k + j] : 1.0f;
			const float *r;
			if (sl < 0)
				continue;
			r = rows + ((size_t)ex * s->cap + sl) * C;
			for (c = 0; c < C; c++)
				y[(size_t)n * C + c] += g * r[c];
		}
}

void mr_moe_combine_bwd(const struct mr_moe_shape *s, const struct mr_moe_acts *a, float *dyo,
			float *dgate, const float *dy, const float *yo)
{
	int n, j, c, C = s->C, k = s->k;

	for (n = 0; n < s->N; n++) {
		const float *dyn = dy + (size_t)n * C;
		for (j = 0; j < k; j++) {
			int sl = a->slot[(size_t)n * k + j], ex = a->topi[(size_t)n * k + j];
			float g = a->gate[(size_t)n * k + j], dg = 0.0f;
			float *d;
			const float *y;
			if (sl >= 0) {
				d = dyo + ((size_t)ex * s->cap + sl) * C;
				y = yo + ((size_t)ex * s->cap + sl) * C;
				for (c = 0; c < C; c++) {
					d[c] = g * dyn[c];
					dg += dyn[c] * y[c];
				}
			}
			dgate[(size_t)n * k + j] = dg;
		}
	}
}

void mr_moe_router_bwd(const struct mr_moe_shape *s, const struct mr_moe_acts *a,
		       float *dlogits, const float *dgate, float aux_scale)
{
	int N = s->N, E = s->E, k = s->k, n, j, e, norm = mr_moe_norm_topk(s);

	memset(dlogits, 0, sizeof(float) * (size_t)N * E);
	/* gates backward (raw: g = p; renormalised: g_j = p_j / sum of the
	 * chosen, whose derivative is (dg_j - <dg, g>) / sum) */
	for (n = 0; n < N; n++) {
		const float *pn = a->probs + (size_t)n * E, *dg = dgate + (size_t)n * k;
		const int *ti = a->topi + (size_t)n * k;
		float gs = 0.0f, gdot = 0.0f;
		if (!norm) {
			for (j = 0; j < k; j++)
				dlogits[(size_t)n * E + ti[j]] += dg[j];
			continue;
		}
		for (j = 0; j < k; j++) {
			gs += pn[ti[j]];
			gdot += dg[j] * a->gate[(size_t)n * k + j];
		}
		for (j = 0; j < k; j++)
			dlogits[(size_t)n * E + ti[j]] += (dg[j] - gdot) / gs;
	}
	/* aux loss: d/dp[n][e] of aux_scale * E * sum_e f_e * mean_n p = ... */
	for (e = 0; e < E; e++) {
		float w = aux_scale * (float)E * ((float)a->routed[e] / ((float)N * k)) /
			  (float)N;
		for (n = 0; n < N; n++)
			dlogits[(size_t)n * E + e] += w;
	}
	/* softmax backward, in place: dlogits = p * (dp - <p, dp>) */
	for (n = 0; n < N; n++) {
		const float *pn = a->probs + (size_t)n * E;
		float *dp = dlogits + (size_t)n * E, dot = 0.0f;
		for (e = 0; e < E; e++)
			dot += pn[e] * dp[e];
		for (e = 0; e < E; e++)
			dp[e] = pn[e] * (dp[e] - dot);
	}
}

int mr_moe_fwd(struct mr_pool *p, const struct mr_moe_shape *s, struct mr_moe_acts *a,
	       const struct mr_moe_xchg *xg, float *y, const float *x, const float *routerw,
	       const float *fcw, const float *fcb, const float *fcprojw,
	       const float *fcprojb)
{
	int C = s->C, H = s->H, F = mr_moe_fc_cols(s), E = s->E, e, rc;
	struct mr_moe_view v;

	mr_matmul_fwd(p, a->probs, x, routerw, NULL, s->N, C, E);
	mr_moe_route(s, a);
	if ((rc = sum_routed(xg, s, a)) < 0)
		return rc;
	mr_moe_dispatch(s, a, a->xin, x);
	rc = xchg(xg, MR_MOE_DISPATCH, a->xin, a->count, s, (size_t)C);
	if (rc < 0)
		return rc;
	v = mr_moe_view_of(xg, s, a->count);
	for (e = 0; e < v.E; e++) {
		int m = v.counts[e];
		size_t r0 = (size_t)e * (size_t)v.cap;
		if (m == 0)
			continue;
		mr_matmul_fwd(p, a->h + r0 * F, a->xin + r0 * C, fcw + (size_t)e * F * C,
			      fcb ? fcb + (size_t)e * F : NULL, m, C, F);
		if (s->swiglu)
			mr_swiglu_fwd(p, a->hg + r0 * H, a->h + r0 * F, m, H);
		else
			mr_gelu_fwd(p, a->hg + r0 * H, a->h + r0 * H, (size_t)m * H);
		mr_matmul_fwd(p, a->yo + r0 * C, a->hg + r0 * H, fcprojw + (size_t)e * C * H,
			      fcprojb ? fcprojb + (size_t)e * C : NULL, m, H, C);
	}
	rc = xchg(xg, MR_MOE_COMBINE, a->yo, a->count, s, (size_t)C);
	if (rc < 0)
		return rc;
	mr_moe_combine(s, a, 1, y, a->yo);
	return 0;
}

int mr_moe_bwd(struct mr_pool *p, const struct mr_moe_shape *s, const struct mr_moe_acts *a,
	       const struct mr_moe_xchg *xg, float *dx, const float *dy, const float *x,
	       const float *routerw, const float *fcw, const float *fcprojw, float *drouterw,
	       float *dfcw, float *dfcb, float *dfcprojw, float *dfcprojb, float aux_scale,
	       float *ws, const float *ones)
{
	int N = s->N, C = s->C, H = s->H, F = mr_moe_fc_cols(s), k = s->k, e, rc;
	struct mr_moe_view v;
	struct mr_moe_ws w;
	float *dprobs, *dyo, *dxin, *dh, *dgate;

	mr_moe_ws_bind(&w, s, ws);
	dprobs = w.dprobs;
	dyo = w.dyo;
	dxin = w.dxin;
	dh = w.dh;
	dgate = w.dgate;

	/* combine backward: dyo = g * dy, dgate = <dy, yo> (partial under tp) */
	mr_moe_combine_bwd(s, a, dyo, dgate, dy, a->yo);
	if (xg && xg->reduce && (rc = xg->reduce(xg->reduce_ctx, dgate, (size_t)N * k)) < 0)
		return rc;
	rc = xchg(xg, MR_MOE_DISPATCH_GRAD, dyo, a->count, s, (size_t)C);
	if (rc < 0)
		return rc;
	v = mr_moe_view_of(xg, s, a->count);
	for (e = 0; e < v.E; e++) {
		int m = v.counts[e];
		size_t r0 = (size_t)e * (size_t)v.cap;
		if (m == 0)
			continue;
		/* the hidden output's gradient: in place for GELU, beside for
		 * SwiGLU, whose backward writes [dgate | dup] into dh */
		float *dhg = s->swiglu ? w.dhg + r0 * H : dh + r0 * H;
		mr_matmul_bwd(p, dhg, dfcprojw + (size_t)e * C * H,
			      dfcprojb ? dfcprojb + (size_t)e * C : NULL, dyo + r0 * C,
			      a->hg + r0 * H, fcprojw + (size_t)e * C * H, m, H, C, 0, ones);
		if (s->swiglu)
			mr_swiglu_bwd(p, dh + r0 * F, a->h + r0 * F, dhg, m, H);
		else
			mr_gelu_bwd(p, dh + r0 * H, a->h + r0 * H, dh + r0 * H, (size_t)m * H);
		mr_matmul_bwd(p, dxin + r0 * C, dfcw + (size_t)e * F * C,
			      dfcb ? dfcb + (size_t)e * F : NULL, dh + r0 * F, a->xin + r0 * C,
			      fcw + (size_t)e * F * C, m, C, F, 0, ones);
	}
	rc = xchg(xg, MR_MOE_COMBINE_GRAD, dxin, a->count, s, (size_t)C);
	if (rc < 0)
		return rc;
	mr_moe_combine(s, a, 0, dx, dxin);
	mr_moe_router_bwd(s, a, dprobs, dgate, mr_moe_aux_scale(xg, aux_scale));
	mr_matmul_bwd(p, xg && xg->router_dx_off ? NULL : dx, drouterw, NULL, dprobs, x, routerw,
		      N, C, s->E, 1, ones);
	return 0;
}
