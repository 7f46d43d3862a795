/*
 * mesh.c - rank <-> coordinates <-> process groups; see mr_mesh.h.
 *
 * Every rank is a mixed-radix number in two equivalent decompositions:
 * dense digits (tp, cp, dp, pp) and expert digits (tp, ep, edp, pp), tp the
 * least significant. A group kind names one decomposition and the digits
 * that vary inside a group; the fixed digits, read as a mixed-radix number
 * (slowest digit most significant), give the group id, the varying ones the
 * index in the group. Because strides grow with significance, that index
 * order is ascending rank order.
 *
 * Non-goals: anything stateful; this file only computes.
 */
#include "mr_mesh.h"

#include <limits.h>
#include <stdio.h>

#define NDIM 4

enum { DENSE, EXPERT };

struct kind {
	const char *name;
	int decomp;
	unsigned vary; /* bit d: digit d varies (0 = tp ... 3 = pp) */
};

static const struct kind kinds[MR_GROUP__COUNT] = {
	[MR_GROUP_WORLD] = {"world", DENSE, 0xf},
	[MR_GROUP_TP] = {"tp", DENSE, 1u << 0},
	[MR_GROUP_CP] = {"cp", DENSE, 1u << 1},
	[MR_GROUP_DP] = {"dp", DENSE, 1u << 2},
	[MR_GROUP_PP] = {"pp", DENSE, 1u << 3},
	[MR_GROUP_EP] = {"ep", EXPERT, 1u << 1},
	[MR_GROUP_EDP] = {"edp", EXPERT, 1u << 2},
	[MR_GROUP_DP_CP] = {"dp_cp", DENSE, (1u << 1) | (1u << 2)},
	[MR_GROUP_TP_CP] = {"tp_cp", DENSE, (1u << 0) | (1u << 1)},
	[MR_GROUP_MP] = {"mp", DENSE, (1u << 0) | (1u << 3)},
	[MR_GROUP_TP_EP_PP] = {"tp_ep_pp", EXPERT, (1u << 0) | (1u << 1) | (1u << 3)},
};

static void radix(const struct mr_mesh *m, int decomp, int size[NDIM])
{
	size[0] = m->tp;
	size[1] = decomp == DENSE ? m->cp : m->ep;
	size[2] = decomp == DENSE ? m->dp : m->edp;
	size[3] = m->pp;
}

static void digits(const int size[NDIM], int rank, int d[NDIM])
{
	for (int i = 0; i < NDIM; i++) {
		d[i] = rank % size[i];
		rank /= size[i];
	}
}

static int compose(const int size[NDIM], const int d[NDIM])
{
	int r = 0;

	for (int i = NDIM - 1; i >= 0; i--)
		r = r * size[i] + d[i];
	return r;
}

/* Reads the digits selected by mask (varying or fixed) as one number. */
static int pack(const int size[NDIM], const int d[NDIM], unsigned mask)
{
	int v = 0;

	for (int i = NDIM - 1; i >= 0; i--)
		if (mask & (1u << i))
			v = v * size[i] + d[i];
	return v;
}

/* Inverse of pack: spreads v over the digits selected by mask. */
static void unpack(const int size[NDIM], int v, unsigned mask, int d[NDIM])
{
	for (int i = 0; i < NDIM; i++)
		if (mask & (1u << i)) {
			d[i] = v % size[i];
			v /= size[i];
		}
}

static int check_size(const char *field, int v, struct mr_errbuf *eb)
{
	if (v < 1)
		return mr_errf_field(eb, MR_EINVAL, field, "%s %d is less than 1", field, v);
	return 0;
}

int mr_mesh_init(struct mr_mesh *m, int world, int tp, int pp, int cp, int ep, int dp,
		 struct mr_errbuf *eb)
{
	long long model, w;
	int rc;

