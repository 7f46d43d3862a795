/*
 * test_config.c - meshrun-agent's configuration: every input source
 * (flag, MESHRUN_* env, JSON file, scheduler env) read correctly, and bad
 * input of each source stopping the real binary with exit 2 and a message
 * naming the input, the value and the reason.
 */
#include "harness.h"

#include "config.h"

/* Runs meshrun-agent with argv/env; returns its exit code, *out its output. */
static int run_agent(char *const *args, char *const *env, char **out)
{
	char log[300], *argv[H_MAX_ARGS];
	static int seq;
	int n = 0, code;
	pid_t pid;

	snprintf(log, sizeof(log), "%s/cfg-%d-%d.log", h_tmpdir(), (int)getpid(), seq++);
	argv[n++] = "meshrun-agent";
	for (int i = 0; args[i]; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	pid = h_spawn(argv, env, log);
	code = h_wait(pid, 5000);
	*out = h_read(log);
	return code;
}

static void expect_usage_error(char *const *args, char *const *env, const char *needle1,
			       const char *needle2)
{
	char *out = NULL;
	int code = run_agent(args, env, &out);

	cr_expect_eq(code, 2, "exit %d, output: %s", code, out);
	cr_expect(strstr(out, needle1) != NULL, "'%s' not in: %s", needle1, out);
	if (needle2)
		cr_expect(strstr(out, needle2) != NULL, "'%s' not in: %s", needle2, out);
	free(out);
}

Test(agent_config, bad_flag_value_exits_2)
{
	char *args[] = {"--nproc-per-node", "abc", "--", "true", NULL};

	expect_usage_error(args, NULL, "--nproc-per-node", "abc");
}

/* the controller's grammar (common/mr_jobname.h): a name that a URL
 * would read otherwise ('..' collapsed, '?' a query) never leaves */
Test(agent_config, job_names_the_controller_would_refuse_exit_2)
{
	static const char *bad[] = { "zz/..", "team/a?x=1", "team/a/b", "Team/a", "team/-a",
				     "/a", "team/" };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *args[] = {"--job", (char *)bad[i], "--", "true", NULL};
		expect_usage_error(args, NULL, "is not a valid job name", bad[i]);
	}
}

Test(agent_config, unknown_flag_exits_2)
{
	char *args[] = {"--bogus", "1", "--", "true", NULL};

	expect_usage_error(args, NULL, "--bogus", NULL);
}

Test(agent_config, bad_env_value_exits_2)
{
	char *args[] = {"--", "true", NULL};
	char *env[] = {"MESHRUN_TP=x2", NULL};

	expect_usage_error(args, env, "MESHRUN_TP", "x2");
}

Test(agent_config, unknown_file_key_exits_2)
{
	char path[300];
	FILE *f;

	h_path(path, sizeof(path), "agent.json");
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "{\"nnodes\": \"2\", \"max_restrats\": 3}\n");
	fclose(f);
	{
		char *args[] = {"--config", path, "--", "true", NULL};

		expect_usage_error(args, NULL, "max_restrats", NULL);
	}
}

Test(agent_config, scheduler_env_errors_name_the_variable)
{
	char *args[] = {"--", "true", NULL};
	char *env1[] = {"VC_TASK_INDEX=first", NULL};
	char *env2[] = {"PET_NNODES=4:2", NULL};
	char *env3[] = {"PET_NPROC_PER_NODE=gpu", NULL};

	expect_usage_error(args, env1, "VC_TASK_INDEX", "first");
	expect_usage_error(args, env2, "nnodes", "4:2");
	expect_usage_error(args, env3, "PET_NPROC_PER_NODE", "gpu");
}

Test(agent_config, mesh_not_dividing_world_exits_2)
{
	char *args[] = {"--nnodes", "3", "--nproc-per-node", "1", "--tp", "2", "--", "true", NULL};

	expect_usage_error(args, NULL, "divisible", "tp=2");
}

