/*
 * config.h - meshrun-agent's configuration: one table (mr_config.h) of
 * flags, MESHRUN_* env vars and JSON file keys, then what the schedulers
 * put in a pod's environment, then validation of the whole.
 *
 * Precedence, lowest first: default < scheduler env (Volcano, Indexed Job,
 * StatefulSet ordinal, Kubeflow PET_*) < JSON file < MESHRUN_* env < flag.
 * Scheduler variables only fill what meshrun's own inputs left unset:
 *   pod_index       VC_TASK_INDEX, else JOB_COMPLETION_INDEX, else
 *                   PET_NODE_RANK, else the ordinal of HOSTNAME "name-<n>"
 *   nnodes          PET_NNODES ("2" or "1:4"), else VC_<TASK>_NUM (or the
 *                   number of entries of VC_<TASK>_HOSTS) when the pod has
 *                   exactly one Volcano task
 *   nproc_per_node  PET_NPROC_PER_NODE
 *   max_restarts    PET_MAX_RESTARTS
 * topology, when not given, is read from the labels topology_labels names
 * on the pod's Node (NODE_NAME; agent/k8s_node.c), once, at load.
 * A bad value is reported naming the variable, the value and the reason.
 *
 * Ownership: the caller owns struct mr_agent_config; cmd points into argv.
 * token_file is read here, at load: an unreadable or empty file is a
 * configuration error (exit 2) naming the file.
 *
 * Non-goals: talking to anyone.
 */
#ifndef MR_AGENT_CONFIG_H
#define MR_AGENT_CONFIG_H

#include <stdint.h>
#include <jansson.h>

#include "mr_config.h"
#include "mr_err.h"

enum mr_agent_mode {
	MR_AGENT_MODE_AUTO = 0, /* exec when a command follows `--`, else inproc */
	MR_AGENT_MODE_EXEC,
	MR_AGENT_MODE_INPROC,
};

enum mr_agent_rank_process {
	MR_AGENT_RANK_AUTO = 0, /* processes on device cuda, threads otherwise */
	MR_AGENT_RANK_THREAD,
	MR_AGENT_RANK_PROCESS,
};

#define MR_AGENT_MAX_PERMANENT 32
#define MR_AGENT_MAX_WORKLOAD_FILE (1 << 20) /* bytes of a workload_config file */

struct mr_agent_config {
	char controller[512];
	char job[256];
	char node_id[256];
	char host[256];
	char host_id[320];
	int pod_index;          /* -1 = none */
	char topology[256];     /* mr_topo.h path, "" = none */
	char topology_labels[1024]; /* Node label keys for topology, "" = none */
	int rank_order;         /* 0 index, 1 topology (job spec) */
	char nnodes[32];        /* "N" or "MIN:MAX" */
	int nproc_per_node;
	int tp, pp, cp, ep, dp; /* dp 0 = derived */
	int zero;               /* ZeRO stage for the in-process runtime; -1 = unset */
	int hsdp_shard;         /* -1 = unset */
	int sequence_parallel;  /* 1 = on; 0 leaves the workload config alone */
	int max_restarts;
	int heartbeat_timeout_ms;
	int heartbeat_interval_ms; /* 0 = heartbeat_timeout / 4 */
	int last_call_ms;
	int join_timeout_ms;
	int controller_timeout_ms;
	int grace_period_ms;
	int exit_barrier_timeout_ms;
	int hang_timeout_ms;     /* job spec; 0 = the controller's default */
	double straggler_factor; /* job spec; 0 = the controller's default */
	char health_addr[64];
	int health_port;        /* 0 = ephemeral, -1 = no health server */
	char token_file[1024];
	char token[512];
	char tls_ca[1024], tls_cert[1024], tls_key[1024]; /* "" = none */
	char role[64];
	char run_id[256];
	int mode;               /* enum mr_agent_mode */
	int rank_process;       /* enum mr_agent_rank_process */
	char permanent_exit_codes[256];
	int log_level;
	int log_format;          /* enum mr_log_format */
	char workload[64];      /* in-process workload name */
	char workload_config[4096]; /* JSON object text for the workload */
	char mesh[16];          /* "auto": the planner's mesh (mesh_auto.h); "" the flags' */
	char plan_cluster[32];  /* --mesh auto's cluster: a preset, or "local" */

	/* derived by mr_agent_config_load() */
	int min_nodes, max_nodes;
	int permanent[MR_AGENT_MAX_PERMANENT];
	int npermanent;
	json_t *workload_json;  /* parsed workload_config, NULL if empty; owned */
	int fix_tp, fix_pp, fix_cp, fix_ep; /* --mesh auto: what the flags fixed, 0 = any */
	char **cmd;             /* exec mode: command and args (into argv) */
	int ncmd;
};

/*
 * Parses argv (argv[0] is the program) and the environment into cfg and
 * validates it. Returns 0, MR_CONFIG_HELP (help printed to stdout: exit
 * 0), or a negative code with eb naming the input, value and reason (exit
 * MR_CONFIG_EXIT_USAGE). prog names the program in --help. cfg->cmd stays
 * valid while argv does. Release with mr_agent_config_release().
 */
int mr_agent_config_load(struct mr_agent_config *cfg, const char *prog, int argc,
			 char **argv, struct mr_errbuf *eb);
void mr_agent_config_release(struct mr_agent_config *cfg);

/* 1 if code is in the permanent set (never retried). */
int mr_agent_config_permanent(const struct mr_agent_config *cfg, int code);

/* "boot-id/ipc:[inode]" - processes with equal host ids can share memory. */
int mr_agent_host_id(char *buf, size_t size);

/* The table, for `meshrun local` which passes agent flags on. */
const struct mr_config_opt *mr_agent_config_table(size_t *n);

#endif
