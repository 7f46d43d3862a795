/*
 * record.c - records of the journal (see journal.h): CRC-32, the field
 * encoder (struct ctl_jbuf), the bounded decoder (struct ctl_jdec), and
 * replay: frames are checked, handed to the state's table of decode+apply
 * functions, and what follows the valid prefix is classified as a torn
 * tail or as corruption.
 *
 * Every decoded field is range-checked by the decoder or the apply
 * function, so a corrupt or hostile journal stops replay instead of
 * corrupting state (tests/fuzz/fuzz_controller.c exercises this).
 *
 * Non-goals: files (file.c), what records mean (core/records.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal.h"

/* ---- CRC-32 (IEEE 802.3, reflected) --------------------------------------- */

uint32_t mr__crc32(const void *buf, size_t len)
{
	static uint32_t table[256];
	static int ready;
	const unsigned char *p = buf;
	uint32_t c = 0xffffffffu;

	if (!ready) {
		for (uint32_t i = 0; i < 256; i++) {
			uint32_t v = i;

			for (int k = 0; k < 8; k++)
				v = v & 1 ? 0xedb88320u ^ (v >> 1) : v >> 1;
			table[i] = v;
		}
		ready = 1;
	}
	for (size_t i = 0; i < len; i++)
		c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
	return c ^ 0xffffffffu;
}

static void wr32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

static uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- encoding ------------------------------------------------------------------ */

static int reserve(struct ctl_jbuf *b, size_t n)
{
	size_t ncap;
	unsigned char *nb;

	if (b->failed)
		return MR_ENOMEM;
	if (b->len + n <= b->cap)
		return 0;
	ncap = b->cap ? b->cap : 4096;
	while (ncap < b->len + n)
		ncap *= 2;
	nb = realloc(b->p, ncap);
	if (!nb) {
		b->failed = 1;
		return MR_ENOMEM;
	}
	b->p = nb;
	b->cap = ncap;
	return 0;
}

static void put_raw(struct ctl_jbuf *b, const void *p, size_t n)
{
	if (reserve(b, n))
		return;
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
}

void mr__jbuf_uv(struct ctl_jbuf *b, uint64_t v)
{
	unsigned char t[10];
	size_t n = 0;

	do {
		t[n] = v & 0x7f;
		v >>= 7;
		if (v)
			t[n] |= 0x80;
		n++;
	} while (v);
	put_raw(b, t, n);
}

void mr__jbuf_bytes(struct ctl_jbuf *b, const void *p, size_t n)
{
	mr__jbuf_uv(b, n);
	put_raw(b, p, n);
}

void mr__jbuf_str(struct ctl_jbuf *b, const char *s)
{
	if (!s) {
		mr__jbuf_uv(b, 0);
		return;
	}
	mr__jbuf_uv(b, strlen(s) + 1);
	put_raw(b, s, strlen(s));
}

void mr__jbuf_begin(struct ctl_jbuf *b, unsigned type)
{
	unsigned char t = (unsigned char)type;

	b->rec_start = b->len;
	put_raw(b, "\0\0\0\0\0\0\0\0", 8);
	put_raw(b, &t, 1);
}

void mr__jbuf_end(struct ctl_jbuf *b)
{
	size_t plen;

	if (b->failed || b->len < b->rec_start + 8)
		return;
	plen = b->len - b->rec_start - 8;
	if (plen > MR_JR_MAX_RECORD) { /* replay would refuse it: the batch is lost */
		b->failed = 1;
		return;
	}
	wr32(b->p + b->rec_start, (uint32_t)plen);
	wr32(b->p + b->rec_start + 4, mr__crc32(b->p + b->rec_start + 8, plen));
}

void mr__jbuf_release(struct ctl_jbuf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* ---- decoding ------------------------------------------------------------------- */

uint64_t mr__jdec_uv(struct ctl_jdec *d)
{
	uint64_t v = 0;

	for (int shift = 0; shift < 64; shift += 7) {
		unsigned char c;

		if (d->off >= d->len) {
			d->bad = 1;
			return 0;
		}
		c = d->p[d->off++];
		v |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80))
			return v;
	}
	d->bad = 1;
	return 0;
}

int32_t mr__jdec_i32(struct ctl_jdec *d, int64_t lo, int64_t hi)
{
	uint64_t v = mr__jdec_uv(d);

	if (v > (uint64_t)INT32_MAX || (int64_t)v < lo || (int64_t)v > hi)
		d->bad = 1;
	return d->bad ? (int32_t)lo : (int32_t)v;
}

const char *mr__jdec_str(struct ctl_jdec *d, char *buf, size_t cap)
{
	uint64_t n = mr__jdec_uv(d);

	if (d->bad || n == 0)
		return NULL;
	n--;
	if (n >= cap || n > d->len - d->off || memchr(d->p + d->off, 0, (size_t)n)) {
		d->bad = 1;
		return NULL;
	}
	memcpy(buf, d->p + d->off, (size_t)n);
	buf[n] = 0;
	d->off += (size_t)n;
	return buf;
}

const void *mr__jdec_bytes(struct ctl_jdec *d, size_t *n)
{
	uint64_t l = mr__jdec_uv(d);
	const void *p;

	*n = 0;
	if (d->bad || l > d->len - d->off) {
		d->bad = 1;
		return NULL;
	}
	p = d->p + d->off;
	d->off += (size_t)l;
	*n = (size_t)l;
	return p;
}

