/*
 * ckpt.c - `meshrun ckpt`: look into, export and import checkpoints
 * (runtime/ckpt/mr_ckpt.h, docs/CHECKPOINTS.md).
 *
 *   meshrun ckpt inspect DIR [--json]
 *       DIR a checkpoint directory (every published step, newest first)
 *       or one step directory: the manifest's summary, every tensor and
 *       shard, and every record verified against its CRC-32C
 *   meshrun ckpt export DIR --safetensors OUT [--step N] [--force]
 *       the whole model of one step (DIR's newest, or step N) as one
 *       safetensors file with Hugging Face GPT-2 names, whatever mesh
 *       wrote it (runtime/ckpt/mr_st_gpt.h)
 *   meshrun ckpt import --safetensors IN OUT_DIR [--step N] [--n-head H]
 *       a safetensors file (ours, or a plain GPT-2 one) as a one-rank,
 *       parameters-only checkpoint in OUT_DIR that a job resumes from
 *   meshrun ckpt export DIR --hf OUT_DIR [--step N] [--force]
 *                          [--max-shard-bytes B]
 *   meshrun ckpt import --hf IN_DIR OUT_DIR [--step N] [--max-seq N]
 *       a llama model as a Hugging Face Llama directory (config.json,
 *       model.safetensors or shards + index) and back
 *       (runtime/ckpt/mr_hf_llama.h)
 *
 * Exit status: 0 done (inspect: everything verified), 1 a checkpoint or
 * file is corrupt, does not fit, or the output exists, 2 a usage error
 * (a bad flag, a missing argument or path).
 * Non-goals: editing checkpoints, resharding on disk (a job reshards on
 * load), formats other than safetensors.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/mr_ckpt.h"
#include "ckpt/mr_hf_llama.h"
#include "ckpt/mr_st_gpt.h"
#include "ckpt_int.h"
#include "mr_cli.h"
#include "mr_config.h"

struct ckpt_opts {
	char safetensors[4096], hf[4096];
	int json, force;
	int64_t step, n_head, max_shard_bytes, max_seq;
};

/* The rows get no MESHRUN_* variables (mr_cli_ckpt): a stray MESHRUN_STEP
 * must not pick a step. */
static const struct mr_config_opt ckpt_table[] = {
	MR_CONFIG_STRING("safetensors", struct ckpt_opts, safetensors, "",
			 "export: the file to write; import: the file to read."),
	MR_CONFIG_STRING("hf", struct ckpt_opts, hf, "",
			 "export: the Hugging Face Llama directory to write; import: the one to "
			 "read (config.json, model.safetensors or shards with their index)."),
	MR_CONFIG_INT("max_shard_bytes", struct ckpt_opts, max_shard_bytes, "4294967296", 1,
		      INT64_MAX,
		      "export --hf: bytes of tensor data per shard file; a model above it is "
		      "written as model-0000k-of-0000n.safetensors with an index."),
	MR_CONFIG_INT("max_seq", struct ckpt_opts, max_seq, "0", 0, 1 << 20,
		      "import --hf: the model's max_seq instead of config.json's "
		      "max_position_embeddings (a job's max_seq is at most 65536; a llama has no "
		      "position table, so the parameters are the same)."),
	MR_CONFIG_BOOL("json", struct ckpt_opts, json, "false",
		       "inspect: one JSON document on stdout instead of text."),
	MR_CONFIG_BOOL("force", struct ckpt_opts, force, "false",
		       "export: replace existing output files."),
	MR_CONFIG_INT("step", struct ckpt_opts, step, "0", 0, INT64_MAX,
		      "export: the step to export from a checkpoint directory (default its "
		      "newest); import: the step the checkpoint is written as (default the "
		      "file's, else 0)."),
	MR_CONFIG_INT("n_head", struct ckpt_opts, n_head, "0", 0, 1 << 20,
		      "import: attention heads, for a GPT-2 file without meshrun metadata (12 "
		      "for gpt2, 16 for gpt2-medium, 20 for gpt2-large, 25 for gpt2-xl)."),
};
#define NOPTS (sizeof(ckpt_table) / sizeof(ckpt_table[0]))

static const char *const usage_text =
	"usage: meshrun ckpt inspect DIR [--json]\n"
	"       meshrun ckpt export DIR --safetensors OUT [--step N] [--force]\n"
	"       meshrun ckpt import --safetensors IN OUT_DIR [--step N] [--n-head H]\n"
	"       meshrun ckpt export DIR --hf OUT_DIR [--step N] [--force] [--max-shard-bytes B]\n"
	"       meshrun ckpt import --hf IN_DIR OUT_DIR [--step N] [--max-seq N]\n"
	"Run 'meshrun ckpt <command> --help' for the options.\n";

