/*
 * records.c - the state's side of the journal (journal/): one encoder and one
 * decode+apply function per record type, the table of them that replay
 * goes through, and the snapshot that compaction writes.
 *
 * The apply functions of job.c, round.c and kv.c call the encoders here
 * (mr__rec_*) to append a record of each change to the journal's batch;
 * replay calls the decoders here through the table, and they call the same
 * apply functions with ctl->replaying set, so the live path and the
 * replayed path cannot diverge. The journal (journal/journal.h) sees only the
 * table and the snapshot function: it is a layer below the state.
 *
 * Record formats are append-only: a new type gets a new number, a new
 * field goes at the end of its record and is optional on decode, so
 * journals written before still replay. A round close and a bump are
 * journaled as events (the apply function recomputes ranks); the snapshot
 * stores results (members with their state and rank).
 *
 * Non-goals: framing, files, CRC (journal/journal.h).
 */
#include <limits.h>
#include <string.h>

#include "ctl.h"
#include "journal/journal.h"
#include "mr_topo.h"

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

/* ---- encoders ------------------------------------------------------------------ */

/* The batch to record into, with the record begun; NULL while replaying or
 * without a journal. */
static struct ctl_jbuf *rec_begin(struct ctl *ctl, int type, const char *job)
{
	struct ctl_jbuf *b;

	if (!ctl->jr || ctl->replaying)
		return NULL;
	b = mr__jr_batch(ctl->jr);
	mr__jbuf_begin(b, (unsigned)type);
	mr__jbuf_str(b, job);
	return b;
}

static void enc_job(struct ctl_jbuf *b, const struct ctl_job *job)
{
	const struct ctl_spec *s = &job->spec;
	const int32_t v[] = { s->min_nodes, s->max_nodes, s->nproc_per_node, s->tp, s->pp,
			      s->cp, s->ep, s->dp, s->last_call_ms, s->heartbeat_timeout_ms,
			      s->max_restarts };

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		mr__jbuf_uv(b, (uint32_t)v[i]);
	mr__jbuf_uv(b, job->generation);
	mr__jbuf_uv(b, job->state);
	mr__jbuf_uv(b, (uint32_t)job->restarts);
	mr__jbuf_uv(b, job->rounds);
	mr__jbuf_uv(b, job->kv_seq);
	mr__jbuf_uv(b, (uint32_t)job->num_nodes);
	mr__jbuf_str(b, job->reason); /* optional: absent in older journals */
	mr__jbuf_uv(b, (uint32_t)s->hang_timeout_ms); /* optional too, and the next */
	mr__jbuf_uv(b, (uint32_t)s->straggler_pct);
	mr__jbuf_uv(b, (uint32_t)s->rank_order); /* optional */
	mr__jbuf_end(b);
}

static void enc_member(struct ctl_jbuf *b, const struct ctl_member *m)
{
	mr__jbuf_str(b, m->node_id);
	mr__jbuf_str(b, m->host);
	mr__jbuf_str(b, m->host_id);
	mr__jbuf_str(b, m->ports);
	mr__jbuf_uv(b, (uint64_t)((int64_t)m->pod_index + 1));
	mr__jbuf_uv(b, m->state);
	mr__jbuf_uv(b, (uint64_t)((int64_t)m->node_rank + 1));
	mr__jbuf_str(b, m->topology); /* optional: absent in older journals */
	mr__jbuf_end(b);
}

static void enc_kv(struct ctl_jbuf *b, const struct ctl_kv *e)
{
	mr__jbuf_str(b, e->key);
	mr__jbuf_uv(b, e->version);
	mr__jbuf_bytes(b, e->data, e->len);
	mr__jbuf_end(b);
}

uint64_t mr__rec_seq(const struct ctl *ctl)
{
	return ctl->jr && !ctl->replaying ? mr__jr_seq(ctl->jr) : 0;
}

void mr__rec_job(struct ctl *ctl, const struct ctl_job *job)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_JOB, job->name);

	if (b)
		enc_job(b, job);
}

void mr__rec_job_delete(struct ctl *ctl, const char *name)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_JOB_DEL, name);

	if (b)
		mr__jbuf_end(b);
}

void mr__rec_member(struct ctl *ctl, const struct ctl_job *job, const struct ctl_member *m)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_MEMBER, job->name);

	if (b)
		enc_member(b, m);
}

void mr__rec_member_delete(struct ctl *ctl, const struct ctl_job *job, const char *node_id)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_MEMBER_DEL, job->name);

	if (!b)
		return;
	mr__jbuf_str(b, node_id);
	mr__jbuf_end(b);
}

