/*
 * test_tb_events.c - the TensorBoard event file (runtime/mr_tb_events.h,
 * the gpt worker's "tensorboard_dir"), read back by a reader written here
 * from the format, not from the writer's code: records with both masked
 * CRC-32Cs checked, Event and Summary decoded field by field. A short
 * training run writes file_version "brain.Event:2" first, then per step a
 * "loss" equal (as float) to the loss log's, val_loss where evaluated, and
 * the other scalars; a resume adds a new file that starts with SessionLog
 * START at the first step trained again; in a `meshrun local` job of two
 * ranks only rank 0 writes; an unwritable directory is refused naming the
 * key, a directory that is not a string too.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mr_gpt_worker.h"
#include "mr_tb_events.h"
#include "proc.h"

/* ---- the reader -------------------------------------------------------- */

/* CRC-32C bit by bit (the writer uses a table). */
static uint32_t crc32c(const uint8_t *p, size_t n)
{
	uint32_t c = 0xffffffffu;

	while (n--) {
		c ^= *p++;
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
	}
	return ~c;
}

static uint32_t masked(const uint8_t *p, size_t n)
{
	uint32_t c = crc32c(p, n);

	return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t le(const uint8_t *p, int bytes)
{
	uint64_t v = 0;

	for (int i = bytes - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t varint(const uint8_t **p, const uint8_t *end)
{
	uint64_t v = 0;

	for (int shift = 0; shift < 64; shift += 7) {
		cr_assert(*p < end, "varint runs past its message");
		uint8_t b = *(*p)++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return v;
	}
	cr_assert_fail("varint longer than 10 bytes");
	return 0;
}

#define MAX_VALUES 16
struct event {
	double wall_time;
	int64_t step;
	char file_version[32]; /* "" when absent */
	int session_status;    /* -1 when no session_log */
	int nvalues;           /* summary values */
	char tag[MAX_VALUES][64];
	float value[MAX_VALUES];
};

/* A field's key: number and wire type; *p is moved past it. */
static void key(const uint8_t **p, const uint8_t *end, int *field, int *wire)
{
	uint64_t k = varint(p, end);

	*field = (int)(k >> 3);
	*wire = (int)(k & 7);
}

/* Moves *p past a field of wire type wire it does not look into; a
 * length-delimited one's bytes into *data, *len. */
static void skip(const uint8_t **p, const uint8_t *end, int wire, const uint8_t **data,
		 size_t *len)
{
	size_t n = wire == 1 ? 8 : wire == 5 ? 4 : 0;

	if (wire == 0) {
		varint(p, end);
		return;
	}
	if (wire == 2)
		n = (size_t)varint(p, end);
	cr_assert(wire == 1 || wire == 2 || wire == 5, "unexpected wire type %d", wire);
	cr_assert((size_t)(end - *p) >= n, "field runs past its message");
	if (data) {
		*data = *p;
		*len = n;
	}
	*p += n;
}

static void decode_value(const uint8_t *p, const uint8_t *end, struct event *e)
{
	int f, w, i = e->nvalues++, have_value = 0;
	const uint8_t *d;
	size_t n;

	cr_assert(i < MAX_VALUES, "too many values in one summary");
	e->tag[i][0] = 0;
	while (p < end) {
		key(&p, end, &f, &w);
		if (f == 1 && w == 2) {
			skip(&p, end, w, &d, &n);
			cr_assert(n < sizeof(e->tag[i]), "tag of %zu bytes", n);
			memcpy(e->tag[i], d, n);
			e->tag[i][n] = 0;
		} else if (f == 2 && w == 5) {
			uint32_t bits = (uint32_t)le(p, 4);
			memcpy(&e->value[i], &bits, 4);
			p += 4;
			have_value = 1;
		} else {
			skip(&p, end, w, NULL, NULL);
		}
	}
	cr_assert(have_value, "value '%s' has no simple_value", e->tag[i]);
}

static void decode_event(const uint8_t *p, const uint8_t *end, struct event *e)
{
	int f, w;
	const uint8_t *d;
	size_t n;

	memset(e, 0, sizeof(*e));
	e->session_status = -1;
	while (p < end) {
		key(&p, end, &f, &w);
		if (f == 1 && w == 1) {
			uint64_t bits = le(p, 8);
			memcpy(&e->wall_time, &bits, 8);
			p += 8;
		} else if (f == 2 && w == 0) {
			e->step = (int64_t)varint(&p, end);
		} else if (f == 3 && w == 2) {
			skip(&p, end, w, &d, &n);
			cr_assert(n < sizeof(e->file_version));
			memcpy(e->file_version, d, n);
		} else if (f == 5 && w == 2) { /* Summary: repeated 1: Value */
			skip(&p, end, w, &d, &n);
			for (const uint8_t *q = d, *qe = d + n; q < qe;) {
				const uint8_t *v;
				size_t vn;
				key(&q, qe, &f, &w);
				cr_assert(f == 1 && w == 2, "summary field %d wire %d", f, w);
				skip(&q, qe, w, &v, &vn);
				decode_value(v, v + vn, e);
			}
		} else if (f == 7 && w == 2) { /* SessionLog: 1: status */
			skip(&p, end, w, &d, &n);
			for (const uint8_t *q = d, *qe = d + n; q < qe;) {
				key(&q, qe, &f, &w);
				if (f == 1 && w == 0)
					e->session_status = (int)varint(&q, qe);
				else
					skip(&q, qe, w, NULL, NULL);
			}
			if (e->session_status < 0)
				e->session_status = 0;
		} else {
			skip(&p, end, w, NULL, NULL);
		}
	}
}

/* Every record of the file at path, CRCs checked, decoded into ev (at
 * most max); the count. */
static int read_events(const char *path, struct event *ev, int max)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = malloc(1 << 20);
	size_t len, off = 0;
	int n = 0;

	cr_assert_not_null(f, "unable to open '%s'", path);
	len = fread(buf, 1, 1 << 20, f);
	fclose(f);
	while (off < len) {
		uint64_t dlen;
		cr_assert(len - off >= 12, "%s: a torn record header at %zu", path, off);
		dlen = le(buf + off, 8);
		cr_assert_eq((uint32_t)le(buf + off + 8, 4), masked(buf + off, 8),
			     "%s: bad length crc at %zu", path, off);
		cr_assert(len - off - 12 >= dlen + 4, "%s: a torn record at %zu", path, off);
		cr_assert_eq((uint32_t)le(buf + off + 12 + dlen, 4), masked(buf + off + 12, dlen),
			     "%s: bad data crc at %zu", path, off);
		cr_assert(n < max, "more than %d records", max);
		decode_event(buf + off + 12, buf + off + 12 + dlen, &ev[n++]);
		off += 12 + dlen + 4;
	}
	free(buf);
	return n;
}

/* The value tagged tag in e, or NAN with *found 0. */
static float value_of(const struct event *e, const char *tag, int *found)
{
	int hits = 0;
	float v = NAN;

	for (int i = 0; i < e->nvalues; i++)
		if (!strcmp(e->tag[i], tag)) {
			hits++;
			v = e->value[i];
		}
	cr_assert(hits <= 1, "tag '%s' twice in the event of step %lld", tag, (long long)e->step);
	*found = hits;
	return v;
}

/* ---- the worker ---------------------------------------------------------- */

static char dir[256];

static void make_tmpdir(void)
{
	cr_assert_eq(mr_test_tmpdir(dir, sizeof(dir), "mr-tb"), 0);
}

static void remove_tmpdir(void)
{
	mr_test_rmdir(dir);
}

#define SMALL "\"vocab_size\":32,\"n_layer\":1,\"d_model\":32,\"n_head\":2,\"seq_len\":16," \
	      "\"batch_size\":4,\"threads\":1,\"peak_flops\":1e10,\"warmup_steps\":2"

/* A worker of SMALL + extra; *cfg (the worker borrows its strings) is the
 * caller's to free after destroy. */
static int create(void **w, json_t **cfg, const char *extra, struct mr_errbuf *eb)
{
	char js[1024];
	json_error_t err;
	json_t *c;
	struct mr_worker_env env;
	int rc;

	snprintf(js, sizeof(js), "{" SMALL ",%s}", extra);
	c = json_loads(js, 0, &err);
	cr_assert_not_null(c, "bad test json: %s", err.text);
	memset(&env, 0, sizeof(env));
	env.job = "ns/tb";
	env.world_size = env.local_world_size = 1;
	env.tp = env.pp = env.cp = env.ep = env.dp = 1;
	env.config = c;
	rc = mr_gpt_worker.create(w, &env, eb);
	*cfg = c;
	return rc;
}

/* Trains a worker of SMALL + extra until it is done. */
static void train(const char *extra)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_stats st;
	json_t *c;
	void *w;
	int rc;

	cr_assert_eq(create(&w, &c, extra, &eb), 0, "%s", eb.msg);
	do
		rc = mr_gpt_worker.step(w, &st, &eb);
	while (rc == MR_WORKER_MORE);
	cr_assert_eq(rc, MR_WORKER_DONE, "%s", eb.msg);
	mr_gpt_worker.destroy(w);
	json_decref(c);
}

static int by_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

/* The event files in d, sorted by name (TensorBoard's order); the count. */
static int event_files(const char *d, char names[][600], int max)
{
	DIR *dp = opendir(d);
	struct dirent *de;
	int n = 0;

	cr_assert_not_null(dp, "unable to open '%s'", d);
	while ((de = readdir(dp)))
		if (strstr(de->d_name, "tfevents")) {
			cr_assert(n < max);
			snprintf(names[n++], 600, "%s/%s", d, de->d_name);
		}
	closedir(dp);
	qsort(names, (size_t)n, 600, by_name);
	return n;
}

/* The losses of loss_log by step (lines that are not "step loss ..." are
 * skipped); the highest step. */
static int read_loss_log(const char *path, double *loss, int max)
{
	FILE *f = fopen(path, "r");
	char line[512];
	int top = 0;

	cr_assert_not_null(f, "unable to open '%s'", path);
	while (fgets(line, sizeof(line), f)) {
		long s;
		double v;
		if (sscanf(line, "%ld %lf", &s, &v) == 2 && s >= 1 && s < max) {
			loss[s] = v;
			top = s > top ? (int)s : top;
		}
	}
	fclose(f);
	return top;
}

/* The summary events ev[from..n) are steps first.. (one each), each with a
 * "loss" equal as float to loss[step], a val_loss every eval_every steps
 * and at the last, and the other scalars. */
static void expect_steps(const struct event *ev, int from, int n, int first, const double *loss,
			 int eval_every, int last)
{
	for (int i = from; i < n; i++) {
		const struct event *e = &ev[i];
		int step = first + (i - from), found;
		float v;

		cr_expect_eq(e->step, step, "event %d: step %lld, want %d", i, (long long)e->step,
			     step);
		cr_expect(e->wall_time > 1.7e9, "event %d: wall_time %f", i, e->wall_time);
		v = value_of(e, "loss", &found);
		cr_expect(found, "step %d has no loss", step);
		cr_expect_eq(v, (float)loss[step], "step %d: loss %.9g, the loss log's %.9g", step,
			     (double)v, loss[step]);
		value_of(e, "val_loss", &found);
		cr_expect_eq(found, step % eval_every == 0 || step == last, "step %d: val_loss %s", step,
			     found ? "where not evaluated" : "missing");
		v = value_of(e, "lr", &found);
		cr_expect(found && v > 0, "step %d: lr", step);
		v = value_of(e, "grad_norm", &found);
		cr_expect(found && v > 0, "step %d: grad_norm", step);
		v = value_of(e, "tokens_per_s", &found);
		cr_expect(found && v > 0, "step %d: tokens_per_s", step);
		v = value_of(e, "mfu", &found);
		cr_expect(found && v > 0, "step %d: mfu", step);
	}
}

/* ---- tests --------------------------------------------------------------- */

Test(tb_events, crc32c_known_answer)
{
	const char *s = "123456789";

	cr_expect_eq(mr_tb_crc32c(0, s, 9), 0xE3069283u, "0x%08x",
		     (unsigned)mr_tb_crc32c(0, s, 9));
	cr_expect_eq(crc32c((const uint8_t *)s, 9), 0xE3069283u, "the test's own crc");
	/* continued over pieces, as over the whole */
	cr_expect_eq(mr_tb_crc32c(mr_tb_crc32c(0, s, 4), s + 4, 5), 0xE3069283u);
	cr_expect_eq(mr_tb_crc32c(0, "", 0), 0u);
}

Test(tb_events, training_writes_version_then_scalars_per_step, .init = make_tmpdir,
     .fini = remove_tmpdir)
{
	char extra[1024], tb[300], log[300], names[4][600], host[256] = "", want[512];
	struct event ev[32];
	double loss[16] = { 0 };
	int n;

	snprintf(tb, sizeof(tb), "%s/runs/a", dir); /* made, parents too */
	snprintf(log, sizeof(log), "%s/loss.txt", dir);
	snprintf(extra, sizeof(extra),
		 "\"steps\":6,\"eval_every\":3,\"loss_log\":\"%s\",\"tensorboard_dir\":\"%s\"", log,
		 tb);
	train(extra);
	cr_assert_eq(event_files(tb, names, 4), 1, "one event file");
	/* TensorBoard's naming: events.out.tfevents.<secs>.<host>.<pid>.<suffix> */
	gethostname(host, sizeof(host) - 1);
	snprintf(want, sizeof(want), ".%s.%ld.meshrun", host, (long)getpid());
	cr_expect(strstr(names[0], "/events.out.tfevents.") != NULL, "%s", names[0]);
	cr_expect(strlen(names[0]) > strlen(want) &&
			  !strcmp(names[0] + strlen(names[0]) - strlen(want), want),
		  "%s does not end in %s", names[0], want);
	cr_assert_eq(read_loss_log(log, loss, 16), 6);
	n = read_events(names[0], ev, 32);
	cr_assert_str_eq(ev[0].file_version, "brain.Event:2", "the first record is the version");
	cr_expect_eq(ev[0].nvalues, 0);
	cr_assert(n >= 2);
	/* a fresh run restarts TensorBoard's view of the directory at step 1 */
	cr_expect_eq(ev[1].session_status, 1, "SessionLog START before the first step");
	cr_expect_eq(ev[1].step, 1);
	cr_assert_eq(n, 2 + 6, "version, start, one summary per step: %d records", n);
	expect_steps(ev, 2, n, 1, loss, 3, 6);
}

/* A run of `steps` checkpointing every 2 steps into dir/ck, its loss
 * log's losses into loss. */
static void train_ckpt(int steps, const char *tb, double *loss)
{
	char extra[1024], log[300];

	snprintf(log, sizeof(log), "%s/loss.txt", dir);
	snprintf(extra, sizeof(extra),
		 "\"steps\":%d,\"eval_every\":2,\"ckpt_every\":2,\"ckpt_dir\":\"%s/ck\","
		 "\"loss_log\":\"%s\",\"tensorboard_dir\":\"%s\"",
		 steps, dir, log, tb);
	train(extra);
	cr_assert_eq(read_loss_log(log, loss, 16), steps);
}

Test(tb_events, resume_writes_a_new_file_from_the_checkpoint, .init = make_tmpdir,
     .fini = remove_tmpdir)
{
	char tb[300], names[4][600];
	struct event ev[32];
	double loss1[16] = { 0 }, loss2[16] = { 0 };
	int n;

	snprintf(tb, sizeof(tb), "%s/tb", dir);
	train_ckpt(3, tb, loss1); /* checkpoint at step 2 */
	train_ckpt(5, tb, loss2); /* resumes at 2: trains 3 again, then 4, 5 */
	cr_assert_eq(event_files(tb, names, 4), 2, "a new file for the resumed run");
	n = read_events(names[0], ev, 32);
	cr_expect_eq(n, 2 + 3, "the first run's file: version, start, steps 1-3");
	expect_steps(ev, 2, n, 1, loss1, 2, 3);
	n = read_events(names[1], ev, 32);
	cr_assert(n >= 2);
	cr_assert_str_eq(ev[0].file_version, "brain.Event:2");
	cr_expect_eq(ev[1].session_status, 1, "SessionLog START");
	cr_expect_eq(ev[1].step, 3, "at the first step trained again, not %lld",
		     (long long)ev[1].step);
	cr_expect_eq(n, 2 + 3, "the resumed run's file: version, start, steps 3-5");
	expect_steps(ev, 2, n, 3, loss2, 2, 5);
}

Test(tb_events, unwritable_dir_is_refused_naming_the_key, .init = make_tmpdir,
     .fini = remove_tmpdir)
{
	struct mr_errbuf eb = { "", "" };
	char extra[512], file[300];
	void *w = &eb;
	json_t *c;
	FILE *f;

	/* a regular file where a directory must be (root may write anywhere) */
	snprintf(file, sizeof(file), "%s/plain", dir);
	cr_assert_not_null(f = fopen(file, "w"));
	fclose(f);
	snprintf(extra, sizeof(extra), "\"steps\":2,\"tensorboard_dir\":\"%s/tb\"", file);
	cr_expect(create(&w, &c, extra, &eb) < 0, "an unwritable tensorboard_dir must be refused");
	json_decref(c);
	cr_expect_null(w);
	cr_expect(strstr(eb.msg, "tensorboard_dir") != NULL, "'%s' names the key", eb.msg);
	cr_expect(strstr(eb.msg, file) != NULL, "'%s' names the path", eb.msg);
	cr_expect_str_eq(eb.field, "tensorboard_dir");
	memset(&eb, 0, sizeof(eb));
	cr_expect(create(&w, &c, "\"tensorboard_dir\":3", &eb) < 0, "a number is refused");
	json_decref(c);
	cr_expect(strstr(eb.msg, "tensorboard_dir") != NULL, "'%s' names the key", eb.msg);
}

Test(tb_events, only_rank_0_of_a_job_writes, .init = make_tmpdir, .fini = remove_tmpdir)
{
	char js[1024], tb[300], log[300], out[300], names[4][600], tail[4096];
	const char *args[] = { "local", "--nodes", "2", "--health-port", "0",
			       "--workload-config", js, NULL };
	struct mr_proc p;
	struct event ev[32];
	double loss[16] = { 0 };
	int n;

	snprintf(tb, sizeof(tb), "%s/tb", dir);
	snprintf(log, sizeof(log), "%s/loss.txt", dir);
	snprintf(out, sizeof(out), "%s/job.log", dir);
	snprintf(js, sizeof(js),
		 "{" SMALL ",\"steps\":4,\"eval_every\":2,\"loss_log\":\"%s\","
		 "\"tensorboard_dir\":\"%s\"}",
		 log, tb);
	cr_assert_eq(mr_proc_spawn(&p, "meshrun", args, NULL, out), 0);
	cr_assert_eq(mr_proc_reap(&p, 120000), 0, "meshrun local did not finish");
	mr_test_tail(out, tail, sizeof(tail));
	cr_assert(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0, "job failed:\n%s", tail);
	cr_assert_eq(event_files(tb, names, 4), 1, "one event file, rank 0's:\n%s", tail);
	cr_assert_eq(read_loss_log(log, loss, 16), 4);
	n = read_events(names[0], ev, 32);
	cr_assert(n >= 2);
	cr_expect_str_eq(ev[0].file_version, "brain.Event:2");
	cr_expect_eq(ev[1].session_status, 1);
	cr_expect_eq(n, 2 + 4, "version, start, steps 1-4: %d records", n);
	expect_steps(ev, 2, n, 1, loss, 2, 4);
}

Test(tb_events, empty_dir_is_off, .init = make_tmpdir, .fini = remove_tmpdir)
{
	char cwd[4096], names[4][600];

	cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
	cr_assert_eq(chdir(dir), 0);
	train("\"steps\":1,\"tensorboard_dir\":\"\"");
	cr_expect_eq(event_files(".", names, 4), 0, "no event file with an empty tensorboard_dir");
	cr_assert_eq(chdir(cwd), 0);
}
