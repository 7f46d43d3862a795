/*
 * manifest_read.c - a manifest read back and checked against itself
 * before a single byte of a shard is trusted (see mr_ckpt.h,
 * docs/CHECKPOINTS.md "manifest.json").
 *
 * The file is mapped, not copied, and its seal checked first: the text
 * ends with ,"manifest_crc32c":N} and N is the CRC-32C of every byte
 * before that comma, so a flipped bit anywhere - the model section too -
 * makes the whole manifest "damaged", never "another model". The small
 * part (everything but "shards") is read with jansson; the shards and
 * their records, which are nearly all of a large manifest's bytes, are
 * read straight into struct mr_ckpt_rec by the scanner below, so reading
 * costs about the file's size again in records, not a DOM of a dozen
 * allocations per record.
 *
 * Non-goals: a general JSON parser (the scanner only skips what it does
 * not read, and reads integers and plain strings).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "mr_crc32c.h"

#define REC_FIELDS 10
#define SCAN_DEPTH 64
#define SEAL_KEY ",\"manifest_crc32c\":"

/* ---- the small part, through jansson ---- */

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
	const char *arch = json_string_value(json_object_get(mo, "arch"));
	const char *td = json_string_value(json_object_get(da, "train_data"));
	struct mr_errbuf ce = { "", "" };
	int64_t ver, crc;

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
	if (json_object_get(mo, "moe_norm_topk")) {
		if (!json_is_boolean(json_object_get(mo, "moe_norm_topk")))
			return bad(eb, mf->dir, "invalid 'moe_norm_topk'");
		mf->model.moe_norm_topk = json_is_true(json_object_get(mo, "moe_norm_topk")) ? 1 : -1;
	}
	if (arch && strcmp(arch, "gpt2") != 0) {
		int64_t v;
		if (strcmp(arch, "llama") != 0)
			return bad(eb, mf->dir, "unknown model family 'arch'");
		mf->model.arch = MR_ARCH_LLAMA;
		GETI(mo, "n_kv_head", 1, 1 << 20, mf->model.n_kv_head);
		GETI(mo, "ffn_hidden", 1, 1 << 30, mf->model.ffn_hidden);
		GETF(mo, "norm_eps", mf->model.norm_eps);
		GETF(mo, "rope_theta", mf->model.rope_theta);
		GETF(mo, "rope_scaling_factor", mf->model.rope_scaling.factor);
		GETF(mo, "rope_low_freq_factor", mf->model.rope_scaling.low_freq_factor);
		GETF(mo, "rope_high_freq_factor", mf->model.rope_scaling.high_freq_factor);
		GETI(mo, "rope_original_max_pos", 0, 1 << 30, v);
		mf->model.rope_scaling.original_max_pos = (int)v;
		if (!json_is_boolean(json_object_get(mo, "tie_embeddings")))
			return bad(eb, mf->dir, "missing or invalid 'tie_embeddings'");
		mf->model.tie_embeddings = json_is_true(json_object_get(mo, "tie_embeddings"));
	}
	GETI(doc, "config_crc32c", 0, UINT32_MAX, crc);
	if (mr__ckpt_model_crc(mo) != (uint32_t)crc)
		return bad(eb, mf->dir, "'config_crc32c' does not match 'model'");
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
	/* added later: a manifest without them trained the cosine schedule */
	if (json_object_get(tr, "lr_schedule") &&
	    mr_lr_schedule_parse(json_string_value(json_object_get(tr, "lr_schedule")),
				 &mf->opt.schedule) < 0)
		return bad(eb, mf->dir, "invalid 'lr_schedule'");
	if (json_object_get(tr, "decay_frac"))
		GETF(tr, "decay_frac", mf->opt.decay_frac);
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
	if (td && !(mf->train_data = strdup(td)))
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
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

/* ---- the scanner: a cursor over the mapped text ---- */

