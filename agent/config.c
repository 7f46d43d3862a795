/*
 * config.c - meshrun-agent's option table, scheduler environment and
 * validation; see config.h.
 *
 * Non-goals: parsing mechanics (common mr_config), mesh maths (mr_mesh).
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mr_jobname.h"
#include "mr_log.h"
#include "mr_topo.h"
#include "k8s_node.h"
#include "mesh_auto.h"
#include "mr_mesh.h"
#include "device/mr_device.h"
#include "mr_gpt_worker.h"
#include "mr_token.h"

extern char **environ;

#define C struct mr_agent_config
static const char *const mode_names[] = {"auto", "exec", "inproc", NULL};
static const char *const rank_process_names[] = {"auto", "thread", "process", NULL};
static const char *const rank_order_names[] = {"index", "topology", NULL};
static const char *const level_names[] = {"debug", "info", "warn", "error", "off", NULL};

static const struct mr_config_opt agent_opts[] = {
	MR_CONFIG_STRING("controller", C, controller, "http://127.0.0.1:29400",
			 "Base URL of the meshrun controller."),
	MR_CONFIG_STRING("job", C, job, "default/job",
			 "Job name as namespace/name; every agent of a job uses the same."),
	MR_CONFIG_STRING("node_id", C, node_id, NULL,
			 "Stable id of this agent in the job (default: the hostname, which "
			 "survives a restart of the same pod)."),
	MR_CONFIG_STRING("host", C, host, NULL,
			 "Address other nodes reach this one at; MASTER_ADDR when this node "
			 "has node rank 0 (default: POD_IP, else 127.0.0.1)."),
	MR_CONFIG_STRING("host_id", C, host_id, NULL,
			 "Who can share memory with whom (default: boot id + IPC namespace)."),
	MR_CONFIG_INT("pod_index", C, pod_index, "-1", -1, 1000000,
		      "Index of this pod; orders node ranks (-1: from the scheduler env, "
		      "else none)."),
	MR_CONFIG_STRING("topology", C, topology, NULL,
			 "Where this node sits, widest domain first: block-2/rack-7/node-31 "
			 "(default: from topology_labels, else none)."),
	MR_CONFIG_STRING("topology_labels", C, topology_labels, NULL,
			 "Node label keys, widest first, whose values make the topology path; "
			 "the agent reads its Node (env NODE_NAME) from the API server."),
	MR_CONFIG_ENUM("rank_order", C, rank_order, "index", rank_order_names,
		       "Node ranks by pod index (index), or by topology path first "
		       "(topology: tp, cp, dp groups inside the narrowest domains); job spec."),
	MR_CONFIG_STRING("nnodes", C, nnodes, "1",
			 "Number of nodes (agents): N, or MIN:MAX for an elastic job."),
	MR_CONFIG_INT("nproc_per_node", C, nproc_per_node, "1", 1, 256,
		      "Worker processes (or threads) per node."),
	MR_CONFIG_INT("tp", C, tp, "1", 1, 1 << 20, "Tensor parallel size."),
	MR_CONFIG_INT("pp", C, pp, "1", 1, 1 << 20, "Pipeline parallel size."),
	MR_CONFIG_INT("cp", C, cp, "1", 1, 1 << 20, "Context parallel size."),
	MR_CONFIG_INT("ep", C, ep, "1", 1, 1 << 20, "Expert parallel size."),
	MR_CONFIG_INT("dp", C, dp, "0", 0, 1 << 20,
		      "Data parallel size; 0 derives it from the world size."),
	MR_CONFIG_INT("zero", C, zero, "-1", -1, 3,
		      "ZeRO stage of the in-process runtime: 0 DDP, 1 optimizer state, 2 + "
		      "gradients, 3 + parameters (FSDP); -1 leaves workload_config's."),
	MR_CONFIG_INT("hsdp_shard", C, hsdp_shard, "-1", -1, 1 << 20,
		      "Shard ZeRO state within groups of this many dp ranks, replicate "
		      "across groups (HSDP); -1 leaves workload_config's."),
	MR_CONFIG_BOOL("sequence_parallel", C, sequence_parallel, "false",
		       "Sequence parallelism with tp > 1 (in-process runtime)."),
	MR_CONFIG_INT("max_restarts", C, max_restarts, "3", 0, 1000000,
		      "Restarts of the workers (failure or membership change) before the "
		      "agent gives up."),
	MR_CONFIG_DURATION("heartbeat_timeout", C, heartbeat_timeout_ms, "10s", 200,
			   3600 * 1000,
			   "A member silent this long is declared dead (sent in the job spec)."),
	MR_CONFIG_DURATION("heartbeat_interval", C, heartbeat_interval_ms, "0", 0, 3600 * 1000,
			   "Time between heartbeats; 0 = heartbeat_timeout / 4."),
	MR_CONFIG_DURATION("last_call", C, last_call_ms, "3s", 0, 3600 * 1000,
			   "How long a round with min nodes stays open for more (job spec)."),
	MR_CONFIG_DURATION("join_timeout", C, join_timeout_ms, "600s", 100, 24 * 3600 * 1000,
			   "Give up when a round does not close within this time."),
	MR_CONFIG_DURATION("controller_timeout", C, controller_timeout_ms, "300s", 200,
			   24 * 3600 * 1000,
			   "Give up (exit 1, workers stopped) when the controller has not answered "
			   "for this long; shorter outages leave running workers alone."),
	MR_CONFIG_DURATION("grace_period", C, grace_period_ms, "5s", 0, 3600 * 1000,
			   "Time between SIGTERM and SIGKILL when stopping workers."),
	MR_CONFIG_DURATION("exit_barrier_timeout", C, exit_barrier_timeout_ms, "300s", 0,
			   24 * 3600 * 1000,
			   "After local success, how long to wait for the other nodes to finish."),
	MR_CONFIG_DURATION("hang_timeout", C, hang_timeout_ms, "0", 0, 86400 * 1000,
			   "Hang diagnosis (job spec): the controller reports the job stuck, "
			   "naming the rank the others wait for, once no rank made progress "
			   "this long; 0 = the controller's default (--hang-timeout, 30s)."),
	MR_CONFIG_DOUBLE("straggler_factor", C, straggler_factor, "0", 0, 100,
			 "Straggler detection (job spec): a rank whose busy time per step "
			 "(step minus communication wait) stays above this times the job's "
			 "median is flagged; at least 1.01; 0 = the controller's default (1.5)."),
	MR_CONFIG_STRING("health_addr", C, health_addr, "0.0.0.0",
			 "Bind address of the health and metrics server."),
	MR_CONFIG_INT("health_port", C, health_port, "29401", -1, 65535,
		      "Port of /healthz, /readyz, /metrics; 0 = ephemeral, -1 = off."),
	MR_CONFIG_STRING("token_file", C, token_file, NULL,
			 "File holding the bearer token for the controller (e.g. a mounted "
			 "Secret); read once at start, wins over token."),
	MR_CONFIG_STRING("token", C, token, NULL,
			 "Bearer token for the controller (prefer token_file)."),
	MR_CONFIG_STRING("tls_ca", C, tls_ca, NULL,
			 "PEM CA that signed an https controller's certificate (the agent, "
			 "its workers' KV calls and their processes use it)."),
	MR_CONFIG_STRING("tls_cert", C, tls_cert, NULL,
			 "Client certificate for a controller with --tls-client-ca."),
	MR_CONFIG_STRING("tls_key", C, tls_key, NULL, "Key of tls_cert."),
	MR_CONFIG_STRING("role", C, role, "default", "ROLE_NAME given to workers."),
	MR_CONFIG_STRING("run_id", C, run_id, NULL,
			 "TORCHELASTIC_RUN_ID given to workers (default: the job name)."),
	MR_CONFIG_ENUM("mode", C, mode, "auto", mode_names,
		       "Workers: exec (the command after --), inproc (the built-in runtime), "
		       "auto (exec when a command is given)."),
	MR_CONFIG_ENUM("rank_process", C, rank_process, "auto", rank_process_names,
		       "In-process ranks (inproc mode): a worker process each, which a "
		       "restart replaces (a sticky CUDA error poisons its process), or a "
		       "thread of the agent; auto: processes on device cuda, threads on cpu."),
	MR_CONFIG_STRING("permanent_exit_codes", C, permanent_exit_codes, "2,126,127",
			 "Worker exit codes that fail the job at once (comma list); every "
			 "other non-zero code is retried."),
	MR_CONFIG_ENUM("log_level", C, log_level, "info", level_names, "Log level."),
	MR_CONFIG_ENUM("log_format", C, log_format, "logfmt", mr_log_format_names,
		       "Log lines: logfmt (key=value) or json (one object per line)."),
	MR_CONFIG_STRING("workload", C, workload, "gpt",
			 "In-process workload (inproc mode): gpt."),
	MR_CONFIG_STRING("workload_config", C, workload_config, NULL,
			 "JSON object given to the in-process workload, e.g. "
			 "'{\"steps\": 20, \"d_model\": 64}', or the path of a file holding one "
			 "(a mounted ConfigMap); checked at start. Its keys: docs/WORKLOAD.md "
			 "(meshrun local --help-workload)."),
	MR_CONFIG_STRING("mesh", C, mesh, NULL,
			 "auto: the mesh (and ZeRO stage, micro-batches, schedule) of meshrun "
			 "plan's top plan for the world the job gets, from workload_config's "
			 "model; --tp/--pp/--cp/--ep given too are kept (docs/PLANNER.md)."),
	MR_CONFIG_STRING("plan_cluster", C, plan_cluster, "local",
			 "The cluster --mesh auto plans for: a preset of meshrun plan "
			 "(h100, a100-80g, ...; nproc_per_node to a node) or local (this "
			 "machine's CPU ranks)."),
};
#undef C

const struct mr_config_opt *mr_agent_config_table(size_t *n)
{
	*n = sizeof(agent_opts) / sizeof(agent_opts[0]);
	return agent_opts;
}

int mr_agent_host_id(char *buf, size_t size)
{
	char boot[64] = "", ipc[64] = "";
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	ssize_t n;

	if (f) {
		if (!fgets(boot, sizeof(boot), f))
			boot[0] = '\0';
		fclose(f);
	}
	boot[strcspn(boot, "\n")] = '\0';
	n = readlink("/proc/self/ns/ipc", ipc, sizeof(ipc) - 1);
	ipc[n > 0 ? n : 0] = '\0';
	if (!boot[0] && !ipc[0])
		return MR_ENOTFOUND;
	snprintf(buf, size, "%s/%s", boot[0] ? boot : "noboot", ipc[0] ? ipc : "noipc");
	return 0;
}

/* Sets name from a scheduler variable unless meshrun's own inputs did. */
static int from_env(struct mr_config *mc, const char *name, const char *var,
		    struct mr_errbuf *eb)
{
	const char *v = getenv(var);

