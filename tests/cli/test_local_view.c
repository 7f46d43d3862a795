/*
 * test_local_view.c - what a person sees of `meshrun local`: on a
 * pseudo-terminal (forkpty, as a shell would run it) the model, one line
 * per logged step with the figures of the loss log, and the summary, the
 * rest in the log file; off a terminal the structured lines as they are
 * (logfmt, or one JSON object per line with --log-format json).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

static char tmp[256];

static const char *bin(void)
{
	const char *b = getenv("MESHRUN_BUILD");

	return b && b[0] ? b : "build";
}

/* shards for train_data / val_data, in a fresh scratch directory */
static void scratch(void)
{
	const char *d = mr_test_scratch("mr-view");
	char *out;

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
	cr_assert_eq(mr_test_sh(tmp, &out, "'%s/meshrun' data synth --out-dir . --tokens 40000",
				bin()),
		     0, "%s", out);
	free(out);
}

#define CONFIG                                                                              \
	"'{\"steps\": 20, \"log_every\": 5, \"eval_every\": 10, \"train_data\": \"train.bin\", " \
	"\"val_data\": \"val.bin\", \"loss_log\": \"loss.log\", \"ckpt_dir\": \"ck\", "         \
	"\"ckpt_every\": 10, \"threads\": 1}'"

/* `meshrun local ARGS` in tmp on a pseudo-terminal 200 columns wide: what
 * the terminal received, status redraws ("\r\033[K") made line breaks
 * (malloc'd); the exit code. */
static int on_terminal(char **screen, const char *args)
{
	struct winsize ws = { .ws_row = 50, .ws_col = 200 };
	size_t cap = 1 << 20, n = 0;
	char *buf = malloc(cap + 1), *cmd = NULL;
	long long end = mr_test_now_ms() + 300000;
	int fd, st;
	pid_t pid;

	cr_assert_not_null(buf);
	cr_assert_geq(asprintf(&cmd, "cd '%s' && exec '%s/meshrun' local %s", tmp, bin(), args), 0);
	pid = forkpty(&fd, NULL, NULL, &ws);
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	while (mr_test_now_ms() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&p, 1, 1000) <= 0)
			continue;
		r = read(fd, buf + n, cap - n);
		if (r <= 0)
			break; /* EIO: the child side closed */
		n += (size_t)r;
		cr_assert_lt(n, cap, "too much output");
	}
	close(fd);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	buf[n] = '\0';
	for (char *p = buf; (p = strstr(p, "\033[K"));)
		memmove(p, p + 3, strlen(p + 3) + 1);
	for (char *p = buf; *p; p++)
		if (*p == '\r')
			*p = '\n';
	free(cmd);
	*screen = buf;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* loss.log's loss (col 1) and val_loss (col 5) of each step (1-based) */
static int read_loss_log(double *loss, double *val, int max)
{
	char path[512], *text, *line, *save = NULL;
	int steps = 0;

	snprintf(path, sizeof(path), "%s/loss.log", tmp);
	text = mr_test_slurp(path, NULL);
	cr_assert_not_null(text, "no loss log");
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		int step;
		double l, a, g, lr;
		char v[32];

		if (sscanf(line, "%d %lf %lf %lf %lf %31s", &step, &l, &a, &g, &lr, v) != 6)
			continue; /* the header */
		cr_assert(step >= 1 && step <= max);
		loss[step] = l;
		val[step] = strcmp(v, "nan") ? atof(v) : NAN;
		steps = step > steps ? step : steps;
	}
	free(text);
	return steps;
}

