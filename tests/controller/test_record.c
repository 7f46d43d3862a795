/*
 * test_record.c - the journal layer with the controller core, no HTTP:
 * the torn-tail vs corruption rule on crafted bytes (journal.h), the
 * data dir's lock in one process, compaction with a pending batch (the
 * batch is dropped, its effects kept), compaction handed to the writer
 * thread by the pipelined commit, a lost batch forcing a compaction, and
 * a compaction that cannot write (falls back to appending, or is owed).
 * Every reopen compares the replayed state with the live one.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/ctl.h"
#include "journal/journal.h"
#include "proc.h"

static void noop_wake(struct ctl *ctl, void *req, struct ctl_res *res)
{
	(void)ctl;
	(void)req;
	(void)res;
}

static void setup(struct ctl *ctl)
{
	struct ctl_limits lim = { .max_value = 4096, .max_keys = 1000, .max_members = 100,
				  .max_jobs = 10 };

	lim.defaults.last_call_ms = 0;
	lim.defaults.heartbeat_timeout_ms = 60000;
	lim.defaults.max_restarts = 3;
	mr__ctl_init(ctl, &lim);
	ctl->wake = noop_wake;
}

static struct ctl_spec spec2(void)
{
	struct ctl_spec s = { .min_nodes = 2, .max_nodes = 2, .nproc_per_node = 1, .tp = 1,
			      .pp = 1, .cp = 1, .ep = 1, .dp = 0, .last_call_ms = 0,
			      .heartbeat_timeout_ms = 60000, .max_restarts = 3 };
	return s;
}

static void join(struct ctl *ctl, const char *id, int pod)
{
	struct ctl_spec sp = spec2();
	struct ctl_join j = { .node_id = id, .pod_index = pod, .spec = &sp, .host = "h" };
	struct ctl_res res;

	memset(&res, 0, sizeof(res));
	mr__ctl_join(ctl, "ns/job", &j, &res);
	cr_assert_eq(res.status, 200, "join %s: %d %s", id, res.status, res.msg);
	mr__res_release(&res);
}

static void kv_put(struct ctl *ctl, const char *key, const char *val)
{
	struct ctl_put p = { .val = val, .len = strlen(val), .if_match = -1 };
	struct ctl_res res;

	memset(&res, 0, sizeof(res));
	mr__ctl_kv_put(ctl, mr__ctl_job(ctl, "ns/job"), key, &p, &res);
	cr_assert_eq(res.status, 200, "put %s: %d %s", key, res.status, res.msg);
	mr__res_release(&res);
}

static void kv_del(struct ctl *ctl, const char *key)
{
	struct ctl_res res;

	memset(&res, 0, sizeof(res));
	mr__ctl_kv_delete(ctl, mr__ctl_job(ctl, "ns/job"), key, &res);
	mr__res_release(&res);
}

/* Jobs, members (state, rank) and KV entries of a equal those of b. */
static void expect_same(struct ctl *a, struct ctl *b)
{
	size_t cur = 0;
	void *v;

	cr_assert_eq(mr_dict_len(&a->jobs), mr_dict_len(&b->jobs));
	cr_assert_eq(a->kv_bytes, b->kv_bytes);
	while (mr_dict_next(&a->jobs, &cur, NULL, &v)) {
		struct ctl_job *ja = v, *jb = mr__ctl_job(b, ja->name);
		size_t kc = 0;
		void *e;

		cr_assert_not_null(jb, "job %s", ja->name);
		cr_assert_eq(ja->generation, jb->generation);
		cr_assert_eq(ja->state, jb->state);
		cr_assert_eq(ja->kv_seq, jb->kv_seq);
		cr_assert_eq(mr_dict_len(&ja->members), mr_dict_len(&jb->members));
		cr_assert_eq(mr_dict_len(&ja->kv), mr_dict_len(&jb->kv));
		for (struct ctl_member *m = ja->lru_head; m; m = m->lru_next) {
			struct ctl_member *n = mr_dict_get(&jb->members, m->node_id);

			cr_assert_not_null(n, "member %s", m->node_id);
			cr_assert_eq(m->state, n->state);
			cr_assert_eq(m->node_rank, n->node_rank);
		}
		while (mr_dict_next(&ja->kv, &kc, NULL, &e)) {
			struct ctl_kv *x = e, *y = mr_dict_get(&jb->kv, x->key);

			cr_assert_not_null(y, "key %s", x->key);
			cr_assert_eq(x->version, y->version);
			cr_assert(x->len == y->len && !memcmp(x->data, y->data, x->len), "value of %s",
				  x->key);
		}
	}
}

