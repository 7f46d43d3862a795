/*
 * test_journal.c - the controller's journal and data dir against real
 * meshrun-controller processes: a corrupt byte in the middle of the
 * journal stops the start (exit 2, the message names file, offset and
 * record count, the file is left as it was); a torn tail is dropped with a
 * warning; --journal-recover keeps the valid prefix after preserving the
 * original beside it, and a second recovery never overwrites the first
 * copy; a second controller on a data dir exits 2 naming the dir and the
 * holder's pid while the first keeps serving and its writes survive its
 * restart; compaction while running, under concurrent writes, then
 * kill -9 and restart, keeps every acknowledged write.
 *
 * Only the binary is used (no controller internals), so these tests also
 * run against an older build (MESHRUN_BUILD) to show what they catch.
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_test.h"

/* ---- helpers ---------------------------------------------------------------- */

static unsigned char *read_bytes(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	unsigned char *buf;
	long n;

	cr_assert_not_null(f, "unable to open '%s'", path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static void write_bytes(const char *path, const unsigned char *buf, size_t len)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f, "unable to create '%s'", path);
	cr_assert_eq(fwrite(buf, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
}

/* Offsets of the frames (u32 LE length, u32 CRC, payload) of a journal. */
static int frames(const unsigned char *buf, size_t len, size_t *off, int max)
{
	size_t o = 0;
	int n = 0;

	while (o + 8 <= len && n < max) {
		uint32_t plen = (uint32_t)buf[o] | (uint32_t)buf[o + 1] << 8 |
				(uint32_t)buf[o + 2] << 16 | (uint32_t)buf[o + 3] << 24;

		off[n++] = o;
		o += 8 + plen;
	}
	cr_assert_eq(o, len, "the journal is not a sequence of frames");
	return n;
}

static char *slurp_log(const struct ctlp *c)
{
	size_t n;
	char *s = (char *)read_bytes(c->log, &n);

	s[n] = 0;
	return s;
}

/* Waits (30 s at most) for a controller that must exit by itself; returns
 * its exit status (-1 if it had to be killed or died by a signal). */
static int exit_status(struct ctlp *c)
{
	int killed = mr_proc_reap(&c->proc, 30000);

	if (killed || !WIFEXITED(c->proc.status))
		return -1;
	return WEXITSTATUS(c->proc.status);
}

/* Names of the files in dir starting with prefix, sorted; returns count. */
static int list_prefix(const char *dir, const char *prefix, char names[][512], int max)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	cr_assert_not_null(d);
	while ((e = readdir(d)) && n < max) {
		if (!strncmp(e->d_name, prefix, strlen(prefix)))
			snprintf(names[n++], 512, "%.250s/%.250s", dir, e->d_name);
	}
	closedir(d);
	for (int i = 1; i < n; i++) /* insertion sort: a handful of names */
		for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
			char t[512];

			memcpy(t, names[j], 512);
			memcpy(names[j], names[j - 1], 512);
			memcpy(names[j - 1], t, 512);
		}
	return n;
}

static void mkjob(struct ctlp *c, const char *body)
{
	struct mr_test_resp r;

	ctl_call(c, &r, "POST", body, NULL, "/v1/jobs");
	cr_assert(r.status == 201 || r.status == 200, "create: %ld %s", r.status, r.body);
}

static void put(struct ctlp *c, const char *job, const char *key, const char *val)
{
	struct mr_test_resp r;

	ctl_call(c, &r, "PUT", val, NULL, "/v1/jobs/%s/kv/%s", job, key);
	cr_assert_eq(r.status, 200, "put %s: %ld %s", key, r.status, r.body);
}

static void expect_kv(struct ctlp *c, const char *job, const char *key, const char *val)
{
	struct mr_test_resp r;

	ctl_call(c, &r, "GET", NULL, NULL, "/v1/jobs/%s/kv/%s", job, key);
	if (!val) {
		cr_assert_eq(r.status, 404, "%s must be absent: %ld %s", key, r.status, r.body);
		return;
	}
	cr_assert_eq(r.status, 200, "get %s: %ld %s", key, r.status, r.body);
	cr_assert_str_eq(r.body, val, "value of %s", key);
}

/* A controller with job t/j and keys k0..k<n-1> = v0..., stopped cleanly;
 * its journal is R_JOB then one R_KV_PUT per key. */
static void make_journal(struct ctlp *c, int n)
{
	char key[16], val[16];

	ctlp_start(c, 0, NULL);
	mkjob(c, "{\"name\":\"t/j\",\"min_nodes\":2}");
	for (int i = 0; i < n; i++) {
		snprintf(key, sizeof(key), "k%d", i);
		snprintf(val, sizeof(val), "v%d", i);
		put(c, "t/j", key, val);
	}
	ctlp_stop(c, 0);
}