static int usage_error(const char *cmd, const char *msg)
{
	fprintf(stderr, "meshrun ckpt %s: %s\n", cmd, msg);
	return CKPT_EXIT_USAGE;
}

/* Options that make no sense for cmd are refused naming the flag. */
static int only_for(const struct mr_config *cfg, const char *cmd, const char *const *allowed)
{
	for (size_t i = 0; i < NOPTS; i++) {
		const char *name = ckpt_table[i].name;
		int ok = 0;
		char flag[64];
		for (int k = 0; allowed[k]; k++)
			ok |= !strcmp(allowed[k], name);
		if (ok || !mr_config_is_set(cfg, name))
			continue;
		snprintf(flag, sizeof(flag), "--%s", name);
		for (char *p = flag; *p; p++)
			*p = *p == '_' ? '-' : *p;
		fprintf(stderr, "meshrun ckpt %s: %s: not an option of '%s'\n", cmd, flag, cmd);
		return CKPT_EXIT_USAGE;
	}
	return 0;
}

int mr__ckpt_resolve(const char *cmd, const char *dir, char ***dirs, int *n, int *is_step)
{
	struct mr_errbuf eb = { "", "" };
	char path[4200];
	struct stat st;

	*dirs = NULL;
	*n = 0;
	*is_step = 0;
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		int missing = errno == ENOENT && access(dir, F_OK) != 0;
		fprintf(stderr, "meshrun ckpt %s: '%s' is not a directory%s\n", cmd, dir,
			missing ? " (no such file)" : "");
		return CKPT_EXIT_USAGE;
	}
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	if (access(path, F_OK) == 0) {
		if (!(*dirs = calloc(1, sizeof(char *))) || !((*dirs)[0] = strdup(dir))) {
			free(*dirs);
			*dirs = NULL;
			fprintf(stderr, "meshrun ckpt %s: out of memory\n", cmd);
			return CKPT_EXIT_FAIL;
		}
		*n = 1;
		*is_step = 1;
		return CKPT_EXIT_OK;
	}
	if (mr_ckpt_list(dir, dirs, n, &eb) < 0) {
		fprintf(stderr, "meshrun ckpt %s: %s\n", cmd, eb.msg);
		return CKPT_EXIT_FAIL;
	}
	if (*n == 0) {
		fprintf(stderr,
			"meshrun ckpt %s: '%s' holds no checkpoint (neither a manifest.json nor "
			"step-N directories)\n", cmd, dir);
		return CKPT_EXIT_FAIL;
	}
	return CKPT_EXIT_OK;
}

/* mkdir -p. */
static int make_dirs(const char *dir)
{
	char buf[4096];
	size_t n = strlen(dir);

	if (n == 0 || n >= sizeof(buf))
		return -1;
	memcpy(buf, dir, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != 0)
			continue;
		buf[i] = 0;
		if (mkdir(buf, 0755) != 0 && errno != EEXIST)
			return -1;
		buf[i] = dir[i];
	}
	return 0;
}

/* The one-rank model of mf's config with every parameter read back
 * (reassembled from whatever mesh wrote them, each record verified). */
static int load_model(const struct mr_ckpt_manifest *mf, struct mr_gpt *m, struct mr_errbuf *eb)
{
	int rc;

	if ((rc = mr_gpt_create(m, &mf->model, 1, 1, NULL, eb)) < 0)
		return rc;
	rc = mr_ckpt_read_model(mf, m, m->params, eb);
	if (rc < 0)
		mr_gpt_release(m);
	return rc;
}

