/*
 * config.c - the per-binary configuration table; see mr_config.h.
 *
 * Every source turns into text first (a flag value, an env var, a JSON
 * value, a default) and goes through one parser per type, so a value means
 * the same wherever it comes from and every error reads
 * "<source>: '<value>' <reason>".
 *
 * Order of work in mr_config_parse(): a first pass over argv only looks for
 * -h/--help and --config (so help works whatever else is wrong, and the file
 * is read before env and flags); then file, env vars and flags are applied
 * in precedence order, each overwriting the previous.
 *
 * Non-goals: short options, repeated options, unknown-env-var warnings.
 */
#include "mr_config.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 64
#define SHOWN_MAX 64

static const char *const source_names[] = {"unset", "default", "file", "env", "flag", "api"};

const char *mr_config_source_name(enum mr_config_source src)
{
	if ((unsigned)src >= sizeof(source_names) / sizeof(source_names[0]))
		return "?";
	return source_names[src];
}

/* ---- names ------------------------------------------------------------ */

static void flag_of(const struct mr_config_opt *o, char *buf, size_t size)
{
	size_t n;

	if (o->flag) {
		snprintf(buf, size, "%s", o->flag);
		return;
	}
	n = (size_t)snprintf(buf, size, "--%s", o->name);
	for (size_t i = 2; i < n && i < size; i++)
		if (buf[i] == '_')
			buf[i] = '-';
}

/* "" when the row has no env var. */
static void env_of(const struct mr_config_opt *o, char *buf, size_t size)
{
	size_t n;

	if (o->env) {
		snprintf(buf, size, "%s", o->env);
		return;
	}
	n = (size_t)snprintf(buf, size, "MESHRUN_%s", o->name);
	for (size_t i = 8; i < n && i < size; i++)
		buf[i] = buf[i] == '-' ? '_' : (char)toupper((unsigned char)buf[i]);
}

static int find_opt(const struct mr_config *cfg, const char *name)
{
	for (size_t i = 0; i < cfg->nopts; i++)
		if (strcmp(cfg->opts[i].name, name) == 0)
			return (int)i;
	return -1;
}

/* Row whose flag is exactly flag[0..len). */
static int find_flag(const struct mr_config *cfg, const char *flag, size_t len)
{
	char buf[NAME_MAX_LEN + 8];

	for (size_t i = 0; i < cfg->nopts; i++) {
		flag_of(&cfg->opts[i], buf, sizeof(buf));
		if (strlen(buf) == len && strncmp(buf, flag, len) == 0)
			return (int)i;
	}
	return -1;
}

/* The value as shown in messages: cut to SHOWN_MAX bytes. */
static const char *shown(const char *text, char *buf, size_t size)
{
	if (strlen(text) <= SHOWN_MAX)
		return text;
	snprintf(buf, size, "%.*s...", SHOWN_MAX, text);
	return buf;
}

/* ---- parsers ---------------------------------------------------------- */

static int parse_int(const char *text, int64_t *out)
{
	char *end;
	long long v;

	if (!*text || isspace((unsigned char)*text))
		return MR_EPARSE;
	errno = 0;
	v = strtoll(text, &end, 10);
	if (*end)
		return MR_EPARSE;
	if (errno == ERANGE)
		return MR_ERANGE;
	*out = v;
	return 0;
}

static int parse_double(const char *text, double *out)
{
	char *end;
	double v;

	if (!*text || strspn(text, "0123456789+-.eE") != strlen(text))
		return MR_EPARSE;
	errno = 0;
	v = strtod(text, &end);
	if (*end || end == text)
		return MR_EPARSE;
	if (errno == ERANGE || !isfinite(v))
		return MR_ERANGE;
	*out = v;
	return 0;
}