/* ---- corruption -------------------------------------------------------------- */

/* Flips bit `bit` of byte `at`, starts the controller and expects it to
 * refuse with exit 2 naming the file, `off` and `good`, leaving the file as
 * it was and no copy beside it. */
static void expect_refusal(struct ctlp *c, const unsigned char *orig, size_t len, size_t at,
			   int bit, size_t off, int good)
{
	char path[400], want[600], names[4][512];
	unsigned char *bad = malloc(len), *after;
	size_t alen;
	char *log;

	memcpy(bad, orig, len);
	bad[at] ^= (unsigned char)(1u << bit);
	snprintf(path, sizeof(path), "%s/journal", c->dir);
	write_bytes(path, bad, len);
	ctlp_spawn(c, 0, NULL);
	cr_assert_eq(exit_status(c), 2, "a corrupt journal must stop the start with exit 2 "
		     "(byte %zu bit %d; log %s)", at, bit, c->log);
	log = slurp_log(c);
	snprintf(want, sizeof(want), "journal '%s' is corrupt at offset %zu (after %d good records)",
		 path, off, good);
	cr_assert(strstr(log, want), "the error names file, offset and count: want \"%s\" in:\n%s",
		  want, log);
	cr_assert(strstr(log, "--journal-recover"), "the error says how to recover:\n%s", log);
	free(log);
	after = read_bytes(path, &alen);
	cr_assert(alen == len && !memcmp(after, bad, len), "the journal must be left as it was");
	cr_assert_eq(list_prefix(c->dir, "journal.corrupt", names, 4), 0,
		     "nothing is preserved without --journal-recover");
	free(after);
	free(bad);
}

Test(journal, corrupt_byte_in_the_middle_stops_the_start)
{
	struct ctlp c = { 0 };
	char path[400];
	unsigned char *orig;
	size_t len, off[32];
	int n;

	make_journal(&c, 10);
	snprintf(path, sizeof(path), "%s/journal", c.dir);
	orig = read_bytes(path, &len);
	n = frames(orig, len, off, 32);
	cr_assert_eq(n, 11, "R_JOB + 10 KV puts");
	/* a byte inside record 5's payload: crc mismatch, records follow */
	expect_refusal(&c, orig, len, off[5] + 11, 0, off[5], 5);
	/* the case: one flipped bit in byte 0 (record 0's length) */
	expect_refusal(&c, orig, len, 0, 0, 0, 0);
	expect_refusal(&c, orig, len, 0, 6, 0, 0);
	/* a flipped high bit of a length: runs past the end of the file, but
	 * valid records follow it */
	expect_refusal(&c, orig, len, off[3] + 2, 7, off[3], 3);
	/* the original journal still starts and serves everything */
	write_bytes(path, orig, len);
	ctlp_start(&c, 0, NULL);
	expect_kv(&c, "t/j", "k0", "v0");
	expect_kv(&c, "t/j", "k9", "v9");
	ctlp_stop(&c, 1);
	free(orig);
}

/* ---- torn tail ------------------------------------------------------------------ */

Test(journal, torn_tail_is_dropped_with_a_warning)
{
	struct ctlp c = { 0 };
	char path[400], *log;
	unsigned char *orig, *zeros;
	size_t len, off[32];

	make_journal(&c, 5);
	snprintf(path, sizeof(path), "%s/journal", c.dir);
	orig = read_bytes(path, &len);
	cr_assert_eq(frames(orig, len, off, 32), 6);
	/* kill -9 in the middle of the last write: a prefix of a record */
	cr_assert_eq(truncate(path, (off_t)len - 2), 0);
	ctlp_start(&c, 0, NULL);
	expect_kv(&c, "t/j", "k3", "v3");
	expect_kv(&c, "t/j", "k4", NULL);
	mr_proc_kill(&c.proc, SIGKILL);
	mr_proc_reap(&c.proc, 5000);
	log = slurp_log(&c);
	cr_assert(strstr(log, "event=journal_tail_dropped"), "a warning is logged:\n%s", log);
	free(log);
	/* a last record whose bytes did not all reach the disk: bad crc, at EOF */
	orig[len - 1] ^= 0x40;
	write_bytes(path, orig, len);
	ctlp_start(&c, 0, NULL);
	expect_kv(&c, "t/j", "k3", "v3");
	expect_kv(&c, "t/j", "k4", NULL);
	ctlp_stop(&c, 0);
	/* a zero-filled tail (blocks a crash allocated but never wrote) */
	orig[len - 1] ^= 0x40;
	zeros = calloc(1, len + 4096);
	cr_assert_not_null(zeros);
	memcpy(zeros, orig, len);
	write_bytes(path, zeros, len + 4096);
	ctlp_start(&c, 0, NULL);
	expect_kv(&c, "t/j", "k4", "v4");
	ctlp_stop(&c, 1);
	free(zeros);
	free(orig);
}