struct scan {
	const char *p, *end;
};

static void ws(struct scan *s)
{
	while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
		s->p++;
}

/* 1 and past c when c is next (after whitespace), else 0. */
static int eat(struct scan *s, char c)
{
	ws(s);
	if (s->p < s->end && *s->p == c) {
		s->p++;
		return 1;
	}
	return 0;
}

/* A string: *str its raw bytes (escapes left as they are), *n their
 * count, the cursor past its closing quote; -1 if none is next. */
static int string(struct scan *s, const char **str, size_t *n)
{
	const char *b;

	ws(s);
	if (s->p >= s->end || *s->p != '"')
		return -1;
	b = ++s->p;
	while (s->p < s->end && *s->p != '"') {
		if ((unsigned char)*s->p < 0x20)
			return -1;
		if (*s->p == '\\' && ++s->p >= s->end)
			return -1;
		s->p++;
	}
	if (s->p >= s->end)
		return -1;
	*str = b;
	*n = (size_t)(s->p++ - b);
	return 0;
}

/* Whether the raw string (str, n) is exactly the plain key k. */
static int is_key(const char *str, size_t n, const char *k)
{
	return n == strlen(k) && memcmp(str, k, n) == 0;
}

/* An integer without fraction or exponent into *v; -1 if none is next
 * or it does not fit int64. */
static int integer(struct scan *s, int64_t *v)
{
	uint64_t u = 0;
	int neg, digits = 0;

	ws(s);
	neg = s->p < s->end && *s->p == '-';
	s->p += neg;
	while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
		if (u > (UINT64_MAX - 9) / 10)
			return -1;
		u = u * 10 + (uint64_t)(*s->p++ - '0');
		digits++;
	}
	if (!digits || (s->p < s->end && (*s->p == '.' || *s->p == 'e' || *s->p == 'E')) ||
	    u > (uint64_t)INT64_MAX + (uint64_t)neg)
		return -1;
	*v = neg ? (int64_t)(0 - u) : (int64_t)u;
	return 0;
}

/* Past any one value; -1 at anything that is not one. */
static int skip(struct scan *s, int depth)
{
	const char *str;
	size_t n;
	char close;

	ws(s);
	if (s->p >= s->end || depth > SCAN_DEPTH)
		return -1;
	switch (*s->p) {
	case '"':
		return string(s, &str, &n);
	case '{':
	case '[':
		close = *s->p++ == '{' ? '}' : ']';
		if (eat(s, close))
			return 0;
		do {
			if (close == '}' && (string(s, &str, &n) < 0 || !eat(s, ':')))
				return -1;
			if (skip(s, depth + 1) < 0)
				return -1;
		} while (eat(s, ','));
		return eat(s, close) ? 0 : -1;
	case 't':
	case 'f':
	case 'n':
		n = *s->p == 'f' ? 5 : 4;
		if ((size_t)(s->end - s->p) < n ||
		    memcmp(s->p, *s->p == 't' ? "true" : *s->p == 'f' ? "false" : "null", n))
			return -1;
		s->p += n;
		return 0;
	default:
		if (*s->p != '-' && (*s->p < '0' || *s->p > '9'))
			return -1;
		while (s->p < s->end && strchr("+-.eE0123456789", *s->p))
			s->p++;
		return 0;
	}
}

/* The seal: text (n bytes) ends with ,"manifest_crc32c":N} and optional
 * whitespace, N the CRC-32C of every byte before the comma. */
static int check_seal(const struct mr_ckpt_manifest *mf, const char *text, size_t n,
		      struct mr_errbuf *eb)
{
	size_t k = sizeof(SEAL_KEY) - 1, at;
	struct scan s;
	int64_t crc;

