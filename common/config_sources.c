/*
 * config_sources.c - reading a config table's values from its sources (see
 * mr_config.h): the JSON file, MESHRUN_* env vars and flags.
 *
 * Order of work in mr_config_parse(): a first pass over argv only looks for
 * -h/--help and --config (so help works whatever else is wrong, and the file
 * is read before env and flags); then file, env vars and flags are applied
 * in precedence order, each overwriting the previous.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_int.h"

/* ---- sources ---------------------------------------------------------------- */

static int json_to_text(const struct mr_config_opt *o, const json_t *v, char *buf, size_t size,
			const char **text)
{
	*text = buf;
	switch (o->type) {
	case MR_CONFIG_T_INT:
		if (!json_is_integer(v))
			return -1;
		snprintf(buf, size, "%lld", (long long)json_integer_value(v));
		return 0;
	case MR_CONFIG_T_DURATION:
		if (json_is_string(v)) {
			*text = json_string_value(v);
			return 0;
		}
		if (!json_is_integer(v))
			return -1;
		snprintf(buf, size, "%lld", (long long)json_integer_value(v));
		return 0;
	case MR_CONFIG_T_DOUBLE:
		if (!json_is_number(v))
			return -1;
		mr__config_format_dbl(json_number_value(v), buf, size);
		return 0;
	case MR_CONFIG_T_BOOL:
		if (!json_is_boolean(v))
			return -1;
		snprintf(buf, size, "%s", json_is_true(v) ? "true" : "false");
		return 0;
	default:
		if (!json_is_string(v))
			return -1;
		*text = json_string_value(v);
		return 0;
	}
}

static const char *json_expect(enum mr_config_type t)
{
	switch (t) {
	case MR_CONFIG_T_INT: return "an integer";
	case MR_CONFIG_T_DURATION: return "a duration (milliseconds or a string like \"3s\")";
	case MR_CONFIG_T_DOUBLE: return "a number";
	case MR_CONFIG_T_BOOL: return "true or false";
	default: return "a string";
	}
}

static int load_file(struct mr_config *cfg, const char *path, const char *from,
		     struct mr_errbuf *eb)
{
	FILE *f = NULL;
	char *buf = NULL;
	size_t n;
	json_t *root = NULL;
	json_error_t jerr;
	const char *key;
	json_t *val;
	int rc = 0;

	snprintf(cfg->config_path, sizeof(cfg->config_path), "%s", path);
	f = fopen(path, "rb");
	if (!f) {
		rc = mr_errf_field(eb, MR_EIO, from, "%s: unable to open '%s': %s", from, path,
				   strerror(errno));
		goto out;
	}
	buf = malloc(MR_CONFIG_MAX_FILE + 1);
	if (!buf) {
		rc = mr_errf(eb, MR_ENOMEM, "%s: out of memory", path);
		goto out;
	}
	n = fread(buf, 1, MR_CONFIG_MAX_FILE + 1, f);
	if (ferror(f)) {
		rc = mr_errf_field(eb, MR_EIO, from, "%s: unable to read '%s'", from, path);
		goto out;
	}
	if (n > MR_CONFIG_MAX_FILE) {
		rc = mr_errf_field(eb, MR_ELIMIT, from, "%s: file is larger than %d bytes", path,
				   MR_CONFIG_MAX_FILE);
		goto out;
	}
	root = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		rc = mr_errf_field(eb, MR_EPARSE, from, "%s:%d: %s", path, jerr.line, jerr.text);
		goto out;
	}
	if (!json_is_object(root)) {
		rc = mr_errf_field(eb, MR_EPARSE, from, "%s: top level is not an object", path);
		goto out;
	}
	json_object_foreach(root, key, val) {
		int i = mr__config_find_opt(cfg, key);
		char origin[1200], tbuf[64];
		const char *text;

		if (i < 0) {
			rc = mr_errf_field(eb, MR_EINVAL, key, "%s: key '%s' is not known", path, key);
			goto out;
		}
		snprintf(origin, sizeof(origin), "%s: key '%s'", path, key);
		if (json_to_text(&cfg->opts[i], val, tbuf, sizeof(tbuf), &text) < 0) {
			rc = mr_errf_field(eb, MR_EPARSE, key, "%s: expected %s", origin,
					   json_expect(cfg->opts[i].type));
			goto out;
		}
		if ((rc = mr__config_apply(cfg, &cfg->opts[i], text, origin, key, eb)) < 0)
			goto out;
		cfg->source[i] = MR_CONFIG_SRC_FILE;
	}
out:
	json_decref(root);
	free(buf);
	if (f)
		fclose(f);
	return rc;
}

static int load_env(struct mr_config *cfg, struct mr_errbuf *eb)
{
	char env[NAME_MAX_LEN + 16];
	int rc;

	for (size_t i = 0; i < cfg->nopts; i++) {
		const char *v;

		mr__config_env_of(&cfg->opts[i], env, sizeof(env));
		if (!env[0] || !(v = getenv(env)) || !*v)
			continue; /* an empty env var counts as unset */
		if ((rc = mr__config_apply(cfg, &cfg->opts[i], v, env, env, eb)) < 0)
			return rc;
		cfg->source[i] = MR_CONFIG_SRC_ENV;
	}
	return 0;
}

