/*
 * test_cli.c - the `meshrun` subcommands that need no controller: `mesh`
 * (the table comes from mr_mesh, so check it against the pure function) and
 * `data` (shards written by the CLI read back through the runtime's own
 * shard reader; bad files rejected naming the file).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/mr_shard.h"
#include "data/mr_synth.h"
#include "mr_mesh.h"

static char tmp[64];

static void mktmp(void)
{
	snprintf(tmp, sizeof(tmp), "/tmp/mr-cli-test-XXXXXX");
	cr_assert_not_null(mkdtemp(tmp));
}

static void rmtmp(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	(void)!system(cmd);
}

/* Each test runs in a fresh scratch directory, removed at exit. */
static void scratch(void)
{
	mktmp();
	atexit(rmtmp); /* Criterion runs each test in its own process */
}

/* Runs `meshrun ARGS` (a shell fragment) in tmp; returns the exit code and
 * the combined output in *out (malloc'd). */
static int meshrun(char **out, const char *args)
{
	const char *b = getenv("MESHRUN_BUILD");
	char cmd[2048], log[128];
	FILE *f;
	long n;
	int st;

	snprintf(log, sizeof(log), "%s/out.log", tmp);
	snprintf(cmd, sizeof(cmd), "cd '%s' && '%s/meshrun' %s >'%s' 2>&1", tmp,
		 b && b[0] ? b : "build", args, log);
	st = system(cmd);
	f = fopen(log, "rb");
	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	*out = calloc(1, (size_t)n + 1);
	cr_assert_eq(fread(*out, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(cli, mesh_table_matches_the_mesh_function)
{
	struct mr_mesh m;
	struct mr_mesh_coord c;
	char *out, want[128];

	scratch();

	cr_assert_eq(meshrun(&out, "mesh --tp 2 --pp 2 --dp 2 --ep 2"), 0, "%s", out);
	cr_assert_eq(mr_mesh_init(&m, 0, 2, 2, 1, 2, 2, NULL), 0);
	for (int r = 0; r < m.world; r++) {
		cr_assert_eq(mr_mesh_coord(&m, r, &c), 0);
		/* rank pp dp cp tp ep edp, as the table's first columns */
		snprintf(want, sizeof(want), "%6d %4d %4d %4d %4d %4d %4d |", r, c.pp, c.dp, c.cp,
			 c.tp, c.ep, c.edp);
		cr_expect(strstr(out, want), "row '%s' missing:\n%s", want, out);
	}
	free(out);
	cr_assert_eq(meshrun(&out, "mesh --world 12 --tp 8"), 2);
	cr_expect(strstr(out, "not divisible"), "%s", out);
	free(out);
}

Test(cli, data_synth_writes_the_runtime_task)
{
	struct mr_shard s;
	struct mr_errbuf eb = {0};
	char *out, path[128];
	int row[257];

	scratch();

	cr_assert_eq(meshrun(&out, "data synth --out-dir d --tokens 5000 --vocab 64 --seed 7"), 0,
		     "%s", out);
	free(out);
	snprintf(path, sizeof(path), "%s/d/train.bin", tmp);
	cr_assert_eq(mr_shard_open(&s, path, 64, 16, 0, &eb), 0, "%s", eb.msg);
	cr_assert_eq(s.count, 5000);
	mr_synth_row(7, 0, 1, 64, 257, row); /* the second row of stream 0 */
	for (int k = 0; k < 257; k++)
		cr_assert_eq(s.tok[257 + k], row[k], "token %d", 257 + k);
	mr_shard_close(&s);
	snprintf(path, sizeof(path), "%s/d/val.bin", tmp);
	cr_assert_eq(mr_shard_open(&s, path, 64, 16, 0, &eb), 0, "%s", eb.msg);
	cr_assert_eq(s.count, 500);
	mr_synth_row(7, 1, 0, 64, 257, row);
	cr_assert_eq(s.tok[0], row[0]);
	cr_assert_eq(s.tok[256], row[256]);
	mr_shard_close(&s);
}

Test(cli, data_prepare_is_byte_level_and_splits)
{
	static const char text[] = "hello meshrun, a byte-level corpus\n";
	struct mr_shard tr, va;
	struct mr_errbuf eb = {0};
	char *out, path[128];
	FILE *f;

	scratch();

	snprintf(path, sizeof(path), "%s/in.txt", tmp);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	for (int i = 0; i < 100; i++)
		fputs(text, f);
	fclose(f);
	cr_assert_eq(meshrun(&out, "data prepare --out-dir p --val-fraction 0.25 in.txt"), 0, "%s",
		     out);
	free(out);
	snprintf(path, sizeof(path), "%s/p/train.bin", tmp);
	cr_assert_eq(mr_shard_open(&tr, path, 256, 8, 0, &eb), 0, "%s", eb.msg);
	snprintf(path, sizeof(path), "%s/p/val.bin", tmp);
	cr_assert_eq(mr_shard_open(&va, path, 256, 8, 0, &eb), 0, "%s", eb.msg);
	cr_assert_eq(tr.count + va.count, 100 * (sizeof(text) - 1));
	cr_assert_eq(va.count, (size_t)(0.25 * (double)(100 * (sizeof(text) - 1))));
	for (size_t i = 0; i < tr.count; i++)
		cr_assert_eq(tr.tok[i], (unsigned char)text[i % (sizeof(text) - 1)]);
	mr_shard_close(&tr);
	mr_shard_close(&va);
}

Test(cli, data_rejects_bad_input_naming_it)
{
	char *out, path[128];
	FILE *f;

	scratch();

	snprintf(path, sizeof(path), "%s/in.txt", tmp);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	for (int i = 0; i < 300; i++)
		fputs("not a shard\n", f);
	fclose(f);
	cr_assert_eq(meshrun(&out, "data inspect in.txt"), 1);
	cr_expect(strstr(out, "shard 'in.txt': bad magic"), "%s", out);
	free(out);
	cr_assert_eq(meshrun(&out, "data prepare --out-dir p missing.txt"), 1);
	cr_expect(strstr(out, "unable to open 'missing.txt'"), "%s", out);
	free(out);
	cr_assert_eq(meshrun(&out, "data synth --tokens 5"), 2);
	cr_expect(strstr(out, "--tokens: '5' is out of range"), "%s", out);
	free(out);
	cr_assert_eq(meshrun(&out, "data prepare"), 2);
	free(out);
}