Test(local_view, terminal_shows_model_steps_and_summary_and_logs_the_rest, .timeout = 600)
{
	double loss[32], val[32], best = INFINITY;
	char *screen, *log, path[512], want[256];
	int rc, best_step = 0, lines = 0;

	scratch();
	rc = on_terminal(&screen, "--nodes 2 --nproc-per-node 1 --log-file view.log "
				  "--workload-config " CONFIG);
	cr_assert_eq(rc, 0, "%s", screen);
	cr_assert_eq(read_loss_log(loss, val, 31), 20);
	cr_expect(strstr(screen, "model: gpt2, "), "%s", screen);
	cr_expect(strstr(screen, "mesh: tp 1, cp 1, pp 1, dp 2"), "%s", screen);
	/* the agents' routine lines are in the log file, not on the screen */
	cr_expect_null(strstr(screen, "event=health_listening"), "%s", screen);
	cr_expect_null(strstr(screen, "event=progress"), "%s", screen);
	snprintf(path, sizeof(path), "%s/view.log", tmp);
	log = mr_test_slurp(path, NULL);
	cr_assert_not_null(log, "no log file");
	cr_expect(strstr(log, "event=health_listening"), "%s", log);
	cr_expect(strstr(log, "event=job_summary state=succeeded"), "%s", log);
	free(log);
	/* a line per logged step, its figures those of the loss log */
	for (char *p = screen; (p = strstr(p, "\nstep ")); p++) {
		int step, total;
		double l, v;
		char *val_at;

		if (sscanf(p, "\nstep %d/%d loss %lf", &step, &total, &l) != 3)
			continue; /* the status line: "step 7/20, eta 1s" */
		lines++;
		cr_expect_eq(total, 20);
		cr_expect_eq(step % 5, 0, "step %d is not a multiple of log_every", step);
		cr_expect_float_eq(l, loss[step], 0.6e-4, "step %d: %f vs %f", step, l, loss[step]);
		val_at = strstr(p, "  val ");
		if (val_at && val_at < strchr(p + 1, '\n')) {
			cr_expect(sscanf(val_at, "  val %lf", &v) == 1);
			cr_expect_float_eq(v, val[step], 0.6e-4, "step %d val", step);
		} else {
			cr_expect(isnan(val[step]), "step %d evaluated but shows no val", step);
		}
	}
	cr_expect_eq(lines, 4, "step lines: %d\n%s", lines, screen);
	for (int s = 1; s <= 20; s++)
		if (!isnan(val[s]) && val[s] < best) {
			best = val[s];
			best_step = s;
		}
	cr_assert_gt(best_step, 0, "no validation in the loss log");
	cr_expect(strstr(screen, "done: succeeded, 20/20 steps in "), "%s", screen);
	snprintf(want, sizeof(want), "best val_loss %.4f at step %d", best, best_step);
	cr_expect(strstr(screen, want), "'%s' not in\n%s", want, screen);
	snprintf(want, sizeof(want), "loss %.4f  val_loss %.4f", loss[20], val[20]);
	cr_expect(strstr(screen, want), "'%s' not in\n%s", want, screen);
	cr_expect(strstr(screen, "2 checkpoints in ck"), "%s", screen);
	free(screen);
}

/* (the sanitizer pass: the view's code runs in the test above) */
Test(local_view, log_level_warn_still_shows_the_summary, .timeout = 600, MR_NOT_UNDER_SAN)
{
	char *screen;

	scratch();
	cr_assert_eq(on_terminal(&screen, "--log-level warn --log-file view.log "
					  "--workload-config " CONFIG),
		     0, "%s", screen);
	cr_expect_null(strstr(screen, "  grad_norm "), "no step lines at warn:\n%s", screen);
	cr_expect(strstr(screen, "done: succeeded, 20/20 steps"), "%s", screen);
	free(screen);
}

Test(local_view, off_a_terminal_the_structured_lines_stay, .timeout = 600)
{
	char *out, *p;
	int steps = 0;

	scratch();
	cr_assert_eq(mr_test_sh(tmp, &out, "'%s/meshrun' local --nodes 2 --workload-config %s",
				bin(), CONFIG),
		     0, "%s", out);
	cr_expect(strstr(out, "event=health_listening"), "%s", out);
	for (p = out; (p = strstr(p, " event=step ")); p++) {
		steps++;
		cr_expect(!strncmp(p - 7, " rank=0", 7), "a step line not from rank 0");
	}
	cr_expect_eq(steps, 4, "%s", out);
	p = strstr(out, "event=job_summary state=succeeded steps=20/20 ");
	cr_expect(p, "%s", out);
	cr_expect(p && !strstr(p + 1, "event=job_summary"), "one summary");
	free(out);
}

/* (the sanitizer pass: common/test_log.c runs the JSON writer) */
Test(local_view, json_log_format_is_one_object_per_line, .timeout = 600, MR_NOT_UNDER_SAN)
{
	char *out, *line, *save = NULL;
	int objects = 0, summaries = 0;

	scratch();
	cr_assert_eq(mr_test_sh(tmp, &out,
				"'%s/meshrun' local --log-format json --workload-config %s", bin(),
				CONFIG),
		     0, "%s", out);
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		json_error_t je;
		json_t *o;

		if (strncmp(line, "[node ", 6))
			continue; /* meshrun local's own lines */
		o = json_loads(strchr(line, ']') + 2, 0, &je);
		cr_assert_not_null(o, "not JSON (%s): %s", je.text, line);
		cr_expect(json_is_string(json_object_get(o, "event")), "%s", line);
		if (!strcmp(json_string_value(json_object_get(o, "event")), "job_summary")) {
			summaries++;
			cr_expect_str_eq(json_string_value(json_object_get(o, "state")), "succeeded");
			cr_expect(json_is_number(json_object_get(o, "seconds")), "%s", line);
			cr_expect(json_is_number(json_object_get(o, "best_val_loss")), "%s", line);
		}
		objects++;
		json_decref(o);
	}
	cr_expect_gt(objects, 10);
	cr_expect_eq(summaries, 1);
	free(out);
}
