/*
 * mr_config.h - one configuration table per binary: flags, MESHRUN_* env
 * vars and an optional JSON config file, with a generated --help.
 *
 * Each row (struct mr_config_opt) names an option ("port"), its type and
 * bounds, its default as text (parsed by the same parser as every other
 * source), its help and where its value lives in the caller's struct. From
 * the name are derived the long flag (--port; '_' becomes '-'), the env var
 * (MESHRUN_PORT; upper case, '-' becomes '_') and the JSON key (the name
 * itself); a row may override flag and env.
 *
 * Precedence, lowest first: default < JSON file (--config FILE or
 * MESHRUN_CONFIG) < env var < flag. Flags: `--name value`, `--name=value`;
 * bools also `--name`, `--no-name`, `--name=true|false`. `--` ends the
 * options: what follows is returned as positional args (the agent's
 * `-- CMD ARGS...`). `--help`/`-h` prints the help and parse returns
 * MR_CONFIG_HELP: the caller exits 0.
 *
 * Errors name the source, the value and the reason, and the source goes to
 * eb->field:
 *   --port: 'abc' is not an integer
 *   MESHRUN_PORT: '70000' is out of range [0, 65535]
 *   config.json: key 'prot' is not known
 *   --bogus: unknown option
 * main() prints eb->msg and exits MR_CONFIG_EXIT_USAGE.
 *
 * Storage per type (the field at `offset`, `size` bytes):
 *   INT       int (size 4) or int64_t (size 8), within [min, max]
 *   DURATION  milliseconds, int or int64_t, within [min, max]; text is
 *             "1500", "500ms", "3s", "1.5s", "2m", "1h"
 *   DOUBLE    double, within [dmin, dmax]
 *   BOOL      int (size 4) or bool (size 1): 0/1; text true/false, 1/0,
 *             yes/no, on/off
 *   STRING    char[size] in the caller's struct; at most size-1 bytes
 *   ENUM      int: index into choices (NULL-terminated list of names)
 * Use the MR_CONFIG_* row macros below; they fill offset and size.
 *
 * Ownership: the table and target struct belong to the caller and must
 * outlive the struct mr_config; positional args point into argv.
 *
 * Non-goals: short options besides -h, repeated options, subcommands (the
 * CLI dispatches on argv[1] itself), YAML.
 */
#ifndef MR_CONFIG_H
#define MR_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mr_err.h"

/* Exit status for a usage/config error. */
#define MR_CONFIG_EXIT_USAGE 2
/* Positive return of mr_config_parse(): help was printed, exit 0. */
#define MR_CONFIG_HELP 1
#define MR_CONFIG_MAX_OPTS 128
/* Largest JSON config file read. */
#define MR_CONFIG_MAX_FILE (1 << 20)

enum mr_config_type {
	MR_CONFIG_T_INT,
	MR_CONFIG_T_DOUBLE,
	MR_CONFIG_T_BOOL,
	MR_CONFIG_T_STRING,
	MR_CONFIG_T_DURATION,
	MR_CONFIG_T_ENUM,
};

/* Where an option's current value came from. */
enum mr_config_source {
	MR_CONFIG_SRC_UNSET = 0, /* no default and never set: field zeroed */
	MR_CONFIG_SRC_DEFAULT,
	MR_CONFIG_SRC_FILE,
	MR_CONFIG_SRC_ENV,
	MR_CONFIG_SRC_FLAG,
	MR_CONFIG_SRC_API, /* mr_config_set() */
};

struct mr_config_opt {
	const char *name; /* "max_restarts": JSON key, flag and env derive */
	enum mr_config_type type;
	size_t offset;
	size_t size;
	const char *def;  /* default as text; NULL = no default (zero/"") */
	const char *help; /* one or more sentences, wrapped by --help */
	int64_t min, max; /* INT, DURATION (ms) */
	double dmin, dmax;            /* DOUBLE */
	const char *const *choices;   /* ENUM, NULL-terminated */
	const char *flag; /* NULL = "--" + name with '_' -> '-' */
	const char *env;  /* NULL = MESHRUN_ + NAME; "" = no env var */
	const char *meta; /* placeholder in --help ("N", "ADDR"); NULL = type */
};

#define MR__CFG_FIELD(st, fld) .offset = offsetof(st, fld), .size = sizeof(((st *)0)->fld)
#define MR_CONFIG_INT(nm, st, fld, dflt, lo, hi, hlp)                                     \
	{ .name = (nm), .type = MR_CONFIG_T_INT, MR__CFG_FIELD(st, fld), .def = (dflt),  \
	  .min = (lo), .max = (hi), .help = (hlp) }
