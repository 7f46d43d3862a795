/*
 * test_plan_cli.c - `meshrun plan` as a user runs it: the best plans that
 * fit, inputs from flags, a JSON file or a job's workload config; --explain
 * prints the rank table of the mesh function and each mode's volume; bad
 * input exits 2 naming the flag; nothing fitting, or no valid mesh, exits
 * 1 with the closest plan and what limits it.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mr_mesh.h"
#include "proc.h"

static char tmp[64];

static void scratch(void)
{
	const char *d = mr_test_scratch("mr-plan-cli");

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
}

/* `meshrun ARGS` in tmp: the exit code; stdout and stderr in *out and
 * *err (malloc'd). */
static int meshrun(char **out, char **err, const char *args)
{
	const char *b = getenv("MESHRUN_BUILD");
	char cmd[4096], path[2][128];
	char **dst[2] = { out, err };
	int st;

	snprintf(path[0], sizeof(path[0]), "%s/out.log", tmp);
	snprintf(path[1], sizeof(path[1]), "%s/err.log", tmp);
	snprintf(cmd, sizeof(cmd), "cd '%s' && '%s/meshrun' %s >'%s' 2>'%s'", tmp,
		 b && b[0] ? b : "build", args, path[0], path[1]);
	st = system(cmd);
	for (int i = 0; i < 2; i++) {
		FILE *f = fopen(path[i], "rb");
		long n;
		cr_assert_not_null(f);
		fseek(f, 0, SEEK_END);
		n = ftell(f);
		rewind(f);
		*dst[i] = calloc(1, (size_t)n + 1);
		cr_assert_eq(fread(*dst[i], 1, (size_t)n, f), (size_t)n);
		fclose(f);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(plan_cli, prints_the_fastest_plans_that_fit)
{
	char *out, *err;

	scratch();
	cr_assert_eq(meshrun(&out, &err, "plan --model gpt2-350m --cluster h100 --gpus 16 "
					 "--global-batch 256 --top 3"),
		     0, "%s%s", out, err);
	cr_expect(strstr(out, "model gpt2-350m") && strstr(out, "cluster h100: 16 GPUs"), "%s",
		  out);
	cr_expect(strstr(out, "\n  1 ") && strstr(out, "\n  3 ") && !strstr(out, "\n  4 "),
		  "three ranked rows: %s", out);
	cr_expect(strstr(out, "communication per step") && strstr(out, "step "), "%s", out);
	free(out);
	free(err);
}

Test(plan_cli, inputs_from_a_json_file_and_a_workload_config)
{
	char *out, *err, path[160];
	FILE *f;

	scratch();
	snprintf(path, sizeof(path), "%s/in.json", tmp);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "{\"model\": \"gpt2-124m\", \"gpus\": 8, \"global_batch\": 64, "
		   "\"cluster\": \"a100-40g\"}\n");
	fclose(f);
	cr_assert_eq(meshrun(&out, &err, "plan --config in.json"), 0, "%s%s", out, err);
	cr_expect(strstr(out, "cluster a100-40g: 8 GPUs") && strstr(out, "global batch 64"),
		  "%s", out);
	free(out);
	free(err);
	cr_assert_eq(meshrun(&out, &err, "plan --cluster local --gpus 2 --workload-config "
					 "'{\"n_layer\": 4, \"batch_size\": 4, \"zero\": 1}'"),
		     0, "%s%s", out, err);
	cr_expect(strstr(out, "model workload") && strstr(out, "global batch 8") &&
			  strstr(out, "precision fp32"),
		  "%s", out);
	free(out);
	free(err);
}

/* the llama family: a Llama 3 preset (its 8.03B parameters in the
 * header) and a workload config with "arch": "llama" */
Test(plan_cli, plans_the_llama_family)
{
	char *out, *err;

	scratch();
	cr_assert_eq(meshrun(&out, &err, "plan --presets"), 0, "%s", err);
	cr_expect(strstr(out, "llama3-405b") && strstr(out, "kv_heads=8 ffn=53248"), "%s", out);
	free(out);
	free(err);
	cr_assert_eq(meshrun(&out, &err, "plan --model llama3-8b --cluster h100 --gpus 8 "
					 "--global-batch 8 --micro-batch 1 --impl megatron "
					 "--precision mixed --tp 1 --pp 1 --zero 3"),
		     0, "%s%s", out, err);
	cr_expect(strstr(out, "model llama3-8b (llama): 8.03B parameters, 32 layers") &&
			  strstr(out, "32 heads (8 key/value)"),
		  "%s", out);
	free(out);
	free(err);
	/* the Mixtral-shaped preset: the family, its experts, and a plan that fits */
	cr_assert_eq(meshrun(&out, &err, "plan --model mixtral-8x7b --cluster h100 --gpus 64 "
					 "--global-batch 512 --top 1"),
		     0, "%s%s", out, err);
	cr_expect(strstr(out, "model mixtral-8x7b (llama): 46.70B parameters") &&
			  strstr(out, "MoE every 1: 8 experts top-2") && strstr(out, "\n  1 "),
		  "%s", out);
	free(out);
	free(err);
	cr_assert_eq(meshrun(&out, &err, "plan --cluster local --gpus 2 --workload-config "
					 "'{\"arch\": \"llama\", \"n_layer\": 2, "
					 "\"n_kv_head\": 2, \"batch_size\": 2}'"),
		     0, "%s%s", out, err);
	cr_expect(strstr(out, "model workload") && strstr(out, "\n  1 "), "%s", out);
	free(out);
	free(err);
	/* a key of the family the worker refuses is named */
	cr_expect_eq(meshrun(&out, &err, "plan --cluster local --gpus 2 --workload-config "
					 "'{\"arch\": \"llama\", \"n_kv_head\": 3}'"),
		     2, "%s%s", out, err);
	cr_expect(strstr(err, "kv-head: 3 does not divide n_head 4"), "%s", err);
	free(out);
	free(err);
}

Test(plan_cli, explain_prints_the_mesh_functions_table_and_volumes)
{
	struct mr_mesh m;
	struct mr_mesh_coord c;
	char *out, *err, want[160];

	scratch();
	cr_assert_eq(meshrun(&out, &err, "plan --model gpt2-124m --gpus 8 --global-batch 16 "
					 "--explain tp=2,pp=2,mb=1,zero=1,schedule=1f1b"),
		     0, "%s%s", out, err);
	cr_expect(strstr(out, "plan tp=2 cp=1 pp=2 dp=2") && strstr(out, "stage 1:"), "%s", out);
	cr_expect(strstr(out, "\n  tp ") && strstr(out, "\n  pp ") && strstr(out, "\n  dp "),
		  "a volume per mode: %s", out);
	cr_assert_eq(mr_mesh_init(&m, 8, 2, 2, 1, 1, 0, NULL), 0);
	for (int r = 0; r < 8; r++) {
		mr_mesh_coord(&m, r, &c);
		snprintf(want, sizeof(want), "\n%6d %4d %4d %4d %4d %4d %4d |", r, c.pp, c.dp, c.cp,
			 c.tp, c.ep, c.edp);
		cr_expect(strstr(out, want), "rank %d's coordinates as mr_mesh gives them", r);
	}
	free(out);
	free(err);
}

Test(plan_cli, bad_input_exits_2_naming_the_flag)
{
	static const struct {
		const char *args, *flag;
	} bad[] = {
		{ "plan --model gpt-5 --global-batch 8", "--model" },
		{ "plan --model gpt2-124m --global-batch 8 --cluster tpu", "--cluster" },
		{ "plan --model gpt2-124m", "--global-batch" },
		{ "plan --model gpt2-124m --global-batch 8 --n-head 7", "--n-head" },
		{ "plan --model gpt2-124m --global-batch 8 --zero 4", "--zero" },
		{ "plan --model gpt2-124m --global-batch 8 --explain tp=5", "tp" },
		{ "plan --model gpt2-124m --global-batch 8 --explain tpp=2", "tpp" },
		{ "plan --cluster local --gpus 2 --workload-config '{\"n_layers\": 4}'",
		  "n_layers" },
		{ "plan --cluster local --gpus 2 --workload-config /nonexistent/w.json",
		  "No such file" },
	};

	scratch();
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *out, *err;
		cr_expect_eq(meshrun(&out, &err, bad[i].args), 2, "%s: %s", bad[i].args, err);
		cr_expect(strstr(err, bad[i].flag), "%s: '%s' names %s", bad[i].args, err,
			  bad[i].flag);
		cr_expect(!strstr(err, "line -1"), "%s: '%s'", bad[i].args, err);
		free(out);
		free(err);
	}
}

