/*
 * manifest.c - the checkpoint's JSON (see mr_ckpt.h, docs/CHECKPOINTS.md):
 * a rank's index of what it wrote, the manifest merged from every index,
 * and the manifest parsed back into struct mr_ckpt_manifest and checked
 * against itself before a single byte of a shard is trusted.
 *
 * A record is a JSON array [tensor, kind, tp_rank, tp, ep_rank, ep, at,
 * n, offset, crc32c], tensor indexing the document's "tensors".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_int.h"
#include "mr_crc32c.h"
#include "mr_json.h"

#define REC_FIELDS 10

json_t *mr__ckpt_model_json(const struct mr_gpt_config *c)
{
	return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:s}", "vocab_size",
			 c->vocab, "max_seq", c->max_seq, "n_layer", c->n_layer, "d_model",
			 c->d_model, "n_head", c->n_head, "moe_every", c->moe_every, "n_experts",
			 c->n_experts, "top_k", c->top_k, "capacity_factor",
			 (double)c->capacity_factor, "aux_coef", (double)c->aux_coef, "moe_policy",
			 c->moe_dropless ? "dropless" : "capacity");
}

const char *mr_ckpt_model_diff(const struct mr_gpt_config *a, const struct mr_gpt_config *b)
{
	return a->vocab != b->vocab		      ? "vocab_size"
	       : a->max_seq != b->max_seq	      ? "max_seq"
	       : a->n_layer != b->n_layer	      ? "n_layer"
	       : a->d_model != b->d_model	      ? "d_model"
	       : a->n_head != b->n_head		      ? "n_head"
	       : a->moe_every != b->moe_every	      ? "moe_every"
	       : a->n_experts != b->n_experts	      ? "n_experts"
	       : a->top_k != b->top_k		      ? "top_k"
	       : a->capacity_factor != b->capacity_factor ? "capacity_factor"
	       : a->aux_coef != b->aux_coef	      ? "aux_coef"
	       : a->moe_dropless != b->moe_dropless   ? "moe_policy"
						      : NULL;
}

static json_t *tensor_json(const struct mr_gpt_tensor *t)
{
	json_t *shape = json_array();

	for (int k = 0; k < t->ndim; k++)
		json_array_append_new(shape, json_integer(t->full[k]));
	return json_pack("{s:s, s:o, s:i, s:i, s:b}", "name", t->name, "shape", shape, "tp_dim",
			 t->tp_dim, "parts", t->split_parts, "expert", t->expert);
}

json_t *mr__ckpt_index_json(const struct mr_ckpt_job *job, const struct ckpt_piece *p, int np,
			    int kinds, uint64_t bytes)
{
	const struct mr_gpt *m = job->m;
	json_t *tensors = json_array(), *recs = json_array();
	int *local = calloc((size_t)m->ntensors, sizeof(int)), i, k, nt = 0;
	char file[32];

	if (!local || !tensors || !recs) {
		free(local);
		json_decref(tensors);
		json_decref(recs);
		return NULL;
	}
	for (i = 0; i < np; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[p[i].tensor];
		int tp_split = t->split[MR_AXIS_TP] >= 0, ep_split = t->split[MR_AXIS_EP] >= 0;
		if (!local[p[i].tensor]) {
			json_array_append_new(tensors, tensor_json(t));
			local[p[i].tensor] = ++nt;
		}
		for (k = 0; k < kinds; k++)
			json_array_append_new(
				recs, json_pack("[i, i, i, i, i, i, I, I, I, I]",
						local[p[i].tensor] - 1, k,
						tp_split ? m->tp.rank : -1, tp_split ? m->tp.size : 1,
						ep_split ? m->ep.rank : -1, ep_split ? m->ep.size : 1,
						(json_int_t)p[i].at, (json_int_t)p[i].n,
						(json_int_t)(p[i].offset +
							     (uint64_t)k * p[i].n * sizeof(float)),
						(json_int_t)p[i].crc[k]));
	}
	free(local);
	snprintf(file, sizeof(file), "rank-%05d.bin", job->rank);
	return json_pack("{s:i, s:s, s:I, s:o, s:o}", "rank", job->rank, "file", file, "bytes",
			 (json_int_t)bytes, "tensors", tensors, "records", recs);
}

/* Index of the tensor named like t in merged (appending it), -1 when a
 * tensor of that name is there with another description. */
