/*
 * config_help.c - the --help text generated from a config table (see
 * mr_config.h): each option's flag, help, env var, type, bounds and
 * default, word-wrapped.
 */
#include <stdio.h>
#include <string.h>

#include "config_int.h"

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

	mr__config_env_of(o, env, sizeof(env));
	switch (o->type) {
	case MR_CONFIG_T_INT:
		snprintf(type, sizeof(type), "integer in [%lld, %lld]", (long long)o->min,
			 (long long)o->max);
		break;
	case MR_CONFIG_T_DURATION:
		mr__config_format_ms(o->min, lo, sizeof(lo));
		mr__config_format_ms(o->max, hi, sizeof(hi));
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
		mr__config_choices_list(o->choices, list, sizeof(list));
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

		mr__config_flag_of(o, flag, sizeof(flag));
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