Test(agent_config, exec_mode_without_command_exits_2)
{
	char *args[] = {"--mode", "exec", NULL};

	expect_usage_error(args, NULL, "exec", "--");
}

Test(agent_config, help_exits_0)
{
	char *args[] = {"--help", NULL};
	char *out = NULL;

	cr_assert_eq(run_agent(args, NULL, &out), 0);
	cr_expect(strstr(out, "--max-restarts") && strstr(out, "MESHRUN_MAX_RESTARTS"), "%s",
		  out);
	free(out);
}

/* ---- in-process: precedence and scheduler variables ---- */

static int load(struct mr_agent_config *cfg, char **args, struct mr_errbuf *eb)
{
	int n = 0;

	while (args[n])
		n++;
	return mr_agent_config_load(cfg, "meshrun-agent", n, args, eb);
}

Test(agent_config, scheduler_env_fills_unset_values)
{
	struct mr_agent_config cfg;
	struct mr_errbuf eb = {0};
	char *args[] = {"meshrun-agent", "--", "true", NULL};

	setenv("JOB_COMPLETION_INDEX", "5", 1);
	setenv("PET_NNODES", "2:8", 1);
	setenv("PET_NPROC_PER_NODE", "2", 1);
	setenv("PET_MAX_RESTARTS", "7", 1);
	cr_assert_eq(load(&cfg, args, &eb), 0, "%s", eb.msg);
	cr_expect_eq(cfg.pod_index, 5);
	cr_expect_eq(cfg.min_nodes, 2);
	cr_expect_eq(cfg.max_nodes, 8);
	cr_expect_eq(cfg.nproc_per_node, 2);
	cr_expect_eq(cfg.max_restarts, 7);
	cr_expect_eq(cfg.mode, MR_AGENT_MODE_EXEC);
	cr_expect_eq(cfg.ncmd, 1);
	cr_expect_str_eq(cfg.cmd[0], "true");
	mr_agent_config_release(&cfg);
}

Test(agent_config, meshrun_inputs_win_over_scheduler_env)
{
	struct mr_agent_config cfg;
	struct mr_errbuf eb = {0};
	char *args[] = {"meshrun-agent", "--pod-index", "1", "--", "true", NULL};

	setenv("VC_TASK_INDEX", "3", 1);
	setenv("MESHRUN_MAX_RESTARTS", "9", 1);
	setenv("PET_MAX_RESTARTS", "1", 1);
	cr_assert_eq(load(&cfg, args, &eb), 0, "%s", eb.msg);
	cr_expect_eq(cfg.pod_index, 1);
	cr_expect_eq(cfg.max_restarts, 9);
	mr_agent_config_release(&cfg);
}

Test(agent_config, volcano_and_statefulset)
{
	struct mr_agent_config cfg;
	struct mr_errbuf eb = {0};
	char *args[] = {"meshrun-agent", "--", "true", NULL};

	setenv("HOSTNAME", "gpt-small-worker-12", 1);
	setenv("VC_WORKER_NUM", "16", 1);
	setenv("VC_WORKER_HOSTS", "a,b", 1);
	cr_assert_eq(load(&cfg, args, &eb), 0, "%s", eb.msg);
	cr_expect_eq(cfg.pod_index, 12);
	cr_expect_eq(cfg.min_nodes, 16);
	cr_expect_eq(cfg.max_nodes, 16);
	cr_expect_str_eq(cfg.node_id, "gpt-small-worker-12");
	/* host id: boot id + IPC namespace */
	cr_expect(strstr(cfg.host_id, "ipc:[") != NULL, "%s", cfg.host_id);
	mr_agent_config_release(&cfg);
}

