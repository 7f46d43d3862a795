/*
 * test_loss_log.c - what a person sees of a gpt worker's run: the
 * loss_log's header and columns (val_loss "nan" where no validation ran),
 * one header over a resume, the schedule's lr in the lr column, and
 * validation that cannot be missed: val_data without eval_every is
 * evaluated every max(1, steps/10) steps, train_data without val_data is
 * never evaluated on the synthetic task (a warning says so).
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/mr_shard.h"
#include "mr_gpt_worker.h"

#define SMALL "\"vocab_size\":32,\"n_layer\":1,\"d_model\":32,\"n_head\":2,\"seq_len\":16," \
	      "\"batch_size\":4,\"lr\":0.003,\"warmup_steps\":2,\"threads\":1," \
	      "\"peak_flops\":1e11"
#define MAX_STEPS 32

static char dir[64];

static void scratch(void)
{
	snprintf(dir, sizeof(dir), "/tmp/mr-losslog-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
}

static void cleanup(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	(void)!system(cmd);
}

/* Runs the config's steps on one rank; the last stats into *last (may be
 * NULL); with err_log, stderr goes there while the worker is created. */
static void run(const char *js, struct mr_worker_stats *last, const char *err_log)
{
	json_error_t jerr;
	json_t *c = json_loads(js, 0, &jerr);
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_env env;
	struct mr_worker_stats st;
	int rc = MR_WORKER_MORE, saved = -1, fd, i = 0;
	void *w;

	cr_assert_not_null(c, "bad test json: %s", jerr.text);
	memset(&env, 0, sizeof(env));
	env.job = "ns/test";
	env.world_size = env.local_world_size = 1;
	env.tp = env.pp = env.cp = env.ep = env.dp = 1;
	env.config = c;
	if (err_log) {
		fd = open(err_log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		cr_assert(fd >= 0);
		fflush(stderr);
		saved = dup(2);
		dup2(fd, 2);
		close(fd);
	}
	rc = mr_gpt_worker.create(&w, &env, &eb);
	if (err_log) {
		fflush(stderr);
		dup2(saved, 2);
		close(saved);
	}
	cr_assert_eq(rc, 0, "%s", eb.msg);
	for (rc = MR_WORKER_MORE; rc == MR_WORKER_MORE && i++ < 1000;) {
		rc = mr_gpt_worker.step(w, &st, &eb);
		cr_assert(rc >= 0, "%s", eb.msg);
	}
	if (last)
		*last = st;
	mr_gpt_worker.destroy(w);
	json_decref(c);
}

struct log_row {
	long step;
	double loss, aux, norm, lr, val;
};

/* The loss log's rows by step (row[s] for step s); the number of rows.
 * Asserts the header is the first line and appears once, and that every
 * row has six columns. */
static int read_log(const char *path, struct log_row *row)
{
	FILE *f = fopen(path, "r");
	char line[512];
	int n = 0, lineno = 0;

	cr_assert_not_null(f, "no loss log '%s'", path);
	memset(row, 0, sizeof(*row) * MAX_STEPS);
	while (fgets(line, sizeof(line), f)) {
		struct log_row r;
		char val[64], extra[8];
		lineno++;
		if (lineno == 1) {
			cr_assert_str_eq(line, MR_LOSS_LOG_HEADER "\n", "%s: first line", path);
			continue;
		}
		cr_assert_eq(sscanf(line, "%ld %lf %lf %lf %lf %63s %7s", &r.step, &r.loss, &r.aux,
				    &r.norm, &r.lr, val, extra),
			     6, "%s line %d: '%s' is not six columns", path, lineno, line);
		r.val = strcmp(val, "nan") ? strtod(val, NULL) : NAN;
		cr_assert(r.step >= 1 && r.step < MAX_STEPS && !row[r.step].step,
			  "%s line %d: step %ld again or out of range", path, lineno, r.step);
		row[r.step] = r;
		n++;
	}
	fclose(f);
	return n;
}

Test(loss_log, header_columns_val_loss_and_schedule)
{
	struct log_row row[MAX_STEPS];
	char js[512], log[128];

	scratch();
	snprintf(log, sizeof(log), "%s/loss.txt", dir);
	snprintf(js, sizeof(js),
		 "{" SMALL ",\"steps\":4,\"eval_every\":2,\"lr_schedule\":\"constant\","
		 "\"loss_log\":\"%s\"}", log);
	run(js, NULL, NULL);
	cr_assert_eq(read_log(log, row), 4);
	for (int s = 1; s <= 4; s++) {
		cr_expect(isfinite(row[s].loss) && row[s].loss > 0, "step %d loss", s);
		/* warmup 2 then constant: 0.0015, 0.003, 0.003, 0.003 */
		cr_expect_float_eq(row[s].lr, s == 1 ? 0.0015 : 0.003, 1e-9, "step %d lr %g", s,
				   row[s].lr);
		if (s % 2)
			cr_expect(isnan(row[s].val), "step %d: no validation, val_loss nan", s);
		else
			cr_expect(isfinite(row[s].val) && row[s].val > 0, "step %d: val_loss %g",
				  s, row[s].val);
	}
	/* a second run over the same file starts it afresh: one header */
	run(js, NULL, NULL);
	cr_expect_eq(read_log(log, row), 4);
	cleanup();
}

Test(loss_log, resumed_run_keeps_exactly_one_header, .timeout = 120)
{
	struct log_row row[MAX_STEPS];
	char js[768], log[128], cmd[512];
	double loss4;

	scratch();
	snprintf(log, sizeof(log), "%s/loss.txt", dir);
	snprintf(js, sizeof(js),
		 "{" SMALL ",\"steps\":4,\"ckpt_every\":2,\"ckpt_async\":false,\"ckpt_dir\":"
		 "\"%s/ck\",\"loss_log\":\"%s\"}", dir, log);
	run(js, NULL, NULL);
	cr_assert_eq(read_log(log, row), 4);
	loss4 = row[4].loss;
	/* killed after step 4 before its checkpoint: the resume at step 2
	 * trains 3 and 4 again */
	snprintf(cmd, sizeof(cmd), "rm -r '%s'/ck/step-00000004", dir);
	cr_assert_eq(system(cmd), 0);
	run(js, NULL, NULL);
	cr_expect_eq(read_log(log, row), 4, "steps 1-4 once each under one header");
	cr_expect_eq(row[4].loss, loss4, "the resumed run's losses are the run's");
	/* a log written before the header existed gets one on resume */
	snprintf(cmd, sizeof(cmd), "sed -i 1d '%s' && rm -r '%s'/ck/step-00000004", log, dir);
	cr_assert_eq(system(cmd), 0);
	run(js, NULL, NULL);
	cr_expect_eq(read_log(log, row), 4);
	cleanup();
}

/* n tokens of a learnable cycle as a shard at path */
static void shard(const char *path, int n)
{
	static uint16_t tok[8192];
	struct mr_errbuf eb = { "", "" };

	cr_assert(n <= 8192);
	for (int i = 0; i < n; i++)
		tok[i] = (uint16_t)((i * 5) % 7 + 3);
	cr_assert_eq(mr_shard_write(path, tok, (size_t)n, &eb), 0, "%s", eb.msg);
}

/* Whether the file at path holds s. */
static int file_has(const char *path, const char *s)
{
	FILE *f = fopen(path, "r");
	char line[2048];
	int found = 0;

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, s) != NULL;
	fclose(f);
	return found;
}

