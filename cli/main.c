/*
 * main.c - `meshrun`, the user CLI: dispatches to a subcommand.
 *
 *   meshrun local   run a whole job (controller + agents) on this machine
 *   meshrun status  jobs, members and generations from a controller
 *   meshrun mesh    print the rank <-> mesh coordinates table
 *   meshrun plan    choose the mesh for a model and a cluster
 *   meshrun data    make llm.c token shards
 *   meshrun ckpt    inspect, export and import checkpoints
 *   meshrun generate  sample text from a checkpoint
 *   meshrun plot    draw a loss_log as an SVG
 */
#include <stdio.h>
#include <string.h>

#include "mr_cli.h"

#define MESHRUN_VERSION "0.1.0"

struct subcommand {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *help;
};

static const struct subcommand subcommands[] = {
	{"local", mr_cli_local, "run a whole job (controller + agents) on this machine"},
	{"status", mr_cli_status, "jobs, members and generations from a controller"},
	{"mesh", mr_cli_mesh, "print the rank <-> mesh coordinates table"},
	{"plan", mr_cli_plan, "choose the mesh for a model and a cluster (memory, step time)"},
	{"data", mr_cli_data, "make llm.c token shards (prepare, synth, inspect)"},
	{"ckpt", mr_cli_ckpt, "inspect, verify, export (safetensors) and import checkpoints"},
	{"generate", mr_cli_generate, "sample text (or token ids) from a checkpoint"},
	{"plot", mr_cli_plot, "draw a loss_log as an SVG (train and validation loss)"},
	{NULL, NULL, NULL},
};

static void usage(FILE *out)
{
	fprintf(out, "usage: meshrun <command> [options]\n\ncommands:\n");
	for (const struct subcommand *s = subcommands; s->name; s++)
		fprintf(out, "  %-10s %s\n", s->name, s->help);
	fprintf(out, "\nRun 'meshrun <command> --help' for the options of a command.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
		printf("meshrun %s\n", MESHRUN_VERSION);
		return 0;
	}
	for (const struct subcommand *s = subcommands; s->name; s++)
		if (!strcmp(argv[1], s->name))
			return s->run(argc - 1, argv + 1);
	fprintf(stderr, "meshrun: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