Test(plan_cli, nothing_fits_exits_1_with_the_closest_plan)
{
	char *out, *err;

	scratch();
	cr_expect_eq(meshrun(&out, &err, "plan --model gpt3-175b --cluster a100-80g --gpus 8 "
					 "--global-batch 8 --impl megatron"),
		     1, "%s%s", out, err);
	cr_expect(strstr(out, "\n  1 "), "the closest plan is shown: %s", out);
	cr_expect(strstr(err, "nothing fits") && strstr(err, "GB per GPU, 80.0 available") &&
			  strstr(err, "more GPUs"),
		  "%s", err);
	free(out);
	free(err);
	/* a fixed mesh that does not fit names the knobs to turn */
	cr_expect_eq(meshrun(&out, &err, "plan --model llama-7b-like --gpus 8 --global-batch 64 "
					 "--explain tp=1,pp=1,zero=0,mb=8"),
		     1);
	cr_expect(strstr(err, "raise pp or the ZeRO stage"), "%s", err);
	free(out);
	free(err);
	cr_expect_eq(meshrun(&out, &err, "plan --model gpt2-124m --gpus 13 --global-batch 8"), 1);
	cr_expect(strstr(err, "no valid mesh for 13 GPUs"), "%s", err);
	free(out);
	free(err);
}

