/*
 * tokenizer.c - reading a Hugging Face tokenizer.json into a byte-level
 * BPE tokenizer (see mr_tokenizer.h for what is read and what is refused).
 * Encoding and decoding are in tokenizer_bpe.c.
 *
 * Format facts (the tokenizers library's serialization): model.vocab is an
 * object of token -> id; model.merges a list whose index is the merge's
 * rank, each entry "a b" (older files) or ["a", "b"] (tokenizers >= 0.20);
 * added_tokens a list of {id, content, special, ...}; pre_tokenizer and
 * decoder objects tagged by "type".
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/tokenizer_int.h"
#include "mr_file.h"

/* ---- GPT-2's byte <-> unicode table --------------------------------------- */

static int byte_is_printable(unsigned b)
{
	return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

/* The 68 other bytes, in order, are U+0100 onward: 0x00..0x20 (33), then
 * 0x7F..0xA0 (34), then 0xAD. */
uint32_t mr__tk_byte_cp(unsigned b)
{
	if (byte_is_printable(b))
		return b;
	if (b <= 0x20)
		return 256 + b;
	if (b <= 0xA0)
		return 256 + 33 + (b - 0x7F);
	return 256 + 67; /* 0xAD */
}

int mr__tk_cp_byte(uint32_t cp)
{
	if (cp < 256)
		return byte_is_printable(cp) ? (int)cp : -1;
	if (cp < 256 + 33)
		return (int)(cp - 256);
	if (cp < 256 + 67)
		return (int)(cp - 256 - 33 + 0x7F);
	return cp == 256 + 67 ? 0xAD : -1;
}

size_t mr__tk_utf8_put(uint32_t cp, char *out)
{
	unsigned char *o = (unsigned char *)out;

	if (cp < 0x80) {
		o[0] = (unsigned char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (unsigned char)(0xC0 | cp >> 6);
		o[1] = (unsigned char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (unsigned char)(0xE0 | cp >> 12);
		o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (unsigned char)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (unsigned char)(0xF0 | cp >> 18);
	o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
	o[3] = (unsigned char)(0x80 | (cp & 0x3F));
	return 4;
}

/* Next code point of the valid UTF-8 s[*i..n) (jansson strings are). */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *i)
{
	uint32_t c = s[(*i)++];
	int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;

	c &= more == 3 ? 0x07 : more == 2 ? 0x0F : more == 1 ? 0x1F : 0x7F;
	while (more-- > 0 && *i < n)
		c = c << 6 | (s[(*i)++] & 0x3F);
	return c;
}

/* ---- merge table ------------------------------------------------------------- */

static size_t merge_slot(uint32_t a, uint32_t b, size_t mask)
{
	uint64_t h = ((uint64_t)a << 32 | b) * 0x9E3779B97F4A7C15ull;

	return (size_t)(h >> 20) & mask;
}

const struct mr__tk_merge *mr__tk_merge_find(const struct mr_tokenizer *t, uint32_t a,
					     uint32_t b)
{
	size_t mask = t->mcap - 1, i;

	if (!t->mcap)
		return NULL;
	for (i = merge_slot(a, b, mask);; i = (i + 1) & mask) {
		const struct mr__tk_merge *m = &t->merge[i];

		if (m->rank == UINT32_MAX)
			return NULL;
		if (m->a == a && m->b == b)
			return m;
	}
}

/* Inserts (a, b) unless present (the first, lowest rank, wins). */
static void merge_put(struct mr_tokenizer *t, uint32_t a, uint32_t b, uint32_t rank,
		      uint32_t id)
{
	size_t mask = t->mcap - 1, i;

	for (i = merge_slot(a, b, mask); t->merge[i].rank != UINT32_MAX; i = (i + 1) & mask)
		if (t->merge[i].a == a && t->merge[i].b == b)
			return;
	t->merge[i] = (struct mr__tk_merge){ a, b, rank, id };
}

/* ---- loading ------------------------------------------------------------------- */

static int vocab_id(const struct mr_tokenizer *t, const char *s)
{
	uintptr_t v = (uintptr_t)mr_dict_get(&t->vocab, s);

	return v ? (int)(v - 1) : -1;
}

/* The bytes a vocab string stands for (GPT-2's table backwards; a code
 * point outside it stands for its own UTF-8). */
static int set_bytes(struct mr_tokenizer *t, int id, const char *s, int byte_level)
{
	size_t n = strlen(s), i = 0, k = 0;
	char *b = malloc(n + 1);

	if (!b)
		return MR_ENOMEM;
	while (i < n) {
		size_t at = i;
		uint32_t cp = utf8_next((const unsigned char *)s, n, &i);
		int byte = byte_level ? mr__tk_cp_byte(cp) : -1;

		if (byte >= 0) {
			b[k++] = (char)byte;
		} else {
			memcpy(b + k, s + at, i - at);
			k += i - at;
		}
	}
	b[k] = '\0';
	free(t->bytes[id]);
	t->bytes[id] = b;
	t->blen[id] = (uint32_t)k;
	return 0;
}

static int load_vocab(struct mr_tokenizer *t, json_t *vocab, json_t *added,
		      struct mr_errbuf *eb)
{
	const char *key;
	json_t *v;
	size_t i;
	int max = -1;

	json_object_foreach(vocab, key, v) {
		json_int_t id = json_integer_value(v);

		if (!json_is_integer(v) || id < 0 || id >= MR_TOKENIZER_MAX_VOCAB)
			return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': vocab entry '%s' has no id "
				       "in [0, %d)", t->path, key, MR_TOKENIZER_MAX_VOCAB);
		max = (int)id > max ? (int)id : max;
	}
	json_array_foreach(added, i, v) {
		json_t *id = json_object_get(v, "id");
		const char *c = json_string_value(json_object_get(v, "content"));

		if (!json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) >= MR_TOKENIZER_MAX_VOCAB || !c || !*c)
			return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': added_tokens[%zu] needs an "
				       "id in [0, %d) and a non-empty content", t->path, i,
				       MR_TOKENIZER_MAX_VOCAB);
		max = (int)json_integer_value(id) > max ? (int)json_integer_value(id) : max;
	}
	if (max < 0)
		return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': empty vocabulary", t->path);
	t->nid = max + 1;
	t->bytes = calloc((size_t)t->nid, sizeof(*t->bytes));
	t->blen = calloc((size_t)t->nid, sizeof(*t->blen));
	if (!t->bytes || !t->blen)
		return mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", t->path);
	json_object_foreach(vocab, key, v) {
		int id = (int)json_integer_value(v);

		if (mr_dict_put(&t->vocab, key, (void *)(uintptr_t)(id + 1), NULL) < 0 ||
		    (!t->bytes[id] && set_bytes(t, id, key, 1) < 0))
			return mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", t->path);
	}
	t->nadded = json_array_size(added);
	t->added = calloc(t->nadded + 1, sizeof(*t->added));
	if (!t->added)
		return mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", t->path);
	json_array_foreach(added, i, v) {
		const char *c = json_string_value(json_object_get(v, "content"));
		int id = (int)json_integer_value(json_object_get(v, "id"));

		t->added[i].id = (uint32_t)id;
		t->added[i].len = strlen(c);
		if (!(t->added[i].s = strdup(c)) || set_bytes(t, id, c, 0) < 0)
			return mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", t->path);
		t->added_first[(unsigned char)c[0]] = 1;
	}
	return 0;
}

