/*
 * status.c - `meshrun status [JOB]`: jobs, generations and members from a
 * controller, as aligned human tables.
 *
 *   meshrun status                      every job, one line each
 *   meshrun status team-a/gpt-small     the job, its health (stuck,
 *                                       stragglers), then its members by rank
 *   meshrun status --why team-a/gpt     the diagnosis: who the others wait
 *                                       for, in which group and operation
 *                                       (docs/DIAGNOSIS.md)
 *
 * Options: --controller URL (MESHRUN_CONTROLLER, default
 * http://127.0.0.1:29400), --token / MESHRUN_TOKEN, --token-file.
 *
 * A job name is checked with the controller's own grammar (mr_jobname.h)
 * before any URL is built: "zz/../team/a" or "team/a?x=1" would otherwise
 * reach another job (libcurl folds "..") or smuggle a query. A bad name
 * exits 2.
 *
 * Non-goals: watching (run it under `watch`), changing anything.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_cli.h"
#include "mr_config.h"
#include "mr_httpc.h"
#include "mr_jobname.h"
#include "mr_json.h"
#include "mr_token.h"

struct status_opts {
	char controller[512];
	char token[256];
	char token_file[1024];
	char tls_ca[1024], tls_cert[1024], tls_key[1024];
	int why;
};

#define O struct status_opts
static const struct mr_config_opt status_config[] = {
	MR_CONFIG_STRING("controller", O, controller, "http://127.0.0.1:29400",
			 "Controller base URL."),
	MR_CONFIG_STRING("token", O, token, "", "Bearer token (read or write)."),
	MR_CONFIG_STRING("token_file", O, token_file, "", "File holding the bearer token."),
	MR_CONFIG_STRING("tls_ca", O, tls_ca, "",
			 "PEM CA that signed an https controller's certificate."),
	MR_CONFIG_STRING("tls_cert", O, tls_cert, "",
			 "Client certificate, for a controller with --tls-client-ca."),
	MR_CONFIG_STRING("tls_key", O, tls_key, "", "Key of tls_cert."),
	MR_CONFIG_BOOL("why", O, why, "false",
		       "With a job: why it is stuck or slow - the rank the others wait for, "
		       "the group and operation, stragglers (GET .../diagnosis)."),
};
#undef O

static long long geti(const json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

static const char *gets_(const json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s ? s : "-";
}

static int get(struct mr_httpc *c, const char *path, json_t **out)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	long status = 0;

	if (mr_httpc_json(c, "GET", path, NULL, 10000, &status, out, &eb)) {
		fprintf(stderr, "meshrun status: %s\n", eb.msg);
		return 1;
	}
	if (status != 200) {
		json_t *e = json_object_get(*out, "error");

		fprintf(stderr, "meshrun status: %s: HTTP %ld: %s\n", path, status,
			e ? gets_(e, "message") : "unexpected reply");
		json_decref(*out);
		*out = NULL;
		return 1;
	}
	return 0;
}

static void print_job_line(const json_t *j)
{
	const json_t *m = json_object_get(j, "members");
	const json_t *kv = json_object_get(j, "kv");

	printf("%-40s %-9s %6lld %6lld %6lld %8lld %8lld %8lld %8lld %8lld\n", gets_(j, "name"),
	       gets_(j, "state"), geti(j, "generation"), geti(j, "num_nodes"),
	       geti(j, "world_size"), geti(j, "restarts"), geti(m, "waiting"),
	       geti(m, "running"), geti(m, "standby"), geti(kv, "keys"));
}

static int list_jobs(struct mr_httpc *c)
{
	long long off = 0;

	printf("%-40s %-9s %6s %6s %6s %8s %8s %8s %8s %8s\n", "JOB", "STATE", "GEN", "NODES",
	       "WORLD", "RESTARTS", "WAITING", "RUNNING", "STANDBY", "KV_KEYS");
	for (;;) {
		char path[128];
		json_t *o = NULL, *jobs;
		size_t i;

		snprintf(path, sizeof(path), "/v1/jobs?offset=%lld&limit=1000", off);
		if (get(c, path, &o))
			return 1;
		jobs = json_object_get(o, "jobs");
		for (i = 0; i < json_array_size(jobs); i++)
			print_job_line(json_array_get(jobs, i));
		if (!json_is_integer(json_object_get(o, "next"))) {
			json_decref(o);
			return 0;
		}
		off = geti(o, "next");
		json_decref(o);
	}
}

static double getf(const json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

static void print_stragglers(const json_t *list, long long total, double median)
{
	size_t i;

	if (!total) {
		printf("stragglers:  none (median busy %.1f ms per step)\n", median);
		return;
	}
	printf("stragglers:  %lld (median busy %.1f ms per step)\n", total, median);
	for (i = 0; i < json_array_size(list); i++) {
		const json_t *s = json_array_get(list, i);

		printf("             rank %lld (node %s): busy %.1f ms per step, %.1fx the median\n",
		       geti(s, "rank"), gets_(s, "node"), getf(s, "busy_ms"),
		       getf(s, "median_ms") > 0 ? getf(s, "busy_ms") / getf(s, "median_ms") : 0.0);
	}
}

/* `--why`: the diagnosis as text. */
static int show_why(struct mr_httpc *c, const char *job)
{
	char path[512];
	json_t *o = NULL, *cs, *gs;
	size_t i;

	snprintf(path, sizeof(path), "/v1/jobs/%s/diagnosis", job);
	if (get(c, path, &o))
		return 1;
	printf("job:         %s (generation %lld)\n", gets_(o, "job"), geti(o, "generation"));
	printf("verdict:     %s", gets_(o, "verdict"));
	if (!strcmp(gets_(o, "verdict"), "stuck") || !strcmp(gets_(o, "verdict"), "progressing"))
		printf(": last progress %.1f s ago (hang timeout %.0f s); %lld of %lld ranks "
		       "report progress", getf(o, "stalled_s"), getf(o, "hang_timeout_s"),
		       geti(o, "ranks_reporting"), geti(o, "world_size"));
	printf("\nwhy:         %s\n", gets_(o, "message"));
	cs = json_object_get(o, "culprits");
	if (json_array_size(cs)) {
		printf("\n%-8s %-24s %-22s %6s %6s %8s %-20s %-14s %8s %s\n", "RANK", "NODE",
		       "COORDS", "STEP", "MICRO", "WAITING", "GROUP", "OP", "SEQ", "REASON");
		for (i = 0; i < json_array_size(cs); i++) {
			const json_t *x = json_array_get(cs, i), *co = json_object_get(x, "coords");
			char coords[64] = "-", step[24] = "-", micro[16] = "-", seq[24] = "-";

			if (co)
				snprintf(coords, sizeof(coords), "tp%lld cp%lld dp%lld pp%lld",
					 geti(co, "tp"), geti(co, "cp"), geti(co, "dp"), geti(co, "pp"));
			if (json_object_get(x, "step"))
				snprintf(step, sizeof(step), "%lld", geti(x, "step"));
			if (json_object_get(x, "micro") && geti(x, "micro") >= 0)
				snprintf(micro, sizeof(micro), "%lld", geti(x, "micro"));
			if (json_object_get(x, "seq"))
				snprintf(seq, sizeof(seq), "%lld", geti(x, "seq"));
			printf("%-8lld %-24s %-22s %6s %6s %8lld %-20s %-14s %8s %s%s\n",
			       geti(x, "rank"), gets_(x, "node"), coords, step, micro,
			       geti(x, "waiting"), gets_(x, "group"), gets_(x, "op"), seq,
			       gets_(x, "reason"),
			       json_object_get(x, "node_silent_s") ? " (node silent)" : "");
		}
	}
	gs = json_object_get(o, "groups");
	if (json_array_size(gs)) {
		printf("\n%-20s %-14s %8s %8s %9s %12s %10s %s\n", "GROUP", "OP", "SEQ", "WAITING",
		       "SINCE", "NOT_ENTERED", "NO_REPORT", "TYPE");
		for (i = 0; i < json_array_size(gs); i++) {
			const json_t *g = json_array_get(gs, i);

			printf("%-20s %-14s %8lld %8lld %8.1fs %12lld %10lld %s\n", gets_(g, "group"),
			       gets_(g, "op"), geti(g, "seq"), geti(g, "waiting"),
			       getf(g, "waiting_since_s"), geti(g, "not_entered"),
			       geti(g, "no_report"), gets_(g, "type"));
		}
		if (geti(o, "groups_total") > (long long)json_array_size(gs))
			printf("(%lld groups in all)\n", geti(o, "groups_total"));
	}
	if (geti(o, "ranks_not_reporting") > 0)
		printf("\n%lld ranks report no progress\n", geti(o, "ranks_not_reporting"));
	printf("\n");
	print_stragglers(json_object_get(o, "stragglers"), geti(o, "stragglers_total"),
			 getf(o, "median_busy_ms"));
	json_decref(o);
	return 0;
}