int mr_config_parse_bool(const char *text, int *out)
{
	static const char *const yes[] = {"true", "1", "yes", "on"};
	static const char *const no[] = {"false", "0", "no", "off"};

	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(text, yes[i]) == 0) {
			*out = 1;
			return 0;
		}
		if (strcasecmp(text, no[i]) == 0) {
			*out = 0;
			return 0;
		}
	}
	return MR_EPARSE;
}

int mr_config_parse_duration_ms(const char *text, int64_t *ms)
{
	static const struct {
		const char *unit;
		double ms;
	} units[] = {{"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
	size_t n = strspn(text, "0123456789.");
	char num[32], *end;
	double v;

	if (n == 0 || n >= sizeof(num) || !isdigit((unsigned char)text[0]))
		return MR_EPARSE;
	memcpy(num, text, n);
	num[n] = '\0';
	v = strtod(num, &end);
	if (*end)
		return MR_EPARSE;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(text + n, units[i].unit) != 0)
			continue;
		v *= units[i].ms;
		if (v > 9007199254740992.0) /* 2^53: beyond, ms are not exact */
			return MR_ERANGE;
		if (fabs(v - round(v)) > 1e-6)
			return MR_EPARSE; /* fractions of a millisecond */
		*ms = (int64_t)llround(v);
		return 0;
	}
	return MR_EPARSE;
}

static void format_ms(int64_t ms, char *buf, size_t size)
{
	if (ms != 0 && ms % 3600000 == 0)
		snprintf(buf, size, "%lldh", (long long)(ms / 3600000));
	else if (ms != 0 && ms % 60000 == 0)
		snprintf(buf, size, "%lldm", (long long)(ms / 60000));
	else if (ms != 0 && ms % 1000 == 0)
		snprintf(buf, size, "%llds", (long long)(ms / 1000));
	else
		snprintf(buf, size, "%lldms", (long long)ms);
}

static void format_dbl(double v, char *buf, size_t size)
{
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, size, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			return;
	}
}

/* ---- storing ------------------------------------------------------------ */

static void *field(const struct mr_config *cfg, const struct mr_config_opt *o)
{
	return (char *)cfg->target + o->offset;
}

static void store_int(void *dst, size_t size, int64_t v)
{
	if (size == sizeof(int32_t)) {
		int32_t x = (int32_t)v;
		memcpy(dst, &x, sizeof(x));
	} else {
		memcpy(dst, &v, sizeof(v));
	}
}

static int64_t load_int(const void *src, size_t size)
{
	if (size == sizeof(int32_t)) {
		int32_t x;
		memcpy(&x, src, sizeof(x));
		return x;
	}
	int64_t v;
	memcpy(&v, src, sizeof(v));
	return v;
}

static void choices_list(const char *const *choices, char *buf, size_t size)
{
	size_t n = 0;

	buf[0] = '\0';
	for (size_t i = 0; choices[i] && n < size; i++)
		n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", choices[i]);
}

/*
 * Parses text for row o and stores it in the target. origin names the
 * source in messages ("--port", "MESHRUN_PORT", "f.json: key 'port'");
 * fieldname goes to eb->field.
 */