/* ---- --journal-recover ------------------------------------------------------------ */

Test(journal, recover_keeps_the_valid_prefix_and_preserves_the_original)
{
	struct ctlp c = { 0 };
	const char *recover[] = { "--journal-recover", NULL };
	char path[400], names[8][512], *log;
	unsigned char *first, *second, *kept;
	size_t len1, len2, klen, off[32];

	make_journal(&c, 10);
	snprintf(path, sizeof(path), "%s/journal", c.dir);
	first = read_bytes(path, &len1);
	cr_assert_eq(frames(first, len1, off, 32), 11);
	first[off[5] + 11] ^= 1; /* record 5 (k4) is corrupt, 5 good before it */
	write_bytes(path, first, len1);
	ctlp_start(&c, 0, recover);
	for (int i = 0; i < 10; i++) {
		char key[16], val[16];

		snprintf(key, sizeof(key), "k%d", i);
		snprintf(val, sizeof(val), "v%d", i);
		expect_kv(&c, "t/j", key, i < 4 ? val : NULL);
	}
	log = slurp_log(&c);
	cr_assert(strstr(log, "event=journal_recovered"), "recovery is logged:\n%s", log);
	free(log);
	cr_assert_eq(list_prefix(c.dir, "journal.corrupt.", names, 8), 1);
	kept = read_bytes(names[0], &klen);
	cr_assert(klen == len1 && !memcmp(kept, first, len1),
		  "the original is preserved byte for byte beside the journal");
	free(kept);
	put(&c, "t/j", "k10", "v10");
	put(&c, "t/j", "k11", "v11");
	ctlp_stop(&c, 0);

	/* corrupt again and recover again (likely in the same second) */
	second = read_bytes(path, &len2);
	cr_assert_eq(frames(second, len2, off, 32), 7, "R_JOB + 4 kept keys + 2 puts");
	second[off[5] + 11] ^= 1; /* k10: the first put after the snapshot */
	write_bytes(path, second, len2);
	ctlp_start(&c, 0, recover);
	expect_kv(&c, "t/j", "k0", "v0");
	expect_kv(&c, "t/j", "k3", "v3");
	expect_kv(&c, "t/j", "k10", NULL);
	expect_kv(&c, "t/j", "k11", NULL);
	ctlp_stop(&c, 0);
	cr_assert_eq(list_prefix(c.dir, "journal.corrupt.", names, 8), 2);
	for (int i = 0; i < 2; i++) {
		kept = read_bytes(names[i], &klen);
		if (klen == len1)
			cr_assert(!memcmp(kept, first, len1), "the first copy is never overwritten");
		else
			cr_assert(klen == len2 && !memcmp(kept, second, len2),
				  "the second copy is the second original");
		free(kept);
	}
	mr_test_rmdir(c.dir);
	free(first);
	free(second);
}

/* ---- one controller per data dir ----------------------------------------------------- */

Test(journal, second_controller_on_a_data_dir_exits_2)
{
	struct ctlp a = { 0 }, b = { 0 };
	char want[600], *log;

	ctlp_start(&a, 0, NULL);
	mkjob(&a, "{\"name\":\"t/l\",\"min_nodes\":2}");
	put(&a, "t/l", "before", "1");
	memcpy(b.dir, a.dir, sizeof(b.dir));
	snprintf(b.port_file, sizeof(b.port_file), "%s/port-b", a.dir);
	snprintf(b.log, sizeof(b.log), "%s/controller-b.log", a.dir);
	ctlp_spawn(&b, 0, NULL);
	cr_assert_eq(exit_status(&b), 2, "the second controller must exit 2 (log %s)", b.log);
	log = slurp_log(&b);
	snprintf(want, sizeof(want), "data dir '%s' is in use by another controller (pid %d",
		 a.dir, (int)a.proc.pid);
	cr_assert(strstr(log, want), "want \"%s\" in:\n%s", want, log);
	free(log);
	/* the first one is untouched: it serves, and what it acknowledges is
	 * in the journal it replays after kill -9 */
	put(&a, "t/l", "after", "2");
	mr_proc_kill(&a.proc, SIGKILL);
	mr_proc_reap(&a.proc, 5000);
	ctlp_start(&a, 0, NULL);
	expect_kv(&a, "t/l", "before", "1");
	expect_kv(&a, "t/l", "after", "2");
	ctlp_stop(&a, 1);
}