	if (!v || !v[0] || mr_config_is_set(mc, name))
		return 0;
	return mr_config_set(mc, name, v, MR_CONFIG_SRC_ENV, var, eb);
}

/* The single Volcano task of this pod: VC_<TASK>_NUM / VC_<TASK>_HOSTS. */
static int volcano_nodes(struct mr_config *mc, struct mr_errbuf *eb)
{
	char var[256] = "", val[32];
	int tasks = 0, count = 0;

	if (mr_config_is_set(mc, "nnodes"))
		return 0;
	for (char **e = environ; *e; e++) {
		const char *eq = strchr(*e, '=');
		size_t kl = eq ? (size_t)(eq - *e) : 0;

		if (kl < 8 || strncmp(*e, "VC_", 3) || kl >= sizeof(var))
			continue;
		if (kl > 7 && !strncmp(*e + kl - 4, "_NUM", 4)) {
			tasks++;
			snprintf(var, sizeof(var), "%.*s", (int)kl, *e);
		} else if (kl > 9 && !strncmp(*e + kl - 6, "_HOSTS", 6) && !var[0]) {
			const char *p = eq + 1;

			count = *p ? 1 : 0;
			for (; *p; p++)
				count += *p == ',';
		}
	}
	if (tasks == 1)
		return mr_config_set(mc, "nnodes", getenv(var), MR_CONFIG_SRC_ENV, var, eb);
	if (tasks == 0 && count > 0) {
		snprintf(val, sizeof(val), "%d", count);
		return mr_config_set(mc, "nnodes", val, MR_CONFIG_SRC_ENV, "VC_<TASK>_HOSTS", eb);
	}
	return 0;
}

