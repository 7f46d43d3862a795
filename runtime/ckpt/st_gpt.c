/*
 * st_gpt.c - a GPT model's parameters <-> safetensors with Hugging Face
 * GPT-2 names (see mr_st_gpt.h): the name table, the transposes, the
 * metadata, and the config rebuilt on import from the metadata or from a
 * plain GPT-2 file's shapes.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/mr_safetensors.h"
#include "ckpt/mr_st_gpt.h"

/* Our block tensor suffix -> its file suffix; T: written transposed;
 * X: one file tensor per expert ("%d" takes the expert). */
static const struct {
	const char *ours, *file;
	int transposed, expert;
} block_names[] = {
	{ "ln1.w", "ln_1.weight", 0, 0 },
	{ "ln1.b", "ln_1.bias", 0, 0 },
	{ "attn.qkv.w", "attn.c_attn.weight", 1, 0 },
	{ "attn.qkv.b", "attn.c_attn.bias", 0, 0 },
	{ "attn.proj.w", "attn.c_proj.weight", 1, 0 },
	{ "attn.proj.b", "attn.c_proj.bias", 0, 0 },
	{ "ln2.w", "ln_2.weight", 0, 0 },
	{ "ln2.b", "ln_2.bias", 0, 0 },
	{ "mlp.fc.w", "mlp.c_fc.weight", 1, 0 },
	{ "mlp.fc.b", "mlp.c_fc.bias", 0, 0 },
	{ "mlp.proj.w", "mlp.c_proj.weight", 1, 0 },
	{ "mlp.proj.b", "mlp.c_proj.bias", 0, 0 },
	{ "moe.router.w", "moe.router.weight", 1, 0 },
	{ "moe.fc.w", "moe.experts.%d.c_fc.weight", 1, 1 },
	{ "moe.fc.b", "moe.experts.%d.c_fc.bias", 0, 1 },
	{ "moe.proj.w", "moe.experts.%d.c_proj.weight", 1, 1 },
	{ "moe.proj.b", "moe.experts.%d.c_proj.bias", 0, 1 },
};

#define PREFIX "transformer."

int mr_st_gpt_name(const struct mr_gpt_tensor *t, int e, char *buf, size_t cap,
		   int *transposed)
{
	static const char *const top[][2] = { { "wte", "wte.weight" },
					       { "wpe", "wpe.weight" },
					       { "lnf.w", "ln_f.weight" },
					       { "lnf.b", "ln_f.bias" } };
	char suffix[64];
	size_t k;
	int layer, at = 0;

	if (transposed)
		*transposed = 0;
	for (k = 0; k < sizeof(top) / sizeof(top[0]); k++)
		if (!strcmp(t->name, top[k][0])) {
			snprintf(buf, cap, PREFIX "%s", top[k][1]);
			return 0;
		}
	if (sscanf(t->name, "h.%d.%n", &layer, &at) != 1 || at == 0)
		return MR_ENOTFOUND;
	for (k = 0; k < sizeof(block_names) / sizeof(block_names[0]); k++) {
		if (strcmp(t->name + at, block_names[k].ours))
			continue;
		if (block_names[k].expert)
			snprintf(suffix, sizeof(suffix), block_names[k].file, e);
		else
			snprintf(suffix, sizeof(suffix), "%s", block_names[k].file);
		snprintf(buf, cap, PREFIX "h.%d.%s", layer, suffix);
		if (transposed)
			*transposed = block_names[k].transposed;
		return 0;
	}
	return MR_ENOTFOUND;
}

/* One file tensor of table tensor t: expert e's part (pieces(t) of them),
 * its element count and file shape. */
static int pieces(const struct mr_gpt_tensor *t)
{
	return t->expert ? t->full[0] : 1;
}

static void piece_shape(const struct mr_gpt_tensor *t, int transposed, int *ndim, int64_t *shape,
			size_t *n)
{
	int k, d = t->expert ? 1 : 0;

	*ndim = t->ndim - d;
	*n = 1;
	for (k = 0; k < *ndim; k++) {
		shape[k] = t->full[k + d];
		*n *= (size_t)shape[k];
	}
	if (transposed && *ndim == 2) {
		int64_t s = shape[0];
		shape[0] = shape[1];
		shape[1] = s;
	}
}

