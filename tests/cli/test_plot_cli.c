/*
 * test_plot_cli.c - `meshrun plot` as a user runs it: the loss_log of a
 * real (small, in-process) run becomes an SVG that is well-formed XML,
 * with a training polyline of one point per step and a validation point
 * per evaluation; -o names the output; a malformed log is refused naming
 * the file, the line and the reason, and writes nothing.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mr_gpt_worker.h"
#include "proc.h"

static char tmp[64];

static void scratch(void)
{
	const char *d = mr_test_scratch("mr-plot-cli");

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
}

/* `cmd` run by the shell in tmp: the exit code; stdout and stderr
 * together in *out (malloc'd). */
static int sh(char **out, const char *cmd)
{
	return mr_test_sh(tmp, out, "%s", cmd);
}

/* `meshrun ARGS` in tmp. */
static int meshrun(char **out, const char *args)
{
	const char *b = getenv("MESHRUN_BUILD");
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), "'%s/meshrun' %s", b && b[0] ? b : "build", args);
	return sh(out, cmd);
}

/* A run of `steps` steps, validated every `every`, with its loss_log at
 * tmp/name: the gpt worker in this process, as one rank of a job. */
static void train(const char *name, int steps, int every)
{
	char js[512];
	json_error_t jerr;
	json_t *c;
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_env env;
	struct mr_worker_stats st;
	void *w;
	int rc = MR_WORKER_MORE;

	snprintf(js, sizeof(js),
		 "{\"vocab_size\":32,\"n_layer\":1,\"d_model\":32,\"n_head\":2,\"seq_len\":16,"
		 "\"batch_size\":4,\"threads\":1,\"peak_flops\":1e11,\"steps\":%d,"
		 "\"eval_every\":%d,\"loss_log\":\"%s/%s\"}",
		 steps, every, tmp, name);
	cr_assert_not_null(c = json_loads(js, 0, &jerr), "%s", jerr.text);
	memset(&env, 0, sizeof(env));
	env.job = "ns/plot";
	env.world_size = env.local_world_size = 1;
	env.tp = env.pp = env.cp = env.ep = env.dp = 1;
	env.config = c;
	cr_assert_eq(mr_gpt_worker.create(&w, &env, &eb), 0, "%s", eb.msg);
	while (rc == MR_WORKER_MORE)
		cr_assert((rc = mr_gpt_worker.step(w, &st, &eb)) >= 0, "%s", eb.msg);
	mr_gpt_worker.destroy(w);
	json_decref(c);
}

/* svg parsed by Python's xml.dom.minidom: "points circles" of the train
 * polyline and the val group into *out; the exit code. */
static int inspect_svg(char **out, const char *svg)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd),
		 "/usr/bin/python3 -c \"import sys, xml.dom.minidom as m; "
		 "d = m.parse(sys.argv[1]); "
		 "p = [e for e in d.getElementsByTagName('polyline') "
		 "if e.getAttribute('id') == 'train']; "
		 "c = [e for e in d.getElementsByTagName('circle') "
		 "if e.parentNode.getAttribute('id') == 'val']; "
		 "t = d.getElementsByTagName('text'); "
		 "print(len(p[0].getAttribute('points').split()), len(c), len(t) > 6)\" '%s'",
		 svg);
	return sh(out, cmd);
}

Test(plot_cli, a_run_loss_log_becomes_an_svg_with_a_point_per_step, .timeout = 120)
{
	char *out;

	scratch();
	train("loss.txt", 12, 4);
	cr_assert_eq(meshrun(&out, "plot loss.txt"), 0, "%s", out);
	cr_expect(strstr(out, "loss.svg: 12 steps, 3 validation losses"), "%s", out);
	free(out);
	cr_assert_eq(inspect_svg(&out, "loss.svg"), 0, "not well-formed XML: %s", out);
	cr_expect_str_eq(out, "12 3 True\n", "train points, val points, labels: %s", out);
	free(out);
	/* -o names the output */
	cr_assert_eq(meshrun(&out, "plot loss.txt -o other.svg --title 'a <b> & c'"), 0, "%s",
		     out);
	free(out);
	cr_assert_eq(inspect_svg(&out, "other.svg"), 0, "not well-formed XML: %s", out);
	cr_expect_str_eq(out, "12 3 True\n", "%s", out);
	free(out);
}

/* A log of header + lines into tmp/name. */
static void write_log(const char *name, const char *header, const char *lines)
{
	char path[160];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmp, name);
	cr_assert_not_null(f = fopen(path, "w"));
	fprintf(f, "%s%s", header, lines);
	fclose(f);
}

/* `meshrun plot name` fails with exit 1, naming the file, "line N" and
 * the reason, and writes no svg. */
static void refused(const char *name, int line, const char *reason)
{
	char *out, want[64], svg[160];

	snprintf(want, sizeof(want), "line %d: ", line);
	snprintf(svg, sizeof(svg), "plot %s -o refused.svg", name);
	cr_expect_eq(meshrun(&out, svg), 1, "%s: %s", name, out);
	cr_expect(strstr(out, name) && strstr(out, want) && strstr(out, reason),
		  "%s: want '%s' and '%s' in: %s", name, want, reason, out);
	free(out);
	snprintf(svg, sizeof(svg), "%s/refused.svg", tmp);
	cr_expect_neq(access(svg, F_OK), 0, "%s: an svg was written", name);
}

Test(plot_cli, malformed_logs_are_refused_naming_file_line_and_reason)
{
	const char *h = MR_LOSS_LOG_HEADER "\n";
	char *out;

	scratch();
	write_log("cols.txt", h, "1 2.5 0 1 0.001 nan\n2 2.4 0 1 0.001\n");
	refused("cols.txt", 3, "5 columns, want 6");
	write_log("num.txt", h, "1 2.5 0 1 0.001 nan\n2 2.4 0 1 0.001 nan\n3 fast 0 1 0.1 nan\n");
	refused("num.txt", 4, "loss 'fast' is not a number");
	write_log("order.txt", h, "1 2.5 0 1 0.001 nan\n3 2.4 0 1 0.001 2.6\n2 2.3 0 1 0.1 nan\n");
	refused("order.txt", 4, "step 2 does not follow step 3");
	write_log("nohead.txt", "", "1 2.5 0 1 0.001 nan\n");
	refused("nohead.txt", 1, "not the header");
	write_log("empty.txt", h, "");
	refused("empty.txt", 2, "no steps");
	/* usage errors exit 2 */
	cr_expect_eq(meshrun(&out, "plot"), 2, "%s", out);
	cr_expect(strstr(out, "LOSS_LOG"), "%s", out);
	free(out);
	cr_expect_eq(meshrun(&out, "plot missing.txt"), 1, "%s", out);
	cr_expect(strstr(out, "missing.txt"), "%s", out);
	free(out);
}