static int apply(struct mr_config *cfg, const struct mr_config_opt *o, const char *text,
		 const char *origin, const char *fieldname, struct mr_errbuf *eb)
{
	void *dst = field(cfg, o);
	char sbuf[SHOWN_MAX + 8], list[512];
	const char *s = shown(text, sbuf, sizeof(sbuf));
	int64_t iv = 0;
	double dv = 0;
	int bv = 0, rc;

	switch (o->type) {
	case MR_CONFIG_T_INT:
	case MR_CONFIG_T_DURATION:
		if (o->type == MR_CONFIG_T_INT)
			rc = parse_int(text, &iv);
		else
			rc = mr_config_parse_duration_ms(text, &iv);
		if (rc == MR_EPARSE && o->type == MR_CONFIG_T_INT)
			return mr_errf_field(eb, MR_EPARSE, fieldname, "%s: '%s' is not an integer",
					     origin, s);
		if (rc == MR_EPARSE)
			return mr_errf_field(eb, MR_EPARSE, fieldname,
					     "%s: '%s' is not a duration (use 500ms, 3s, 2m or 1h)",
					     origin, s);
		if (rc < 0 || iv < o->min || iv > o->max) {
			if (o->type == MR_CONFIG_T_INT)
				return mr_errf_field(eb, MR_ERANGE, fieldname,
						     "%s: '%s' is out of range [%lld, %lld]", origin,
						     s, (long long)o->min, (long long)o->max);
			char lo[32], hi[32];
			format_ms(o->min, lo, sizeof(lo));
			format_ms(o->max, hi, sizeof(hi));
			return mr_errf_field(eb, MR_ERANGE, fieldname,
					     "%s: '%s' is out of range [%s, %s]", origin, s, lo, hi);
		}
		store_int(dst, o->size, iv);
		return 0;
	case MR_CONFIG_T_DOUBLE:
		rc = parse_double(text, &dv);
		if (rc == MR_EPARSE)
			return mr_errf_field(eb, rc, fieldname, "%s: '%s' is not a number", origin, s);
		if (rc < 0 || dv < o->dmin || dv > o->dmax)
			return mr_errf_field(eb, MR_ERANGE, fieldname,
					     "%s: '%s' is out of range [%g, %g]", origin, s, o->dmin,
					     o->dmax);
		memcpy(dst, &dv, sizeof(dv));
		return 0;
	case MR_CONFIG_T_BOOL:
		if (mr_config_parse_bool(text, &bv) < 0)
			return mr_errf_field(eb, MR_EPARSE, fieldname,
					     "%s: '%s' is not a boolean (use true or false)", origin,
					     s);
		if (o->size == sizeof(bool)) {
			bool b = bv;
			memcpy(dst, &b, sizeof(b));
		} else {
			memcpy(dst, &bv, sizeof(bv));
		}
		return 0;
	case MR_CONFIG_T_STRING:
		if (strlen(text) >= o->size)
			return mr_errf_field(eb, MR_ERANGE, fieldname,
					     "%s: '%s' is longer than %zu bytes", origin, s,
					     o->size - 1);
		memcpy(dst, text, strlen(text) + 1);
		return 0;
	case MR_CONFIG_T_ENUM:
		for (int i = 0; o->choices[i]; i++)
			if (strcmp(o->choices[i], text) == 0) {
				memcpy(dst, &i, sizeof(i));
				return 0;
			}
		choices_list(o->choices, list, sizeof(list));
		return mr_errf_field(eb, MR_EPARSE, fieldname, "%s: '%s' is not one of: %s", origin,
				     s, list);
	}
	return mr_errf_field(eb, MR_EINVAL, fieldname, "%s: option type is not known", origin);
}

/* ---- table ---------------------------------------------------------------- */

