/*
 * jrecord.c - journal records of the controller (see journal.h): CRC-32,
 * the encoders behind the mr__jr_* hooks, the bounded decoder and replay,
 * and the snapshot written at compaction.
 *
 * Every decoded field is range-checked before it reaches an apply function,
 * so a corrupt or hostile journal stops replay instead of corrupting state
 * (this is what tests/fuzz/fuzz_controller.c exercises).
 *
 * Non-goals: files (journal.c); reading journals of another format version
 * (record types are append-only).
 */
#include "journal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECORD (16u << 20)

enum {
	R_JOB = 1,
	R_JOB_DEL = 2,
	R_MEMBER = 3,
	R_MEMBER_DEL = 4,
	R_CLOSE = 5,
	R_BUMP = 6,
	R_KV_PUT = 7,
	R_KV_DEL = 8,
	R_END = 9, /* a job became failed/succeeded (permanent fail, completion) */
};

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

/* ---- encoding ------------------------------------------------------------------ */

static int reserve(struct ctl_journal *jr, size_t n)
{
	size_t ncap;
	unsigned char *nb;

	if (jr->len + n <= jr->cap)
		return 0;
	ncap = jr->cap ? jr->cap : 4096;
	while (ncap < jr->len + n)
		ncap *= 2;
	nb = realloc(jr->buf, ncap);
	if (!nb) {
		jr->failed = 1;
		return MR_ENOMEM;
	}
	jr->buf = nb;
	jr->cap = ncap;
	return 0;
}

static void put_raw(struct ctl_journal *jr, const void *p, size_t n)
{
	if (reserve(jr, n))
		return;
	if (n)
		memcpy(jr->buf + jr->len, p, n);
	jr->len += n;
}

static void put_uv(struct ctl_journal *jr, uint64_t v)
{
	unsigned char b[10];
	size_t n = 0;

	do {
		b[n] = v & 0x7f;
		v >>= 7;
		if (v)
			b[n] |= 0x80;
		n++;
	} while (v);
	put_raw(jr, b, n);
}

static void put_bytes(struct ctl_journal *jr, const void *p, size_t n)
{
	put_uv(jr, n);
	put_raw(jr, p, n);
}

/* NULL is encoded as length 0, "x" as length 2. */
static void put_str(struct ctl_journal *jr, const char *s)
{
	if (!s) {
		put_uv(jr, 0);
		return;
	}
	put_uv(jr, strlen(s) + 1);
	put_raw(jr, s, strlen(s));
}

static struct ctl_journal *rec_begin(struct ctl *ctl, int type, const char *job)
{
	struct ctl_journal *jr = ctl->jr;
	unsigned char t = (unsigned char)type;