static int cmp_added(const void *a, const void *b)
{
	const struct mr__tk_added *x = a, *y = b;

	return x->len != y->len ? (x->len < y->len ? 1 : -1) : strcmp(x->s, y->s);
}

/* merges[i]: "a b" or ["a", "b"]; both halves and their concatenation
 * must be vocab tokens. */
static int load_merges(struct mr_tokenizer *t, json_t *merges, struct mr_errbuf *eb)
{
	size_t n = json_array_size(merges), i;
	char buf[1024];
	json_t *m;

	for (t->mcap = 16; t->mcap < 2 * n; t->mcap *= 2)
		;
	t->merge = malloc(t->mcap * sizeof(*t->merge));
	if (!t->merge)
		return mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", t->path);
	for (i = 0; i < t->mcap; i++)
		t->merge[i].rank = UINT32_MAX;
	json_array_foreach(merges, i, m) {
		const char *a = NULL, *b = NULL, *sp;
		size_t la = 0;
		int ia, ib, ic;

		if (json_is_string(m) && (sp = strchr(json_string_value(m), ' ')) &&
		    !strchr(sp + 1, ' ')) {
			a = json_string_value(m);
			la = (size_t)(sp - a);
			b = sp + 1;
		} else if (json_is_array(m) && json_array_size(m) == 2 &&
			   json_is_string(json_array_get(m, 0)) &&
			   json_is_string(json_array_get(m, 1))) {
			a = json_string_value(json_array_get(m, 0));
			la = strlen(a);
			b = json_string_value(json_array_get(m, 1));
		}
		if (!a || !la || !*b || la + strlen(b) >= sizeof(buf))
			return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': merges[%zu] is neither "
				       "\"a b\" nor [\"a\", \"b\"] of two tokens", t->path, i);
		memcpy(buf, a, la);
		buf[la] = '\0';
		ia = vocab_id(t, buf);
		ib = vocab_id(t, b);
		snprintf(buf + la, sizeof(buf) - la, "%s", b);
		ic = vocab_id(t, buf);
		if (ia < 0 || ib < 0 || ic < 0) {
			buf[la] = '\0';
			return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': merges[%zu] ('%s' '%s') "
				       "names a token not in the vocab", t->path, i, buf, b);
		}
		merge_put(t, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)ic);
	}
	return 0;
}