static int check_row(const struct mr_config *cfg, size_t idx, struct mr_errbuf *eb)
{
	const struct mr_config_opt *o = &cfg->opts[idx];
	const char *n = o->name;
	char f1[NAME_MAX_LEN + 8], f2[NAME_MAX_LEN + 8], e1[NAME_MAX_LEN + 16],
		e2[NAME_MAX_LEN + 16];

	if (!n || !*n || strlen(n) > NAME_MAX_LEN || strspn(n, "abcdefghijklmnopqrstuvwxyz0123456789_-") != strlen(n))
		return mr_errf_field(eb, MR_EINVAL, "name", "option %zu: name '%s' is not valid", idx,
				     n ? n : "");
	if (!o->help)
		return mr_errf_field(eb, MR_EINVAL, n, "option '%s': help is missing", n);
	flag_of(o, f1, sizeof(f1));
	if (strncmp(f1, "--", 2) != 0 || strcmp(f1, "--help") == 0 ||
	    (cfg->config_file && strcmp(f1, "--config") == 0) || strchr(f1, '='))
		return mr_errf_field(eb, MR_EINVAL, n, "option '%s': flag '%s' is reserved or not valid",
				     n, f1);
	switch (o->type) {
	case MR_CONFIG_T_INT:
	case MR_CONFIG_T_DURATION:
		if (o->size != 4 && o->size != 8)
			return mr_errf_field(eb, MR_EINVAL, n, "option '%s': field is not int or int64_t", n);
		if (o->min > o->max || (o->size == 4 && (o->min < INT32_MIN || o->max > INT32_MAX)))
			return mr_errf_field(eb, MR_EINVAL, n, "option '%s': bounds are not valid", n);
		break;
	case MR_CONFIG_T_DOUBLE:
		if (o->size != sizeof(double) || !(o->dmin <= o->dmax))
			return mr_errf_field(eb, MR_EINVAL, n, "option '%s': field or bounds not valid", n);
		break;
	case MR_CONFIG_T_BOOL:
		if (o->size != sizeof(int) && o->size != sizeof(bool))
			return mr_errf_field(eb, MR_EINVAL, n, "option '%s': field is not int or bool", n);
		break;
	case MR_CONFIG_T_STRING:
		if (o->size < 1)
			return mr_errf_field(eb, MR_EINVAL, n, "option '%s': string field is empty", n);
		break;
	case MR_CONFIG_T_ENUM:
		if (o->size != sizeof(int) || !o->choices || !o->choices[0])
			return mr_errf_field(eb, MR_EINVAL, n, "option '%s': enum without choices", n);
		break;
	default:
		return mr_errf_field(eb, MR_EINVAL, n, "option '%s': type is not known", n);
	}
	env_of(o, e1, sizeof(e1));
	for (size_t j = 0; j < idx; j++) {
		flag_of(&cfg->opts[j], f2, sizeof(f2));
		env_of(&cfg->opts[j], e2, sizeof(e2));
		if (strcmp(cfg->opts[j].name, n) == 0 || strcmp(f1, f2) == 0 ||
		    (e1[0] && strcmp(e1, e2) == 0))
			return mr_errf_field(eb, MR_EINVAL, n, "option '%s': name, flag or env var is repeated", n);
	}
	return 0;
}

int mr_config_init(struct mr_config *cfg, const struct mr_config_opt *opts, size_t nopts,
		   void *target, struct mr_errbuf *eb)
{
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	cfg->opts = opts;
	cfg->nopts = nopts;
	cfg->target = target;
	cfg->config_file = 1;
	cfg->dashdash = -1;
	if (nopts > MR_CONFIG_MAX_OPTS)
		return mr_errf(eb, MR_ELIMIT, "config table has more than %d rows", MR_CONFIG_MAX_OPTS);
	for (size_t i = 0; i < nopts; i++) {
		const struct mr_config_opt *o = &opts[i];
		char origin[NAME_MAX_LEN + 32];

		if ((rc = check_row(cfg, i, eb)) < 0)
			return rc;
		memset(field(cfg, o), 0, o->size);
		cfg->source[i] = MR_CONFIG_SRC_UNSET;
		if (!o->def)
			continue;
		snprintf(origin, sizeof(origin), "default of '%s'", o->name);
		if ((rc = apply(cfg, o, o->def, origin, o->name, eb)) < 0)
			return rc;
		cfg->source[i] = MR_CONFIG_SRC_DEFAULT;
	}
	return 0;
}