	if ((rc = check_size("tp", tp, eb)) || (rc = check_size("pp", pp, eb)) ||
	    (rc = check_size("cp", cp, eb)) || (rc = check_size("ep", ep, eb)))
		return rc;
	if (world < 0)
		return mr_errf_field(eb, MR_EINVAL, "world", "world %d is negative", world);
	if (dp < 0)
		return mr_errf_field(eb, MR_EINVAL, "dp", "dp %d is negative", dp);
	if (world == 0 && dp == 0)
		return mr_errf_field(eb, MR_EINVAL, "world",
				     "world and dp are both 0: one of them must be given");
	model = (long long)tp * pp * cp;
	if (world == 0) {
		w = model * dp;
		if (w > INT_MAX)
			return mr_errf_field(eb, MR_ERANGE, "world",
					     "world tp*pp*cp*dp = %lld is too large", w);
		world = (int)w;
	}
	if (world % model != 0)
		return mr_errf_field(eb, MR_EINVAL, "world",
				     "world %d is not divisible by tp*pp*cp = %lld", world, model);
	if (dp == 0)
		dp = (int)(world / model);
	else if (model * dp != world)
		return mr_errf_field(eb, MR_EINVAL, "dp",
				     "dp %d does not match world %d / (tp*pp*cp = %lld) = %lld",
				     dp, world, model, world / model);
	if (((long long)dp * cp) % ep != 0)
		return mr_errf_field(eb, MR_EINVAL, "ep", "ep %d does not divide dp*cp = %lld",
				     ep, (long long)dp * cp);
	m->world = world;
	m->tp = tp;
	m->cp = cp;
	m->dp = dp;
	m->pp = pp;
	m->ep = ep;
	m->edp = dp * cp / ep;
	return 0;
}

int mr_mesh_coord(const struct mr_mesh *m, int rank, struct mr_mesh_coord *c)
{
	int size[NDIM], d[NDIM], j;

	if (rank < 0 || rank >= m->world)
		return MR_ERANGE;
	radix(m, DENSE, size);
	digits(size, rank, d);
	c->tp = d[0];
	c->cp = d[1];
	c->dp = d[2];
	c->pp = d[3];
	j = c->dp * m->cp + c->cp;
	c->ep = j % m->ep;
	c->edp = j / m->ep;
	return 0;
}

int mr_mesh_rank(const struct mr_mesh *m, const struct mr_mesh_coord *c)
{
	int size[NDIM], d[NDIM] = {c->tp, c->cp, c->dp, c->pp};

	radix(m, DENSE, size);
	for (int i = 0; i < NDIM; i++)
		if (d[i] < 0 || d[i] >= size[i])
			return MR_ERANGE;
	return compose(size, d);
}

const char *mr_mesh_group_name(enum mr_mesh_group g)
{
	if ((unsigned)g >= MR_GROUP__COUNT)
		return "?";
	return kinds[g].name;
}

int mr_mesh_group_size(const struct mr_mesh *m, enum mr_mesh_group g)
{
	int size[NDIM], n = 1;

	if ((unsigned)g >= MR_GROUP__COUNT)
		return MR_EINVAL;
	radix(m, kinds[g].decomp, size);
	for (int i = 0; i < NDIM; i++)
		if (kinds[g].vary & (1u << i))
			n *= size[i];
	return n;
}

int mr_mesh_group_count(const struct mr_mesh *m, enum mr_mesh_group g)
{
	int n = mr_mesh_group_size(m, g);

	if (n < 1)
		return n < 0 ? n : MR_EINVAL;
	return m->world / n;
}

int mr_mesh_group_id(const struct mr_mesh *m, enum mr_mesh_group g, int rank)
{
	int size[NDIM], d[NDIM];

	if ((unsigned)g >= MR_GROUP__COUNT)
		return MR_EINVAL;
	if (rank < 0 || rank >= m->world)
		return MR_ERANGE;
	radix(m, kinds[g].decomp, size);
	digits(size, rank, d);
	return pack(size, d, ~kinds[g].vary & 0xfu);
}

int mr_mesh_group_members(const struct mr_mesh *m, enum mr_mesh_group g, int id,
			  int *ranks_out)
{
	int size[NDIM], d[NDIM] = {0, 0, 0, 0};
	int n = mr_mesh_group_size(m, g);

	if (n < 0)
		return n;
	if (id < 0 || id >= m->world / n)
		return MR_ERANGE;
	radix(m, kinds[g].decomp, size);
	unpack(size, id, ~kinds[g].vary & 0xfu, d);
	if (ranks_out)
		for (int k = 0; k < n; k++) {
			unpack(size, k, kinds[g].vary, d);
			ranks_out[k] = compose(size, d);
		}
	return n;
}

