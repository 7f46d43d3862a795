/*
 * tokenizer_bpe.c - encoding and decoding with a loaded tokenizer (see
 * mr_tokenizer.h): added tokens, the pre-tokenizer steps, BPE per word.
 *
 * BPE on a word of n symbols is O(n log n): the symbols are a linked list,
 * the candidate pairs a min-heap ordered by (merge rank, position), and a
 * popped pair whose symbols changed since it was pushed is skipped - the
 * same order as merging the lowest-rank adjacent pair, leftmost first,
 * until none is left.
 */
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_int.h"

#define CACHE_MAX_WORD 255        /* longer words are not cached */
#define CACHE_MAX_ENTRIES (1 << 16) /* then the cache starts over */

struct ids {
	uint32_t *v;
	size_t n, cap;
};

struct cached {
	size_t n;
	uint32_t id[];
};

/* one encode call's state */
struct enc {
	const struct mr_tokenizer *t;
	struct ids out;
	struct mr_dict cache;          /* word -> struct cached */
	pcre2_match_data *md[MR__TK_MAX_STEPS];
	struct mr_errbuf *eb;
	/* BPE scratch, grown to the longest word */
	uint32_t *sym;
	int *prev, *next;
	struct pair { uint32_t rank; int pos; uint32_t a, b; } *heap;
	size_t scratch, nheap;
};

static int push_ids(struct enc *e, const uint32_t *v, size_t n)
{
	if (e->out.n + n > e->out.cap) {
		size_t cap = e->out.cap ? e->out.cap : 1024;
		uint32_t *p;

		while (cap < e->out.n + n)
			cap *= 2;
		if (!(p = realloc(e->out.v, cap * sizeof(*p))))
			return mr_errf(e->eb, MR_ENOMEM, "tokenizer '%s': out of memory", e->t->path);
		e->out.v = p;
		e->out.cap = cap;
	}
	memcpy(e->out.v + e->out.n, v, n * sizeof(*v));
	e->out.n += n;
	return 0;
}

/* ---- BPE ----------------------------------------------------------------------- */

static int grow_scratch(struct enc *e, size_t n)
{
	void *a, *b, *c, *d;

	if (n <= e->scratch)
		return 0;
	a = realloc(e->sym, n * sizeof(*e->sym));
	if (a)
		e->sym = a;
	b = realloc(e->prev, n * sizeof(*e->prev));
	if (b)
		e->prev = b;
	c = realloc(e->next, n * sizeof(*e->next));
	if (c)
		e->next = c;
	d = realloc(e->heap, 2 * n * sizeof(*e->heap));
	if (d)
		e->heap = d;
	if (!a || !b || !c || !d)
		return mr_errf(e->eb, MR_ENOMEM, "tokenizer '%s': out of memory", e->t->path);
	e->scratch = n;
	return 0;
}