/* StatefulSet pods are named <set>-<ordinal>. */
static int hostname_ordinal(struct mr_config *mc, struct mr_errbuf *eb)
{
	const char *h = getenv("HOSTNAME");
	const char *dash;

	if (mr_config_is_set(mc, "pod_index") || !h || !(dash = strrchr(h, '-')) || !dash[1])
		return 0;
	for (const char *p = dash + 1; *p; p++)
		if (!isdigit((unsigned char)*p))
			return 0;
	return mr_config_set(mc, "pod_index", dash + 1, MR_CONFIG_SRC_ENV, "HOSTNAME", eb);
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return MR_EPARSE;
	*out = (int)v;
	return 0;
}

static const char *source_of(struct mr_config *mc, const char *name, const char *flag)
{
	switch (mr_config_source(mc, name)) {
	case MR_CONFIG_SRC_FLAG:
		return flag;
	case MR_CONFIG_SRC_ENV:
		return "environment";
	case MR_CONFIG_SRC_FILE:
		return mc->config_path;
	default:
		return "default";
	}
}

static int parse_nnodes(struct mr_agent_config *cfg, struct mr_config *mc, struct mr_errbuf *eb)
{
	char a[32] = "", *colon;

	snprintf(a, sizeof(a), "%s", cfg->nnodes);
	colon = strchr(a, ':');
	if (colon)
		*colon = '\0';
	if (parse_int(a, 1, 100000, &cfg->min_nodes) ||
	    parse_int(colon ? colon + 1 : a, 1, 100000, &cfg->max_nodes) ||
	    cfg->min_nodes > cfg->max_nodes)
		return mr_errf_field(eb, MR_EINVAL, "nnodes",
				     "nnodes (%s): '%s' is not N or MIN:MAX with 1 <= MIN <= MAX "
				     "<= 100000",
				     source_of(mc, "nnodes", "--nnodes"), cfg->nnodes);
	return 0;
}