	while (n > 0 && strchr(" \t\r\n", text[n - 1]))
		n--;
	if (n < k + 2 || text[n - 1] != '}')
		return bad(eb, mf->dir, "no seal at its end (written in part, or not by meshrun)");
	for (at = n - 2; at > 0 && text[at] >= '0' && text[at] <= '9'; at--)
		;
	at = at + 1 >= k ? at + 1 - k : 0;
	s.p = text + at + k;
	s.end = text + n - 1;
	if (memcmp(text + at, SEAL_KEY, k) != 0 || integer(&s, &crc) < 0 || s.p != s.end ||
	    crc > UINT32_MAX)
		return bad(eb, mf->dir, "no seal at its end (written in part, or not by meshrun)");
	if (mr_crc32c(0, text, at) != (uint32_t)crc)
		return bad(eb, mf->dir, "checksum mismatch: the manifest is damaged");
	return 0;
}

/* ---- shards and records ---- */

/* One record's 10 integers checked against its tensor (everything but
 * its shard's length, which the shard's "bytes" may follow). */
static int take_rec(struct mr_ckpt_manifest *mf, const int64_t *v, int shard,
		    struct mr_ckpt_rec *r, struct mr_errbuf *eb)
{
	const struct mr_ckpt_tensor *t;

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
	if (r->n > CKPT_MAX_BYTES / sizeof(float) || r->at + r->n > mr__ckpt_slice_n(t, r->tp, r->ep))
		return mr_errf(eb, MR_ECORRUPT,
			       "'%s/manifest.json': a record of '%s' runs past its slice", mf->dir,
			       t->name);
	return 0;
}

/* A shard's "records": [[10 integers], ...] appended to mf->recs. */
static int read_records(struct mr_ckpt_manifest *mf, struct scan *s, int shard, size_t *cap,
			struct mr_errbuf *eb)
{
	int64_t v[REC_FIELDS];
	int k, rc;

	if (!eat(s, '['))
		return bad(eb, mf->dir, "a shard's 'records' is not an array");
	if (eat(s, ']'))
		return 0;
	do {
		if (!eat(s, '['))
			return bad(eb, mf->dir, "a record is not an array of 10 integers");
		for (k = 0; k < REC_FIELDS; k++)
			if ((k && !eat(s, ',')) || integer(s, &v[k]) < 0)
				return bad(eb, mf->dir, "a record is not an array of 10 integers");
		if (!eat(s, ']'))
			return bad(eb, mf->dir, "a record is not an array of 10 integers");
		if ((size_t)mf->nrecs == *cap) {
			size_t grown = *cap ? *cap * 2 : 256;
			struct mr_ckpt_rec *g = grown <= INT32_MAX ? realloc(mf->recs, grown * sizeof(*g)) : NULL;
			if (!g)
				return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
			mf->recs = g;
			*cap = grown;
		}
		if ((rc = take_rec(mf, v, shard, &mf->recs[mf->nrecs], eb)) < 0)
			return rc;
		mf->nrecs++;
	} while (eat(s, ','));
	return eat(s, ']') ? 0 : bad(eb, mf->dir, "a record is not an array of 10 integers");
}

/* One shard object {"file", "rank", "bytes", "records"} (any order,
 * other members skipped) into mf->shards[i]. */
static int read_shard(struct mr_ckpt_manifest *mf, struct scan *s, int i, size_t *cap,
		      struct mr_errbuf *eb)
{
	struct mr_ckpt_shard *sh = &mf->shards[i];
	int first = mf->nrecs, seen = 0, r, rc;
	const char *key, *str;
	size_t n, len;
	int64_t v;

