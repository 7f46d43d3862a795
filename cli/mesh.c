/*
 * mesh.c - `meshrun mesh`: print the rank <-> mesh coordinates table.
 *
 *   meshrun mesh --world 16 --tp 2 --pp 4
 *   meshrun mesh --tp 2 --pp 2 --cp 2 --dp 2 --ep 2
 *
 * The table comes from the same pure function (common/mr_mesh.h) that the
 * agent and the runtime use, so what it prints is what a job will do.
 * Non-goals: choosing a mesh (that is `meshrun plan`).
 */
#include <stdio.h>

#include "mr_cli.h"
#include "mr_config.h"
#include "mr_mesh.h"

struct mesh_opts {
	int world, tp, pp, cp, ep, dp;
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
};

int mr_cli_mesh(int argc, char **argv)
{
	struct mesh_opts o;
	struct mr_config cfg = {0};
	struct mr_errbuf eb = {0};
	struct mr_mesh m;
	char line[256];
	int rc;

	rc = mr_config_init(&cfg, mesh_table, sizeof(mesh_table) / sizeof(mesh_table[0]), &o,
			    &eb);
	cfg.prog = "meshrun mesh";
	cfg.usage = "[--world N] [--tp N] [--pp N] [--cp N] [--ep N] [--dp N]";
	cfg.summary = "Print every rank's mesh coordinates (tp fastest, then cp, dp, pp; "
		      "ep carved from dp*cp as Megatron-Core does) and its group ids.";
	cfg.config_file = 0;
	if (rc == 0)
		rc = mr_config_parse(&cfg, argc, argv, &eb);
	mr_config_release(&cfg);
	if (rc == MR_CONFIG_HELP)
		return 0;
	if (rc < 0) {
		fprintf(stderr, "meshrun mesh: %s\n", eb.msg);
		return MR_CONFIG_EXIT_USAGE;
	}
	if (o.world == 0 && o.dp == 0)
		o.dp = 1;
	if (mr_mesh_init(&m, o.world, o.tp, o.pp, o.cp, o.ep, o.dp, &eb) < 0) {
		fprintf(stderr, "meshrun mesh: %s\n", eb.msg);
		return MR_CONFIG_EXIT_USAGE;
	}
	mr_mesh_describe(&m, line, sizeof(line));
	printf("%s\n\n", line);
	return mr_mesh_format_table(&m, stdout) < 0 ? 1 : 0;
}