static void jopen(struct ctl *ctl, const char *dir, int factor, uint64_t min)
{
	struct ctl_journal_opts o = { .dir = dir, .fsync = 1, .compact_factor = factor,
				      .compact_min = min };
	struct ctl_journal_info ji;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	setup(ctl);
	cr_assert_eq(mr__ctl_journal_open(ctl, &o, &ji, &eb), 0, "%s", eb.msg);
	cr_assert_eq(ji.verdict, CTL_JR_CLEAN);
}

/* Closes live, reopens dir and compares. */
static void expect_survives(struct ctl *live, const char *dir)
{
	struct ctl b;

	mr__ctl_journal_close(live);
	jopen(&b, dir, 0, 0);
	expect_same(live, &b);
	mr__ctl_journal_close(&b);
	mr__ctl_release(&b);
}

static off_t file_size(const char *dir)
{
	char path[300];
	struct stat st;

	snprintf(path, sizeof(path), "%s/journal", dir);
	cr_assert_eq(stat(path, &st), 0);
	return st.st_size;
}

/* ---- the torn-tail rule ------------------------------------------------------------ */

/* A state with one job, two members in a closed round and 5 keys, as the
 * frames of its snapshot; off[] gets each frame's offset. */
static struct ctl_jbuf frames_of_state(size_t *off, int *n)
{
	struct ctl a;
	struct ctl_jbuf b = { 0 };
	char k[8];
	size_t o = 0;

	setup(&a);
	join(&a, "x", 0);
	join(&a, "y", 1);
	for (int i = 0; i < 5; i++) {
		snprintf(k, sizeof(k), "k%d", i);
		kv_put(&a, k, "value");
	}
	cr_assert_eq(mr__ctl_snapshot(&a, &b), 0);
	mr__ctl_release(&a);
	*n = 0;
	while (o < b.len) {
		uint32_t plen = (uint32_t)b.p[o] | (uint32_t)b.p[o + 1] << 8 |
				(uint32_t)b.p[o + 2] << 16 | (uint32_t)b.p[o + 3] << 24;

		off[(*n)++] = o;
		o += 8 + plen;
	}
	cr_assert_eq(*n, 8, "job + 2 members + 5 keys");
	return b;
}

static void wr32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

/* Replays buf (len bytes) into a fresh core and checks the verdict. */
static void expect_scan(const unsigned char *buf, size_t len, int verdict, size_t good,
			uint64_t records, const char *why)
{
	struct ctl c;
	struct ctl_jr_scan s;

	setup(&c);
	mr__ctl_replay(&c, buf, len, &s);
	cr_assert_eq(s.verdict, verdict, "verdict %d, want %d (%s)", s.verdict, verdict, s.why);
	cr_assert_eq(s.good, good, "good %zu, want %zu (%s)", s.good, good, s.why);
	cr_assert_eq(s.records, records);
	cr_assert_eq(s.err, 0);
	if (why)
		cr_assert(strstr(s.why, why), "why '%s' lacks '%s'", s.why, why);
	mr__ctl_release(&c);
}