static int parse_permanent(struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	const char *p = cfg->permanent_exit_codes;

	cfg->npermanent = 0;
	while (*p) {
		char item[16];
		size_t l = strcspn(p, ",");
		int code;

		snprintf(item, sizeof(item), "%.*s", (int)(l < 15 ? l : 15), p);
		if (l >= 15 || parse_int(item, 1, 255, &code) ||
		    cfg->npermanent == MR_AGENT_MAX_PERMANENT)
			return mr_errf_field(eb, MR_EINVAL, "permanent_exit_codes",
					     "permanent_exit_codes: '%s' is not a comma list of "
					     "at most %d codes in [1, 255]",
					     cfg->permanent_exit_codes, MR_AGENT_MAX_PERMANENT);
		cfg->permanent[cfg->npermanent++] = code;
		p += l;
		if (*p == ',')
			p++;
	}
	return 0;
}

int mr_agent_config_permanent(const struct mr_agent_config *cfg, int code)
{
	for (int i = 0; i < cfg->npermanent; i++)
		if (cfg->permanent[i] == code)
			return 1;
	return 0;
}

/* The mesh must divide every world size the job may have. */
static int check_mesh(const struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	int ends[2] = {cfg->min_nodes, cfg->max_nodes};

	if (cfg->dp && cfg->min_nodes != cfg->max_nodes)
		return mr_errf_field(eb, MR_EINVAL, "dp",
				     "dp: %d is fixed but nnodes '%s' is elastic; use dp 0 "
				     "(derived)",
				     cfg->dp, cfg->nnodes);
	for (int i = 0; i < 2; i++) {
		struct mr_errbuf me = {0};
		struct mr_mesh m;
		int world = ends[i] * cfg->nproc_per_node;

		if (mr_mesh_init(&m, world, cfg->tp, cfg->pp, cfg->cp, cfg->ep, cfg->dp, &me))
			return mr_errf_field(eb, MR_EINVAL, me.field,
					     "mesh: %s (nnodes %d x nproc_per_node %d; tp=%d "
					     "pp=%d cp=%d ep=%d dp=%d)",
					     me.msg, ends[i], cfg->nproc_per_node, cfg->tp,
					     cfg->pp, cfg->cp, cfg->ep, cfg->dp);
	}
	return 0;
}

static int check_job(const char *job, struct mr_errbuf *eb)
{
	if (!mr_job_name_valid(job))
		return mr_errf_field(eb, MR_EINVAL, "job", "job: '%s' is not a valid job name: %s",
				     job, MR_JOB_NAME_RULE);
	return 0;
}