Test(loss_log, val_data_without_eval_every_is_evaluated_every_tenth)
{
	struct log_row row[MAX_STEPS];
	struct mr_worker_stats st;
	char js[768], log[128], tr[128], va[128], err[128];

	scratch();
	snprintf(log, sizeof(log), "%s/loss.txt", dir);
	snprintf(tr, sizeof(tr), "%s/train.bin", dir);
	snprintf(va, sizeof(va), "%s/val.bin", dir);
	snprintf(err, sizeof(err), "%s/stderr", dir);
	shard(tr, 4096);
	shard(va, 1024);
	snprintf(js, sizeof(js),
		 "{" SMALL ",\"steps\":25,\"train_data\":\"%s\",\"val_data\":\"%s\","
		 "\"loss_log\":\"%s\"}", tr, va, log);
	run(js, &st, err);
	cr_expect(file_has(err, "eval_interval") && file_has(err, "eval_every=2 "),
		  "the chosen interval is logged (see %s)", err);
	cr_assert_eq(read_log(log, row), 25);
	/* max(1, 25/10) = 2, and the last step */
	for (int s = 1; s <= 25; s++)
		cr_expect(isfinite(row[s].val) == (s % 2 == 0 || s == 25),
			  "step %d: val_loss %g", s, row[s].val);
	cr_expect(isfinite(st.val_loss) && fabs(st.val_loss - row[25].val) < 1e-6 * st.val_loss,
		  "the stats carry the last val_loss: %g, logged %g", st.val_loss, row[25].val);
	/* an explicit 0 still means never */
	snprintf(js, sizeof(js),
		 "{" SMALL ",\"steps\":3,\"val_data\":\"%s\",\"eval_every\":0,"
		 "\"loss_log\":\"%s\"}", va, log);
	run(js, &st, NULL);
	cr_assert_eq(read_log(log, row), 3);
	for (int s = 1; s <= 3; s++)
		cr_expect(isnan(row[s].val), "eval_every 0: step %d val_loss %g", s, row[s].val);
	cleanup();
}

Test(loss_log, train_data_without_val_data_is_not_evaluated_on_synthetic)
{
	struct log_row row[MAX_STEPS];
	struct mr_worker_stats st;
	char js[768], log[128], tr[128], err[128];

	scratch();
	snprintf(log, sizeof(log), "%s/loss.txt", dir);
	snprintf(tr, sizeof(tr), "%s/train.bin", dir);
	snprintf(err, sizeof(err), "%s/stderr", dir);
	shard(tr, 4096);
	snprintf(js, sizeof(js),
		 "{" SMALL ",\"steps\":4,\"eval_every\":2,\"train_data\":\"%s\","
		 "\"loss_log\":\"%s\"}", tr, log);
	run(js, &st, err);
	cr_expect(file_has(err, "no_validation") && file_has(err, "val_data"),
		  "a warning says why there is no validation (see %s)", err);
	cr_assert_eq(read_log(log, row), 4);
	for (int s = 1; s <= 4; s++)
		cr_expect(isnan(row[s].val), "step %d: val_loss %g", s, row[s].val);
	cr_expect(isnan(st.val_loss), "no val_loss in the stats: %g", st.val_loss);
	/* the synthetic task itself is still evaluated */
	snprintf(js, sizeof(js), "{" SMALL ",\"steps\":2,\"eval_every\":2,\"loss_log\":\"%s\"}",
		 log);
	run(js, &st, NULL);
	cr_expect(isfinite(st.val_loss), "synthetic run: val_loss %g", st.val_loss);
	cleanup();
}