/* (r, c) row-major src into (c, r) dst. */
static void transpose(float *dst, const float *src, int64_t r, int64_t c)
{
	for (int64_t i = 0; i < r; i++)
		for (int64_t j = 0; j < c; j++)
			dst[j * r + i] = src[i * c + j];
}

/* "[a, b, ...]" into buf. */
static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
	size_t at = 0;

	at += (size_t)snprintf(buf, cap, "[");
	for (int k = 0; k < ndim && at < cap; k++)
		at += (size_t)snprintf(buf + at, cap - at, "%s%lld", k ? ", " : "",
				       (long long)shape[k]);
	if (at < cap)
		snprintf(buf + at, cap - at, "]");
}

/* ---- export ---- */

int mr_st_gpt_export(const struct mr_gpt *m, long step, const char *path, int overwrite,
		     struct mr_errbuf *eb)
{
	const struct mr_gpt_config *c = &m->cfg;
	char num[13][32], (*names)[MR_ST_MAX_NAME + 1] = NULL;
	struct mr_st_spec *specs = NULL;
	struct mr_st_writer w;
	float *buf = NULL;
	size_t most = 0, n;
	int i, e, np = 0, k = 0, tr, rc = 0;

	if (c->arch != MR_ARCH_GPT2)
		return mr_errf_field(eb, MR_ENOTSUP, "arch",
				     "'%s': safetensors export writes GPT-2's layout; a llama "
				     "model exports as a Hugging Face Llama directory (--hf)",
				     path);
	for (i = 0; i < m->ntensors; i++) {
		np += pieces(&m->tensors[i]);
		if (m->tensors[i].n > most)
			most = m->tensors[i].n;
	}
	specs = calloc((size_t)np, sizeof(*specs));
	names = calloc((size_t)np, sizeof(*names));
	buf = malloc((most ? most : 1) * sizeof(float));
	if (!specs || !names || !buf) {
		rc = mr_errf(eb, MR_ENOMEM, "out of memory exporting to '%s'", path);
		goto out;
	}
	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		for (e = 0; e < pieces(t); e++, k++) {
			if (mr_st_gpt_name(t, e, names[k], sizeof(names[k]), &tr) < 0) {
				rc = mr_errf(eb, MR_EINVAL, "tensor '%s' has no safetensors name",
					     t->name);
				goto out;
			}
			specs[k].name = names[k];
			piece_shape(t, tr, &specs[k].ndim, specs[k].shape, &n);
		}
	}
	snprintf(num[0], sizeof(num[0]), "%ld", step);
	snprintf(num[1], sizeof(num[1]), "%d", c->vocab);
	snprintf(num[2], sizeof(num[2]), "%d", c->max_seq);
	snprintf(num[3], sizeof(num[3]), "%d", c->n_layer);
	snprintf(num[4], sizeof(num[4]), "%d", c->d_model);
	snprintf(num[5], sizeof(num[5]), "%d", c->n_head);
	snprintf(num[6], sizeof(num[6]), "%d", c->moe_every);
	snprintf(num[7], sizeof(num[7]), "%d", c->n_experts);
	snprintf(num[8], sizeof(num[8]), "%d", c->top_k);
	snprintf(num[9], sizeof(num[9]), "%.9g", (double)c->capacity_factor);
	snprintf(num[10], sizeof(num[10]), "%.9g", (double)c->aux_coef);
	{
		const char *meta[] = { "format", "pt", "meshrun", MR_ST_GPT_META_VERSION,
				       "step", num[0], "vocab_size", num[1], "max_seq", num[2],
				       "n_layer", num[3], "d_model", num[4], "n_head", num[5],
				       "moe_every", num[6], "n_experts", num[7], "top_k", num[8],
				       "capacity_factor", num[9], "aux_coef", num[10],
				       "moe_policy", c->moe_dropless ? "dropless" : "capacity",
				       NULL };
		if ((rc = mr_st_writer_open(&w, path, specs, np, meta, overwrite, eb)) < 0)
			goto out;
	}
	for (i = 0, k = 0; i < m->ntensors && rc == 0; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		for (e = 0; e < pieces(t) && rc == 0; e++, k++) {
			const float *src;
			mr_st_gpt_name(t, e, names[k], sizeof(names[k]), &tr);
			piece_shape(t, 0, &specs[k].ndim, specs[k].shape, &n);
			src = m->params + t->off + (size_t)e * n;
			if (tr && specs[k].ndim == 2) {
				transpose(buf, src, specs[k].shape[0], specs[k].shape[1]);
				src = buf;
			}
			rc = mr_st_writer_put(&w, src, n, eb);
		}
	}
	if (rc == 0)
		rc = mr_st_writer_commit(&w, eb);
	else
		mr_st_writer_abort(&w);