/* --zero, --hsdp-shard and --sequence-parallel are shorthands for the
 * workload config's keys (Megatron and torchrun users pass them as flags);
 * a flag wins over the same key in workload_config. */
static int merge_parallel_flags(struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	json_t *j;

	if (cfg->zero < 0 && cfg->hsdp_shard < 0 && !cfg->sequence_parallel)
		return 0;
	if (!cfg->workload_json && !(cfg->workload_json = json_object()))
		return mr_errf(eb, MR_ENOMEM, "unable to build the workload config");
	j = cfg->workload_json;
	if ((cfg->zero >= 0 && json_object_set_new(j, "zero", json_integer(cfg->zero))) ||
	    (cfg->hsdp_shard >= 0 &&
	     json_object_set_new(j, "hsdp_shard", json_integer(cfg->hsdp_shard))) ||
	    (cfg->sequence_parallel &&
	     json_object_set_new(j, "sequence_parallel", json_true())))
		return mr_errf(eb, MR_ENOMEM, "unable to build the workload config");
	return 0;
}

/* A job of a fixed size on the flags' mesh: every rank placed as its
 * worker will place it (heads, key/value heads, layers, sequence, experts
 * against tp, pp, cp, ep; the pipeline's split and schedule), so a job no
 * rank could run is refused before it starts. An elastic job's world is
 * known only at each round: its ranks check themselves. */
static int check_placement(const struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	struct mr_errbuf pe = { "", "" };
	int world = cfg->min_nodes * cfg->nproc_per_node;
	struct mr_gpt_worker_ranks r = { world, cfg->tp, cfg->pp, cfg->cp, cfg->ep, 0, world };

	if (cfg->mesh[0] || cfg->min_nodes != cfg->max_nodes || world < 1 ||
	    mr_gpt_worker_check_mesh(cfg->workload_json, &r, &pe) == 0)
		return 0;
	return mr_errf_field(eb, MR_EINVAL, pe.field[0] ? pe.field : "workload_config",
			     "workload_config: %s", pe.msg);
}

/* The 1-based line of the first "key" in text, 0 if it is not there. */
static int line_of_key(const char *text, const char *key)
{
	size_t kl = strlen(key);
	int line = 1;

	for (const char *p = text; *p; p++) {
		if (*p == '\n')
			line++;
		else if (*p == '"' && !strncmp(p + 1, key, kl) && p[kl + 1] == '"')
			return line;
	}
	return 0;
}

/* The workload config file at path (at most MR_AGENT_MAX_WORKLOAD_FILE
 * bytes) into *text, malloc'd and NUL-terminated. */
static int read_workload_file(const char *path, char **text, struct mr_errbuf *eb)
{
	FILE *f = fopen(path, "rb");
	size_t n;

	*text = NULL;
	if (!f)
		return mr_errf_field(eb, MR_EINVAL, "workload_config",
				     "workload_config: unable to read '%s': %s", path, strerror(errno));
	*text = malloc(MR_AGENT_MAX_WORKLOAD_FILE + 1);
	n = *text ? fread(*text, 1, MR_AGENT_MAX_WORKLOAD_FILE + 1, f) : 0;
	fclose(f);
	if (!*text)
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	if (n > MR_AGENT_MAX_WORKLOAD_FILE)
		return mr_errf_field(eb, MR_EINVAL, "workload_config",
				     "workload_config: '%s' is larger than %d bytes", path,
				     MR_AGENT_MAX_WORKLOAD_FILE);
	(*text)[n] = '\0';
	return 0;
}

/*
 * workload_config is inline JSON (it starts with '{') or a file's path.
 * A key given twice is an error naming it, not "the last one wins"; then
 * the workload checks every key, type and bound, so a bad config exits 2
 * before the job starts, naming the file, the line and the key.
 */