/*
 * First pass: finds -h/--help and --config before `--`, skipping the
 * values of options that take one. Returns 1 for help, else 0.
 */
static int prescan(const struct mr_config *cfg, int argc, char **argv, const char **config)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *eq;
		int k;

		if (strcmp(a, "--") == 0)
			break;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
			return 1;
		if (strncmp(a, "--", 2) != 0)
			continue;
		eq = strchr(a, '=');
		if (cfg->config_file && strncmp(a, "--config", 8) == 0 && (a[8] == '=' || !a[8])) {
			if (a[8] == '=')
				*config = a + 9;
			else if (i + 1 < argc)
				*config = argv[++i];
			continue;
		}
		k = mr__config_find_flag(cfg, a, eq ? (size_t)(eq - a) : strlen(a));
		if (k >= 0 && !eq && cfg->opts[k].type != MR_CONFIG_T_BOOL)
			i++;
	}
	return 0;
}

static void add_arg(struct mr_config *cfg, char *arg)
{
	cfg->args[cfg->nargs++] = arg;
}

static int parse_flags(struct mr_config *cfg, int argc, char **argv, struct mr_errbuf *eb)
{
	for (int i = 1; i < argc; i++) {
		char *a = argv[i];
		const char *eq, *value;
		char flag[NAME_MAX_LEN + 8];
		size_t len;
		int k, rc;

		if (strcmp(a, "--") == 0) {
			cfg->dashdash = cfg->nargs;
			while (++i < argc)
				add_arg(cfg, argv[i]);
			break;
		}
		if (a[0] != '-' || strcmp(a, "-") == 0) {
			if (!cfg->allow_positional)
				return mr_errf_field(eb, MR_EINVAL, a, "'%s': unexpected argument (use -- before a command)", a);
			add_arg(cfg, a);
			continue;
		}
		eq = strchr(a, '=');
		len = eq ? (size_t)(eq - a) : strlen(a);
		snprintf(flag, sizeof(flag), "%.*s", (int)len, a);
		if (strncmp(a, "--", 2) != 0)
			return mr_errf_field(eb, MR_EINVAL, flag, "%s: unknown option", flag);
		if (cfg->config_file && strcmp(flag, "--config") == 0) {
			if (!eq && ++i >= argc)
				return mr_errf_field(eb, MR_EINVAL, flag, "%s: missing value", flag);
			continue; /* read already */
		}
		k = mr__config_find_flag(cfg, a, len);
		if (k < 0 && !eq && strncmp(a, "--no-", 5) == 0) {
			char pos[NAME_MAX_LEN + 8];
			snprintf(pos, sizeof(pos), "--%s", a + 5);
			k = mr__config_find_flag(cfg, pos, strlen(pos));
			if (k >= 0 && cfg->opts[k].type == MR_CONFIG_T_BOOL) {
				if ((rc = mr__config_apply(cfg, &cfg->opts[k], "false", flag, flag, eb)) < 0)
					return rc;
				cfg->source[k] = MR_CONFIG_SRC_FLAG;
				continue;
			}
			k = -1;
		}
		if (k < 0)
			return mr_errf_field(eb, MR_EINVAL, flag, "%s: unknown option", flag);
		if (eq)
			value = eq + 1;
		else if (cfg->opts[k].type == MR_CONFIG_T_BOOL)
			value = "true";
		else if (i + 1 < argc)
			value = argv[++i];
		else
			return mr_errf_field(eb, MR_EINVAL, flag, "%s: missing value", flag);
		if ((rc = mr__config_apply(cfg, &cfg->opts[k], value, flag, flag, eb)) < 0)
			return rc;
		cfg->source[k] = MR_CONFIG_SRC_FLAG;
	}
	return 0;
}

int mr_config_parse(struct mr_config *cfg, int argc, char **argv, struct mr_errbuf *eb)
{
	const char *config = NULL;
	int rc;

	if (!cfg->prog && argc > 0)
		cfg->prog = argv[0];
	if (prescan(cfg, argc, argv, &config)) {
		mr_config_help(cfg, cfg->help_out ? cfg->help_out : stdout);
		return MR_CONFIG_HELP;
	}
	free(cfg->args);
	cfg->nargs = 0;
	cfg->dashdash = -1;
	cfg->args = calloc((size_t)(argc > 0 ? argc : 1), sizeof(char *));
	if (!cfg->args)
		return mr_errf(eb, MR_ENOMEM, "out of memory parsing arguments");
	if (cfg->config_file) {
		const char *from = "--config";
		const char *env = getenv("MESHRUN_CONFIG");
		if (!config && env && *env) {
			config = env;
			from = "MESHRUN_CONFIG";
		}
		if (config && (rc = load_file(cfg, config, from, eb)) < 0)
			return rc;
	}
	if ((rc = load_env(cfg, eb)) < 0)
		return rc;
	return parse_flags(cfg, argc, argv, eb);
}

/* ---- api ------------------------------------------------------------------ */