static int merge_tensor(json_t *merged, json_t *t)
{
	const char *name = json_string_value(json_object_get(t, "name"));
	size_t i;
	json_t *v;

	json_array_foreach(merged, i, v)
	{
		if (strcmp(json_string_value(json_object_get(v, "name")), name) == 0)
			return json_equal(v, t) ? (int)i : -1;
	}
	json_array_append(merged, t);
	return (int)json_array_size(merged) - 1;
}

json_t *mr__ckpt_manifest_json(const struct mr_ckpt_job *job, long step, long opt_steps,
			       json_t *const *indexes, int n, struct mr_errbuf *eb)
{
	const struct mr_adamw_config *o = job->opt;
	json_t *tensors = json_array(), *shards = json_array(), *model, *doc;
	char *model_text;
	uint32_t crc;
	int r;

	for (r = 0; r < n; r++) {
		json_t *ts = json_object_get(indexes[r], "tensors"), *rs, *rec, *recs = json_array();
		int *map = calloc(json_array_size(ts) + 1, sizeof(int));
		size_t i;
		json_t *v;
		json_array_foreach(ts, i, v)
		{
			if ((map[i] = merge_tensor(tensors, v)) < 0) {
				mr_errf(eb, MR_ECORRUPT,
					"rank %d describes tensor '%s' unlike another rank", r,
					json_string_value(json_object_get(v, "name")));
				free(map);
				json_decref(recs);
				json_decref(tensors);
				json_decref(shards);
				return NULL;
			}
		}
		rs = json_object_get(indexes[r], "records");
		json_array_foreach(rs, i, rec)
		{
			json_t *c = json_copy(rec);
			json_array_set_new(c, 0,
					   json_integer(map[json_integer_value(json_array_get(rec, 0))]));
			json_array_append_new(recs, c);
		}
		free(map);
		json_array_append_new(shards,
				      json_pack("{s:O, s:O, s:O, s:o}", "file",
						json_object_get(indexes[r], "file"), "rank",
						json_object_get(indexes[r], "rank"), "bytes",
						json_object_get(indexes[r], "bytes"), "records", recs));
	}
	model = mr__ckpt_model_json(&job->m->cfg);
	model_text = json_dumps(model, JSON_COMPACT | JSON_SORT_KEYS);
	crc = model_text ? mr_crc32c(0, model_text, strlen(model_text)) : 0;
	free(model_text);
	doc = json_pack("{s:s, s:i, s:I, s:I, s:o, s:I,"
			" s:{s:i, s:i, s:i, s:I, s:I, s:f, s:f, s:i, s:f, s:f, s:f, s:f, s:f},"
			" s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i},"
			" s:{s:I, s:s?}, s:{s:I}, s:o, s:o}",
			"format", "meshrun-checkpoint", "version", MR_CKPT_VERSION, "step",
			(json_int_t)step, "optimizer_steps", (json_int_t)opt_steps, "model", model,
			"config_crc32c", (json_int_t)crc,
			"train", "batch_size", job->batch_size, "seq_len", job->seq_len,
			"grad_accum", job->grad_accum, "seed", (json_int_t)job->seed, "steps",
			(json_int_t)job->total_steps, "lr", (double)o->lr, "min_lr_frac",
			(double)o->min_lr_frac, "warmup_steps", o->warmup_steps, "beta1",
			(double)o->beta1, "beta2", (double)o->beta2, "eps", (double)o->eps,
			"weight_decay", (double)o->weight_decay, "grad_clip", (double)o->grad_clip,
			"mesh", "world", job->world, "tp", job->tp, "cp", job->cp, "dp", job->dp, "pp",
			job->pp, "ep", job->ep, "zero", job->zero,
			"data", "micro_batches",
			(json_int_t)((uint64_t)step * (uint64_t)job->dp * (uint64_t)job->grad_accum),
			"train_data", job->train_data, "rng", "seed", (json_int_t)job->seed, "tensors",
			tensors, "shards", shards);
	if (!doc)
		mr_errf(eb, MR_ENOMEM, "unable to build the manifest");
	return doc;
}