static int parse_workload(struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	const char *src = cfg->workload_config, *path = NULL;
	struct mr_errbuf ce = {0};
	char *text = NULL;
	json_error_t je;
	int rc = 0;

	if (strcmp(cfg->workload, "gpt"))
		return mr_errf_field(eb, MR_EINVAL, "workload",
				     "workload: '%s' is not known (known: gpt)", cfg->workload);
	while (isspace((unsigned char)*src))
		src++;
	if (*src && *src != '{') {
		path = src;
		rc = read_workload_file(path, &text, eb);
		src = text;
	}
	if (!rc && *src) {
		cfg->workload_json = json_loads(src, JSON_REJECT_DUPLICATES, &je);
		if (!cfg->workload_json && path)
			rc = mr_errf_field(eb, MR_EINVAL, "workload_config",
					   "workload_config: '%s' line %d, column %d: %s", path,
					   je.line, je.column, je.text);
		else if (!cfg->workload_json)
			rc = mr_errf_field(eb, MR_EINVAL, "workload_config",
					   "workload_config: '%.200s' is not valid JSON: %s", src,
					   je.text);
		else if (!json_is_object(cfg->workload_json))
			rc = mr_errf_field(eb, MR_EINVAL, "workload_config",
					   "workload_config: %s%.200s%s is not a JSON object",
					   path ? "'" : "'", path ? path : src, "'");
	}
	if (!rc)
		rc = merge_parallel_flags(cfg, eb);
	if (!rc && mr_gpt_worker_check_config(cfg->workload_json, &ce)) {
		int line = path && ce.field[0] ? line_of_key(text, ce.field) : 0;

		if (line)
			rc = mr_errf_field(eb, MR_EINVAL, ce.field, "workload_config: '%s' line %d: %s",
					   path, line, ce.msg);
		else
			rc = mr_errf_field(eb, MR_EINVAL, ce.field[0] ? ce.field : "workload_config",
					   "workload_config%s%s%s: %s", path ? " '" : "",
					   path ? path : "", path ? "'" : "", ce.msg);
	}
	if (rc) {
		json_decref(cfg->workload_json);
		cfg->workload_json = NULL;
	}
	free(text);
	return rc;
}

/* The in-process workload's device exists here: a job asking for GPUs on
 * a node without one fails before it joins, naming why, instead of in its
 * ranks after the round formed. */
static int check_device(const struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	const char *dev = json_string_value(json_object_get(cfg->workload_json, "device"));
	struct mr_errbuf why = { "", "" };

	if (!dev || strcmp(dev, "cuda") || mr_dev_cuda_count(&why) > 0)
		return 0;
	return mr_errf_field(eb, MR_ENOTSUP, "device",
			     "workload_config: 'device' \"cuda\" is not available on this node: %s",
			     why.msg);
}

/*
 * --mesh auto: the flags' tp, pp, cp and ep become what the planner keeps
 * (1 when not given), dp is derived; a job of fixed size is planned now,
 * so its spec carries the mesh, an elastic one each round (workers.c).
 */
static int mesh_auto(const struct mr_config *mc, struct mr_agent_config *cfg,
		     struct mr_errbuf *eb)
{
	struct mr_agent_mesh m;
	json_t *planned;
	int rc;

	if (!cfg->mesh[0])
		return 0;
	if (strcmp(cfg->mesh, "auto"))
		return mr_errf_field(eb, MR_EINVAL, "mesh",
				     "mesh: '%s' is not auto (leave it out for --tp, --pp ... as "
				     "given)",
				     cfg->mesh);
	if (mc->nargs > 0 || cfg->mode == MR_AGENT_MODE_EXEC)
		return mr_errf_field(eb, MR_EINVAL, "mesh",
				     "mesh: auto plans the in-process runtime's model; exec mode "
				     "has none to plan for");
	if (mr_config_is_set(mc, "dp") && cfg->dp)
		return mr_errf_field(eb, MR_EINVAL, "dp", "dp: --mesh auto derives it; leave it out");
	cfg->fix_tp = mr_config_is_set(mc, "tp") ? cfg->tp : 0;
	cfg->fix_pp = mr_config_is_set(mc, "pp") ? cfg->pp : 0;
	cfg->fix_cp = mr_config_is_set(mc, "cp") ? cfg->cp : 0;
	cfg->fix_ep = mr_config_is_set(mc, "ep") ? cfg->ep : 0;
	if (cfg->min_nodes != cfg->max_nodes) /* each round plans the world it gets */
		return 0;
	rc = mr_agent_mesh_auto(cfg, cfg->min_nodes * cfg->nproc_per_node, &m, &planned, eb);
	if (rc < 0)
		return rc;
	cfg->tp = m.tp;
	cfg->pp = m.pp;
	cfg->cp = m.cp;
	cfg->ep = m.ep;
	cfg->dp = 0;
	json_decref(cfg->workload_json);
	cfg->workload_json = planned;
	return 0;
}