/* ---- compaction while running ---------------------------------------------------------- */

#define WRITERS 4
#define KEYS 16
#define WRITES 150

struct writer {
	struct ctlp *c;
	int id;
	char last[KEYS][400]; /* last acknowledged value; "" = deleted */
	int acked;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	struct mr_test_resp *r = malloc(sizeof(*r));
	char val[400];

	for (int i = 0; i < WRITES; i++) {
		int k = (i * 7) % KEYS;

		if (i % 9 == 8) {
			ctl_call(w->c, r, "DELETE", NULL, NULL, "/v1/jobs/t/c/kv/w%d-%d", w->id, k);
			if (r->status == 200 || r->status == 404) {
				w->last[k][0] = 0;
				w->acked++;
			}
			continue;
		}
		snprintf(val, sizeof(val), "w%d-i%d-%0300d", w->id, i, i);
		ctl_call(w->c, r, "PUT", val, NULL, "/v1/jobs/t/c/kv/w%d-%d", w->id, k);
		if (r->status == 200) {
			memcpy(w->last[k], val, strlen(val) + 1);
			w->acked++;
		}
	}
	free(r);
	return NULL;
}

static long long compactions(struct ctlp *c)
{
	struct mr_test_resp r;
	const char *m = "\nmeshrun_controller_journal_compactions_total ";
	const char *p;

	ctl_call(c, &r, "GET", NULL, NULL, "/metrics");
	cr_assert_eq(r.status, 200);
	p = strstr(r.body, m);
	cr_assert_not_null(p, "no compaction counter in:\n%s", r.body);
	return atoll(p + strlen(m));
}

Test(journal, compaction_while_running_keeps_every_acknowledged_write)
{
	struct ctlp c = { 0 };
	const char *extra[] = { "--journal-compact-factor", "2", "--journal-compact-min", "4096",
				NULL };
	static struct writer w[WRITERS];
	pthread_t th[WRITERS];
	struct mr_test_resp r;
	char *log;
	json_t *o;

	ctlp_start(&c, 0, extra);
	mkjob(&c, "{\"name\":\"t/c\",\"min_nodes\":2,\"max_nodes\":2,"
		  "\"heartbeat_timeout_ms\":600000}");
	ctl_call(&c, &r, "POST", "{\"node_id\":\"a\",\"host\":\"h\",\"pod_index\":0}", NULL,
		 "/v1/jobs/t/c/join");
	cr_assert_eq(r.status, 200, "%s", r.body);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"b\",\"host\":\"h\",\"pod_index\":1}", NULL,
		 "/v1/jobs/t/c/join");
	cr_assert_eq(r.status, 200, "%s", r.body);
	for (int i = 0; i < WRITERS; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		w[i].c = &c;
		w[i].id = i;
		cr_assert_eq(pthread_create(&th[i], NULL, writer_main, &w[i]), 0);
	}
	for (int i = 0; i < WRITERS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < WRITERS; i++)
		cr_assert_eq(w[i].acked, WRITES, "writer %d: every write was acknowledged", i);
	cr_assert_geq(compactions(&c), 2, "the journal was compacted while running");
	put(&c, "t/c", "last", "after-the-compactions");
	log = slurp_log(&c);
	cr_assert(!strstr(log, "journal_compaction_failed") && !strstr(log, "journal_write_failed"),
		  "%s", log);
	free(log);

	mr_proc_kill(&c.proc, SIGKILL);
	mr_proc_reap(&c.proc, 5000);
	ctlp_start(&c, 0, NULL);
	for (int i = 0; i < WRITERS; i++) {
		for (int k = 0; k < KEYS; k++) {
			char key[32];

			snprintf(key, sizeof(key), "w%d-%d", i, k);
			expect_kv(&c, "t/c", key, w[i].last[k][0] ? w[i].last[k] : NULL);
		}
	}
	expect_kv(&c, "t/c", "last", "after-the-compactions");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/t/c");
	cr_assert_eq(r.status, 200);
	o = resp_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(o, "state")), "running");
	cr_assert_eq(json_integer_value(json_object_get(o, "generation")), 1);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(o, "members"), "running")),
		     2);
	json_decref(o);
	ctlp_stop(&c, 1);
}