/* ---- --mesh auto ------------------------------------------------------------------ */

#define AUTO_CFG "'{\"n_layer\": 4, \"d_model\": 64, \"n_head\": 4, \"seq_len\": 32, " \
		 "\"batch_size\": 2, \"steps\": 2, \"vocab_size\": 512, \"loss_log\": \"loss.txt\"}'"

/* The plan each agent logged ("plan=\"...\""), the first one after from. */
static const char *logged_plan(const char *from, char *buf, size_t cap)
{
	const char *p = strstr(from, "event=mesh_auto"), *q, *e;

	if (!p || !(q = strstr(p, "plan=\"")) || !(e = strchr(q + 6, '"')))
		return NULL;
	snprintf(buf, cap, "%.*s", (int)(e - q - 6), q + 6);
	return e;
}

Test(plan_cli, local_mesh_auto_trains_on_the_top_plan, .timeout = 240)
{
	char *out, *err, plan[160], path[160], line[256];
	FILE *f;
	int lines = 0;

	scratch();
	cr_assert_eq(meshrun(&out, &err, "local --nodes 1 --nproc-per-node 2 --mesh auto --tp 2 "
					 "--workload-config " AUTO_CFG),
		     0, "%s%s", out, err);
	cr_assert_not_null(logged_plan(err, plan, sizeof(plan)), "the plan is logged: %s", err);
	cr_expect(strstr(plan, "tp=2 "), "a fixed --tp is kept: %s", plan);
	cr_expect(strstr(err, "succeeded"), "%s", err);
	snprintf(path, sizeof(path), "%s/loss.txt", tmp);
	f = fopen(path, "r");
	cr_assert_not_null(f, "rank 0 wrote its loss log");
	while (fgets(line, sizeof(line), f))
		lines++;
	fclose(f);
	cr_expect_eq(lines, 3, "a header and both steps trained");
	free(out);
	free(err);
}

Test(plan_cli, elastic_agents_plan_each_round_alike, .timeout = 240)
{
	char *out, *err, a[160], b[160];
	const char *next;

	scratch();
	cr_assert_eq(meshrun(&out, &err, "local --nodes 2 --nnodes 1:2 --last-call 2s "
					 "--nproc-per-node 1 --mesh auto --workload-config " AUTO_CFG),
		     0, "%s%s", out, err);
	next = logged_plan(err, a, sizeof(a));
	cr_assert_not_null(next, "%s", err);
	cr_assert_not_null(logged_plan(next, b, sizeof(b)), "both agents plan: %s", err);
	cr_expect_str_eq(a, b, "every agent plans the same mesh");
	cr_expect(strstr(err, "world=2"), "for the world the round has: %s", err);
	free(out);
	free(err);
}

Test(plan_cli, mesh_auto_that_cannot_fit_exits_2)
{
	char *out, *err;

	scratch();
	cr_expect_eq(meshrun(&out, &err, "local --nodes 1 --nproc-per-node 2 --mesh auto "
					 "--workload-config '{\"n_layer\": 12, \"d_model\": 8192, "
					 "\"n_head\": 64, \"vocab_size\": 50000, \"seq_len\": 2048}'"),
		     2);
	cr_expect(strstr(err, "mesh: auto: nothing fits") && strstr(err, "GB per GPU"), "%s",
		  err);
	free(out);
	free(err);
	cr_expect_eq(meshrun(&out, &err, "local --nodes 1 --mesh sideways"), 2);
	cr_expect(strstr(err, "mesh: 'sideways'"), "%s", err);
	free(out);
	free(err);
}