Test(agent_config, mesh_and_permanent_codes)
{
	struct mr_agent_config cfg;
	struct mr_errbuf eb = {0};
	char *ok[] = {"meshrun-agent", "--nnodes", "2", "--nproc-per-node", "4", "--tp", "2",
		      "--pp", "2", "--permanent-exit-codes", "3,127", "--", "true", NULL};
	char *elastic_dp[] = {"meshrun-agent", "--nnodes", "1:2", "--dp", "2", "--", "true", NULL};
	char *bad_codes[] = {"meshrun-agent", "--permanent-exit-codes", "3,x", "--", "true", NULL};

	cr_assert_eq(load(&cfg, ok, &eb), 0, "%s", eb.msg);
	cr_expect(mr_agent_config_permanent(&cfg, 127));
	cr_expect(mr_agent_config_permanent(&cfg, 3));
	cr_expect(!mr_agent_config_permanent(&cfg, 1));
	cr_expect_eq(cfg.heartbeat_interval_ms, cfg.heartbeat_timeout_ms / 4);
	mr_agent_config_release(&cfg);
	cr_expect_eq(load(&cfg, elastic_dp, &eb), MR_EINVAL);
	cr_expect(strstr(eb.msg, "elastic") != NULL, "%s", eb.msg);
	mr_agent_config_release(&cfg);
	mr_errbuf_clear(&eb);
	cr_expect_eq(load(&cfg, bad_codes, &eb), MR_EINVAL);
	cr_expect(strstr(eb.msg, "3,x") != NULL, "%s", eb.msg);
	mr_agent_config_release(&cfg);
}

Test(agent_config, parallel_flags_land_in_the_workload_config)
{
	struct mr_agent_config cfg;
	struct mr_errbuf eb = {0};
	/* 4 ranks, tp 2: a mesh the flags fit (sp needs tp, hsdp_shard divides dp), which the
	 * agent checks before launch */
	char *args[] = {"meshrun-agent", "--nproc-per-node", "4", "--tp", "2", "--zero", "3",
			"--hsdp-shard", "2",
			"--sequence-parallel", "--workload-config",
			"{\"zero\": 1, \"steps\": 5}", NULL};

	cr_assert_eq(load(&cfg, args, &eb), 0, "%s", eb.msg);
	cr_assert_not_null(cfg.workload_json);
	/* the flag wins over the same key in workload_config */
	cr_expect_eq(json_integer_value(json_object_get(cfg.workload_json, "zero")), 3);
	cr_expect_eq(json_integer_value(json_object_get(cfg.workload_json, "hsdp_shard")), 2);
	cr_expect(json_is_true(json_object_get(cfg.workload_json, "sequence_parallel")));
	cr_expect_eq(json_integer_value(json_object_get(cfg.workload_json, "steps")), 5);
	mr_agent_config_release(&cfg);
}

Test(agent_config, bad_zero_stage_exits_2)
{
	char *args[] = {"--zero", "4", NULL};

	expect_usage_error(args, NULL, "--zero", "4");
}

Test(agent_config, duplicate_workload_key_exits_2_naming_it)
{
	char *args[] = {"--workload-config", "{\"steps\": 5, \"d_model\": 32, \"steps\": 50}",
			NULL};

	expect_usage_error(args, NULL, "workload_config", "duplicate object key near '\"steps\"'");
}

/* Errors a rank would only meet after launch, found at start: bf16 on the
 * cpu device; a GPU job on a node without a GPU (the emulated device told
 * to have none), before it joins any round. */