static int add_regex(struct mr_tokenizer *t, struct mr__tk_step *st, const char *pat,
		     int literal, struct mr_errbuf *eb)
{
	int err;
	PCRE2_SIZE off;
	PCRE2_UCHAR msg[160];

	st->re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
			       literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP, &err, &off,
			       NULL);
	if (!st->re) {
		pcre2_get_error_message(err, msg, sizeof(msg));
		return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': pre_tokenizer regex '%s' does not "
			       "compile: %s at offset %zu", t->path, pat, (char *)msg, (size_t)off);
	}
	pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE); /* faster when it works; optional */
	return 0;
}

static int load_pretok(struct mr_tokenizer *t, json_t *p, struct mr_errbuf *eb)
{
	const char *type = json_string_value(json_object_get(p, "type"));
	struct mr__tk_step *st;

	if (type && !strcmp(type, "Sequence")) {
		json_t *each;
		size_t i;
		int rc;

		json_array_foreach(json_object_get(p, "pretokenizers"), i, each)
			if ((rc = load_pretok(t, each, eb)) < 0)
				return rc;
		return 0;
	}
	if (t->nstep == MR__TK_MAX_STEPS)
		return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': more than %d pre-tokenizers",
			       t->path, MR__TK_MAX_STEPS);
	if (t->nstep && t->step[t->nstep - 1].byte_level)
		return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': a pre-tokenizer after ByteLevel "
			       "is not supported", t->path);
	st = &t->step[t->nstep++];
	if (type && !strcmp(type, "ByteLevel")) {
		st->byte_level = 1;
		st->prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
		if (json_is_false(json_object_get(p, "use_regex")))
			return 0;
		st->behavior = MR__TK_ISOLATED;
		return add_regex(t, st, MR_TOKENIZER_GPT2_REGEX, 0, eb);
	}
	if (type && !strcmp(type, "Split")) {
		json_t *pat = json_object_get(p, "pattern");
		const char *beh = json_string_value(json_object_get(p, "behavior"));
		const char *rx = json_string_value(json_object_get(pat, "Regex"));
		const char *lit = json_string_value(json_object_get(pat, "String"));

		if (json_is_true(json_object_get(p, "invert")))
			return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': Split with invert is not "
				       "supported", t->path);
		if (!beh || !strcmp(beh, "Isolated"))
			st->behavior = MR__TK_ISOLATED;
		else if (!strcmp(beh, "Removed"))
			st->behavior = MR__TK_REMOVED;
		else if (!strcmp(beh, "MergedWithPrevious"))
			st->behavior = MR__TK_MERGED_PREV;
		else if (!strcmp(beh, "MergedWithNext"))
			st->behavior = MR__TK_MERGED_NEXT;
		else
			return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': Split behavior '%s' is not "
				       "supported", t->path, beh);
		if (!rx && !lit)
			return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': Split without a Regex or "
				       "String pattern", t->path);
		return add_regex(t, st, rx ? rx : lit, !rx, eb);
	}
	return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': pre_tokenizer '%s' is not supported "
		       "(ByteLevel, Split, Sequence)", t->path, type ? type : "(no type)");
}

/* The model's options this module cannot honour. */
static int check_model(struct mr_tokenizer *t, json_t *model, struct mr_errbuf *eb)
{
	const char *type = json_string_value(json_object_get(model, "type"));
	json_t *d = json_object_get(model, "dropout");
	const char *pre = json_string_value(json_object_get(model, "continuing_subword_prefix"));
	const char *suf = json_string_value(json_object_get(model, "end_of_word_suffix"));

	if (!json_is_object(model) || !type || strcmp(type, "BPE"))
		return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': model type '%s' is not BPE",
			       t->path, type ? type : "(none)");
	if (!json_is_object(json_object_get(model, "vocab")))
		return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': model.vocab is missing", t->path);
	if (!json_is_array(json_object_get(model, "merges")))
		return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': model.merges is missing",
			       t->path);
	if ((d && !json_is_null(d) && json_number_value(d) != 0.0) ||
	    json_is_true(json_object_get(model, "byte_fallback")) || (pre && *pre) ||
	    (suf && *suf))
		return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': BPE dropout, byte_fallback, "
			       "continuing_subword_prefix and end_of_word_suffix are not supported",
			       t->path);
	t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
	return 0;
}