/* ---- reading ---- */

static int bad(struct mr_errbuf *eb, const char *dir, const char *why)
{
	return mr_errf(eb, MR_ECORRUPT, "'%s/manifest.json': %s", dir, why);
}

static int get_i(json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out)
{
	json_t *v = json_object_get(o, k);

	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
		return -1;
	*out = json_integer_value(v);
	return 0;
}

static int get_f(json_t *o, const char *k, float *out)
{
	json_t *v = json_object_get(o, k);

	if (!json_is_number(v))
		return -1;
	*out = (float)json_number_value(v);
	return 0;
}

#define GETI(o, k, lo, hi, dst)                                                  \
	do {                                                                     \
		int64_t v_;                                                      \
		if (get_i(o, k, lo, hi, &v_) < 0)                                \
			return bad(eb, mf->dir, "missing or invalid '" k "'");   \
		dst = v_;                                                        \
	} while (0)
#define GETF(o, k, dst)                                                          \
	do {                                                                     \
		if (get_f(o, k, &(dst)) < 0)                                     \
			return bad(eb, mf->dir, "missing or invalid '" k "'");   \
	} while (0)

static int parse_head(struct mr_ckpt_manifest *mf, json_t *doc, struct mr_errbuf *eb)
{
	json_t *mo = json_object_get(doc, "model"), *tr = json_object_get(doc, "train");
	json_t *me = json_object_get(doc, "mesh"), *da = json_object_get(doc, "data");
	const char *fmt = json_string_value(json_object_get(doc, "format"));
	const char *pol = json_string_value(json_object_get(mo, "moe_policy"));
	struct mr_errbuf ce = { "", "" };
	int64_t ver;

	if (!fmt || strcmp(fmt, "meshrun-checkpoint") != 0)
		return bad(eb, mf->dir, "not a meshrun checkpoint manifest ('format')");
	GETI(doc, "version", 1, 1 << 30, ver);
	if (ver != MR_CKPT_VERSION)
		return mr_errf(eb, MR_ENOTSUP, "'%s/manifest.json': version %lld, this build reads %d",
			       mf->dir, (long long)ver, MR_CKPT_VERSION);
	if (!json_is_object(mo) || !json_is_object(tr) || !json_is_object(me) ||
	    !json_is_object(da))
		return bad(eb, mf->dir, "'model', 'train', 'mesh' and 'data' must be objects");
	GETI(doc, "step", 0, INT64_MAX, mf->step);
	GETI(doc, "optimizer_steps", 0, INT64_MAX, mf->opt_steps);
	GETI(mo, "vocab_size", 1, 1 << 30, mf->model.vocab);
	GETI(mo, "max_seq", 1, 1 << 30, mf->model.max_seq);
	GETI(mo, "n_layer", 1, 1 << 20, mf->model.n_layer);
	GETI(mo, "d_model", 1, 1 << 20, mf->model.d_model);
	GETI(mo, "n_head", 1, 1 << 20, mf->model.n_head);
	GETI(mo, "moe_every", 0, 1 << 20, mf->model.moe_every);
	GETI(mo, "n_experts", 0, 1 << 20, mf->model.n_experts);
	GETI(mo, "top_k", 0, 16, mf->model.top_k);
	GETF(mo, "capacity_factor", mf->model.capacity_factor);
	GETF(mo, "aux_coef", mf->model.aux_coef);
	mf->model.moe_dropless = pol && !strcmp(pol, "dropless");
	if (mr_gpt_config_check(&mf->model, &ce) < 0)
		return mr_errf(eb, MR_ECORRUPT, "'%s/manifest.json': model: %s", mf->dir, ce.msg);
	GETI(tr, "batch_size", 1, 1 << 30, mf->batch_size);
	GETI(tr, "seq_len", 1, 1 << 30, mf->seq_len);
	GETI(tr, "grad_accum", 1, 1 << 30, mf->grad_accum);
	GETI(tr, "seed", 0, INT64_MAX, mf->seed);
	GETI(tr, "steps", 0, INT64_MAX, mf->total_steps);
	GETF(tr, "lr", mf->opt.lr);
	GETF(tr, "min_lr_frac", mf->opt.min_lr_frac);
	GETI(tr, "warmup_steps", 0, INT32_MAX, mf->opt.warmup_steps);
	GETF(tr, "beta1", mf->opt.beta1);
	GETF(tr, "beta2", mf->opt.beta2);
	GETF(tr, "eps", mf->opt.eps);
	GETF(tr, "weight_decay", mf->opt.weight_decay);
	GETF(tr, "grad_clip", mf->opt.grad_clip);
	mf->opt.total_steps = (int)mf->total_steps;
	GETI(me, "world", 1, 1 << 30, mf->world);
	GETI(me, "tp", 1, 1 << 20, mf->tp);
	GETI(me, "cp", 1, 1 << 20, mf->cp);
	GETI(me, "dp", 1, 1 << 30, mf->dp);
	GETI(me, "pp", 1, 1 << 20, mf->pp);
	GETI(me, "ep", 1, 1 << 20, mf->ep);
	GETI(me, "zero", 0, 3, mf->zero);
	GETI(da, "micro_batches", 0, INT64_MAX, mf->micro_batches);
	return 0;
}