static int pair_less(const struct pair *x, const struct pair *y)
{
	return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void heap_push(struct enc *e, int pos)
{
	const struct mr__tk_merge *m;
	struct pair p;
	size_t i;

	if (pos < 0 || e->next[pos] < 0)
		return;
	m = mr__tk_merge_find(e->t, e->sym[pos], e->sym[e->next[pos]]);
	if (!m)
		return;
	p = (struct pair){ m->rank, pos, e->sym[pos], e->sym[e->next[pos]] };
	for (i = e->nheap++; i > 0 && pair_less(&p, &e->heap[(i - 1) / 2]); i = (i - 1) / 2)
		e->heap[i] = e->heap[(i - 1) / 2];
	e->heap[i] = p;
}

static struct pair heap_pop(struct enc *e)
{
	struct pair top = e->heap[0], last = e->heap[--e->nheap];
	size_t i = 0, c;

	while ((c = 2 * i + 1) < e->nheap) {
		if (c + 1 < e->nheap && pair_less(&e->heap[c + 1], &e->heap[c]))
			c++;
		if (!pair_less(&e->heap[c], &last))
			break;
		e->heap[i] = e->heap[c];
		i = c;
	}
	e->heap[i] = last;
	return top;
}

/* The ids of one pre-tokenized word (raw bytes w[0..n)). */
static int bpe_word(struct enc *e, const unsigned char *w, size_t n)
{
	const struct mr_tokenizer *t = e->t;
	struct cached *c = NULL;
	char key[CACHE_MAX_WORD + 1];
	int cacheable = n <= CACHE_MAX_WORD && !memchr(w, 0, n), i, k;

	if (cacheable) {
		memcpy(key, w, n);
		key[n] = '\0';
		if ((c = mr_dict_get(&e->cache, key)))
			return push_ids(e, c->id, c->n);
	}
	if (n == 0)
		return 0;
	if (grow_scratch(e, n + 1) < 0)
		return MR_ENOMEM;
	if (t->ignore_merges && n <= CACHE_MAX_WORD) {
		/* Llama 3: a word that is a token is that token, merges or not */
		char s[4 * CACHE_MAX_WORD + 1];
		size_t sl = 0;
		uintptr_t v;

		for (size_t j = 0; j < n; j++)
			sl += mr__tk_utf8_put(mr__tk_byte_cp(w[j]), s + sl);
		s[sl] = '\0';
		if ((v = (uintptr_t)mr_dict_get(&t->vocab, s))) {
			uint32_t id = (uint32_t)(v - 1);

			return push_ids(e, &id, 1);
		}
	}
	for (i = 0; i < (int)n; i++) {
		if (t->byte_id[w[i]] < 0)
			return mr_errf(e->eb, MR_ECORRUPT, "tokenizer '%s': no token for byte 0x%02x",
				       t->path, w[i]);
		e->sym[i] = (uint32_t)t->byte_id[w[i]];
		e->prev[i] = i - 1;
		e->next[i] = i + 1 < (int)n ? i + 1 : -1;
	}
	e->nheap = 0;
	for (i = 0; i + 1 < (int)n; i++)
		heap_push(e, i);
	while (e->nheap) {
		struct pair p = heap_pop(e);
		int r = e->next[p.pos];
		const struct mr__tk_merge *m;

		/* stale: the left symbol was absorbed (next = -2), or changed */
		if (r < 0 || e->sym[p.pos] != p.a || e->sym[r] != p.b)
			continue;
		m = mr__tk_merge_find(t, p.a, p.b);
		e->sym[p.pos] = m->id;
		e->next[p.pos] = e->next[r];
		if (e->next[r] >= 0)
			e->prev[e->next[r]] = p.pos;
		e->next[r] = -2;
		e->sym[r] = UINT32_MAX;
		heap_push(e, e->prev[p.pos]);
		heap_push(e, p.pos);
	}
	/* compact the surviving symbols in order */
	for (i = 0, k = 0; i >= 0; i = e->next[i])
		e->sym[k++] = e->sym[i];
	if (cacheable) {
		if (mr_dict_len(&e->cache) >= CACHE_MAX_ENTRIES)
			mr_dict_release(&e->cache, free);
		c = malloc(sizeof(*c) + (size_t)k * sizeof(uint32_t));
		if (c) {
			c->n = (size_t)k;
			memcpy(c->id, e->sym, (size_t)k * sizeof(uint32_t));
			if (mr_dict_put(&e->cache, key, c, NULL) < 0)
				free(c);
		}
	}
	return push_ids(e, e->sym, (size_t)k);
}

/* ---- pre-tokenization --------------------------------------------------------------- */

static int pretok(struct enc *e, int step, const char *s, size_t n);

/* The pieces of s[0..n) cut by step's regex, each on to the next step. */
static int split(struct enc *e, int step, const char *s, size_t n)
{
	const struct mr__tk_step *st = &e->t->step[step];
	size_t at = 0, cut = 0;
	int rc;

	while (at <= n) {
		PCRE2_SIZE *ov;
		size_t ms, me;
		int m = pcre2_match(st->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, e->md[step],
				    NULL);

		if (m == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its stack on the heap */
			m = pcre2_match(st->re, (PCRE2_SPTR)s, n, at,
					PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md[step], NULL);
		if (m == PCRE2_ERROR_NOMATCH)
			break;
		if (m < 0) {
			PCRE2_UCHAR msg[160];

			pcre2_get_error_message(m, msg, sizeof(msg));
			return mr_errf(e->eb, MR_EIO, "tokenizer '%s': regex match failed: %s",
				       e->t->path, (char *)msg);
		}
		ov = pcre2_get_ovector_pointer(e->md[step]);
		ms = ov[0];
		me = ov[1];
		if (me == ms) { /* an empty match cuts nothing; step one character on */
			at = ms + 1;
			while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80)
				at++;
			continue;
		}
		switch (st->behavior) {
		case MR__TK_ISOLATED:
			if (ms > cut && (rc = pretok(e, step + 1, s + cut, ms - cut)) < 0)
				return rc;
			if ((rc = pretok(e, step + 1, s + ms, me - ms)) < 0)
				return rc;
			cut = me;
			break;
		case MR__TK_REMOVED:
			if (ms > cut && (rc = pretok(e, step + 1, s + cut, ms - cut)) < 0)
				return rc;
			cut = me;
			break;
		case MR__TK_MERGED_PREV:
			if ((rc = pretok(e, step + 1, s + cut, me - cut)) < 0)
				return rc;
			cut = me;
			break;
		case MR__TK_MERGED_NEXT:
			if (ms > cut && (rc = pretok(e, step + 1, s + cut, ms - cut)) < 0)
				return rc;
			cut = ms;
			break;
		}
		at = me;
	}
	return n > cut ? pretok(e, step + 1, s + cut, n - cut) : 0;
}

static int pretok(struct enc *e, int step, const char *s, size_t n)
{
	const struct mr__tk_step *st;

	if (step == e->t->nstep)
		return bpe_word(e, (const unsigned char *)s, n);
	st = &e->t->step[step];
	if (st->prefix_space && (n == 0 || s[0] != ' ')) {
		char *p = malloc(n + 1);
		int rc;

		if (!p)
			return mr_errf(e->eb, MR_ENOMEM, "tokenizer '%s': out of memory", e->t->path);
		p[0] = ' ';
		memcpy(p + 1, s, n);
		rc = st->re ? split(e, step, p, n + 1) : pretok(e, step + 1, p, n + 1);
		free(p);
		return rc;
	}
	return st->re ? split(e, step, s, n) : pretok(e, step + 1, s, n);
}

/* ---- encode, decode ------------------------------------------------------------------ */

/* Offset of the first byte that is not valid UTF-8, or n. */
static size_t utf8_check(const unsigned char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		unsigned c = s[i];
		size_t more = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2
			      : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
		unsigned lo = 0x80, hi = 0xBF;

		if (more == 9 || more >= n - i)
			return i;
		if (c == 0xE0)
			lo = 0xA0; /* no overlong */
		else if (c == 0xED)
			hi = 0x9F; /* no surrogates */
		else if (c == 0xF0)
			lo = 0x90;
		else if (c == 0xF4)
			hi = 0x8F; /* <= U+10FFFF */
		for (size_t k = 1; k <= more; k++) {
			unsigned b = s[i + k];

			if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80)
				return i;
		}
		i += more + 1;
	}
	return n;
}