void mr_config_release(struct mr_config *cfg)
{
	if (!cfg)
		return;
	free(cfg->args);
	cfg->args = NULL;
	cfg->nargs = 0;
}

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
		format_dbl(json_number_value(v), buf, size);
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
		int i = find_opt(cfg, key);
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
		if ((rc = apply(cfg, &cfg->opts[i], text, origin, key, eb)) < 0)
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

		env_of(&cfg->opts[i], env, sizeof(env));
		if (!env[0] || !(v = getenv(env)) || !*v)
			continue; /* an empty env var counts as unset */
		if ((rc = apply(cfg, &cfg->opts[i], v, env, env, eb)) < 0)
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
		k = find_flag(cfg, a, eq ? (size_t)(eq - a) : strlen(a));
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
		k = find_flag(cfg, a, len);
		if (k < 0 && !eq && strncmp(a, "--no-", 5) == 0) {
			char pos[NAME_MAX_LEN + 8];
			snprintf(pos, sizeof(pos), "--%s", a + 5);
			k = find_flag(cfg, pos, strlen(pos));
			if (k >= 0 && cfg->opts[k].type == MR_CONFIG_T_BOOL) {
				if ((rc = apply(cfg, &cfg->opts[k], "false", flag, flag, eb)) < 0)
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
		if ((rc = apply(cfg, &cfg->opts[k], value, flag, flag, eb)) < 0)
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

int mr_config_set(struct mr_config *cfg, const char *name, const char *text,
		  enum mr_config_source src, const char *origin, struct mr_errbuf *eb)
{
	int i = find_opt(cfg, name);
	char flag[NAME_MAX_LEN + 8];
	int rc;

	if (i < 0)
		return mr_errf_field(eb, MR_ENOTFOUND, name, "option '%s' is not known", name);
	flag_of(&cfg->opts[i], flag, sizeof(flag));
	if ((rc = apply(cfg, &cfg->opts[i], text, origin ? origin : flag, name, eb)) < 0)
		return rc;
	cfg->source[i] = (unsigned char)src;
	return 0;
}

enum mr_config_source mr_config_source(const struct mr_config *cfg, const char *name)
{
	int i = find_opt(cfg, name);

	return i < 0 ? MR_CONFIG_SRC_UNSET : (enum mr_config_source)cfg->source[i];
}

int mr_config_is_set(const struct mr_config *cfg, const char *name)
{
	return mr_config_source(cfg, name) > MR_CONFIG_SRC_DEFAULT;
}

int mr_config_format(const struct mr_config *cfg, const char *name, char *buf, size_t size)
{
	int i = find_opt(cfg, name);
	const struct mr_config_opt *o;
	const void *src;
	char tmp[64];
	int iv;
	double dv;

	if (i < 0)
		return MR_ENOTFOUND;
	o = &cfg->opts[i];
	src = (const char *)cfg->target + o->offset;
	switch (o->type) {
	case MR_CONFIG_T_INT:
		return snprintf(buf, size, "%lld", (long long)load_int(src, o->size));
	case MR_CONFIG_T_DURATION:
		format_ms(load_int(src, o->size), tmp, sizeof(tmp));
		return snprintf(buf, size, "%s", tmp);
	case MR_CONFIG_T_DOUBLE:
		memcpy(&dv, src, sizeof(dv));
		format_dbl(dv, tmp, sizeof(tmp));
		return snprintf(buf, size, "%s", tmp);
	case MR_CONFIG_T_BOOL:
		iv = o->size == sizeof(bool) ? *(const bool *)src : *(const int *)src;
		return snprintf(buf, size, "%s", iv ? "true" : "false");
	case MR_CONFIG_T_STRING:
		return snprintf(buf, size, "%.*s", (int)o->size, (const char *)src);
	case MR_CONFIG_T_ENUM:
		memcpy(&iv, src, sizeof(iv));
		return snprintf(buf, size, "%s", o->choices[iv]);
	}
	return MR_EINVAL;
}

/* ---- help ------------------------------------------------------------------ */

#define HELP_WIDTH 79
#define HELP_INDENT 8

/* Writes text word-wrapped at HELP_WIDTH, every line indented. */
static void wrap(FILE *out, const char *text, int indent)
{
	const char *p = text;
	int col = 0;

	while (*p) {
		size_t w;

		if (*p == '\n') {
			if (col)
				fputc('\n', out);
			col = 0;
			p++;
			continue;
		}
		if (*p == ' ') {
			p++;
			continue;
		}
		w = strcspn(p, " \n");
		if (col && col + 1 + (int)w > HELP_WIDTH) {
			fputc('\n', out);
			col = 0;
		}
		if (!col)
			col = fprintf(out, "%*s", indent, "");
		else
			col += fprintf(out, " ");
		col += fprintf(out, "%.*s", (int)w, p);
		p += w;
	}
	if (col)
		fputc('\n', out);
}

static const char *meta_of(const struct mr_config_opt *o)
{
	if (o->meta)
		return o->meta;
	switch (o->type) {
	case MR_CONFIG_T_INT: return "N";
	case MR_CONFIG_T_DOUBLE: return "X";
	case MR_CONFIG_T_DURATION: return "DURATION";
	case MR_CONFIG_T_ENUM: return "NAME";
	default: return "STRING";
	}
}

static void describe(const struct mr_config_opt *o, char *buf, size_t size)
{
	char env[NAME_MAX_LEN + 16], type[600], lo[32], hi[32], list[512];

	env_of(o, env, sizeof(env));
	switch (o->type) {
	case MR_CONFIG_T_INT:
		snprintf(type, sizeof(type), "integer in [%lld, %lld]", (long long)o->min,
			 (long long)o->max);
		break;
	case MR_CONFIG_T_DURATION:
		format_ms(o->min, lo, sizeof(lo));
		format_ms(o->max, hi, sizeof(hi));
		snprintf(type, sizeof(type), "duration in [%s, %s]", lo, hi);
		break;
	case MR_CONFIG_T_DOUBLE:
		snprintf(type, sizeof(type), "number in [%g, %g]", o->dmin, o->dmax);
		break;
	case MR_CONFIG_T_BOOL:
		snprintf(type, sizeof(type), "boolean");
		break;
	case MR_CONFIG_T_STRING:
		snprintf(type, sizeof(type), "string of at most %zu bytes", o->size - 1);
		break;
	case MR_CONFIG_T_ENUM:
		choices_list(o->choices, list, sizeof(list));
		snprintf(type, sizeof(type), "one of: %s", list);
		break;
	}
	snprintf(buf, size, "[%s%s%s%s; default %s%s%s]", env[0] ? "env " : "", env,
		 env[0] ? "; " : "", type, o->def ? "'" : "", o->def ? o->def : "none",
		 o->def ? "'" : "");
}

void mr_config_help(const struct mr_config *cfg, FILE *out)
{
	char flag[NAME_MAX_LEN + 8], desc[1400];

	fprintf(out, "usage: %s %s\n", cfg->prog ? cfg->prog : "meshrun",
		cfg->usage ? cfg->usage : "[options]");
	if (cfg->summary) {
		fputc('\n', out);
		wrap(out, cfg->summary, 0);
	}
	fprintf(out, "\noptions (precedence: flag > env var > config file > default):\n");
	for (size_t i = 0; i < cfg->nopts; i++) {
		const struct mr_config_opt *o = &cfg->opts[i];

		flag_of(o, flag, sizeof(flag));
		if (o->type == MR_CONFIG_T_BOOL)
			fprintf(out, "  %s, --no-%s\n", flag, flag + 2);
		else
			fprintf(out, "  %s %s\n", flag, meta_of(o));
		wrap(out, o->help, HELP_INDENT);
		describe(o, desc, sizeof(desc));
		wrap(out, desc, HELP_INDENT);
	}
	if (cfg->config_file) {
		fprintf(out, "  --config FILE\n");
		wrap(out, "JSON object whose keys are the option names above (e.g. "
			  "{\"max_restarts\": 3}); unknown keys are an error.",
		     HELP_INDENT);
		wrap(out, "[env MESHRUN_CONFIG]", HELP_INDENT);
	}
	fprintf(out, "  -h, --help\n");
	wrap(out, "Print this help and exit.", HELP_INDENT);
}