Test(agent_config, device_errors_exit_2_before_joining)
{
	char *args[] = {"--workload-config", "{\"precision\": \"bf16\"}", NULL};
	char bin[1024], log[300], *out;
	char *argv[] = {bin, "--controller", "http://127.0.0.1:1", "--health-port", "-1",
			"--workload-config", "{\"device\": \"cuda\"}", NULL};
	char *env[] = {"MR_CUDA_EMUL_NODEV=1", NULL};
	int code;

	expect_usage_error(args, NULL, "precision", "not available on device cpu");
	snprintf(bin, sizeof(bin), "%s/emul/meshrun-agent", h_build());
	h_path(log, sizeof(log), "nogpu-config.log");
	code = h_wait(h_spawn(argv, env, log), 30000);
	out = h_read(log);
	cr_expect_eq(code, 2, "exit %d: %s", code, out);
	cr_expect(strstr(out, "'device' \"cuda\" is not available on this node"), "%s", out);
	cr_expect(strstr(out, "emulation told so"), "the reason is not named: %s", out);
	cr_expect_null(strstr(out, "event=joined"), "it joined first: %s", out);
	free(out);
}

Test(agent_config, unreadable_or_empty_token_file_exits_2_naming_it)
{
	char empty[300], missing[300];
	FILE *f;

	h_path(empty, sizeof(empty), "empty-token");
	h_path(missing, sizeof(missing), "no-such-token");
	f = fopen(empty, "w");
	cr_assert_not_null(f);
	fputs("\n", f);
	fclose(f);
	{
		char *args[] = {"--token-file", missing, "--", "true", NULL};
		char *a2[] = {"--", "true", NULL};
		char env[400], *envv[] = {env, NULL};

		expect_usage_error(args, NULL, missing, "unable to read token file");
		snprintf(env, sizeof(env), "MESHRUN_TOKEN_FILE=%s", empty);
		expect_usage_error(a2, envv, empty, "is empty");
	}
}

/* A workload config file (a mounted ConfigMap) is checked at start: an
 * error names the file, the line and the key, before anything runs. */
Test(agent_config, workload_config_file_errors_name_file_line_and_key)
{
	char path[300], dup[300];
	FILE *f;

	h_path(path, sizeof(path), "workload.json");
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "{\n  \"steps\": 5,\n  \"d_model\": 32,\n  \"stpes\": 3\n}\n");
	fclose(f);
	h_path(dup, sizeof(dup), "workload-dup.json");
	f = fopen(dup, "w");
	cr_assert_not_null(f);
	fprintf(f, "{\n  \"steps\": 5,\n  \"steps\": 6\n}\n");
	fclose(f);
	{
		char *args[] = {"--workload-config", path, NULL};
		char *a2[] = {"--workload-config", dup, NULL};
		char *a3[] = {"--workload-config", "{\"d_model\": 0}", NULL};
		char *a4[] = {"--workload-config", "/nonexistent/workload.json", NULL};
		char want[400];

		snprintf(want, sizeof(want), "'%s' line 4: 'stpes'", path);
		expect_usage_error(args, NULL, want, "unknown field");
		snprintf(want, sizeof(want), "'%s' line 3", dup);
		expect_usage_error(a2, NULL, want, "duplicate object key");
		expect_usage_error(a3, NULL, "'d_model': 0 is out of range", NULL);
		expect_usage_error(a4, NULL, "unable to read '/nonexistent/workload.json'", NULL);
	}
}

/* topology: a path the controller would refuse stops the agent naming
 * it; MESHRUN_RANK_ORDER and a good path load */
Test(agent_config, topology_and_rank_order)
{
	struct mr_agent_config cfg;
	struct mr_errbuf eb = {0};
	char *bad[] = {"--topology", "rack 1/node-2", "--", "true", NULL};
	char *good[] = {"meshrun-agent", "--topology", "block-1/rack-2/node-3", "--", "true",
			NULL};

	expect_usage_error(bad, NULL, "'topology'", "at byte 4");
	setenv("MESHRUN_RANK_ORDER", "topology", 1);
	cr_assert_eq(load(&cfg, good, &eb), 0, "%s", eb.msg);
	cr_expect_str_eq(cfg.topology, "block-1/rack-2/node-3");
	cr_expect_eq(cfg.rank_order, 1);
	mr_agent_config_release(&cfg);
	unsetenv("MESHRUN_RANK_ORDER");
}