static int parse_tensors(struct mr_ckpt_manifest *mf, json_t *ts, struct mr_errbuf *eb)
{
	size_t i;
	json_t *t;

	if (!json_is_array(ts) || json_array_size(ts) == 0 || json_array_size(ts) > 1u << 20)
		return bad(eb, mf->dir, "'tensors' must be a non-empty array");
	mf->ntensors = (int)json_array_size(ts);
	if (!(mf->tensors = calloc((size_t)mf->ntensors, sizeof(*mf->tensors))))
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
	json_array_foreach(ts, i, t)
	{
		struct mr_ckpt_tensor *d = &mf->tensors[i];
		const char *name = json_string_value(json_object_get(t, "name"));
		json_t *shape = json_object_get(t, "shape");
		int64_t v;
		if (!name || strlen(name) >= sizeof(d->name) || !json_is_array(shape) ||
		    json_array_size(shape) < 1 || json_array_size(shape) > 3)
			return bad(eb, mf->dir, "a tensor without a name or a 1-3 dim 'shape'");
		snprintf(d->name, sizeof(d->name), "%s", name);
		d->ndim = (int)json_array_size(shape);
		for (int k = 0; k < d->ndim; k++) {
			json_t *x = json_array_get(shape, (size_t)k);
			if (!json_is_integer(x) || json_integer_value(x) < 1 ||
			    json_integer_value(x) > 1 << 30)
				return bad(eb, mf->dir, "a tensor's 'shape' is not positive integers");
			d->full[k] = (int)json_integer_value(x);
		}
		GETI(t, "tp_dim", -1, d->ndim - 1, d->tp_dim);
		GETI(t, "parts", 1, 3, v);
		d->parts = (int)v;
		d->expert = json_is_true(json_object_get(t, "expert"));
	}
	return 0;
}

uint64_t mr__ckpt_full_n(const struct mr_ckpt_tensor *t)
{
	uint64_t n = 1;

	for (int k = 0; k < t->ndim; k++)
		n *= (uint64_t)t->full[k];
	return n;
}