	if (!jr || ctl->replaying)
		return NULL;
	jr->rec_start = jr->len;
	put_raw(jr, "\0\0\0\0\0\0\0\0", 8);
	put_raw(jr, &t, 1);
	put_str(jr, job);
	return jr;
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

static void rec_end(struct ctl_journal *jr)
{
	size_t plen;

	if (jr->failed || jr->len < jr->rec_start + 8)
		return;
	plen = jr->len - jr->rec_start - 8;
	wr32(jr->buf + jr->rec_start, (uint32_t)plen);
	wr32(jr->buf + jr->rec_start + 4, mr__crc32(jr->buf + jr->rec_start + 8, plen));
}

static void put_spec(struct ctl_journal *jr, const struct ctl_spec *s)
{
	const int32_t v[] = { s->min_nodes, s->max_nodes, s->nproc_per_node, s->tp, s->pp,
			      s->cp, s->ep, s->dp, s->last_call_ms, s->heartbeat_timeout_ms,
			      s->max_restarts };

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		put_uv(jr, (uint32_t)v[i]);
}

void mr__jr_job(struct ctl *ctl, const struct ctl_job *job)
{
	struct ctl_journal *jr = rec_begin(ctl, R_JOB, job->name);

	if (!jr)
		return;
	put_spec(jr, &job->spec);
	put_uv(jr, job->generation);
	put_uv(jr, job->state);
	put_uv(jr, (uint32_t)job->restarts);
	put_uv(jr, job->rounds);
	put_uv(jr, job->kv_seq);
	put_uv(jr, (uint32_t)job->num_nodes);
	put_str(jr, job->reason); /* optional: absent in older journals */
	rec_end(jr);
}

void mr__jr_job_delete(struct ctl *ctl, const char *name)
{
	struct ctl_journal *jr = rec_begin(ctl, R_JOB_DEL, name);

	if (jr)
		rec_end(jr);
}

void mr__jr_member(struct ctl *ctl, const struct ctl_job *job, const struct ctl_member *m)
{
	struct ctl_journal *jr = rec_begin(ctl, R_MEMBER, job->name);

	if (!jr)
		return;
	put_str(jr, m->node_id);
	put_str(jr, m->host);
	put_str(jr, m->host_id);
	put_str(jr, m->ports);
	put_uv(jr, (uint64_t)((int64_t)m->pod_index + 1));
	put_uv(jr, m->state);
	put_uv(jr, (uint64_t)((int64_t)m->node_rank + 1));
	rec_end(jr);
}

void mr__jr_member_delete(struct ctl *ctl, const struct ctl_job *job, const char *node_id)
{
	struct ctl_journal *jr = rec_begin(ctl, R_MEMBER_DEL, job->name);

	if (!jr)
		return;
	put_str(jr, node_id);
	rec_end(jr);
}

void mr__jr_close(struct ctl *ctl, const struct ctl_job *job, int32_t n)
{
	struct ctl_journal *jr = rec_begin(ctl, R_CLOSE, job->name);

	if (!jr)
		return;
	put_uv(jr, job->generation);
	put_uv(jr, (uint32_t)n);
	rec_end(jr);
}

void mr__jr_bump(struct ctl *ctl, const struct ctl_job *job)
{
	struct ctl_journal *jr = rec_begin(ctl, R_BUMP, job->name);

	if (!jr)
		return;
	put_uv(jr, job->generation);
	put_uv(jr, (uint32_t)job->restarts);
	put_uv(jr, job->state == CTL_JOB_FAILED);
	if (job->state == CTL_JOB_FAILED)
		put_str(jr, job->reason); /* optional: absent in older journals */
	rec_end(jr);
}

void mr__jr_end(struct ctl *ctl, const struct ctl_job *job)
{
	struct ctl_journal *jr = rec_begin(ctl, R_END, job->name);

	if (!jr)
		return;
	put_uv(jr, job->state);
	put_str(jr, job->reason);
	rec_end(jr);
}

void mr__jr_kv_put(struct ctl *ctl, const struct ctl_job *job, const struct ctl_kv *e)
{
	struct ctl_journal *jr = rec_begin(ctl, R_KV_PUT, job->name);

	if (!jr)
		return;
	put_str(jr, e->key);
	put_uv(jr, e->version);
	put_bytes(jr, e->data, e->len);
	rec_end(jr);
}

void mr__jr_kv_del(struct ctl *ctl, const struct ctl_job *job, const char *key)
{
	struct ctl_journal *jr = rec_begin(ctl, R_KV_DEL, job->name);

	if (!jr)
		return;
	put_str(jr, key);
	rec_end(jr);
}

/* ---- decoding and replay -------------------------------------------------------- */

struct dec {
	const unsigned char *p;
	size_t len, off;
	int bad;
};

static uint64_t get_uv(struct dec *d)
{
	uint64_t v = 0;

	for (int shift = 0; shift < 64; shift += 7) {
		unsigned char b;

		if (d->off >= d->len) {
			d->bad = 1;
			return 0;
		}
		b = d->p[d->off++];
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return v;
	}
	d->bad = 1;
	return 0;
}

static int32_t get_i32(struct dec *d, int64_t lo, int64_t hi)
{
	uint64_t v = get_uv(d);

	if (v > (uint64_t)INT32_MAX || (int64_t)v < lo || (int64_t)v > hi)
		d->bad = 1;
	return d->bad ? (int32_t)lo : (int32_t)v;
}

/* Copies a string field into buf (cap bytes incl. NUL); returns buf, or
 * NULL for an encoded NULL. Embedded NULs are corrupt. */
static const char *get_str(struct dec *d, char *buf, size_t cap)
{
	uint64_t n = get_uv(d);

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

static const void *get_bytes(struct dec *d, size_t *n)
{
	uint64_t l = get_uv(d);
	const void *p;

	if (d->bad || l > d->len - d->off) {
		d->bad = 1;
		return NULL;
	}
	p = d->p + d->off;
	d->off += (size_t)l;
	*n = (size_t)l;
	return p;
}

static int get_spec(struct dec *d, struct ctl_spec *s)
{
	s->min_nodes = get_i32(d, 1, 1000000);
	s->max_nodes = get_i32(d, 1, 1000000);
	s->nproc_per_node = get_i32(d, 1, 1024);
	s->tp = get_i32(d, 1, 65536);
	s->pp = get_i32(d, 1, 65536);
	s->cp = get_i32(d, 1, 65536);
	s->ep = get_i32(d, 1, 65536);
	s->dp = get_i32(d, 0, 1 << 24);
	s->last_call_ms = get_i32(d, 0, 3600000);
	s->heartbeat_timeout_ms = get_i32(d, 1, 3600000);
	s->max_restarts = get_i32(d, 0, 1000000);
	return !d->bad && s->max_nodes >= s->min_nodes;
}

/* Applies one payload; 0 or MR_ECORRUPT. */
static int apply_record(struct ctl *ctl, const unsigned char *p, size_t len)
{
	struct dec d = { p, len, 1, 0 };
	char name[256], node[CTL_MAX_NODE_ID + 1], host[CTL_MAX_HOST + 1], hid[CTL_MAX_HOST + 1];
	char ports[CTL_MAX_PORTS_JSON + 1], key[CTL_MAX_KEY + 1], why[CTL_MAX_REASON];
	const char *nm, *s;
	struct ctl_job *job;
	struct ctl_spec spec;

	if (len < 1)
		return MR_ECORRUPT;
	nm = get_str(&d, name, sizeof(name));
	if (!nm)
		return MR_ECORRUPT;
	job = mr__ctl_job(ctl, nm);
	if (p[0] != R_JOB && !job)
		return MR_ECORRUPT;
	switch (p[0]) {
	case R_JOB: {
		uint64_t gen, rounds, kv_seq;
		int32_t state, restarts, nn;

		if (!get_spec(&d, &spec))
			return MR_ECORRUPT;
		gen = get_uv(&d);
		state = get_i32(&d, 0, CTL_JOB_SUCCEEDED);
		restarts = get_i32(&d, 0, INT32_MAX);
		rounds = get_uv(&d);
		kv_seq = get_uv(&d);
		nn = get_i32(&d, 0, spec.max_nodes);
		s = d.off < len ? get_str(&d, why, sizeof(why)) : NULL;
		if (d.bad || d.off != len || !mr__ctl_valid_key(nm, strlen(nm)))
			return MR_ECORRUPT;
		job = mr__ctl_apply_job(ctl, nm, &spec, gen, state, restarts, rounds, kv_seq, nn);
		if (!job)
			return MR_ENOMEM;
		mr__ctl_set_reason(job, s);
		return 0;
	}
	case R_JOB_DEL:
		if (d.off != len)
			return MR_ECORRUPT;
		mr__ctl_apply_job_delete(ctl, job);
		return 0;
	case R_MEMBER: {
		const char *id = get_str(&d, node, sizeof(node));
		const char *h = get_str(&d, host, sizeof(host));
		const char *hi = get_str(&d, hid, sizeof(hid));
		const char *po = get_str(&d, ports, sizeof(ports));
		int32_t pod = get_i32(&d, 0, INT32_MAX) - 1;
		int32_t st = get_i32(&d, 0, CTL_M_NSTATES - 1);
		int32_t rank = get_i32(&d, 0, 1000000) - 1;

		if (d.bad || d.off != len || !id || !mr__ctl_valid_node_id(id))
			return MR_ECORRUPT;
		if (!mr_dict_get(&job->members, id) &&
		    mr_dict_len(&job->members) >= ctl->lim.max_members)
			return MR_ECORRUPT;
		if (!mr__ctl_apply_member(ctl, job, id, h, hi, po, pod, st, rank))
			return MR_ENOMEM;
		return 0;
	}
	case R_MEMBER_DEL: {
		struct ctl_member *m;

		s = get_str(&d, node, sizeof(node));
		if (d.bad || d.off != len || !s || !(m = mr_dict_get(&job->members, s)))
			return MR_ECORRUPT;
		mr__ctl_apply_member_delete(ctl, job, m);
		return 0;
	}
	case R_CLOSE: {
		uint64_t gen = get_uv(&d);
		int32_t n = get_i32(&d, 1, job->spec.max_nodes);

		if (d.bad || d.off != len || gen != job->generation ||
		    job->state != CTL_JOB_FORMING || !mr__ctl_mesh_fits(&job->spec, n, NULL))
			return MR_ECORRUPT;
		mr__ctl_apply_close(ctl, job, n);
		return 0;
	}
	case R_BUMP: {
		uint64_t gen = get_uv(&d);
		int32_t restarts = get_i32(&d, 0, INT32_MAX);
		int32_t failed = get_i32(&d, 0, 1);

		s = failed && d.off < len ? get_str(&d, why, sizeof(why)) : NULL;
		if (d.bad || d.off != len || gen != job->generation + 1 || mr__ctl_job_over(job))
			return MR_ECORRUPT;
		mr__ctl_apply_bump(ctl, job, gen, restarts, failed, s);
		return 0;
	}
	case R_END: {
		int32_t state = get_i32(&d, CTL_JOB_FAILED, CTL_JOB_SUCCEEDED);

		s = get_str(&d, why, sizeof(why));
		if (d.bad || d.off != len || mr__ctl_job_over(job))
			return MR_ECORRUPT;
		mr__ctl_apply_end(ctl, job, state, s);
		return 0;
	}
	case R_KV_PUT: {
		const void *val;
		uint64_t version;
		size_t vlen = 0;

		s = get_str(&d, key, sizeof(key));
		version = get_uv(&d);
		val = get_bytes(&d, &vlen);
		if (d.bad || d.off != len || !s || !mr__ctl_valid_key(s, strlen(s)) ||
		    vlen > ctl->lim.max_value || version == 0)
			return MR_ECORRUPT;
		if (!mr_dict_get(&job->kv, s) && mr_dict_len(&job->kv) >= ctl->lim.max_keys)
			return MR_ECORRUPT;
		return mr__ctl_apply_kv_put(ctl, job, s, val, vlen, version);
	}
	case R_KV_DEL:
		s = get_str(&d, key, sizeof(key));
		if (d.bad || d.off != len || !s)
			return MR_ECORRUPT;
		mr__ctl_apply_kv_del(ctl, job, s);
		return 0;
	default:
		return MR_ECORRUPT;
	}
}

uint64_t mr__jr_replay_buf(struct ctl *ctl, const unsigned char *buf, size_t len, size_t *good)
{
	size_t off = 0;
	uint64_t n = 0;
	int was = ctl->replaying;

	ctl->replaying = 1;
	while (len - off >= 8) {
		uint32_t plen = rd32(buf + off);

		if (plen > MAX_RECORD || plen > len - off - 8)
			break;
		if (rd32(buf + off + 4) != mr__crc32(buf + off + 8, plen))
			break;
		if (apply_record(ctl, buf + off + 8, plen))
			break;
		off += 8 + (size_t)plen;
		n++;
	}
	ctl->replaying = was;
	*good = off;
	return n;
}

int mr__jr_snapshot(struct ctl *ctl, unsigned char **out, size_t *len)
{
	struct ctl_journal tmp, *saved = ctl->jr;
	int was = ctl->replaying;
	size_t cur = 0;
	void *v;

	memset(&tmp, 0, sizeof(tmp));
	tmp.fd = -1;
	ctl->jr = &tmp;
	ctl->replaying = 0;
	while (mr_dict_next(&ctl->jobs, &cur, NULL, &v)) {
		struct ctl_job *job = v;
		size_t kc = 0;
		void *e;

		mr__jr_job(ctl, job);
		for (struct ctl_member *m = job->lru_head; m; m = m->lru_next)
			mr__jr_member(ctl, job, m);
		while (mr_dict_next(&job->kv, &kc, NULL, &e))
			mr__jr_kv_put(ctl, job, e);
	}
	ctl->jr = saved;
	ctl->replaying = was;
	if (tmp.failed) {
		free(tmp.buf);
		return MR_ENOMEM;
	}
	*out = tmp.buf;
	*len = tmp.len;
	return 0;
}