out:
	free(specs);
	free(names);
	free(buf);
	return rc;
}

/* ---- import ---- */

static int meta_int(const struct mr_st_file *f, const char *key, long lo, long hi, int *out,
		    struct mr_errbuf *eb)
{
	const char *v = mr_st_meta(f, key);
	char *end;
	long x;

	if (!v)
		return mr_errf_field(eb, MR_EINVAL, key, "'%s': metadata '%s' is missing", f->path,
				     key);
	errno = 0;
	x = strtol(v, &end, 10);
	if (!v[0] || *end || errno || x < lo || x > hi)
		return mr_errf_field(eb, MR_EINVAL, key,
				     "'%s': metadata '%s' is '%.40s', not an integer in [%ld, %ld]",
				     f->path, key, v, lo, hi);
	*out = (int)x;
	return 0;
}

static int meta_float(const struct mr_st_file *f, const char *key, float *out,
		      struct mr_errbuf *eb)
{
	const char *v = mr_st_meta(f, key);
	char *end;
	float x;

	if (!v)
		return mr_errf_field(eb, MR_EINVAL, key, "'%s': metadata '%s' is missing", f->path,
				     key);
	x = strtof(v, &end);
	if (!v[0] || *end || !isfinite(x))
		return mr_errf_field(eb, MR_EINVAL, key,
				     "'%s': metadata '%s' is '%.40s', not a finite number", f->path,
				     key, v);
	*out = x;
	return 0;
}

/* A name "h.<l>.<rest>" (l a plain decimal below 2^20): *l and the
 * length of "h.<l>."; else 0. */
static int block_of(const char *nm, int *l)
{
	const char *p = nm + 2;
	long v = 0;

	if (strncmp(nm, "h.", 2) || *p < '0' || *p > '9')
		return 0;
	while (*p >= '0' && *p <= '9' && v < 1 << 20)
		v = v * 10 + (*p++ - '0');
	if (*p != '.' || v >= 1 << 20)
		return 0;
	*l = (int)v;
	return (int)(p + 1 - nm);
}

/* The config from meshrun's metadata; *step its step. */
static int config_from_meta(const struct mr_st_file *f, struct mr_gpt_config *c, long *step,
			    struct mr_errbuf *eb)
{
	const char *ver = mr_st_meta(f, "meshrun"), *pol = mr_st_meta(f, "moe_policy");
	const char *sv = mr_st_meta(f, "step");
	char *end;
	int rc;