uint64_t mr__ckpt_slice_n(const struct mr_ckpt_tensor *t, int tp, int ep)
{
	uint64_t n = 1;

	for (int k = 0; k < t->ndim; k++) {
		uint64_t d = (uint64_t)t->full[k];
		if (k == t->tp_dim && tp > 1)
			d = (d + (uint64_t)tp - 1) / (uint64_t)tp;
		if (k == 0 && t->expert && ep > 1)
			d /= (uint64_t)ep;
		n *= d;
	}
	return n;
}

static int parse_rec(struct mr_ckpt_manifest *mf, json_t *a, int shard, struct mr_ckpt_rec *r,
		     struct mr_errbuf *eb)
{
	int64_t v[REC_FIELDS];
	const struct mr_ckpt_tensor *t;

	if (!json_is_array(a) || json_array_size(a) != REC_FIELDS)
		return bad(eb, mf->dir, "a record is not an array of 10 integers");
	for (int k = 0; k < REC_FIELDS; k++) {
		json_t *x = json_array_get(a, (size_t)k);
		if (!json_is_integer(x))
			return bad(eb, mf->dir, "a record is not an array of 10 integers");
		v[k] = json_integer_value(x);
	}
	if (v[0] < 0 || v[0] >= mf->ntensors || v[1] < 0 || v[1] >= MR_CKPT_KINDS ||
	    v[3] < 1 || v[3] > 1 << 20 || v[2] < -1 || v[2] >= v[3] || v[5] < 1 ||
	    v[5] > 1 << 20 || v[4] < -1 || v[4] >= v[5] || v[6] < 0 || v[7] < 1 ||
	    v[8] < CKPT_HEADER || v[9] < 0 || v[9] > UINT32_MAX)
		return bad(eb, mf->dir, "a record field is out of range");
	t = &mf->tensors[v[0]];
	r->tensor = (int)v[0];
	r->kind = (int)v[1];
	r->tp_rank = (int)v[2];
	r->tp = (int)v[3];
	r->ep_rank = (int)v[4];
	r->ep = (int)v[5];
	r->at = (uint64_t)v[6];
	r->n = (uint64_t)v[7];
	r->offset = (uint64_t)v[8];
	r->crc = (uint32_t)v[9];
	r->shard = shard;
	if ((r->tp_rank < 0) != (t->tp_dim < 0 || r->tp == 1) ||
	    (r->ep_rank < 0) != (!t->expert || r->ep == 1))
		return mr_errf(eb, MR_ECORRUPT,
			       "'%s/manifest.json': a record of '%s' names a slice the tensor "
			       "does not have", mf->dir, t->name);
	if (r->at + r->n > mr__ckpt_slice_n(t, r->tp, r->ep) || r->n > CKPT_MAX_BYTES / sizeof(float))
		return mr_errf(eb, MR_ECORRUPT,
			       "'%s/manifest.json': a record of '%s' runs past its slice", mf->dir,
			       t->name);
	if (r->offset + r->n * sizeof(float) > mf->shards[shard].bytes)
		return mr_errf(eb, MR_ECORRUPT,
			       "'%s/manifest.json': a record of '%s' runs past the end of '%s'",
			       mf->dir, t->name, mf->shards[shard].file);
	return 0;
}