Test(record, torn_tail_or_corruption)
{
	size_t off[16];
	int n;
	struct ctl_jbuf b = frames_of_state(off, &n);
	size_t len = b.len, last = off[n - 1];
	unsigned char *x = malloc(len + 4096);

#define FRESH() memcpy(x, b.p, len)
	FRESH();
	expect_scan(x, len, CTL_JR_CLEAN, len, 8, NULL);
	/* torn: a prefix of the last record, or of its header */
	expect_scan(x, len - 3, CTL_JR_TORN, last, 7, "runs past the end");
	expect_scan(x, last + 5, CTL_JR_TORN, last, 7, "incomplete record header");
	/* torn: the last record complete in length but not in content */
	x[len - 1] ^= 1;
	expect_scan(x, len, CTL_JR_TORN, last, 7, "crc mismatch");
	/* torn: zeros after the last good record, or after a partial one */
	FRESH();
	memset(x + len, 0, 4096);
	expect_scan(x, len + 4096, CTL_JR_TORN, len, 8, "zero record length");
	memset(x + len - 4, 0, 4);
	expect_scan(x, len + 4096, CTL_JR_TORN, last, 7, "crc mismatch");
	/* corrupt: a bad crc with records after it */
	FRESH();
	x[off[3] + 12] ^= 0x10;
	expect_scan(x, len, CTL_JR_CORRUPT, off[3], 3, "crc mismatch");
	/* corrupt: a length that runs past the end, with valid records after it */
	FRESH();
	wr32(x + off[3], 0x00ffffff);
	expect_scan(x, len, CTL_JR_CORRUPT, off[3], 3, "a valid record follows");
	/* corrupt: a zero length with data after it */
	FRESH();
	wr32(x, 0);
	expect_scan(x, len, CTL_JR_CORRUPT, 0, 0, "zero record length");
	/* corrupt: a good crc on an unknown type, even as the last record */
	FRESH();
	x[last + 8] = 200;
	wr32(x + last + 4, mr__crc32(x + last + 8, len - last - 8));
	expect_scan(x, len, CTL_JR_CORRUPT, last, 7, "unknown record type 200");
	/* corrupt: a good frame that does not fit the state (a key of a job
	 * that does not exist yet) */
	FRESH();
	expect_scan(x + off[3], len - off[3], CTL_JR_CORRUPT, 0, 0, "kv_put");
#undef FRESH
	free(x);
	mr__jbuf_release(&b);
}

/* ---- the data dir's lock ---------------------------------------------------------------- */

Test(record, a_locked_data_dir_is_refused)
{
	char dir[256], want[400];
	struct ctl a, b;
	struct ctl_journal_opts o = { 0 };
	struct ctl_journal_info ji;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	cr_assert_eq(mr_test_tmpdir(dir, sizeof(dir), "mr-jr"), 0);
	jopen(&a, dir, 0, 0);
	setup(&b);
	o.dir = dir;
	cr_assert_eq(mr__ctl_journal_open(&b, &o, &ji, &eb), MR_ECONFLICT);
	cr_assert_null(b.jr);
	snprintf(want, sizeof(want), "data dir '%s' is in use by another controller (pid %d on '",
		 dir, (int)getpid());
	cr_assert(strstr(eb.msg, want), "'%s' lacks '%s'", eb.msg, want);
	mr__ctl_journal_close(&a); /* releases it */
	memset(&eb, 0, sizeof(eb));
	cr_assert_eq(mr__ctl_journal_open(&b, &o, &ji, &eb), 0, "%s", eb.msg);
	mr__ctl_journal_close(&b);
	mr__ctl_release(&a);
	mr__ctl_release(&b);
	mr_test_rmdir(dir);
}

/* ---- compaction ---------------------------------------------------------------------------- */

Test(record, compaction_drops_the_pending_batch_and_keeps_its_effects)
{
	char dir[256], k[16];
	struct ctl a;
	off_t before;

	cr_assert_eq(mr_test_tmpdir(dir, sizeof(dir), "mr-jr"), 0);
	jopen(&a, dir, 0, 0);
	join(&a, "x", 0);
	join(&a, "y", 1);
	for (int i = 0; i < 50; i++) {
		snprintf(k, sizeof(k), "k%d", i % 5);
		kv_put(&a, k, i % 2 ? "odd" : "even");
	}
	cr_assert_eq(mr__jr_commit(a.jr), 0);
	before = file_size(dir);
	kv_put(&a, "pending", "in the batch only");
	kv_del(&a, "k0");
	cr_assert(mr__jr_pending(a.jr));
	cr_assert_eq(mr__jr_compact(a.jr), 0);
	cr_assert(!mr__jr_pending(a.jr), "the batch is in the snapshot");
	cr_assert_eq(mr__jr_compactions(a.jr), 1);
	cr_assert_lt(file_size(dir), before, "50 puts of 5 keys became 5");
	cr_assert_eq((uint64_t)file_size(dir), mr__jr_size(a.jr));
	/* more after the compaction, then a reopen (as after kill -9) */
	kv_put(&a, "after", "x");
	kv_put(&a, "k1", "changed");
	cr_assert_eq(mr__jr_commit(a.jr), 0);
	expect_survives(&a, dir);
	mr__ctl_release(&a);
	mr_test_rmdir(dir);
}