/* token_file (or MESHRUN_TOKEN_FILE) wins over token, as in the controller. */
static int read_token(struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	if (!cfg->token_file[0])
		return 0;
	return mr_token_read_file(cfg->token_file, cfg->token, sizeof(cfg->token), "token_file",
				  eb);
}

static int fill_defaults(struct mr_agent_config *cfg)
{
	if (!cfg->node_id[0]) {
		const char *h = getenv("HOSTNAME");
		char name[256] = "";

		if (h && h[0])
			snprintf(name, sizeof(name), "%s", h);
		else if (gethostname(name, sizeof(name) - 1) != 0)
			snprintf(name, sizeof(name), "node");
		snprintf(cfg->node_id, sizeof(cfg->node_id), "%s", name);
	}
	if (!cfg->host[0]) {
		const char *ip = getenv("POD_IP");

		snprintf(cfg->host, sizeof(cfg->host), "%s", ip && ip[0] ? ip : "127.0.0.1");
	}
	if (!cfg->host_id[0] && mr_agent_host_id(cfg->host_id, sizeof(cfg->host_id)))
		snprintf(cfg->host_id, sizeof(cfg->host_id), "%s", cfg->node_id);
	if (!cfg->run_id[0])
		snprintf(cfg->run_id, sizeof(cfg->run_id), "%s", cfg->job);
	if (cfg->heartbeat_interval_ms == 0)
		cfg->heartbeat_interval_ms = cfg->heartbeat_timeout_ms / 4;
	if (cfg->heartbeat_interval_ms < 50)
		cfg->heartbeat_interval_ms = 50;
	return 0;
}

/* TLS files reach every HTTP client of this process and its children
 * (common/mr_httpc.h reads MESHRUN_TLS_*); each must be readable now. */
static int tls_env(const struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	static const char *const names[3][2] = { { "tls_ca", "MESHRUN_TLS_CA" },
						  { "tls_cert", "MESHRUN_TLS_CERT" },
						  { "tls_key", "MESHRUN_TLS_KEY" } };
	const char *val[3] = { cfg->tls_ca, cfg->tls_cert, cfg->tls_key };

	if (!cfg->tls_cert[0] != !cfg->tls_key[0])
		return mr_errf_field(eb, MR_EINVAL, cfg->tls_cert[0] ? "tls_key" : "tls_cert",
				     "tls_cert and tls_key go together");
	for (int i = 0; i < 3; i++) {
		if (!val[i][0])
			continue;
		if (access(val[i], R_OK) < 0)
			return mr_errf_field(eb, MR_EINVAL, names[i][0], "%s: cannot read '%s': %s",
					     names[i][0], val[i], strerror(errno));
		if (setenv(names[i][1], val[i], 1) < 0)
			return mr_errf(eb, MR_ENOMEM, "out of memory");
	}
	return 0;
}

/* The node's topology path: as given (checked), else from the labels of
 * its Node (NODE_NAME, the downward API's spec.nodeName), read from the
 * API server (agent/k8s_node.c). */
static int topology(struct mr_agent_config *cfg, struct mr_errbuf *eb)
{
	const char *node = getenv("NODE_NAME");
	int rc;

	if (cfg->topology[0])
		return mr_topo_check(cfg->topology, "topology", eb);
	if (!cfg->topology_labels[0])
		return 0;
	if (!node || !node[0])
		return mr_errf_field(eb, MR_EINVAL, "NODE_NAME",
				     "topology_labels: NODE_NAME is not set (give the pod env "
				     "NODE_NAME from the downward API's spec.nodeName)");
	rc = mr_k8s_node_topology(node, cfg->topology_labels, cfg->topology,
				  sizeof(cfg->topology), eb);
	if (rc == 0)
		mr_log_info("topology", "node=%s path=%s labels=%s", mr_log_q(node),
			    mr_log_q(cfg->topology), mr_log_q(cfg->topology_labels));
	return rc;
}