static int parse_shards(struct mr_ckpt_manifest *mf, json_t *ss, struct mr_errbuf *eb)
{
	size_t i, j, total = 0;
	json_t *s, *a;
	int rc;

	if (!json_is_array(ss) || json_array_size(ss) == 0 || json_array_size(ss) > 1u << 24)
		return bad(eb, mf->dir, "'shards' must be a non-empty array");
	json_array_foreach(ss, i, s) total += json_array_size(json_object_get(s, "records"));
	mf->nshards = (int)json_array_size(ss);
	mf->shards = calloc((size_t)mf->nshards, sizeof(*mf->shards));
	mf->recs = calloc(total ? total : 1, sizeof(*mf->recs));
	if (!mf->shards || !mf->recs)
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
	json_array_foreach(ss, i, s)
	{
		struct mr_ckpt_shard *sh = &mf->shards[i];
		const char *file = json_string_value(json_object_get(s, "file"));
		json_t *recs = json_object_get(s, "records");
		if (!file || strlen(file) >= sizeof(sh->file) || strchr(file, '/') ||
		    file[0] == '.' || !json_is_array(recs))
			return bad(eb, mf->dir, "a shard without a plain 'file' name or 'records'");
		snprintf(sh->file, sizeof(sh->file), "%s", file);
		GETI(s, "rank", 0, 1 << 30, sh->rank);
		GETI(s, "bytes", CKPT_HEADER, (int64_t)CKPT_MAX_BYTES, sh->bytes);
		json_array_foreach(recs, j, a)
		{
			if ((rc = parse_rec(mf, a, (int)i, &mf->recs[mf->nrecs], eb)) < 0)
				return rc;
			mf->nrecs++;
		}
	}
	return 0;
}

static int by_slice_then_at(const void *x, const void *y)
{
	const struct mr_ckpt_rec *a = x, *b = y;

	if (a->tensor != b->tensor)
		return a->tensor < b->tensor ? -1 : 1;
	if (a->kind != b->kind)
		return a->kind < b->kind ? -1 : 1;
	if (a->tp_rank != b->tp_rank)
		return a->tp_rank < b->tp_rank ? -1 : 1;
	if (a->ep_rank != b->ep_rank)
		return a->ep_rank < b->ep_rank ? -1 : 1;
	return a->at < b->at ? -1 : a->at > b->at;
}

/* Every kind a tensor has tiles each slice of one (tp, ep) layout exactly
 * - no gap, no overlap - and every tensor has its parameters. */
static int check_coverage(struct mr_ckpt_manifest *mf, struct mr_errbuf *eb)
{
	struct mr_ckpt_rec *r = malloc((size_t)(mf->nrecs ? mf->nrecs : 1) * sizeof(*r));
	unsigned char *params = calloc((size_t)mf->ntensors, 1);
	int i = 0, j, rc = 0;

	if (!r || !params) {
		free(r);
		free(params);
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
	}
	memcpy(r, mf->recs, (size_t)mf->nrecs * sizeof(*r));
	qsort(r, (size_t)mf->nrecs, sizeof(*r), by_slice_then_at);
	while (i < mf->nrecs && rc == 0) {
		/* one (tensor, kind): its slices in order, each tiled by `at` */
		const struct mr_ckpt_tensor *t = &mf->tensors[r[i].tensor];
		uint64_t slice = mr__ckpt_slice_n(t, r[i].tp, r[i].ep), end = 0;
		int slices = 0, want = r[i].tp * r[i].ep;
		for (j = i; j < mf->nrecs && r[j].tensor == r[i].tensor && r[j].kind == r[i].kind;
		     j++) {
			int first = j == i || r[j].tp_rank != r[j - 1].tp_rank ||
				    r[j].ep_rank != r[j - 1].ep_rank;
			if (r[j].tp != r[i].tp || r[j].ep != r[i].ep) {
				rc = mr_errf(eb, MR_ECORRUPT,
					     "'%s/manifest.json': tensor '%s' is saved in two layouts",
					     mf->dir, t->name);
				break;
			}
			if (first && j > i && end != slice)
				break;
			if (first) {
				slices++;
				end = 0;
			}
			if (r[j].at != end)
				break;
			end += r[j].n;
		}
		if (rc == 0 && (end != slice || slices != want ||
				(j < mf->nrecs && r[j].tensor == r[i].tensor && r[j].kind == r[i].kind)))
			rc = mr_errf(eb, MR_ECORRUPT,
				     "'%s/manifest.json': the records of tensor '%s' do not cover its "
				     "%d slice(s) of %llu elements exactly once (inconsistent manifest)",
				     mf->dir, t->name, want, (unsigned long long)slice);
		if (r[i].kind == MR_CKPT_PARAM)
			params[r[i].tensor] = 1;
		while (j < mf->nrecs && r[j].tensor == r[i].tensor && r[j].kind == r[i].kind)
			j++;
		i = j;
	}
	for (i = 0; i < mf->ntensors && rc == 0; i++)
		if (!params[i])
			rc = mr_errf(eb, MR_ECORRUPT,
				     "'%s/manifest.json': tensor '%s' has no parameters (inconsistent "
				     "manifest)", mf->dir, mf->tensors[i].name);
	free(r);
	free(params);
	return rc;
}