static void print_health(const json_t *h)
{
	if (!h)
		return;
	if (json_is_true(json_object_get(h, "stuck")))
		printf("health:      STUCK: no progress for %.1f s; first culprit rank %lld on %s "
		       "(meshrun status --why)\n",
		       getf(h, "stalled_s"), geti(h, "stuck_rank"), gets_(h, "stuck_group"));
	else
		printf("health:      progressing (last progress %.1f s ago, %lld ranks report)\n",
		       getf(h, "stalled_s"), geti(h, "ranks_reporting"));
	print_stragglers(json_object_get(h, "stragglers"), geti(h, "stragglers_total"),
			 getf(h, "median_busy_ms"));
}

static int show_job(struct mr_httpc *c, const char *job)
{
	long long off = 0;
	int first = 1;

	for (;;) {
		char path[512];
		json_t *o = NULL, *ms, *m;
		size_t i;

		snprintf(path, sizeof(path), "/v1/jobs/%s?members=1&offset=%lld&limit=1000", job,
			 off);
		if (get(c, path, &o))
			return 1;
		if (first) {
			const json_t *sp = json_object_get(o, "spec");
			const json_t *mesh = json_object_get(sp, "mesh");

			printf("job:         %s\n", gets_(o, "name"));
			printf("state:       %s\n", gets_(o, "state"));
			if (json_is_string(json_object_get(o, "reason")))
				printf("reason:      %s\n", gets_(o, "reason"));
			printf("generation:  %lld (restarts %lld of %lld, rounds %lld)\n",
			       geti(o, "generation"), geti(o, "restarts"),
			       geti(sp, "max_restarts"), geti(o, "rounds"));
			printf("nodes:       %lld (min %lld, max %lld) x %lld proc = world %lld\n",
			       geti(o, "num_nodes"), geti(sp, "min_nodes"), geti(sp, "max_nodes"),
			       geti(sp, "nproc_per_node"), geti(o, "world_size"));
			printf("mesh:        tp=%lld pp=%lld cp=%lld ep=%lld dp=%lld\n",
			       geti(mesh, "tp"), geti(mesh, "pp"), geti(mesh, "cp"),
			       geti(mesh, "ep"), geti(o, "dp") ? geti(o, "dp") : geti(mesh, "dp"));
			printf("kv:          %lld keys, %lld bytes\n",
			       geti(json_object_get(o, "kv"), "keys"),
			       geti(json_object_get(o, "kv"), "bytes"));
			printf("rank order:  %s\n", json_is_string(json_object_get(sp, "rank_order"))
							     ? gets_(sp, "rank_order")
							     : "index");
			print_health(json_object_get(o, "health"));
			printf("\n");
			printf("%-9s %-40s %-8s %-20s %6s %10s  %s\n", "NODE_RANK", "NODE_ID",
			       "STATE", "HOST", "POD", "LAST_SEEN", "TOPOLOGY");
			first = 0;
		}
		ms = json_object_get(o, "member_list");
		for (i = 0; i < json_array_size(ms); i++) {
			char rank[16], pod[16], seen[24];

			m = json_array_get(ms, i);
			snprintf(rank, sizeof(rank), "%lld", geti(m, "node_rank"));
			snprintf(pod, sizeof(pod), "%lld", geti(m, "pod_index"));
			snprintf(seen, sizeof(seen), "%.1fs", (double)geti(m, "last_seen_ms_ago") / 1e3);
			printf("%-9s %-40s %-8s %-20s %6s %10s  %s\n",
			       json_object_get(m, "node_rank") ? rank : "-", gets_(m, "node_id"),
			       gets_(m, "state"), gets_(m, "host"),
			       json_object_get(m, "pod_index") ? pod : "-", seen,
			       gets_(m, "topology"));
		}
		if (!json_is_integer(json_object_get(o, "next"))) {
			json_decref(o);
			return 0;
		}
		off = geti(o, "next");
		json_decref(o);
	}
}

