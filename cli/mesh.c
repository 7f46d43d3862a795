/*
 * mesh.c - `meshrun mesh`: print the rank <-> mesh coordinates table and,
 * given the job's workload config, the blocks each pipeline stage holds.
 *
 *   meshrun mesh --world 16 --tp 2 --pp 4
 *   meshrun mesh --tp 2 --pp 2 --cp 2 --dp 2 --ep 2
 *   meshrun mesh --pp 2 --workload-config '{"n_layer": 8, "pp_layers": [5, 3]}'
 *
 * The table comes from the same pure function (common/mr_mesh.h) that the
 * agent and the runtime use, and the split from the runtime's own
 * placement (mr_gpt_worker_place: the config read with its defaults, the
 * balanced split or "pp_layers", checked as a job checks it), so what it
 * prints is what a job will do.
 * Non-goals: choosing a mesh (that is `meshrun plan`).
 */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>

#include "core/mr_place.h"
#include "mr_cli.h"
#include "mr_config.h"
#include "mr_gpt_worker.h"
#include "mr_mesh.h"

struct mesh_opts {
	int world, tp, pp, cp, ep, dp;
	char workload_config[4096];
};

static const struct mr_config_opt mesh_table[] = {
	MR_CONFIG_INT("world", struct mesh_opts, world, "0", 0, 1 << 20,
		      "World size in ranks; 0 = tp*pp*cp*dp."),
	MR_CONFIG_INT("tp", struct mesh_opts, tp, "1", 1, 1 << 20, "Tensor-parallel size."),
	MR_CONFIG_INT("pp", struct mesh_opts, pp, "1", 1, 1 << 20, "Pipeline-parallel size."),
	MR_CONFIG_INT("cp", struct mesh_opts, cp, "1", 1, 1 << 20, "Context-parallel size."),
	MR_CONFIG_INT("ep", struct mesh_opts, ep, "1", 1, 1 << 20,
		      "Expert-parallel size (carved from dp*cp)."),
	MR_CONFIG_INT("dp", struct mesh_opts, dp, "0", 0, 1 << 20,
		      "Data-parallel size; 0 = derived from the world size."),
	MR_CONFIG_STRING("workload_config", struct mesh_opts, workload_config, NULL,
			 "The job's workload config, inline JSON or a file's path as "
			 "`meshrun local` takes it: with it, the layers of each pipeline "
			 "stage, split as the job splits them (n_layer, pp_virtual, "
			 "pp_layers; the model's sizes for the balanced split)."),
};

/* The workload config: inline JSON (it starts with '{') or a file's path;
 * a key given twice is an error, as in the agent. NULL on error. */
static json_t *load_workload(const char *src, struct mr_errbuf *eb)
{
	json_error_t je;
	json_t *j;

	while (isspace((unsigned char)*src))
		src++;
	if (*src == '{')
		j = json_loads(src, JSON_REJECT_DUPLICATES, &je);
	else
		j = json_load_file(src, JSON_REJECT_DUPLICATES, &je);
	if (!j && *src == '{')
		mr_errf_field(eb, MR_EINVAL, "workload_config",
			      "workload_config: '%.200s' is not valid JSON: %s", src, je.text);
	else if (!j && je.line > 0)
		mr_errf_field(eb, MR_EINVAL, "workload_config",
			      "workload_config: '%s' line %d, column %d: %s", src, je.line,
			      je.column, je.text);
	else if (!j) /* jansson's text names the file and the reason */
		mr_errf_field(eb, MR_EINVAL, "workload_config", "workload_config: %s", je.text);
	else if (!json_is_object(j)) {
		mr_errf_field(eb, MR_EINVAL, "workload_config",
			      "workload_config: '%.200s' is not a JSON object", src);
		json_decref(j);
		j = NULL;
	}
	return j;
}

/* Where the job puts stage s: the placement of its first rank (every rank
 * of a stage holds the same blocks). */
static int stage_place(const struct mr_mesh *m, const json_t *config, int s,
		       struct mr_place *p, int *n_layer, struct mr_errbuf *eb)
{
	struct mr_mesh_coord c = { .pp = s };
	struct mr_worker_env env = { 0 };

	env.rank = mr_mesh_rank(m, &c);
	env.world_size = m->world;
	env.tp = m->tp;
	env.pp = m->pp;
	env.cp = m->cp;
	env.ep = m->ep;
	env.dp = m->dp;
	return mr_gpt_worker_place(config, &env, p, n_layer, eb);
}

/* One stage's line:
 *   stage 0: layers 0-1, 4-5 (4 blocks in 2 chunks) + embedding
 * The first stage also runs the embedding, the last the final LayerNorm,
 * the LM head and the loss (parallel/mr_pp_split.h). */