#define MR_CONFIG_DURATION(nm, st, fld, dflt, lo_ms, hi_ms, hlp)                          \
	{ .name = (nm), .type = MR_CONFIG_T_DURATION, MR__CFG_FIELD(st, fld),            \
	  .def = (dflt), .min = (lo_ms), .max = (hi_ms), .help = (hlp) }
#define MR_CONFIG_DOUBLE(nm, st, fld, dflt, lo, hi, hlp)                                  \
	{ .name = (nm), .type = MR_CONFIG_T_DOUBLE, MR__CFG_FIELD(st, fld), .def = (dflt), \
	  .dmin = (lo), .dmax = (hi), .help = (hlp) }
#define MR_CONFIG_BOOL(nm, st, fld, dflt, hlp)                                            \
	{ .name = (nm), .type = MR_CONFIG_T_BOOL, MR__CFG_FIELD(st, fld), .def = (dflt),  \
	  .help = (hlp) }
#define MR_CONFIG_STRING(nm, st, fld, dflt, hlp)                                          \
	{ .name = (nm), .type = MR_CONFIG_T_STRING, MR__CFG_FIELD(st, fld), .def = (dflt), \
	  .help = (hlp) }
#define MR_CONFIG_ENUM(nm, st, fld, dflt, names, hlp)                                     \
	{ .name = (nm), .type = MR_CONFIG_T_ENUM, MR__CFG_FIELD(st, fld), .def = (dflt),  \
	  .choices = (names), .help = (hlp) }

struct mr_config {
	/* set by mr_config_init */
	const struct mr_config_opt *opts;
	size_t nopts;
	void *target;
	/* optional, set by the caller before parse */
	const char *prog;      /* "meshrun-agent" in usage line; NULL = argv[0] */
	const char *usage;     /* after prog, e.g. "[options] [-- CMD ARGS...]" */
	const char *summary;   /* paragraph printed under the usage line */
	FILE *help_out;        /* NULL = stdout */
	int allow_positional;  /* 1: bare args before `--` are positional too */
	int config_file;       /* 0: no --config / MESHRUN_CONFIG (default 1) */
	/* results */
	unsigned char source[MR_CONFIG_MAX_OPTS]; /* enum mr_config_source */
	char **args;        /* positional args (malloc'd array into argv) */
	int nargs;
	int dashdash;       /* index in args where `--` args start, -1 if none */
	char config_path[1024]; /* the config file read, "" if none */
};

/* Checks the table (names, bounds, defaults parse) and applies the
 * defaults to target. Errors are programming errors (MR_EINVAL, message
 * names the row). Call mr_config_release() even after a failure. */
int mr_config_init(struct mr_config *cfg, const struct mr_config_opt *opts, size_t nopts,
		   void *target, struct mr_errbuf *eb);
/* Frees the positional args array. */
void mr_config_release(struct mr_config *cfg);

/*
 * Reads file (if any), env vars, then argv[1..argc-1]. Returns 0,
 * MR_CONFIG_HELP after printing help, or a negative MR_E* code with eb
 * naming source, value and reason (exit MR_CONFIG_EXIT_USAGE).
 */
int mr_config_parse(struct mr_config *cfg, int argc, char **argv, struct mr_errbuf *eb);

/* Sets option name from text as if it came from src; origin names it in
 * errors (NULL = the derived flag). For callers that compute values. */
int mr_config_set(struct mr_config *cfg, const char *name, const char *text,
		  enum mr_config_source src, const char *origin, struct mr_errbuf *eb);

/* Source of the option's current value; MR_CONFIG_SRC_UNSET also for an
 * unknown name. */
enum mr_config_source mr_config_source(const struct mr_config *cfg, const char *name);
/* 1 if set by the file, env, a flag or mr_config_set(), not by default. */
int mr_config_is_set(const struct mr_config *cfg, const char *name);
const char *mr_config_source_name(enum mr_config_source src);

/* Formats the option's current value as text the parser accepts (for logs
 * and for passing options on to child processes). Returns the length, or
 * MR_ENOTFOUND. */
int mr_config_format(const struct mr_config *cfg, const char *name, char *buf, size_t size);

/* Writes the generated help: usage, summary, then for every row the flag,
 * env var, type, default, bounds and wrapped help text. */
void mr_config_help(const struct mr_config *cfg, FILE *out);

/* Parsers shared with other modules; 0 or MR_EPARSE. */
int mr_config_parse_duration_ms(const char *text, int64_t *ms);
int mr_config_parse_bool(const char *text, int *out);

#endif