static int cmd_export(const struct ckpt_opts *o, const struct mr_config *cfg)
{
	static const char *const allowed[] = { "safetensors", "hf", "max_shard_bytes", "step",
					       "force", NULL };
	struct mr_errbuf eb = { "", "" };
	struct mr_ckpt_manifest mf;
	struct mr_gpt m;
	char **dirs = NULL, pick[4200];
	const char *dir, *to = o->hf[0] ? o->hf : o->safetensors;
	int n = 0, is_step, rc, nfiles = 1;

	if ((rc = only_for(cfg, "export", allowed)))
		return rc;
	if (cfg->nargs != 1)
		return usage_error("export", "give one checkpoint or step directory "
					     "(usage: meshrun ckpt export DIR --safetensors OUT)");
	if (!o->safetensors[0] && !o->hf[0])
		return usage_error("export", "--safetensors or --hf: the output is missing");
	if (o->safetensors[0] && o->hf[0])
		return usage_error("export", "--safetensors and --hf: give one output");
	if (!o->hf[0] && mr_config_is_set(cfg, "max_shard_bytes"))
		return usage_error("export", "--max-shard-bytes: only with --hf");
	if ((rc = mr__ckpt_resolve("export", cfg->args[0], &dirs, &n, &is_step)))
		return rc;
	dir = dirs[0];
	if (mr_config_is_set(cfg, "step")) {
		if (is_step) {
			mr_ckpt_list_free(dirs, n);
			return usage_error("export", "--step: DIR is already one step's directory");
		}
		snprintf(pick, sizeof(pick), "%s/step-%08lld", cfg->args[0], (long long)o->step);
		dir = pick;
		if (access(dir, F_OK) != 0) {
			fprintf(stderr, "meshrun ckpt export: --step: '%s' has no step %lld (its "
					"newest is '%s')\n", cfg->args[0], (long long)o->step,
				dirs[0]);
			mr_ckpt_list_free(dirs, n);
			return CKPT_EXIT_USAGE;
		}
	}
	if (mr_ckpt_manifest_read(&mf, dir, &eb) < 0) {
		fprintf(stderr, "meshrun ckpt export: %s\n", eb.msg);
		mr_ckpt_list_free(dirs, n);
		return CKPT_EXIT_FAIL;
	}
	rc = load_model(&mf, &m, &eb);
	if (rc == 0) {
		if (o->hf[0])
			rc = mr_hf_llama_export(&m, o->hf, (uint64_t)o->max_shard_bytes, o->force,
						&nfiles, &eb);
		else
			rc = mr_st_gpt_export(&m, mf.step, o->safetensors, o->force, &eb);
		if (rc == 0 && !o->hf[0])
			printf("exported step %ld of '%s' (%zu parameters, %d tensors) to '%s'\n",
			       mf.step, mf.dir, m.nparams, m.ntensors, to);
		else if (rc == 0)
			printf("exported step %ld of '%s' (%zu parameters, %d tensors) to '%s' as a "
			       "Hugging Face Llama (%d safetensors file%s)\n", mf.step, mf.dir,
			       m.nparams, m.ntensors, to, nfiles, nfiles > 1 ? "s and an index" : "");
		mr_gpt_release(&m);
	}
	if (rc < 0)
		fprintf(stderr, "meshrun ckpt export: %s%s\n", eb.msg,
			rc == MR_EEXISTS ? " (--force replaces it)" : "");
	mr_ckpt_manifest_release(&mf);
	mr_ckpt_list_free(dirs, n);
	return rc < 0 ? CKPT_EXIT_FAIL : CKPT_EXIT_OK;
}