	if (strcmp(ver, MR_ST_GPT_META_VERSION))
		return mr_errf_field(eb, MR_ENOTSUP, "meshrun",
				     "'%s': meshrun metadata version '%.20s', this build reads %s",
				     f->path, ver, MR_ST_GPT_META_VERSION);
	errno = 0;
	*step = sv ? strtol(sv, &end, 10) : -1;
	if (!sv || !sv[0] || *end || errno || *step < 0)
		return mr_errf_field(eb, MR_EINVAL, "step",
				     "'%s': metadata 'step' is missing or not a non-negative "
				     "integer", f->path);
	memset(c, 0, sizeof(*c));
	if ((rc = meta_int(f, "vocab_size", 1, 1 << 30, &c->vocab, eb)) < 0 ||
	    (rc = meta_int(f, "max_seq", 1, 1 << 30, &c->max_seq, eb)) < 0 ||
	    (rc = meta_int(f, "n_layer", 1, 1 << 20, &c->n_layer, eb)) < 0 ||
	    (rc = meta_int(f, "d_model", 1, 1 << 20, &c->d_model, eb)) < 0 ||
	    (rc = meta_int(f, "n_head", 1, 1 << 20, &c->n_head, eb)) < 0 ||
	    (rc = meta_int(f, "moe_every", 0, 1 << 20, &c->moe_every, eb)) < 0 ||
	    (rc = meta_int(f, "n_experts", 0, 1 << 20, &c->n_experts, eb)) < 0 ||
	    (rc = meta_int(f, "top_k", 0, 16, &c->top_k, eb)) < 0 ||
	    (rc = meta_float(f, "capacity_factor", &c->capacity_factor, eb)) < 0 ||
	    (rc = meta_float(f, "aux_coef", &c->aux_coef, eb)) < 0)
		return rc;
	if (!pol || (strcmp(pol, "capacity") && strcmp(pol, "dropless")))
		return mr_errf_field(eb, MR_EINVAL, "moe_policy",
				     "'%s': metadata 'moe_policy' must be \"capacity\" or "
				     "\"dropless\"", f->path);
	c->moe_dropless = !strcmp(pol, "dropless");
	return 0;
}

/* The config of a plain GPT-2 file: vocab and d_model from wte, max_seq
 * from wpe, n_layer from the h.<i> blocks. */
static int config_from_shapes(const struct mr_st_file *f, const char *pre, int n_head,
			      struct mr_gpt_config *c, struct mr_errbuf *eb)
{
	char name[MR_ST_MAX_NAME + 1];
	size_t pl = strlen(pre);
	int wte, wpe, i, most = -1;

	snprintf(name, sizeof(name), "%swte.weight", pre);
	wte = mr_st_find(f, name);
	snprintf(name, sizeof(name), "%swpe.weight", pre);
	wpe = mr_st_find(f, name);
	if (wpe < 0)
		return mr_errf(eb, MR_EINVAL, "'%s': no tensor '%s'", f->path, name);
	if (f->t[wte].ndim != 2 || f->t[wpe].ndim != 2 || f->t[wte].shape[1] != f->t[wpe].shape[1])
		return mr_errf(eb, MR_EINVAL,
			       "'%s': '%swte.weight' and '%swpe.weight' must be (vocab, d_model) and "
			       "(max_seq, d_model)", f->path, pre, pre);
	for (i = 0; i < f->ntensors; i++) {
		const char *nm = f->t[i].name;
		int l, at;
		if (strncmp(nm, pre, pl) || (at = block_of(nm + pl, &l)) == 0)
			continue;
		if (strstr(nm + pl + at, "moe."))
			return mr_errf(eb, MR_EINVAL,
				       "'%s': tensor '%s' is a MoE layer's, and the file has no "
				       "meshrun metadata to say how it routes", f->path, nm);
		if (l > most)
			most = l;
	}
	if (most < 0)
		return mr_errf(eb, MR_EINVAL, "'%s': no '%sh.0.' block tensors", f->path, pre);
	if (n_head <= 0)
		return mr_errf_field(eb, MR_EINVAL, "n_head",
				     "'%s' has no meshrun metadata, and GPT-2 files do not record "
				     "n_head: give it (--n-head; 12 for gpt2, 16 for gpt2-medium)",
				     f->path);
	memset(c, 0, sizeof(*c));
	if (f->t[wte].shape[0] > 1 << 30 || f->t[wte].shape[1] > 1 << 20 ||
	    f->t[wpe].shape[0] > 1 << 30 || most >= 1 << 20)
		return mr_errf(eb, MR_ELIMIT, "'%s': a model larger than meshrun's bounds", f->path);
	c->vocab = (int)f->t[wte].shape[0];
	c->d_model = (int)f->t[wte].shape[1];
	c->max_seq = (int)f->t[wpe].shape[0];
	c->n_layer = most + 1;
	c->n_head = n_head;
	return 0;
}