	if (!eat(s, '{'))
		return bad(eb, mf->dir, "a shard is not an object");
	if (!eat(s, '}'))
		do {
			if (string(s, &key, &n) < 0 || !eat(s, ':'))
				return bad(eb, mf->dir, "a shard is not an object");
			if (is_key(key, n, "file")) {
				if (string(s, &str, &len) < 0 || len == 0 || len >= sizeof(sh->file) ||
				    memchr(str, '/', len) || memchr(str, '\\', len) || str[0] == '.')
					return bad(eb, mf->dir, "a shard without a plain 'file' name");
				memcpy(sh->file, str, len);
				sh->file[len] = '\0';
				seen |= 1;
			} else if (is_key(key, n, "rank")) {
				if (integer(s, &v) < 0 || v < 0 || v > 1 << 30)
					return bad(eb, mf->dir, "missing or invalid 'rank'");
				sh->rank = (int)v;
				seen |= 2;
			} else if (is_key(key, n, "bytes")) {
				if (integer(s, &v) < 0 || v < CKPT_HEADER || (uint64_t)v > CKPT_MAX_BYTES)
					return bad(eb, mf->dir, "missing or invalid 'bytes'");
				sh->bytes = (uint64_t)v;
				seen |= 4;
			} else if (is_key(key, n, "records")) {
				if (seen & 8)
					return bad(eb, mf->dir, "a shard names 'records' twice");
				if ((rc = read_records(mf, s, i, cap, eb)) < 0)
					return rc;
				seen |= 8;
			} else if (skip(s, 2) < 0) {
				return bad(eb, mf->dir, "not valid JSON in 'shards'");
			}
		} while (eat(s, ','));
	if (!eat(s, '}'))
		return bad(eb, mf->dir, "a shard is not an object");
	if (seen != 15)
		return bad(eb, mf->dir, "a shard without 'file', 'rank', 'bytes' and 'records'");
	for (r = first; r < mf->nrecs; r++)
		if (mf->recs[r].offset + mf->recs[r].n * sizeof(float) > sh->bytes)
			return mr_errf(eb, MR_ECORRUPT,
				       "'%s/manifest.json': a record of '%s' runs past the end of '%s'",
				       mf->dir, mf->tensors[mf->recs[r].tensor].name, sh->file);
	return 0;
}

/* "shards": [shard, ...] from the text of its value. */
static int read_shards(struct mr_ckpt_manifest *mf, struct scan *s, struct mr_errbuf *eb)
{
	struct scan count = *s;
	size_t cap = 0;
	int n = 0, rc;

	/* the shards are counted first (skipping each): one allocation */
	if (!eat(&count, '['))
		return bad(eb, mf->dir, "'shards' must be a non-empty array");
	if (!eat(&count, ']'))
		do {
			if (skip(&count, 1) < 0 || ++n > 1 << 24)
				return bad(eb, mf->dir, "'shards' must be a non-empty array");
		} while (eat(&count, ','));
	if (n == 0)
		return bad(eb, mf->dir, "'shards' must be a non-empty array");
	if (!(mf->shards = calloc((size_t)n, sizeof(*mf->shards))))
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
	mf->nshards = n;
	eat(s, '[');
	for (int i = 0; i < n; i++) {
		if (i && !eat(s, ','))
			return bad(eb, mf->dir, "not valid JSON in 'shards'");
		if ((rc = read_shard(mf, s, i, &cap, eb)) < 0)
			return rc;
	}
	return 0;
}

/* ---- the manifest against itself ---- */

static int by_shard_then_offset(const void *x, const void *y, void *arg)
{
	const struct mr_ckpt_rec *recs = arg, *a = &recs[*(const int *)x], *b = &recs[*(const int *)y];

	if (a->shard != b->shard)
		return a->shard < b->shard ? -1 : 1;
	return a->offset < b->offset ? -1 : a->offset > b->offset;
}