int mr_cli_status(int argc, char **argv)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct status_opts o;
	struct mr_httpc_opts ho;
	struct mr_httpc c;
	struct mr_config cfg;
	const char *job = NULL;
	int rc;

	memset(&o, 0, sizeof(o));
	rc = mr_config_init(&cfg, status_config, sizeof(status_config) / sizeof(status_config[0]),
			    &o, &eb);
	if (!rc) {
		cfg.prog = "meshrun status";
		cfg.usage = "[options] [NAMESPACE/JOB]";
		cfg.summary = "Jobs, generations and members known to a meshrun controller.";
		cfg.allow_positional = 1;
		cfg.config_file = 0;
		rc = mr_config_parse(&cfg, argc, argv, &eb);
	}
	if (rc == MR_CONFIG_HELP) {
		mr_config_release(&cfg);
		return 0;
	}
	if (rc || cfg.nargs > 1) {
		fprintf(stderr, "meshrun status: %s\n", rc ? eb.msg : "at most one job name");
		mr_config_release(&cfg);
		return 2;
	}
	if (cfg.nargs == 1)
		job = cfg.args[0];
	if (job && !mr_job_name_valid(job)) {
		fprintf(stderr, "meshrun status: invalid job name '%.300s': %s\n", job,
			MR_JOB_NAME_RULE);
		mr_config_release(&cfg);
		return 2;
	}
	if (o.token_file[0] &&
	    mr_token_read_file(o.token_file, o.token, sizeof(o.token), "token_file", &eb)) {
		fprintf(stderr, "meshrun status: %s\n", eb.msg);
		mr_config_release(&cfg);
		return 2;
	}
	memset(&ho, 0, sizeof(ho));
	ho.base_url = o.controller;
	ho.token = o.token[0] ? o.token : NULL;
	ho.max_retries = 2;
	ho.tls_ca = o.tls_ca[0] ? o.tls_ca : NULL;
	ho.tls_cert = o.tls_cert[0] ? o.tls_cert : NULL;
	ho.tls_key = o.tls_key[0] ? o.tls_key : NULL;
	if (mr_httpc_init(&c, &ho, &eb)) {
		fprintf(stderr, "meshrun status: %s\n", eb.msg);
		mr_config_release(&cfg);
		return 2;
	}
	if (o.why && !job) {
		fprintf(stderr, "meshrun status: --why needs a job name\n");
		rc = 2;
	} else {
		rc = !job ? list_jobs(&c) : o.why ? show_why(&c, job) : show_job(&c, job);
	}
	mr_httpc_release(&c);
	mr_config_release(&cfg);
	return rc;
}