/* Parameters a model of config c has, in double (no overflow). */
static double nparams_of(const struct mr_gpt_config *c)
{
	double C = c->d_model, E = c->n_experts, n = (double)c->vocab * C + (double)c->max_seq * C + 2 * C;

	for (int l = 0; l < c->n_layer; l++) {
		n += 4 * C + 3 * C * C + 3 * C + C * C + C;
		if (mr_gpt_layer_is_moe(c, l))
			n += E * C + E * (8 * C * C + 5 * C);
		else
			n += 8 * C * C + 5 * C;
	}
	return n;
}

/* 1 when file tensor name (after the prefix) is something a GPT-2 file
 * holds that is no parameter: the attention mask buffers. */
static int ignorable(const char *nm)
{
	int l, at;

	if ((at = block_of(nm, &l)) == 0)
		return 0;
	return !strcmp(nm + at, "attn.bias") || !strcmp(nm + at, "attn.masked_bias");
}

/* Every table tensor of m from f (name prefix pre instead of
 * "transformer."); used[i] set for each file tensor taken. */
static int fill_params(struct mr_gpt *m, const struct mr_st_file *f, const char *pre,
		       unsigned char *used, struct mr_errbuf *eb)
{
	char name[MR_ST_MAX_NAME + 1], full[MR_ST_MAX_NAME + 1], want[160], got[160];
	size_t most = 1;
	float *buf;
	int i, e, tr, rc = 0;

	for (i = 0; i < m->ntensors; i++)
		if (m->tensors[i].n > most)
			most = m->tensors[i].n;
	if (!(buf = malloc(most * sizeof(float))))
		return mr_errf(eb, MR_ENOMEM, "out of memory importing '%s'", f->path);
	for (i = 0; i < m->ntensors && rc == 0; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		for (e = 0; e < pieces(t) && rc == 0; e++) {
			int64_t shape[MR_ST_MAX_DIMS];
			int ndim, fi, k, same;
			size_t n;
			float *dst;
			mr_st_gpt_name(t, e, full, sizeof(full), &tr);
			snprintf(name, sizeof(name), "%s%s", pre, full + strlen(PREFIX));
			piece_shape(t, tr, &ndim, shape, &n);
			if ((fi = mr_st_find(f, name)) < 0) {
				rc = mr_errf(eb, MR_EINVAL,
					     "'%s': no tensor '%s' (the model of n_layer %d d_model "
					     "%d has it)", f->path, name, m->cfg.n_layer,
					     m->cfg.d_model);
				break;
			}
			same = f->t[fi].ndim == ndim;
			for (k = 0; same && k < ndim; k++)
				same = f->t[fi].shape[k] == shape[k];
			if (!same) {
				shape_str(got, sizeof(got), f->t[fi].ndim, f->t[fi].shape);
				shape_str(want, sizeof(want), ndim, shape);
				rc = mr_errf(eb, MR_EINVAL,
					     "'%s': tensor '%s' has shape %s, the model (n_layer %d "
					     "d_model %d vocab_size %d) needs %s", f->path, name, got,
					     m->cfg.n_layer, m->cfg.d_model, m->cfg.vocab, want);
				break;
			}
			used[fi] = 1;
			dst = m->params + t->off + (size_t)e * n;
			if ((rc = mr_st_read_f32(f, fi, tr && ndim == 2 ? buf : dst, eb)) < 0)
				break;
			if (tr && ndim == 2)
				transpose(dst, buf, shape[0], shape[1]);
		}
	}
	free(buf);
	return rc;
}

/* The file's other tensors: mask buffers are ignored, a head equal to wte
 * accepted, anything else refused. */