int mr_ckpt_manifest_read(struct mr_ckpt_manifest *mf, const char *dir, struct mr_errbuf *eb)
{
	char path[4200];
	json_error_t je;
	struct stat st;
	json_t *doc;
	int rc;

	memset(mf, 0, sizeof(*mf));
	snprintf(mf->dir, sizeof(mf->dir), "%s", dir);
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	if (stat(path, &st) == 0 && (uint64_t)st.st_size > CKPT_MAX_MANIFEST)
		return mr_errf(eb, MR_ELIMIT, "'%s' is %lld bytes, more than a manifest may be (%llu)",
			       path, (long long)st.st_size, (unsigned long long)CKPT_MAX_MANIFEST);
	doc = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!doc)
		return mr_errf(eb, MR_ECORRUPT, "'%s': %s (line %d)", path, je.text, je.line);
	if (!json_is_object(doc))
		rc = bad(eb, dir, "not a JSON object");
	else if ((rc = parse_head(mf, doc, eb)) == 0 &&
		 (rc = parse_tensors(mf, json_object_get(doc, "tensors"), eb)) == 0 &&
		 (rc = parse_shards(mf, json_object_get(doc, "shards"), eb)) == 0)
		rc = check_coverage(mf, eb);
	json_decref(doc);
	if (rc < 0)
		mr_ckpt_manifest_release(mf);
	return rc;
}

void mr_ckpt_manifest_release(struct mr_ckpt_manifest *mf)
{
	free(mf->tensors);
	free(mf->recs);
	free(mf->shards);
	mf->tensors = NULL;
	mf->recs = NULL;
	mf->shards = NULL;
	mf->ntensors = mf->nrecs = mf->nshards = 0;
}

int mr_ckpt_manifest_find(const struct mr_ckpt_manifest *mf, const char *name)
{
	for (int i = 0; i < mf->ntensors; i++)
		if (strcmp(mf->tensors[i].name, name) == 0)
			return i;
	return -1;
}

int mr_ckpt_list(const char *ckpt_dir, char ***dirs, int *n, struct mr_errbuf *eb)
{
	long steps[CKPT_MAX_STEPS];
	int k = mr__ckpt_steps(ckpt_dir, steps, CKPT_MAX_STEPS, eb), i;

	*dirs = NULL;
	*n = 0;
	if (k <= 0)
		return k;
	if (!(*dirs = calloc((size_t)k, sizeof(char *))))
		return mr_errf(eb, MR_ENOMEM, "out of memory listing '%s'", ckpt_dir);
	for (i = 0; i < k; i++) {
		char buf[4200];
		mr__ckpt_step_dir(buf, sizeof(buf), ckpt_dir, steps[i]);
		if (!((*dirs)[i] = strdup(buf))) {
			mr_ckpt_list_free(*dirs, i);
			*dirs = NULL;
			return mr_errf(eb, MR_ENOMEM, "out of memory listing '%s'", ckpt_dir);
		}
	}
	*n = k;
	return 0;
}

void mr_ckpt_list_free(char **dirs, int n)
{
	for (int i = 0; dirs && i < n; i++)
		free(dirs[i]);
	free(dirs);
}