void mr__rec_close(struct ctl *ctl, const struct ctl_job *job, int32_t n)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_CLOSE, job->name);

	if (!b)
		return;
	mr__jbuf_uv(b, job->generation);
	mr__jbuf_uv(b, (uint32_t)n);
	mr__jbuf_end(b);
}

void mr__rec_bump(struct ctl *ctl, const struct ctl_job *job, int carry)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_BUMP, job->name);

	if (!b)
		return;
	mr__jbuf_uv(b, job->generation);
	mr__jbuf_uv(b, (uint32_t)job->restarts);
	mr__jbuf_uv(b, job->state == CTL_JOB_FAILED);
	if (job->state == CTL_JOB_FAILED)
		mr__jbuf_str(b, job->reason); /* optional: absent in older journals */
	else if (carry)
		mr__jbuf_uv(b, 1); /* optional too: older bumps carried nobody */
	mr__jbuf_end(b);
}

void mr__rec_end(struct ctl *ctl, const struct ctl_job *job)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_END, job->name);

	if (!b)
		return;
	mr__jbuf_uv(b, job->state);
	mr__jbuf_str(b, job->reason);
	mr__jbuf_end(b);
}

void mr__rec_kv_put(struct ctl *ctl, const struct ctl_job *job, const struct ctl_kv *e)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_KV_PUT, job->name);

	if (b)
		enc_kv(b, e);
}

void mr__rec_kv_del(struct ctl *ctl, const struct ctl_job *job, const char *key)
{
	struct ctl_jbuf *b = rec_begin(ctl, R_KV_DEL, job->name);

	if (!b)
		return;
	mr__jbuf_str(b, key);
	mr__jbuf_end(b);
}

/* ---- decode + apply ------------------------------------------------------------- */

/* Every record starts with its job's name: the job, or NULL (corrupt) if
 * the record is not R_JOB and the job does not exist. */
static struct ctl_job *dec_job(struct ctl *ctl, struct ctl_jdec *d, char *name, size_t cap)
{
	const char *nm = mr__jdec_str(d, name, cap);

	return nm ? mr__ctl_job(ctl, nm) : NULL;
}

static int get_spec(struct ctl_jdec *d, struct ctl_spec *s)
{
	s->min_nodes = mr__jdec_i32(d, 1, 1000000);
	s->max_nodes = mr__jdec_i32(d, 1, 1000000);
	s->nproc_per_node = mr__jdec_i32(d, 1, 1024);
	s->tp = mr__jdec_i32(d, 1, 65536);
	s->pp = mr__jdec_i32(d, 1, 65536);
	s->cp = mr__jdec_i32(d, 1, 65536);
	s->ep = mr__jdec_i32(d, 1, 65536);
	s->dp = mr__jdec_i32(d, 0, 1 << 24);
	s->last_call_ms = mr__jdec_i32(d, 0, 3600000);
	s->heartbeat_timeout_ms = mr__jdec_i32(d, 1, 3600000);
	s->max_restarts = mr__jdec_i32(d, 0, 1000000);
	return !d->bad && s->max_nodes >= s->min_nodes;
}

static int ap_job(void *state, struct ctl_jdec *d)
{
	struct ctl *ctl = state;
	char name[256], why[CTL_MAX_REASON];
	const char *nm = mr__jdec_str(d, name, sizeof(name)), *s;
	struct ctl_spec spec;
	struct ctl_job *job;
	uint64_t gen, rounds, kv_seq;
	int32_t st, restarts, nn;

	if (!nm || !get_spec(d, &spec))
		return MR_ECORRUPT;
	gen = mr__jdec_uv(d);
	st = mr__jdec_i32(d, 0, CTL_JOB_SUCCEEDED);
	restarts = mr__jdec_i32(d, 0, INT32_MAX);
	rounds = mr__jdec_uv(d);
	kv_seq = mr__jdec_uv(d);
	nn = mr__jdec_i32(d, 0, spec.max_nodes);
	s = mr__jdec_more(d) ? mr__jdec_str(d, why, sizeof(why)) : NULL;
	/* absent in journals written before hang diagnosis: today's defaults */
	spec.hang_timeout_ms = mr__jdec_more(d) ? mr__jdec_i32(d, 0, 86400000)
						: ctl->lim.defaults.hang_timeout_ms;
	spec.straggler_pct = mr__jdec_more(d) ? mr__jdec_i32(d, 0, 10000)
					      : ctl->lim.defaults.straggler_pct;
	spec.rank_order = mr__jdec_more(d) ? mr__jdec_i32(d, 0, CTL_ORDER_TOPOLOGY)
					   : CTL_ORDER_INDEX;
	if (!mr__jdec_done(d) || !mr__ctl_valid_key(nm, strlen(nm)))
		return MR_ECORRUPT;
	job = mr__ctl_apply_job(ctl, nm, &spec, gen, st, restarts, rounds, kv_seq, nn);
	if (!job)
		return MR_ENOMEM;
	mr__ctl_set_reason(job, s);
	return 0;
}