static int cmd_import(const struct ckpt_opts *o, const struct mr_config *cfg)
{
	static const char *const allowed[] = { "safetensors", "hf", "step", "n_head", NULL };
	static const char *const hf_allowed[] = { "hf", "step", "max_seq", NULL };
	struct mr_errbuf eb = { "", "" };
	struct stat st;
	struct mr_gpt m;
	long step = 0;
	int rc, meta = 0;

	if (o->safetensors[0] && o->hf[0])
		return usage_error("import", "--safetensors and --hf: give one input");
	if ((rc = only_for(cfg, "import", o->hf[0] ? hf_allowed : allowed)))
		return rc;
	if (!o->safetensors[0] && !o->hf[0])
		return usage_error("import", "--safetensors or --hf: the input is missing");
	if (cfg->nargs != 1)
		return usage_error("import", "give the checkpoint directory to write "
					     "(usage: meshrun ckpt import --safetensors IN OUT_DIR)");
	if (o->hf[0] && (stat(o->hf, &st) != 0 || !S_ISDIR(st.st_mode))) {
		fprintf(stderr, "meshrun ckpt import: --hf: '%s' is not a directory\n", o->hf);
		return CKPT_EXIT_USAGE;
	}
	if (o->hf[0])
		rc = mr_hf_llama_import(&m, o->hf, (int)o->max_seq, &eb);
	else
		rc = mr_st_gpt_import(&m, o->safetensors, (int)o->n_head, &step, &meta, &eb);
	if (rc < 0 && o->hf[0]) {
		fprintf(stderr, "meshrun ckpt import: %s\n", eb.msg);
		return CKPT_EXIT_FAIL;
	}
	if (rc < 0) {
		int usage = rc == MR_ENOTFOUND || !strcmp(eb.field, "n_head");
		fprintf(stderr, "meshrun ckpt import: %s\n", eb.msg);
		return usage ? CKPT_EXIT_USAGE : CKPT_EXIT_FAIL;
	}
	if (mr_config_is_set(cfg, "step"))
		step = (long)o->step;
	if (make_dirs(cfg->args[0]) < 0)
		rc = mr_errf(&eb, MR_EIO, "unable to create '%s': %s", cfg->args[0],
			     strerror(errno));
	else
		rc = mr_ckpt_write_params(cfg->args[0], &m.cfg, step, m.params, &eb);
	if (rc == 0 && o->hf[0])
		printf("imported '%s' (Hugging Face Llama; n_layer %d d_model %d n_head %d n_kv_head "
		       "%d ffn_hidden %d vocab_size %d max_seq %d%s%s) as '%s/step-%08ld'\n", o->hf,
		       m.cfg.n_layer, m.cfg.d_model, m.cfg.n_head, mr_gpt_kv_heads(&m.cfg),
		       mr_gpt_ffn(&m.cfg), m.cfg.vocab, m.cfg.max_seq,
		       m.cfg.tie_embeddings ? ", tied head" : "",
		       m.cfg.rope_scaling.factor > 0 ? ", llama3 rope scaling" : "", cfg->args[0],
		       step);
	else if (rc == 0)
		printf("imported '%s' (%s; n_layer %d d_model %d n_head %d vocab_size %d max_seq "
		       "%d%s) as '%s/step-%08ld'\n", o->safetensors,
		       meta ? "meshrun metadata" : "GPT-2 shapes", m.cfg.n_layer, m.cfg.d_model,
		       m.cfg.n_head, m.cfg.vocab, m.cfg.max_seq, m.cfg.moe_every ? ", MoE" : "",
		       cfg->args[0], step);
	else
		fprintf(stderr, "meshrun ckpt import: %s\n", eb.msg);
	mr_gpt_release(&m);
	return rc < 0 ? CKPT_EXIT_FAIL : CKPT_EXIT_OK;
}

int mr_cli_ckpt(int argc, char **argv)
{
	static const char *const inspect_allowed[] = { "json", NULL };
	struct mr_config_opt rows[NOPTS];
	struct ckpt_opts o;
	struct mr_config cfg = { 0 };
	struct mr_errbuf eb = { "", "" };
	const char *sub = argc > 1 ? argv[1] : "";
	int rc;

	if (strcmp(sub, "inspect") && strcmp(sub, "export") && strcmp(sub, "import")) {
		int help = !strcmp(sub, "--help") || !strcmp(sub, "-h");
		if (!help && sub[0])
			fprintf(stderr, "meshrun ckpt: unknown command '%s'\n", sub);
		fputs(usage_text, help ? stdout : stderr);
		return help ? 0 : CKPT_EXIT_USAGE;
	}
	memcpy(rows, ckpt_table, sizeof(rows));
	for (size_t i = 0; i < NOPTS; i++)
		rows[i].env = "";
	rc = mr_config_init(&cfg, rows, NOPTS, &o, &eb);
	cfg.prog = "meshrun ckpt";
	cfg.usage = "inspect|export|import [options] DIR";
	cfg.summary = "Inspect and verify checkpoints; export one step as safetensors with "
		      "Hugging Face GPT-2 names, or a llama model as a Hugging Face Llama "
		      "directory; import either as a checkpoint.";
	cfg.config_file = 0;
	cfg.allow_positional = 1;
	if (rc == 0)
		rc = mr_config_parse(&cfg, argc - 1, argv + 1, &eb);
	if (rc == MR_CONFIG_HELP) {
		rc = 0;
	} else if (rc < 0) {
		fprintf(stderr, "meshrun ckpt %s: %s\n", sub, eb.msg);
		rc = CKPT_EXIT_USAGE;
	} else if (!strcmp(sub, "inspect")) {
		if (!(rc = only_for(&cfg, "inspect", inspect_allowed)))
			rc = cfg.nargs != 1 ? usage_error("inspect", "give one checkpoint or step "
							  "directory (usage: meshrun ckpt inspect DIR)")
					    : mr__ckpt_inspect(cfg.args[0], o.json);
	} else if (!strcmp(sub, "export")) {
		rc = cmd_export(&o, &cfg);
	} else {
		rc = cmd_import(&o, &cfg);
	}
	mr_config_release(&cfg);
	return rc;
}