struct donewait {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
};

static void on_done(void *arg)
{
	struct donewait *d = arg;

	pthread_mutex_lock(&d->mu);
	d->done = 1;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

/* One pipelined commit: hand off, wait for the writer, finish. */
static int pipelined(struct ctl *a, struct donewait *d)
{
	int rc = mr__jr_commit_start(a->jr, on_done, d);

	if (rc != 1)
		return rc;
	pthread_mutex_lock(&d->mu);
	while (!d->done)
		pthread_cond_wait(&d->cv, &d->mu);
	d->done = 0;
	pthread_mutex_unlock(&d->mu);
	return mr__jr_commit_finish(a->jr);
}

Test(record, compaction_is_handed_to_the_writer_when_the_journal_outgrows_the_state)
{
	struct donewait d = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };
	char dir[256], k[16], v[64];
	struct ctl a;
	uint64_t peak = 0;

	cr_assert_eq(mr_test_tmpdir(dir, sizeof(dir), "mr-jr"), 0);
	jopen(&a, dir, 2, 1024);
	join(&a, "x", 0);
	join(&a, "y", 1);
	cr_assert_eq(pipelined(&a, &d), 0);
	for (int i = 0; i < 400; i++) {
		snprintf(k, sizeof(k), "k%d", i % 8);
		snprintf(v, sizeof(v), "value-%d-of-some-length-to-grow-the-journal", i);
		kv_put(&a, k, v);
		if (i % 3 == 2) {
			cr_assert_eq(pipelined(&a, &d), 0);
			cr_assert(!mr__jr_pending(a.jr));
			if (mr__jr_size(a.jr) > peak)
				peak = mr__jr_size(a.jr);
		}
	}
	cr_assert_eq(pipelined(&a, &d), 0);
	cr_assert_geq(mr__jr_compactions(a.jr), 3, "compacted %llu times",
		      (unsigned long long)mr__jr_compactions(a.jr));
	cr_assert_lt(peak, 8192, "the journal stays near 2 x its state (peak %llu)",
		     (unsigned long long)peak);
	cr_assert_eq((uint64_t)file_size(dir), mr__jr_size(a.jr));
	mr__jr_free_writer(a.jr);
	expect_survives(&a, dir);
	mr__ctl_release(&a);
	mr_test_rmdir(dir);
}

Test(record, a_lost_batch_forces_a_compaction)
{
	char dir[256];
	struct ctl a;

	cr_assert_eq(mr_test_tmpdir(dir, sizeof(dir), "mr-jr"), 0);
	jopen(&a, dir, 0, 0);
	join(&a, "x", 0);
	cr_assert_eq(mr__jr_commit(a.jr), 0);
	join(&a, "y", 1); /* closes the round */
	kv_put(&a, "k", "v");
	mr__jr_batch(a.jr)->failed = 1; /* as if recording ran out of memory */
	cr_assert_eq(mr__jr_commit(a.jr), 0, "the snapshot replaces the lost batch");
	cr_assert_eq(mr__jr_compactions(a.jr), 1);
	expect_survives(&a, dir);
	mr__ctl_release(&a);
	mr_test_rmdir(dir);
}

