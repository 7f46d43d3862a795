/*
 * test_prelaunch.c - a job no rank could run is refused by `meshrun
 * local` before anything starts: the reason (naming the key) is the first
 * line, the exit code 2, and no controller or agent was started. The
 * checks are the worker's own (mr_gpt_worker_check_mesh: every rank
 * placed as its worker would place it; the resume's refusals against the
 * newest checkpoint), so a job that passes them fails the same way only
 * where the machine itself differs.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proc.h"

static char tmp[256];

static const char *bin(void)
{
	const char *b = getenv("MESHRUN_BUILD");

	return b && b[0] ? b : "build";
}

/* `meshrun local ARGS` in tmp: exit 2, the first line names every word,
 * nothing was started. */
static void refused(const char *args, const char *w1, const char *w2)
{
	char *out, *nl;
	int rc = mr_test_sh(tmp, &out, "'%s/meshrun' local %s", bin(), args);

	cr_expect_eq(rc, 2, "%s: exit %d:\n%s", args, rc, out);
	nl = strchr(out, '\n');
	if (nl)
		*nl = '\0';
	cr_expect(!strncmp(out, "meshrun local: ", 15) && strstr(out, w1) &&
			  (!w2 || strstr(out, w2)),
		  "%s: first line '%s' lacks '%s' / '%s'", args, out, w1, w2 ? w2 : "");
	if (nl)
		*nl = '\n';
	cr_expect_null(strstr(out, "controller on"), "%s: a controller started:\n%s", args, out);
	cr_expect_null(strstr(out, "[node "), "%s: an agent started:\n%s", args, out);
	free(out);
}

static void scratch(void)
{
	const char *d = mr_test_scratch("mr-prelaunch");

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
}

Test(prelaunch, the_model_against_the_mesh)
{
	scratch();
	refused("--nproc-per-node 3 --tp 3 --workload-config '{\"steps\": 2}'", "'n_head' (4)",
		"tp (3)");
	refused("--nproc-per-node 2 --cp 2 --workload-config '{\"seq_len\": 63}'", "'seq_len'",
		"cp");
	refused("--nproc-per-node 2 --pp 2 --workload-config '{\"n_layer\": 1}'", "n_layer",
		"pp");
	/* key/value heads split by tp or replicated over it, nothing between */
	refused("--nproc-per-node 3 --tp 3 --workload-config "
		"'{\"arch\": \"llama\", \"n_head\": 6, \"d_model\": 48, \"n_kv_head\": 2}'",
		"'n_kv_head' (2)", "tp (3)");
	refused("--nproc-per-node 2 --ep 2 --workload-config "
		"'{\"moe_every\": 1, \"n_experts\": 3}'",
		"n_experts", NULL);
	refused("--nproc-per-node 2 --pp 2 --workload-config "
		"'{\"n_layer\": 4, \"pp_layers\": [3, 3]}'",
		"pp_layers", NULL);
	refused("--workload-config '{\"precision\": \"bf16\"}'", "'precision'", "cpu");
}

/* The device: this machine has no GPU (CUDA is there to build against) */
Test(prelaunch, cuda_without_a_gpu)
{
	if (access("/dev/nvidia0", F_OK) == 0)
		cr_skip_test("a GPU is present: cuda is available");
	scratch();
	refused("--workload-config '{\"device\": \"cuda\"}'", "'device'", "cuda");
}

/* The newest checkpoint of ckpt_dir: another model's, or a step whose
 * micro-batches the new dp cannot share; a dp that can share them starts */
Test(prelaunch, a_resume_that_cannot_work, .timeout = 300)
{
	char *out;

	scratch();
	cr_assert_eq(mr_test_sh(tmp, &out,
				"'%s/meshrun' local --nodes 2 --workload-config '{\"steps\": 2, "
				"\"d_model\": 64, \"ckpt_dir\": \"ck\", \"ckpt_every\": 2}'",
				bin()),
		     0, "%s", out);
	free(out);
	refused("--nodes 2 --workload-config '{\"steps\": 4, \"d_model\": 128, \"ckpt_dir\": "
		"\"ck\", \"ckpt_every\": 2}'",
		"'d_model' differs", "\"resume\": \"never\"");
	refused("--nodes 3 --workload-config '{\"steps\": 4, \"d_model\": 64, \"ckpt_dir\": "
		"\"ck\", \"ckpt_every\": 2}'",
		"dp 3 cannot share", "\"resume\": \"never\"");
	refused("--nodes 3 --workload-config '{\"steps\": 4, \"d_model\": 64, \"ckpt_dir\": "
		"\"ck\", \"ckpt_every\": 2}'",
		"divides 16 rows (1, 2, 4, 8, 16)", NULL);
	/* "resume": "never" starts afresh over it; dp 1 takes both micro-batches */
	cr_expect_eq(mr_test_sh(tmp, &out,
				"'%s/meshrun' local --workload-config '{\"steps\": 4, \"d_model\": "
				"64, \"ckpt_dir\": \"ck\", \"ckpt_every\": 2}'",
				bin()),
		     0, "%s", out);
	cr_expect(strstr(out, "event=checkpoint_resumed step=2"), "%s", out);
	free(out);
	cr_expect_eq(mr_test_sh(tmp, &out,
				"'%s/meshrun' local --workload-config '{\"steps\": 2, \"d_model\": "
				"128, \"ckpt_dir\": \"ck\", \"resume\": \"never\"}'",
				bin()),
		     0, "%s", out);
	free(out);
}

/* A rank that fails anyway (its TensorBoard directory under a file: only
 * the rank finds out): the job's last line carries the rank's own words,
 * which its agent wrote to MESHRUN_TERMINATION_LOG. */
Test(prelaunch, a_rank_failing_at_run_time_names_its_reason_on_the_last_line, .timeout = 300)
{
	char *out, *last;
	size_t n;
	int rc;

	scratch();
	cr_assert_eq(mr_test_sh(tmp, &out, "touch afile"), 0);
	free(out);
	rc = mr_test_sh(tmp, &out,
			"'%s/meshrun' local --nproc-per-node 2 --max-restarts 0 --workload-config "
			"'{\"steps\": 2, \"tensorboard_dir\": \"afile/tb\"}'",
			bin());
	cr_expect_neq(rc, 0, "the job must fail:\n%s", out);
	n = strlen(out);
	while (n > 0 && out[n - 1] == '\n')
		out[--n] = '\0';
	last = strrchr(out, '\n');
	last = last ? last + 1 : out;
	cr_expect(strstr(last, "failed"), "the last line is not the job's end: %s", last);
	cr_expect(strstr(last, "'tensorboard_dir'") && strstr(last, "afile/tb"),
		  "the last line does not give the rank's reason: %s", last);
	free(out);
}