static int by_slice_then_at(const void *x, const void *y, void *arg)
{
	const struct mr_ckpt_rec *recs = arg, *a = &recs[*(const int *)x], *b = &recs[*(const int *)y];

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

/* The records of one shard do not overlap in its file: each byte of a
 * shard belongs to at most one record. ix: nrecs record numbers. */
static int check_offsets(const struct mr_ckpt_manifest *mf, int *ix, struct mr_errbuf *eb)
{
	const struct mr_ckpt_rec *r = mf->recs;

	qsort_r(ix, (size_t)mf->nrecs, sizeof(*ix), by_shard_then_offset, mf->recs);
	for (int i = 1; i < mf->nrecs; i++) {
		const struct mr_ckpt_rec *a = &r[ix[i - 1]], *b = &r[ix[i]];
		if (a->shard == b->shard && a->offset + a->n * sizeof(float) > b->offset)
			return mr_errf(eb, MR_ECORRUPT,
				       "'%s/manifest.json': records at bytes %llu and %llu of '%s' "
				       "overlap (inconsistent manifest)", mf->dir,
				       (unsigned long long)a->offset, (unsigned long long)b->offset,
				       mf->shards[a->shard].file);
	}
	return 0;
}

/* Every kind a tensor has tiles each slice of one (tp, ep) layout exactly
 * - no gap, no overlap - and every tensor has its parameters. */
static int check_coverage(const struct mr_ckpt_manifest *mf, int *ix, struct mr_errbuf *eb)
{
	const struct mr_ckpt_rec *rec = mf->recs;
	unsigned char *params = calloc((size_t)mf->ntensors, 1);
	int i = 0, j, rc = 0;

	if (!params)
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
	qsort_r(ix, (size_t)mf->nrecs, sizeof(*ix), by_slice_then_at, mf->recs);
#define R(k) (&rec[ix[k]])
	while (i < mf->nrecs && rc == 0) {
		/* one (tensor, kind): its slices in order, each tiled by `at` */
		const struct mr_ckpt_tensor *t = &mf->tensors[R(i)->tensor];
		uint64_t slice = mr__ckpt_slice_n(t, R(i)->tp, R(i)->ep), end = 0;
		int slices = 0, want = R(i)->tp * R(i)->ep;
		for (j = i; j < mf->nrecs && R(j)->tensor == R(i)->tensor && R(j)->kind == R(i)->kind;
		     j++) {
			int first = j == i || R(j)->tp_rank != R(j - 1)->tp_rank ||
				    R(j)->ep_rank != R(j - 1)->ep_rank;
			if (R(j)->tp != R(i)->tp || R(j)->ep != R(i)->ep) {
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
			if (R(j)->at != end)
				break;
			end += R(j)->n;
		}
		if (rc == 0 && (end != slice || slices != want ||
				(j < mf->nrecs && R(j)->tensor == R(i)->tensor &&
				 R(j)->kind == R(i)->kind)))
			rc = mr_errf(eb, MR_ECORRUPT,
				     "'%s/manifest.json': the records of tensor '%s' do not cover its "
				     "%d slice(s) of %llu elements exactly once (inconsistent manifest)",
				     mf->dir, t->name, want, (unsigned long long)slice);
		if (R(i)->kind == MR_CKPT_PARAM)
			params[R(i)->tensor] = 1;
		while (j < mf->nrecs && R(j)->tensor == R(i)->tensor && R(j)->kind == R(i)->kind)
			j++;
		i = j;
	}
#undef R
	for (i = 0; i < mf->ntensors && rc == 0; i++)
		if (!params[i])
			rc = mr_errf(eb, MR_ECORRUPT,
				     "'%s/manifest.json': tensor '%s' has no parameters (inconsistent "
				     "manifest)", mf->dir, mf->tensors[i].name);
	free(params);
	return rc;
}

/* ---- the whole ---- */

/* The top-level object's "shards" value as [*at, *end) of text; -1 when
 * the text is not one object naming "shards" exactly once. */
static int find_shards(const char *text, size_t n, size_t *at, size_t *end)
{
	struct scan s = { text, text + n };
	const char *key;
	size_t kn;
	int found = 0, is_shards;

	if (!eat(&s, '{') || eat(&s, '}'))
		return -1;
	do {
		if (string(&s, &key, &kn) < 0 || !eat(&s, ':'))
			return -1;
		ws(&s);
		is_shards = is_key(key, kn, "shards");
		if (is_shards && found++)
			return -1;
		if (is_shards)
			*at = (size_t)(s.p - text);
		if (skip(&s, 1) < 0)
			return -1;
		if (is_shards)
			*end = (size_t)(s.p - text);
	} while (eat(&s, ','));
	if (!eat(&s, '}'))
		return -1;
	ws(&s);
	return found == 1 && s.p == s.end ? 0 : -1;
}

/* Everything but "shards" (its value read as []) into a jansson document. */
static int read_rest(struct mr_ckpt_manifest *mf, const char *text, size_t n, size_t at,
		     size_t end, json_t **doc, struct mr_errbuf *eb)
{
	size_t len = at + 2 + (n - end);
	json_error_t je;
	char *rest;

	if (len > CKPT_MAX_REST)
		return mr_errf(eb, MR_ELIMIT,
			       "'%s/manifest.json': %zu bytes besides 'shards', more than a "
			       "manifest may hold (%d)", mf->dir, len, CKPT_MAX_REST);
	if (!(rest = malloc(len)))
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", mf->dir);
	memcpy(rest, text, at);
	memcpy(rest + at, "[]", 2);
	memcpy(rest + at + 2, text + end, n - end);
	*doc = json_loadb(rest, len, JSON_REJECT_DUPLICATES, &je);
	free(rest);
	if (!*doc)
		return mr_errf(eb, MR_ECORRUPT, "'%s/manifest.json': %s", mf->dir, je.text);
	return 0;
}

int mr_ckpt_manifest_read(struct mr_ckpt_manifest *mf, const char *dir, struct mr_errbuf *eb)
{
	char path[4200], *text;
	size_t n = 0, at = 0, end = 0;
	json_t *doc = NULL;
	struct scan s;
	int fd, rc, *ix = NULL;

	memset(mf, 0, sizeof(*mf));
	snprintf(mf->dir, sizeof(mf->dir), "%s", dir);
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	if ((fd = mr_file_open_regular(path, NULL, &n, eb)) < 0)
		return fd;
	if (n == 0 || n > CKPT_MAX_MANIFEST) {
		close(fd);
		return n ? mr_errf(eb, MR_ELIMIT, "'%s' is %zu bytes, more than a manifest may be "
				   "(%llu)", path, n, (unsigned long long)CKPT_MAX_MANIFEST)
			 : bad(eb, dir, "empty");
	}
	text = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (text == MAP_FAILED)
		return mr_errf(eb, MR_EIO, "unable to map '%s': %s", path, strerror(errno));
	if ((rc = check_seal(mf, text, n, eb)) < 0)
		goto out;
	if (find_shards(text, n, &at, &end) < 0) {
		rc = bad(eb, dir, "not one JSON object with one 'shards'");
		goto out;
	}
	if ((rc = read_rest(mf, text, n, at, end, &doc, eb)) < 0 ||
	    (rc = parse_head(mf, doc, eb)) < 0 ||
	    (rc = parse_tensors(mf, json_object_get(doc, "tensors"), eb)) < 0)
		goto out;
	s.p = text + at;
	s.end = text + end;
	if ((rc = read_shards(mf, &s, eb)) < 0)
		goto out;
	if (!(ix = malloc((size_t)(mf->nrecs ? mf->nrecs : 1) * sizeof(*ix)))) {
		rc = mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", dir);
		goto out;
	}
	for (int i = 0; i < mf->nrecs; i++)
		ix[i] = i;
	if ((rc = check_offsets(mf, ix, eb)) == 0)
		rc = check_coverage(mf, ix, eb);
out:
	free(ix);
	json_decref(doc);
	munmap(text, n);
	if (rc < 0)
		mr_ckpt_manifest_release(mf);
	return rc;
}