static void print_stage(const struct mr_place *p, int n_layer, int s, int stages)
{
	int blocks = 0, chunks = mr_place_chunks(p), lo, hi;

	for (int k = 0; k < chunks; k++) {
		mr_place_chunk(p, n_layer, k, &lo, &hi);
		blocks += hi - lo;
	}
	printf("stage %d: layer%s ", s, blocks == 1 ? "" : "s");
	for (int k = 0; k < chunks; k++) {
		mr_place_chunk(p, n_layer, k, &lo, &hi);
		if (hi - lo == 1)
			printf("%s%d", k ? ", " : "", lo);
		else
			printf("%s%d-%d", k ? ", " : "", lo, hi - 1);
	}
	printf(" (%d block%s", blocks, blocks == 1 ? "" : "s");
	if (chunks > 1)
		printf(" in %d chunks", chunks);
	printf(")%s%s\n", s == 0 ? " + embedding" : "",
	       s < stages - 1 ? "" : s ? " + final LayerNorm, LM head and loss"
				   : ", final LayerNorm, LM head and loss");
}

/* Places every stage as the job would: the first error, naming the field. */
static int check_layers(const struct mr_mesh *m, const json_t *config, struct mr_errbuf *eb)
{
	struct mr_place p;
	int rc;

	for (int s = 0; s < m->pp; s++)
		if ((rc = stage_place(m, config, s, &p, NULL, eb)) < 0)
			return rc;
	return 0;
}

/* Every stage's layers, once check_layers() passed. */
static void print_layers(const struct mr_mesh *m, const json_t *config)
{
	struct mr_errbuf eb = {0};
	struct mr_place p;
	int n_layer = 0;

	for (int s = 0; s < m->pp; s++) {
		if (stage_place(m, config, s, &p, &n_layer, &eb) < 0)
			return;
		if (s == 0)
			printf("pipeline: %d layers over %d stage%s x %d chunk%s, %s\n", n_layer,
			       m->pp, m->pp == 1 ? "" : "s", mr_place_chunks(&p),
			       mr_place_chunks(&p) == 1 ? "" : "s",
			       json_object_get(config, "pp_layers") ? "split by pp_layers"
								     : "balanced by cost");
		print_stage(&p, n_layer, s, m->pp);
	}
}

int mr_cli_mesh(int argc, char **argv)
{
	struct mesh_opts o;
	struct mr_config cfg = {0};
	struct mr_errbuf eb = {0};
	struct mr_mesh m;
	json_t *config = NULL;
	char line[256];
	int rc;

	rc = mr_config_init(&cfg, mesh_table, sizeof(mesh_table) / sizeof(mesh_table[0]), &o,
			    &eb);
	cfg.prog = "meshrun mesh";
	cfg.usage = "[--world N] [--tp N] [--pp N] [--cp N] [--ep N] [--dp N] "
		    "[--workload-config JSON|FILE]";
	cfg.summary = "Print every rank's mesh coordinates (tp fastest, then cp, dp, pp; "
		      "ep carved from dp*cp as Megatron-Core does) and its group ids; with "
		      "--workload-config, first the layers of each pipeline stage.";
	cfg.config_file = 0;
	if (rc == 0)
		rc = mr_config_parse(&cfg, argc, argv, &eb);
	mr_config_release(&cfg);
	if (rc == MR_CONFIG_HELP)
		return 0;
	if (rc < 0)
		goto usage;
	if (o.world == 0 && o.dp == 0)
		o.dp = 1;
	if (mr_mesh_init(&m, o.world, o.tp, o.pp, o.cp, o.ep, o.dp, &eb) < 0)
		goto usage;
	if (o.workload_config[0]) {
		struct mr_errbuf we = {0};

		if (!(config = load_workload(o.workload_config, &eb)))
			goto usage;
		/* what a job checks, then what it places */
		if (mr_gpt_worker_check_config(config, &we) < 0 ||
		    check_layers(&m, config, &we) < 0) {
			mr_errf_field(&eb, MR_EINVAL, we.field, "workload_config: %s", we.msg);
			goto usage;
		}
	}
	mr_mesh_describe(&m, line, sizeof(line));
	printf("%s\n", line);
	if (config)
		print_layers(&m, config);
	else if (m.pp > 1)
		printf("pipeline: pass --workload-config (n_layer, ...) to see each stage's "
		       "layers\n");
	json_decref(config);
	printf("\n");
	return mr_mesh_format_table(&m, stdout) < 0 ? 1 : 0;
usage:
	json_decref(config);
	fprintf(stderr, "meshrun mesh: %s\n", eb.msg);
	return MR_CONFIG_EXIT_USAGE;
}
