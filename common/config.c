/*
 * config.c - the per-binary configuration table; see mr_config.h.
 *
 * Every source turns into text first (a flag value, an env var, a JSON
 * value, a default) and goes through one parser per type, so a value means
 * the same wherever it comes from and every error reads
 * "<source>: '<value>' <reason>".
 *
 * This file: the table checks, the value parsers and formatters, and
 * applying one value; config_sources.c reads the file, env vars and flags
 * (mr_config_parse), config_help.c writes --help.
 *
 * Non-goals: short options, repeated options, unknown-env-var warnings.
 */
#include "config_int.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>


static const char *const source_names[] = {"unset", "default", "file", "env", "flag", "api"};

const char *mr_config_source_name(enum mr_config_source src)
{
	if ((unsigned)src >= sizeof(source_names) / sizeof(source_names[0]))
		return "?";
	return source_names[src];
}

/* ---- names ------------------------------------------------------------ */

void mr__config_flag_of(const struct mr_config_opt *o, char *buf, size_t size)
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
void mr__config_env_of(const struct mr_config_opt *o, char *buf, size_t size)
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

int mr__config_find_opt(const struct mr_config *cfg, const char *name)
{
	for (size_t i = 0; i < cfg->nopts; i++)
		if (strcmp(cfg->opts[i].name, name) == 0)
			return (int)i;
	return -1;
}

/* Row whose flag is exactly flag[0..len). */
int mr__config_find_flag(const struct mr_config *cfg, const char *flag, size_t len)
{
	char buf[NAME_MAX_LEN + 8];

	for (size_t i = 0; i < cfg->nopts; i++) {
		mr__config_flag_of(&cfg->opts[i], buf, sizeof(buf));
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

void mr__config_format_ms(int64_t ms, char *buf, size_t size)
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

void mr__config_format_dbl(double v, char *buf, size_t size)
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

void mr__config_choices_list(const char *const *choices, char *buf, size_t size)
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
int mr__config_apply(struct mr_config *cfg, const struct mr_config_opt *o, const char *text,
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
			mr__config_format_ms(o->min, lo, sizeof(lo));
			mr__config_format_ms(o->max, hi, sizeof(hi));
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
		mr__config_choices_list(o->choices, list, sizeof(list));
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
	mr__config_flag_of(o, f1, sizeof(f1));
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
	mr__config_env_of(o, e1, sizeof(e1));
	for (size_t j = 0; j < idx; j++) {
		mr__config_flag_of(&cfg->opts[j], f2, sizeof(f2));
		mr__config_env_of(&cfg->opts[j], e2, sizeof(e2));
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
		if ((rc = mr__config_apply(cfg, o, o->def, origin, o->name, eb)) < 0)
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

int mr_config_set(struct mr_config *cfg, const char *name, const char *text,
		  enum mr_config_source src, const char *origin, struct mr_errbuf *eb)
{
	int i = mr__config_find_opt(cfg, name);
	char flag[NAME_MAX_LEN + 8];
	int rc;

	if (i < 0)
		return mr_errf_field(eb, MR_ENOTFOUND, name, "option '%s' is not known", name);
	mr__config_flag_of(&cfg->opts[i], flag, sizeof(flag));
	if ((rc = mr__config_apply(cfg, &cfg->opts[i], text, origin ? origin : flag, name, eb)) < 0)
		return rc;
	cfg->source[i] = (unsigned char)src;
	return 0;
}

enum mr_config_source mr_config_source(const struct mr_config *cfg, const char *name)
{
	int i = mr__config_find_opt(cfg, name);

	return i < 0 ? MR_CONFIG_SRC_UNSET : (enum mr_config_source)cfg->source[i];
}

int mr_config_is_set(const struct mr_config *cfg, const char *name)
{
	return mr_config_source(cfg, name) > MR_CONFIG_SRC_DEFAULT;
}

int mr_config_format(const struct mr_config *cfg, const char *name, char *buf, size_t size)
{
	int i = mr__config_find_opt(cfg, name);
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
		mr__config_format_ms(load_int(src, o->size), tmp, sizeof(tmp));
		return snprintf(buf, size, "%s", tmp);
	case MR_CONFIG_T_DOUBLE:
		memcpy(&dv, src, sizeof(dv));
		mr__config_format_dbl(dv, tmp, sizeof(tmp));
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