static int load_json(struct mr_tokenizer *t, json_t *root, struct mr_errbuf *eb)
{
	json_t *model = json_object_get(root, "model"), *added, *norm, *pre, *dec;
	const char *dtype;
	int rc, byte_level = 0;

	added = json_object_get(root, "added_tokens");
	norm = json_object_get(root, "normalizer");
	pre = json_object_get(root, "pre_tokenizer");
	dec = json_object_get(root, "decoder");
	if (!json_is_object(root))
		return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': not a JSON object", t->path);
	if ((rc = check_model(t, model, eb)) < 0)
		return rc;
	if (norm && !json_is_null(norm))
		return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': normalizer '%s' is not supported "
			       "(null only)", t->path,
			       json_string_value(json_object_get(norm, "type")) ?
				       json_string_value(json_object_get(norm, "type")) : "?");
	dtype = json_string_value(json_object_get(dec, "type"));
	if (dec && !json_is_null(dec) && (!dtype || strcmp(dtype, "ByteLevel")))
		return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': decoder '%s' is not supported "
			       "(ByteLevel only)", t->path, dtype ? dtype : "?");
	if (added && !json_is_null(added) && !json_is_array(added))
		return mr_errf(eb, MR_ECORRUPT, "tokenizer '%s': added_tokens is not a list",
			       t->path);
	if (!json_is_object(pre))
		return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': no pre_tokenizer (a byte-level "
			       "BPE has ByteLevel)", t->path);
	if ((rc = load_pretok(t, pre, eb)) < 0)
		return rc;
	for (int i = 0; i < t->nstep; i++)
		byte_level |= t->step[i].byte_level;
	if (!byte_level)
		return mr_errf(eb, MR_ENOTSUP, "tokenizer '%s': no ByteLevel pre-tokenizer: not a "
			       "byte-level BPE", t->path);
	if ((rc = load_vocab(t, json_object_get(model, "vocab"), added, eb)) < 0)
		return rc;
	qsort(t->added, t->nadded, sizeof(*t->added), cmp_added);
	for (unsigned b = 0; b < 256; b++) {
		char s[4];

		s[mr__tk_utf8_put(mr__tk_byte_cp(b), s)] = '\0';
		t->byte_id[b] = vocab_id(t, s);
	}
	return load_merges(t, json_object_get(model, "merges"), eb);
}

int mr_tokenizer_load(struct mr_tokenizer **out, const char *path, struct mr_errbuf *eb)
{
	struct mr_tokenizer *t;
	json_error_t jerr;
	json_t *root = NULL;
	size_t size = 0, got = 0;
	ssize_t r;
	char *buf;
	int fd, rc;

	*out = NULL;
	if ((fd = mr_file_open_regular(path, "tokenizer", &size, eb)) < 0)
		return fd;
	if (size > MR_TOKENIZER_MAX_FILE) {
		close(fd);
		return mr_errf(eb, MR_ELIMIT, "tokenizer '%s': %zu bytes, more than %zu", path,
			       size, MR_TOKENIZER_MAX_FILE);
	}
	/* read whole, then parsed from memory (jansson reads a descriptor a
	 * byte per system call) */
	if (!(buf = malloc(size + 1))) {
		close(fd);
		return mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", path);
	}
	while (got < size && (r = read(fd, buf + got, size - got)) > 0)
		got += (size_t)r;
	close(fd);
	if (got != size) {
		free(buf);
		return mr_errf(eb, MR_EIO, "tokenizer '%s': short read (%zu of %zu bytes)", path, got,
			       size);
	}
	root = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &jerr);
	free(buf);
	if (!root)
		return mr_errf(eb, MR_EPARSE, "tokenizer '%s': not JSON: line %d: %s", path,
			       jerr.line, jerr.text);
	t = calloc(1, sizeof(*t));
	if (!t) {
		json_decref(root);
		return mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", path);
	}
	snprintf(t->path, sizeof(t->path), "%s", path);
	mr_dict_init(&t->vocab, MR_DICT_COPY_KEYS);
	rc = load_json(t, root, eb);
	json_decref(root);
	if (rc < 0) {
		mr_tokenizer_free(t);
		return rc;
	}
	*out = t;
	return 0;
}

int mr_tokenizer_vocab_size(const struct mr_tokenizer *t)
{
	return t->nid;
}

int mr_tokenizer_added_id(const struct mr_tokenizer *t, const char *name)
{
	for (size_t i = 0; i < t->nadded; i++)
		if (!strcmp(t->added[i].s, name))
			return (int)t->added[i].id;
	return -1;
}

void mr_tokenizer_free(struct mr_tokenizer *t)
{
	if (!t)
		return;
	for (int i = 0; t->bytes && i < t->nid; i++)
		free(t->bytes[i]);
	free(t->bytes);
	free(t->blen);
	mr_dict_release(&t->vocab, NULL);
	free(t->merge);
	for (size_t i = 0; t->added && i < t->nadded; i++)
		free(t->added[i].s);
	free(t->added);
	for (int i = 0; i < t->nstep; i++)
		pcre2_code_free(t->step[i].re);
	free(t);
}