/* --topology-file: 64 nodes in 4 racks of 2 blocks; the explained mesh
 * keeps tp in a node and dp in a rack, pp crosses; a slower link between
 * racks is priced into the cross-domain pp transfers; bad files are
 * refused naming the option and the line. */
Test(plan_cli, topology_places_groups_and_prices_cross_domain_links)
{
	char *out, *err, path[160], args[512];
	FILE *f;

	scratch();
	snprintf(path, sizeof(path), "%s/topo.txt", tmp);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("# two blocks of two racks of 16 nodes\nblock 2\nrack 2\nnode 16\n", f);
	fclose(f);
	snprintf(args, sizeof(args),
		 "plan --model gpt2-350m --topology-file %s --gpus-per-node 8 --global-batch 512 "
		 "--explain tp=8,pp=4,dp=16",
		 path);
	cr_assert_eq(meshrun(&out, &err, args), 0, "%s%s", out, err);
	cr_expect(strstr(out, "cluster h100: 512 GPUs") &&
			  strstr(out, "topology: 64 nodes in 4 narrowest domains"),
		  "%s", out);
	cr_expect(strstr(out, "tp groups: inside a node") &&
			  strstr(out, "dp groups: inside a domain") &&
			  strstr(out, "pp groups: across domains"),
		  "%s", out);
	cr_expect(strstr(out, "node 16: pod 16, block-0/rack-1/node-0 (domain 1)"), "%s", out);
	cr_expect(strstr(out, "(cross-domain)"), "%s", out);
	free(out);
	free(err);
	/* a path per line, in pod-index order: the racks sort naturally */
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("rack-10/n-0\nrack-9/n-1\n", f);
	fclose(f);
	snprintf(args, sizeof(args),
		 "plan --model gpt2-124m --topology-file %s --gpus-per-node 8 --global-batch 64 "
		 "--explain tp=4,dp=4",
		 path);
	cr_assert_eq(meshrun(&out, &err, args), 0, "%s%s", out, err);
	cr_expect(strstr(out, "node 0: pod 1, rack-9/n-1 (domain 0)") &&
			  strstr(out, "node 1: pod 0, rack-10/n-0 (domain 1)") &&
			  strstr(out, "dp groups: across domains"),
		  "%s", out);
	free(out);
	free(err);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("rack-1/n-0\nrack 2 3\n", f);
	fclose(f);
	snprintf(args, sizeof(args), "plan --model gpt2-124m --topology-file %s --global-batch 64",
		 path);
	cr_expect_eq(meshrun(&out, &err, args), 2, "%s%s", out, err);
	cr_expect(strstr(err, "topo.txt:2"), "%s", err);
	free(out);
	free(err);
	snprintf(args, sizeof(args),
		 "plan --model gpt2-124m --topology-file %s --gpus 24 --global-batch 64", path);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("rack-1/n-0\nrack-1/n-1\n", f);
	fclose(f);
	cr_expect_eq(meshrun(&out, &err, args), 2, "%s%s", out, err);
	cr_expect(strstr(err, "--topology-file") && strstr(err, "is not gpus 24"), "%s", err);
	free(out);
	free(err);
}

/* recompute and offload: shown in the table, taken as options, refused by
 * name when unknown */
Test(plan_cli, recompute_and_offload_options)
{
	char *out, *err;

	scratch();
	cr_expect_eq(meshrun(&out, &err, "plan --model gpt2-124m --gpus 8 --global-batch 64 "
					 "--recompute full --offload optimizer --tp 1 --pp 1"),
		     0, "%s%s", out, err);
	cr_expect(strstr(out, "recompute") && strstr(out, "offload") &&
			  strstr(out, " full ") && strstr(out, " optimizer "),
		  "%s", out);
	free(out);
	free(err);
	cr_expect_eq(meshrun(&out, &err, "plan --model gpt2-124m --gpus 8 --global-batch 64 "
					 "--offload disk"),
		     2);
	cr_expect(strstr(err, "--offload"), "%s", err);
	free(out);
	free(err);
}