static int ap_job_del(void *state, struct ctl_jdec *d)
{
	char name[256];
	struct ctl_job *job = dec_job(state, d, name, sizeof(name));

	if (!job || !mr__jdec_done(d))
		return MR_ECORRUPT;
	mr__ctl_apply_job_delete(state, job);
	return 0;
}

static int ap_member(void *state, struct ctl_jdec *d)
{
	struct ctl *ctl = state;
	char name[256], node[CTL_MAX_NODE_ID + 1], host[CTL_MAX_HOST + 1], hid[CTL_MAX_HOST + 1];
	char ports[CTL_MAX_PORTS_JSON + 1], topo[MR_TOPO_MAX_LEN + 1];
	struct ctl_job *job = dec_job(ctl, d, name, sizeof(name));
	struct ctl_join who = { 0 };
	int32_t st, rank;

	who.node_id = mr__jdec_str(d, node, sizeof(node));
	who.host = mr__jdec_str(d, host, sizeof(host));
	who.host_id = mr__jdec_str(d, hid, sizeof(hid));
	who.ports = mr__jdec_str(d, ports, sizeof(ports));
	who.pod_index = mr__jdec_i32(d, 0, INT32_MAX) - 1;
	st = mr__jdec_i32(d, 0, CTL_M_NSTATES - 1);
	rank = mr__jdec_i32(d, 0, 1000000) - 1;
	who.topology = mr__jdec_more(d) ? mr__jdec_str(d, topo, sizeof(topo)) : NULL;
	if (!job || !mr__jdec_done(d) || !who.node_id || !mr__ctl_valid_node_id(who.node_id))
		return MR_ECORRUPT;
	if (!mr_dict_get(&job->members, who.node_id) &&
	    mr_dict_len(&job->members) >= ctl->lim.max_members)
		return MR_ECORRUPT;
	if (!mr__ctl_apply_member(ctl, job, &who, st, rank))
		return MR_ENOMEM;
	return 0;
}

static int ap_member_del(void *state, struct ctl_jdec *d)
{
	char name[256], node[CTL_MAX_NODE_ID + 1];
	struct ctl_job *job = dec_job(state, d, name, sizeof(name));
	const char *id = mr__jdec_str(d, node, sizeof(node));
	struct ctl_member *m = job && id ? mr_dict_get(&job->members, id) : NULL;

	if (!m || !mr__jdec_done(d))
		return MR_ECORRUPT;
	mr__ctl_apply_member_delete(state, job, m);
	return 0;
}

static int ap_close(void *state, struct ctl_jdec *d)
{
	char name[256];
	struct ctl_job *job = dec_job(state, d, name, sizeof(name));
	uint64_t gen = mr__jdec_uv(d);
	int32_t n = job ? mr__jdec_i32(d, 1, job->spec.max_nodes) : 0;

	if (!job || !mr__jdec_done(d) || gen != job->generation ||
	    job->state != CTL_JOB_FORMING || !mr__ctl_mesh_fits(&job->spec, n, NULL))
		return MR_ECORRUPT;
	mr__ctl_apply_close(state, job, n);
	return 0;
}

static int ap_bump(void *state, struct ctl_jdec *d)
{
	char name[256], why[CTL_MAX_REASON];
	struct ctl_job *job = dec_job(state, d, name, sizeof(name));
	uint64_t gen = mr__jdec_uv(d);
	int32_t restarts = mr__jdec_i32(d, 0, INT32_MAX);
	int32_t failed = mr__jdec_i32(d, 0, 1);
	const char *s = failed && mr__jdec_more(d) ? mr__jdec_str(d, why, sizeof(why)) : NULL;
	int32_t carry = !failed && mr__jdec_more(d) ? mr__jdec_i32(d, 0, 1) : 0;

	if (!job || !mr__jdec_done(d) || gen != job->generation + 1 || mr__ctl_job_over(job))
		return MR_ECORRUPT;
	mr__ctl_apply_bump(state, job, gen, restarts, failed, s, carry);
	return 0;
}

static int ap_end(void *state, struct ctl_jdec *d)
{
	char name[256], why[CTL_MAX_REASON];
	struct ctl_job *job = dec_job(state, d, name, sizeof(name));
	int32_t st = mr__jdec_i32(d, CTL_JOB_FAILED, CTL_JOB_SUCCEEDED);
	const char *s = mr__jdec_str(d, why, sizeof(why));

	if (!job || !mr__jdec_done(d) || mr__ctl_job_over(job))
		return MR_ECORRUPT;
	mr__ctl_apply_end(state, job, st, s);
	return 0;
}