static int check_rest(const struct mr_gpt *m, const struct mr_st_file *f, const char *pre,
		      const unsigned char *used, struct mr_errbuf *eb)
{
	size_t pl = strlen(pre);
	int i, rc = 0;

	for (i = 0; i < f->ntensors && rc == 0; i++) {
		const char *nm = f->t[i].name;
		const struct mr_gpt_tensor *wte = &m->tensors[0];
		float *head;
		if (used[i] || (!strncmp(nm, pre, pl) && ignorable(nm + pl)))
			continue;
		if (strcmp(nm, "lm_head.weight"))
			return mr_errf(eb, MR_EINVAL,
				       "'%s': unexpected tensor '%s' (not a parameter of a meshrun "
				       "GPT model; see docs/CHECKPOINTS.md for the names)", f->path,
				       nm);
		if (f->t[i].count != wte->n || f->t[i].ndim != 2)
			return mr_errf(eb, MR_EINVAL,
				       "'%s': 'lm_head.weight' is not shaped like wte: meshrun ties "
				       "the head to wte", f->path);
		if (!(head = malloc(wte->n * sizeof(float))))
			return mr_errf(eb, MR_ENOMEM, "out of memory importing '%s'", f->path);
		rc = mr_st_read_f32(f, i, head, eb);
		if (rc == 0 && memcmp(head, m->params + wte->off, wte->n * sizeof(float)))
			rc = mr_errf(eb, MR_EINVAL,
				     "'%s': 'lm_head.weight' differs from the token embedding: "
				     "meshrun ties the head to wte and cannot hold an untied one",
				     f->path);
		free(head);
	}
	return rc;
}

int mr_st_gpt_import(struct mr_gpt *m, const char *path, int n_head, long *step, int *had_meta,
		     struct mr_errbuf *eb)
{
	struct mr_st_file f;
	struct mr_gpt_config c;
	struct mr_errbuf ce = { "", "" };
	unsigned char *used = NULL;
	const char *pre;
	double room;
	int rc, meta;

	memset(m, 0, sizeof(*m));
	*step = 0;
	if ((rc = mr_st_open(&f, path, eb)) < 0)
		return rc;
	meta = mr_st_meta(&f, "meshrun") != NULL;
	if (had_meta)
		*had_meta = meta;
	pre = mr_st_find(&f, PREFIX "wte.weight") >= 0 ? PREFIX
	      : mr_st_find(&f, "wte.weight") >= 0     ? ""
						      : NULL;
	if (!pre) {
		rc = mr_errf(eb, MR_EINVAL,
			     "'%s': no tensor 'transformer.wte.weight' (nor 'wte.weight'): not a "
			     "GPT-2 model", path);
		goto out;
	}
	rc = meta ? config_from_meta(&f, &c, step, eb) : config_from_shapes(&f, pre, n_head, &c, eb);
	if (rc < 0)
		goto out;
	if (meta && n_head > 0 && n_head != c.n_head) {
		rc = mr_errf_field(eb, MR_EINVAL, "n_head",
				   "--n-head %d differs from the file's n_head %d", n_head, c.n_head);
		goto out;
	}
	if (mr_gpt_config_check(&c, &ce) < 0) {
		/* the caller's n_head is the caller's problem, the file's the file's */
		rc = !meta && !strcmp(ce.field, "n_head")
			     ? mr_errf_field(eb, MR_EINVAL, "n_head", "--n-head %d: %s", n_head,
					     ce.msg)
			     : mr_errf(eb, MR_EINVAL, "'%s': model: %s", path, ce.msg);
		goto out;
	}
	/* the config must fit the file before a model of it is allocated
	 * (2 bytes per parameter at least) */
	room = (double)(f.size - f.data_at) / 2.0;
	if (nparams_of(&c) > room) {
		rc = mr_errf(eb, MR_EINVAL,
			     "'%s': a model of n_layer %d d_model %d vocab_size %d has %.0f "
			     "parameters, more than the file holds", path, c.n_layer, c.d_model,
			     c.vocab, nparams_of(&c));
		goto out;
	}
	if ((rc = mr_gpt_create(m, &c, 1, 1, NULL, eb)) < 0) {
		memset(m, 0, sizeof(*m));
		goto out;
	}
	if (!(used = calloc((size_t)(f.ntensors ? f.ntensors : 1), 1)))
		rc = mr_errf(eb, MR_ENOMEM, "out of memory importing '%s'", path);
	if (rc == 0 && (rc = fill_params(m, &f, pre, used, eb)) == 0)
		rc = check_rest(m, &f, pre, used, eb);
	if (rc < 0) {
		mr_gpt_release(m);
		memset(m, 0, sizeof(*m));
	}
out:
	free(used);
	mr_st_close(&f);
	return rc;
}