/* The longest added token at s[0..n), or NULL. */
static const struct mr__tk_added *added_at(const struct mr_tokenizer *t, const char *s,
					   size_t n)
{
	if (!t->added_first[(unsigned char)s[0]])
		return NULL;
	for (size_t i = 0; i < t->nadded; i++)
		if (t->added[i].len <= n && !memcmp(s, t->added[i].s, t->added[i].len))
			return &t->added[i];
	return NULL;
}

int mr_tokenizer_encode(const struct mr_tokenizer *t, const char *text, size_t len,
			uint32_t **ids, size_t *n, struct mr_errbuf *eb)
{
	struct enc e;
	size_t bad, at, seg = 0;
	int rc = 0, i;

	*ids = NULL;
	*n = 0;
	if (len > MR_TOKENIZER_MAX_TEXT)
		return mr_errf(eb, MR_ELIMIT, "tokenizer '%s': %zu bytes to encode, more than %zu",
			       t->path, len, MR_TOKENIZER_MAX_TEXT);
	if ((bad = utf8_check((const unsigned char *)text, len)) < len)
		return mr_errf(eb, MR_EINVAL, "tokenizer '%s': the text is not valid UTF-8 at "
			       "byte %zu", t->path, bad);
	memset(&e, 0, sizeof(e));
	e.t = t;
	e.eb = eb;
	mr_dict_init(&e.cache, MR_DICT_COPY_KEYS);
	for (i = 0; i < t->nstep; i++)
		if (t->step[i].re &&
		    !(e.md[i] = pcre2_match_data_create_from_pattern(t->step[i].re, NULL))) {
			rc = mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", t->path);
			goto out;
		}
	for (at = 0; at < len && rc == 0;) {
		const struct mr__tk_added *a = added_at(t, text + at, len - at);

		if (!a) {
			at++;
			continue;
		}
		if (at > seg && (rc = pretok(&e, 0, text + seg, at - seg)) < 0)
			break;
		rc = push_ids(&e, &a->id, 1);
		at += a->len;
		seg = at;
	}
	if (rc == 0 && len > seg)
		rc = pretok(&e, 0, text + seg, len - seg);
out:
	for (i = 0; i < t->nstep; i++)
		pcre2_match_data_free(e.md[i]);
	mr_dict_release(&e.cache, free);
	free(e.sym);
	free(e.prev);
	free(e.next);
	free(e.heap);
	if (rc < 0) {
		free(e.out.v);
		return rc;
	}
	*ids = e.out.v;
	*n = e.out.n;
	return 0;
}

int mr_tokenizer_decode(const struct mr_tokenizer *t, const uint32_t *ids, size_t n,
			char **text, size_t *len, struct mr_errbuf *eb)
{
	size_t total = 0, i;
	char *s;

	*text = NULL;
	*len = 0;
	for (i = 0; i < n; i++) {
		if (ids[i] >= (uint32_t)t->nid || !t->bytes[ids[i]])
			return mr_errf(eb, MR_ERANGE, "tokenizer '%s': id %u (at %zu) is not in the "
				       "vocabulary of %d", t->path, ids[i], i, t->nid);
		total += t->blen[ids[i]];
	}
	if (!(s = malloc(total + 1)))
		return mr_errf(eb, MR_ENOMEM, "tokenizer '%s': out of memory", t->path);
	for (i = 0, total = 0; i < n; i++) {
		memcpy(s + total, t->bytes[ids[i]], t->blen[ids[i]]);
		total += t->blen[ids[i]];
	}
	s[total] = '\0';
	*text = s;
	*len = total;
	return 0;
}