int mr__jdec_more(const struct ctl_jdec *d)
{
	return !d->bad && d->off < d->len;
}

int mr__jdec_done(const struct ctl_jdec *d)
{
	return !d->bad && d->off == d->len;
}

/* ---- replay ------------------------------------------------------------------------ */

enum frame { F_INTACT, F_SHORT, F_CRC, F_TYPE };

/* Checks the frame at off. F_SHORT: header incomplete, length 0, above the
 * maximum or past the end; F_CRC: CRC mismatch; F_TYPE: good CRC, type not
 * in the table. why (may be NULL) says which. */
static enum frame check_frame(const struct ctl_jr_ops *ops, const unsigned char *buf,
			      size_t len, size_t off, char *why, size_t cap)
{
	size_t rest = len - off;
	uint32_t plen;
	unsigned t;
	int known;

	if (rest < 8) {
		if (why)
			snprintf(why, cap, "incomplete record header (%zu of 8 bytes)", rest);
		return F_SHORT;
	}
	plen = rd32(buf + off);
	if (plen == 0 || plen > MR_JR_MAX_RECORD || plen > rest - 8) {
		if (why && plen == 0)
			snprintf(why, cap, "zero record length");
		else if (why)
			snprintf(why, cap, "record length %u runs past the end of the file (%zu bytes left)",
				 plen, rest - 8);
		return F_SHORT;
	}
	t = buf[off + 8];
	known = t < ops->ntypes && ops->types[t].apply;
	if (!known && !why)
		return F_TYPE;
	if (rd32(buf + off + 4) != mr__crc32(buf + off + 8, plen)) {
		if (why)
			snprintf(why, cap, "crc mismatch");
		return F_CRC;
	}
	if (!known) {
		if (why)
			snprintf(why, cap, "unknown record type %u", t);
		return F_TYPE;
	}
	return F_INTACT;
}

/* 1 if an intact frame starts anywhere in (off, len) (*at gets its
 * offset), 2 if that could not be ruled out: the CRC work is bounded, and
 * past the budget the answer is "maybe" (never drop what might be data). */
static int intact_after(const struct ctl_jr_ops *ops, const unsigned char *buf, size_t len,
			size_t off, size_t *at)
{
	uint64_t budget = (uint64_t)4 * (len - off) + (64u << 20);

	for (size_t o = off + 1; o + 9 <= len; o++) {
		uint32_t plen = rd32(buf + o);
		unsigned t = buf[o + 8];

		if (plen == 0 || plen > len - o - 8 || t >= ops->ntypes || !ops->types[t].apply)
			continue;
		if (budget < plen)
			return 2;
		budget -= plen;
		if (check_frame(ops, buf, len, o, NULL, 0) == F_INTACT) {
			*at = o;
			return 1;
		}
	}
	return 0;
}

static int all_zero(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

/* The frame at off is bad (f): a torn tail, or corruption (see journal.h). */
static void classify(const struct ctl_jr_ops *ops, const unsigned char *buf, size_t len,
		     size_t off, enum frame f, struct ctl_jr_scan *s)
{
	size_t rest = len - off, at = 0;
	char why[sizeof(s->why)];
	int r;

	memcpy(why, s->why, sizeof(why));
	s->verdict = CTL_JR_CORRUPT;
	if (f == F_TYPE)
		return;
	if (rest >= 8 && rd32(buf + off) < rest - 8 &&
	    !all_zero(buf + off + 8 + rd32(buf + off), rest - 8 - rd32(buf + off))) {
		snprintf(s->why, sizeof(s->why), "%.80s, and %zu bytes follow the record", why,
			 rest - 8 - rd32(buf + off));
		return;
	}
	r = intact_after(ops, buf, len, off, &at);
	if (r == 1) {
		snprintf(s->why, sizeof(s->why), "%.80s, and a valid record follows at offset %zu",
			 why, at);
		return;
	}
	if (r == 2) {
		snprintf(s->why, sizeof(s->why), "%.80s, and valid records may follow", why);
		return;
	}
	s->verdict = CTL_JR_TORN;
}

void mr__jr_replay_buf(const struct ctl_jr_ops *ops, const unsigned char *buf, size_t len,
		       struct ctl_jr_scan *s)
{
	size_t off = 0;

	memset(s, 0, sizeof(*s));
	while (off < len) {
		enum frame f = check_frame(ops, buf, len, off, s->why, sizeof(s->why));
		struct ctl_jdec d;
		uint32_t plen;
		unsigned t;
		int err;

		if (f != F_INTACT) {
			classify(ops, buf, len, off, f, s);
			break;
		}
		plen = rd32(buf + off);
		t = buf[off + 8];
		d.p = buf + off + 9;
		d.len = plen - 1;
		d.off = 0;
		d.bad = 0;
		err = ops->types[t].apply(ops->state, &d);
		if (err == MR_ECORRUPT) {
			snprintf(s->why, sizeof(s->why), "%s record does not decode or fit the state",
				 ops->types[t].name);
			s->verdict = CTL_JR_CORRUPT;
			break;
		}
		if (err) {
			snprintf(s->why, sizeof(s->why), "%s", mr_strerror(err));
			s->err = err;
			break;
		}
		off += 8 + (size_t)plen;
		s->records++;
	}
	if (off == len)
		s->why[0] = 0;
	s->good = off;
}