Test(record, a_compaction_that_cannot_write_falls_back_or_is_owed)
{
	char dir[256], tmp[300];
	struct ctl a;
	off_t before;

	cr_assert_eq(mr_test_tmpdir(dir, sizeof(dir), "mr-jr"), 0);
	snprintf(tmp, sizeof(tmp), "%s/journal.tmp", dir);
	jopen(&a, dir, 0, 0);
	join(&a, "x", 0);
	cr_assert_eq(mr__jr_commit(a.jr), 0);
	/* journal.tmp cannot be created: a due compaction appends instead */
	cr_assert_eq(mkdir(tmp, 0700), 0);
	before = file_size(dir);
	kv_put(&a, "k", "v1");
	cr_assert_eq(mr__jr_compact(a.jr), 0, "the batch is appended to the old file");
	cr_assert_eq(mr__jr_compactions(a.jr), 0);
	cr_assert_gt(file_size(dir), before);
	/* a lost batch owes a compaction: until one works, commits fail */
	kv_put(&a, "k", "v2");
	mr__jr_batch(a.jr)->failed = 1;
	cr_assert_eq(mr__jr_commit(a.jr), MR_EIO);
	kv_put(&a, "k2", "w");
	cr_assert_eq(mr__jr_commit(a.jr), MR_EIO, "no append after a hole");
	cr_assert_eq(rmdir(tmp), 0);
	kv_put(&a, "k3", "z");
	cr_assert_eq(mr__jr_commit(a.jr), 0, "the owed compaction");
	cr_assert_eq(mr__jr_compactions(a.jr), 1);
	expect_survives(&a, dir);
	mr__ctl_release(&a);
	mr_test_rmdir(dir);
}

/* A journal written before this layering (tests/fuzz/corpus/controller/
 * journal-basic without its selector byte): job (no reason field), two
 * members, round close, KV put, bump. Record formats did not change. */
static const unsigned char old_journal[] = {
	0x18, 0x00, 0x00, 0x00, 0xf3, 0x56, 0x59, 0x7f, 0x01, 0x05, 0x6e, 0x73,
	0x2f, 0x6a, 0x02, 0x02, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00, 0x00, 0xe8,
	0x07, 0x03, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0f, 0x00, 0x00, 0x00,
	0x3b, 0x13, 0x20, 0x76, 0x03, 0x05, 0x6e, 0x73, 0x2f, 0x6a, 0x02, 0x61,
	0x02, 0x68, 0x00, 0x00, 0x01, 0x00, 0x00, 0x19, 0x00, 0x00, 0x00, 0x3a,
	0x1c, 0x4e, 0xb5, 0x03, 0x05, 0x6e, 0x73, 0x2f, 0x6a, 0x02, 0x62, 0x02,
	0x68, 0x00, 0x0b, 0x7b, 0x22, 0x63, 0x6f, 0x6d, 0x6d, 0x22, 0x3a, 0x31,
	0x7d, 0x02, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x6c, 0xab, 0x72, 0xb9,
	0x05, 0x05, 0x6e, 0x73, 0x2f, 0x6a, 0x01, 0x02, 0x13, 0x00, 0x00, 0x00,
	0x54, 0x57, 0x12, 0x66, 0x07, 0x05, 0x6e, 0x73, 0x2f, 0x6a, 0x07, 0x70,
	0x65, 0x65, 0x72, 0x2f, 0x30, 0x01, 0x04, 0x61, 0x64, 0x64, 0x72, 0x09,
	0x00, 0x00, 0x00, 0x0a, 0x61, 0x59, 0x86, 0x06, 0x05, 0x6e, 0x73, 0x2f,
	0x6a, 0x02, 0x01, 0x00,
};

Test(record, a_journal_written_before_replays_unchanged)
{
	struct ctl c;
	struct ctl_jr_scan s;
	struct ctl_job *job;

	setup(&c);
	mr__ctl_replay(&c, old_journal, sizeof(old_journal), &s);
	cr_assert_eq(s.verdict, CTL_JR_CLEAN, "%s", s.why);
	cr_assert_eq(s.good, sizeof(old_journal));
	cr_assert_eq(s.records, 6);
	job = mr__ctl_job(&c, "ns/j");
	cr_assert_not_null(job);
	cr_assert_eq(job->generation, 2, "the bump was applied");
	cr_assert_eq(job->state, CTL_JOB_FORMING);
	cr_assert_eq(job->count[CTL_M_STALE], 2);
	cr_assert_eq(mr_dict_len(&job->kv), 0, "the bump cleared the KV store");
	mr__ctl_release(&c);
}