static int ap_kv_put(void *state, struct ctl_jdec *d)
{
	struct ctl *ctl = state;
	char name[256], key[CTL_MAX_KEY + 1];
	struct ctl_job *job = dec_job(ctl, d, name, sizeof(name));
	const char *k = mr__jdec_str(d, key, sizeof(key));
	uint64_t version = mr__jdec_uv(d);
	size_t vlen = 0;
	const void *val = mr__jdec_bytes(d, &vlen);

	if (!job || !mr__jdec_done(d) || !k || !mr__ctl_valid_key(k, strlen(k)) ||
	    vlen > ctl->lim.max_value || version == 0)
		return MR_ECORRUPT;
	if (!mr_dict_get(&job->kv, k) && mr_dict_len(&job->kv) >= ctl->lim.max_keys)
		return MR_ECORRUPT;
	return mr__ctl_apply_kv_put(ctl, job, k, val, vlen, version);
}

static int ap_kv_del(void *state, struct ctl_jdec *d)
{
	char name[256], key[CTL_MAX_KEY + 1];
	struct ctl_job *job = dec_job(state, d, name, sizeof(name));
	const char *k = mr__jdec_str(d, key, sizeof(key));

	if (!job || !mr__jdec_done(d) || !k)
		return MR_ECORRUPT;
	mr__ctl_apply_kv_del(state, job, k);
	return 0;
}

/* Record type -> decode+apply, indexed by the type byte. */
static const struct ctl_jr_type types[] = {
	[R_JOB] = { "job", ap_job },
	[R_JOB_DEL] = { "job_delete", ap_job_del },
	[R_MEMBER] = { "member", ap_member },
	[R_MEMBER_DEL] = { "member_delete", ap_member_del },
	[R_CLOSE] = { "close", ap_close },
	[R_BUMP] = { "bump", ap_bump },
	[R_KV_PUT] = { "kv_put", ap_kv_put },
	[R_KV_DEL] = { "kv_delete", ap_kv_del },
	[R_END] = { "end", ap_end },
};

/* ---- snapshot, open, replay --------------------------------------------------------- */

int mr__ctl_snapshot(struct ctl *ctl, struct ctl_jbuf *out)
{
	size_t cur = 0;
	void *v;

	while (mr_dict_next(&ctl->jobs, &cur, NULL, &v)) {
		struct ctl_job *job = v;
		size_t kc = 0;
		void *e;

		mr__jbuf_begin(out, R_JOB);
		mr__jbuf_str(out, job->name);
		enc_job(out, job);
		for (struct ctl_member *m = job->lru_head; m; m = m->lru_next) {
			mr__jbuf_begin(out, R_MEMBER);
			mr__jbuf_str(out, job->name);
			enc_member(out, m);
		}
		while (mr_dict_next(&job->kv, &kc, NULL, &e)) {
			mr__jbuf_begin(out, R_KV_PUT);
			mr__jbuf_str(out, job->name);
			enc_kv(out, e);
		}
	}
	return out->failed ? MR_ENOMEM : 0;
}

static int snapshot(void *state, struct ctl_jbuf *out)
{
	return mr__ctl_snapshot(state, out);
}

static struct ctl_jr_ops ops_of(struct ctl *ctl)
{
	struct ctl_jr_ops ops = { types, sizeof(types) / sizeof(types[0]), snapshot, ctl };

	return ops;
}

void mr__ctl_replay(struct ctl *ctl, const unsigned char *buf, size_t len,
		    struct ctl_jr_scan *scan)
{
	struct ctl_jr_ops ops = ops_of(ctl);
	int was = ctl->replaying;

	ctl->replaying = 1;
	mr__jr_replay_buf(&ops, buf, len, scan);
	ctl->replaying = was;
}

int mr__ctl_journal_open(struct ctl *ctl, const struct ctl_journal_opts *o,
			 struct ctl_journal_info *info, struct mr_errbuf *eb)
{
	struct ctl_jr_ops ops = ops_of(ctl);
	struct ctl_journal *jr = NULL;
	int was = ctl->replaying, err;

	ctl->replaying = 1;
	err = mr__jr_open(&jr, o, &ops, info, eb);
	ctl->replaying = was;
	ctl->jr = jr;
	return err;
}

void mr__ctl_journal_close(struct ctl *ctl)
{
	mr__jr_free(ctl->jr);
	ctl->jr = NULL;
}