int mr_agent_config_load(struct mr_agent_config *cfg, const char *prog, int argc,
			 char **argv, struct mr_errbuf *eb)
{
	struct mr_config mc;
	int err;

	memset(cfg, 0, sizeof(*cfg));
	memset(&mc, 0, sizeof(mc));
	err = mr_config_init(&mc, agent_opts, sizeof(agent_opts) / sizeof(agent_opts[0]), cfg,
			     eb);
	if (err)
		goto out;
	mc.prog = prog;
	mc.usage = "[options] [-- CMD ARGS...]";
	mc.summary = "Joins a meshrun job through the controller, derives its ranks and mesh "
		     "coordinates, runs nproc_per_node workers (the command after `--` with "
		     "torchrun's environment, or the in-process runtime), heartbeats, and "
		     "restarts the workers when a member fails.";
	err = mr_config_parse(&mc, argc, argv, eb);
	if (err)
		goto out;
	/* scheduler variables fill only what meshrun's own inputs left unset */
	err = from_env(&mc, "pod_index", "VC_TASK_INDEX", eb);
	if (!err)
		err = from_env(&mc, "pod_index", "JOB_COMPLETION_INDEX", eb);
	if (!err)
		err = from_env(&mc, "pod_index", "PET_NODE_RANK", eb);
	if (!err)
		err = hostname_ordinal(&mc, eb);
	if (!err)
		err = from_env(&mc, "nnodes", "PET_NNODES", eb);
	if (!err)
		err = volcano_nodes(&mc, eb);
	if (!err)
		err = from_env(&mc, "nproc_per_node", "PET_NPROC_PER_NODE", eb);
	if (!err)
		err = from_env(&mc, "max_restarts", "PET_MAX_RESTARTS", eb);
	if (!err)
		err = parse_nnodes(cfg, &mc, eb);
	if (!err)
		err = parse_permanent(cfg, eb);
	if (!err)
		err = check_job(cfg->job, eb);
	if (!err)
		err = parse_workload(cfg, eb);
	if (!err)
		err = mesh_auto(&mc, cfg, eb);
	if (!err)
		err = check_mesh(cfg, eb);
	if (!err)
		err = read_token(cfg, eb);
	if (!err)
		err = topology(cfg, eb);
	if (!err)
		err = tls_env(cfg, eb);
	if (!err && cfg->straggler_factor > 0.0 && cfg->straggler_factor < 1.01)
		err = mr_errf_field(eb, MR_EINVAL, "straggler_factor",
				    "straggler_factor: %g must be 0 (the controller's default) or "
				    "at least 1.01", cfg->straggler_factor);
	if (err)
		goto out;
	if (mc.nargs > 0 && mc.dashdash < 0) {
		err = mr_errf_field(eb, MR_EINVAL, mc.args[0],
				    "%s: unexpected argument (put the worker command after --)",
				    mc.args[0]);
		goto out;
	}
	if (mc.nargs > 0) {
		cfg->ncmd = mc.nargs - mc.dashdash;
		cfg->cmd = calloc((size_t)cfg->ncmd + 1, sizeof(*cfg->cmd));
		if (!cfg->cmd) {
			err = MR_ENOMEM;
			goto out;
		}
		for (int i = 0; i < cfg->ncmd; i++)
			cfg->cmd[i] = mc.args[mc.dashdash + i];
	}
	if (cfg->mode == MR_AGENT_MODE_AUTO)
		cfg->mode = cfg->ncmd > 0 ? MR_AGENT_MODE_EXEC : MR_AGENT_MODE_INPROC;
	if (cfg->mode == MR_AGENT_MODE_EXEC && cfg->ncmd == 0) {
		err = mr_errf_field(eb, MR_EINVAL, "mode",
				    "mode: 'exec' needs a worker command after --");
		goto out;
	}
	if (cfg->mode == MR_AGENT_MODE_INPROC && (err = check_device(cfg, eb)) < 0)
		goto out;
	if (cfg->mode == MR_AGENT_MODE_INPROC && (err = check_placement(cfg, eb)) < 0)
		goto out;
	fill_defaults(cfg);
out:
	mr_config_release(&mc);
	return err;
}

void mr_agent_config_release(struct mr_agent_config *cfg)
{
	free(cfg->cmd);
	cfg->cmd = NULL;
	json_decref(cfg->workload_json);
	cfg->workload_json = NULL;
	cfg->ncmd = 0;
}