int mr_mesh_group_member(const struct mr_mesh *m, enum mr_mesh_group g, int id, int index)
{
	int size[NDIM], d[NDIM] = {0, 0, 0, 0};
	int n = mr_mesh_group_size(m, g);

	if (n < 0)
		return n;
	if (id < 0 || id >= m->world / n || index < 0 || index >= n)
		return MR_ERANGE;
	radix(m, kinds[g].decomp, size);
	unpack(size, id, ~kinds[g].vary & 0xfu, d);
	unpack(size, index, kinds[g].vary, d);
	return compose(size, d);
}

int mr_mesh_group_label(const struct mr_mesh *m, enum mr_mesh_group g, int id, char *buf,
			size_t cap)
{
	static const char *const digit_name[2][NDIM] = {{"tp", "cp", "dp", "pp"},
							{"tp", "ep", "edp", "pp"}};
	int size[NDIM], d[NDIM] = {0, 0, 0, 0}, n = mr_mesh_group_size(m, g), w, first = 1;
	unsigned fixed;
	size_t len;

	if (n < 0)
		return n;
	if (id < 0 || id >= m->world / n)
		return MR_ERANGE;
	radix(m, kinds[g].decomp, size);
	fixed = ~kinds[g].vary & 0xfu;
	unpack(size, id, fixed, d);
	w = snprintf(buf, cap, "%s", kinds[g].name);
	/* the fixed coordinates that can differ, slowest first */
	for (int i = NDIM - 1; i >= 0 && w >= 0; i--) {
		if (!(fixed & (1u << i)) || size[i] < 2)
			continue;
		len = (size_t)w < cap ? (size_t)w : cap;
		w += snprintf(buf + len, cap - len, "%s%s=%d", first ? "[" : ",",
			      digit_name[kinds[g].decomp][i], d[i]);
		first = 0;
	}
	if (!first) {
		len = (size_t)w < cap ? (size_t)w : cap;
		w += snprintf(buf + len, cap - len, "]");
	}
	return (size_t)w < cap ? 0 : MR_ERANGE;
}

int mr_mesh_group(const struct mr_mesh *m, enum mr_mesh_group g, int rank, int *ranks_out,
		  int *index)
{
	int size[NDIM], d[NDIM];
	int id = mr_mesh_group_id(m, g, rank);

	if (id < 0)
		return id;
	if (index) {
		radix(m, kinds[g].decomp, size);
		digits(size, rank, d);
		*index = pack(size, d, kinds[g].vary);
	}
	return mr_mesh_group_members(m, g, id, ranks_out);
}

int mr_mesh_describe(const struct mr_mesh *m, char *buf, size_t size)
{
	return snprintf(buf, size, "world=%d tp=%d cp=%d dp=%d pp=%d ep=%d edp=%d", m->world,
			m->tp, m->cp, m->dp, m->pp, m->ep, m->edp);
}

int mr_mesh_format_table(const struct mr_mesh *m, FILE *out)
{
	static const enum mr_mesh_group cols[] = {MR_GROUP_TP, MR_GROUP_CP, MR_GROUP_DP,
						  MR_GROUP_PP, MR_GROUP_EP, MR_GROUP_EDP,
						  MR_GROUP_DP_CP, MR_GROUP_MP};
	const size_t ncols = sizeof(cols) / sizeof(cols[0]);
	char desc[160];
	struct mr_mesh_coord c;

	mr_mesh_describe(m, desc, sizeof(desc));
	fprintf(out, "mesh %s (order tp-cp-dp-pp; ep within dp*cp)\n", desc);
	fprintf(out, "%6s %4s %4s %4s %4s %4s %4s |", "rank", "pp", "dp", "cp", "tp", "ep",
		"edp");
	for (size_t i = 0; i < ncols; i++)
		fprintf(out, " %6s", mr_mesh_group_name(cols[i]));
	fprintf(out, "\n");
	for (int r = 0; r < m->world; r++) {
		mr_mesh_coord(m, r, &c);
		fprintf(out, "%6d %4d %4d %4d %4d %4d %4d |", r, c.pp, c.dp, c.cp, c.tp, c.ep,
			c.edp);
		for (size_t i = 0; i < ncols; i++)
			fprintf(out, " %6d", mr_mesh_group_id(m, cols[i], r));
		fprintf(out, "\n");
	}
	fprintf(out, "(group columns give the group id of each kind; members of a group "
		     "share its id)\n");
	return ferror(out) ? MR_EIO : 0;
}
