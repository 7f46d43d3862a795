/*
 * test_config.c - the config table (common/config.c): every type, every
 * source and their precedence, every error message, --help, `--`.
 *
 * Criterion runs each test in its own process, so setenv() stays local.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mr_config.h"

struct cfg {
	int port;
	int64_t max_bytes;
	double ratio;
	int verbose;
	bool fast;
	char job[16];
	int64_t timeout_ms;
	int grace_ms;
	int mode;
};

static const char *const modes[] = {"exec", "runtime", NULL};

static const struct mr_config_opt opts[] = {
	MR_CONFIG_INT("port", struct cfg, port, "8080", 0, 65535,
		      "Listen port for health and metrics."),
	MR_CONFIG_INT("max_bytes", struct cfg, max_bytes, "1048576", 1, INT64_MAX,
		      "Largest request body."),
	MR_CONFIG_DOUBLE("ratio", struct cfg, ratio, "0.5", 0, 1, "A fraction."),
	MR_CONFIG_BOOL("verbose", struct cfg, verbose, "false", "Log more."),
	MR_CONFIG_BOOL("fast", struct cfg, fast, "true", "Go fast."),
	MR_CONFIG_STRING("job", struct cfg, job, NULL, "Job name (namespace/name)."),
	MR_CONFIG_DURATION("timeout", struct cfg, timeout_ms, "3s", 1, 3600000,
			   "Heartbeat timeout. A member silent for longer than this is declared "
			   "dead, the generation is bumped and every survivor restarts from the "
			   "last checkpoint; keep it well above the heartbeat interval."),
	MR_CONFIG_DURATION("grace", struct cfg, grace_ms, "500ms", 0, 60000, "Grace period."),
	MR_CONFIG_ENUM("mode", struct cfg, mode, "exec", modes, "Worker mode."),
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

struct fixture {
	struct mr_config c;
	struct cfg v;
	struct mr_errbuf eb;
};

static void setup(struct fixture *f)
{
	memset(f, 0, sizeof(*f));
	memset(&f->v, 0x5a, sizeof(f->v)); /* init must overwrite everything */
	cr_assert_eq(mr_config_init(&f->c, opts, NOPTS, &f->v, &f->eb), 0, "%s", f->eb.msg);
}

/* Parses argv (NULL-terminated, without program name). */
static int run(struct fixture *f, char **args)
{
	char *argv[32] = {"prog"};
	int argc = 1;

	while (args && args[argc - 1])
		argv[argc] = args[argc - 1], argc++;
	mr_errbuf_clear(&f->eb);
	return mr_config_parse(&f->c, argc, argv, &f->eb);
}

#define ARGS(...) ((char *[]){__VA_ARGS__, NULL})

static char *write_file(const char *text)
{
	static char path[64];
	int fd;

	snprintf(path, sizeof(path), "/tmp/mr_cfg_XXXXXX");
	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return path;
}

static void expect_error(char **args, const char *field, const char *msg)
{
	struct fixture f;

	setup(&f);
	cr_assert_lt(run(&f, args), 0, "expected '%s'", msg);
	cr_assert_str_eq(f.eb.msg, msg);
	cr_assert_str_eq(f.eb.field, field);
	mr_config_release(&f.c);
}

Test(config, defaults)
{
	struct fixture f;

	setup(&f);
	cr_assert_eq(run(&f, NULL), 0);
	cr_assert_eq(f.v.port, 8080);
	cr_assert_eq(f.v.max_bytes, 1048576);
	cr_assert_eq(f.v.ratio, 0.5);
	cr_assert_eq(f.v.verbose, 0);
	cr_assert_eq(f.v.fast, true);
	cr_assert_str_eq(f.v.job, "");
	cr_assert_eq(f.v.timeout_ms, 3000);
	cr_assert_eq(f.v.grace_ms, 500);
	cr_assert_eq(f.v.mode, 0);
	cr_assert_eq(mr_config_source(&f.c, "port"), MR_CONFIG_SRC_DEFAULT);
	cr_assert_eq(mr_config_source(&f.c, "job"), MR_CONFIG_SRC_UNSET);
	cr_assert_eq(mr_config_source(&f.c, "nope"), MR_CONFIG_SRC_UNSET);
	cr_assert_not(mr_config_is_set(&f.c, "port"));
	cr_assert_eq(f.c.nargs, 0);
	cr_assert_eq(f.c.dashdash, -1);
	mr_config_release(&f.c);
}

Test(config, every_type_from_flags)
{
	struct fixture f;

	setup(&f);
	cr_assert_eq(run(&f, ARGS("--port", "9000", "--max-bytes=9000000000", "--ratio", "0.25",
				  "--verbose", "--no-fast", "--job=ns/a", "--timeout", "2m",
				  "--grace=1500", "--mode", "runtime")),
		     0, "%s", f.eb.msg);
	cr_assert_eq(f.v.port, 9000);
	cr_assert_eq(f.v.max_bytes, 9000000000LL);
	cr_assert_eq(f.v.ratio, 0.25);
	cr_assert_eq(f.v.verbose, 1);
	cr_assert_eq(f.v.fast, false);
	cr_assert_str_eq(f.v.job, "ns/a");
	cr_assert_eq(f.v.timeout_ms, 120000);
	cr_assert_eq(f.v.grace_ms, 1500);
	cr_assert_eq(f.v.mode, 1);
	for (size_t i = 0; i < NOPTS; i++) {
		cr_assert_eq(mr_config_source(&f.c, opts[i].name), MR_CONFIG_SRC_FLAG, "%s",
			     opts[i].name);
		cr_assert(mr_config_is_set(&f.c, opts[i].name));
	}
	mr_config_release(&f.c);

	setup(&f);
	cr_assert_eq(run(&f, ARGS("--verbose=yes", "--fast=false", "--job", "", "--port=-0")), 0,
		     "%s", f.eb.msg);
	cr_assert_eq(f.v.verbose, 1);
	cr_assert_eq(f.v.fast, false);
	cr_assert_str_eq(f.v.job, "");
	cr_assert_eq(f.v.port, 0);
	mr_config_release(&f.c);
}

Test(config, duration_and_bool_parsers)
{
	static const struct {
		const char *text;
		int64_t ms;
	} ok[] = {{"500ms", 500}, {"3s", 3000}, {"2m", 120000}, {"1h", 3600000},
		  {"1500", 1500}, {"1.5s", 1500}, {"0", 0},        {"0.25m", 15000}};
	static const char *const bad[] = {"", "3x", "-1s", "1.5ms", "s", "1 s", "1e3", ".5s", "3sec"};
	int64_t ms;
	int b;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		cr_assert_eq(mr_config_parse_duration_ms(ok[i].text, &ms), 0, "%s", ok[i].text);
		cr_assert_eq(ms, ok[i].ms, "%s", ok[i].text);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_lt(mr_config_parse_duration_ms(bad[i], &ms), 0, "'%s'", bad[i]);
	cr_assert_lt(mr_config_parse_duration_ms("999999999999h", &ms), 0);
	cr_assert(mr_config_parse_bool("ON", &b) == 0 && b == 1);
	cr_assert(mr_config_parse_bool("0", &b) == 0 && b == 0);
	cr_assert_lt(mr_config_parse_bool("2", &b), 0);
}

Test(config, env_vars)
{
	struct fixture f;

	setenv("MESHRUN_PORT", "7000", 1);
	setenv("MESHRUN_MAX_BYTES", "12", 1);
	setenv("MESHRUN_VERBOSE", "true", 1);
	setenv("MESHRUN_TIMEOUT", "", 1); /* empty counts as unset */
	setup(&f);
	cr_assert_eq(run(&f, NULL), 0, "%s", f.eb.msg);
	cr_assert_eq(f.v.port, 7000);
	cr_assert_eq(f.v.max_bytes, 12);
	cr_assert_eq(f.v.verbose, 1);
	cr_assert_eq(f.v.timeout_ms, 3000);
	cr_assert_eq(mr_config_source(&f.c, "port"), MR_CONFIG_SRC_ENV);
	cr_assert_eq(mr_config_source(&f.c, "timeout"), MR_CONFIG_SRC_DEFAULT);
	mr_config_release(&f.c);
}

Test(config, file_every_type)
{
	struct fixture f;
	char *path = write_file("{\"port\": 6000, \"max_bytes\": 99, \"ratio\": 1, \"verbose\": true,"
				" \"fast\": false, \"job\": \"from/file\", \"timeout\": \"10s\","
				" \"grace\": 250, \"mode\": \"runtime\"}");

	setup(&f);
	cr_assert_eq(run(&f, ARGS("--config", path)), 0, "%s", f.eb.msg);
	cr_assert_eq(f.v.port, 6000);
	cr_assert_eq(f.v.max_bytes, 99);
	cr_assert_eq(f.v.ratio, 1.0);
	cr_assert_eq(f.v.verbose, 1);
	cr_assert_eq(f.v.fast, false);
	cr_assert_str_eq(f.v.job, "from/file");
	cr_assert_eq(f.v.timeout_ms, 10000);
	cr_assert_eq(f.v.grace_ms, 250);
	cr_assert_eq(f.v.mode, 1);
	cr_assert_eq(mr_config_source(&f.c, "grace"), MR_CONFIG_SRC_FILE);
	cr_assert_str_eq(f.c.config_path, path);
	mr_config_release(&f.c);
	unlink(path);
}

Test(config, precedence)
{
	struct fixture f;
	char *p = write_file("{\"port\": 6000, \"ratio\": 0.125}");
	char path[64], other[64];

	snprintf(path, sizeof(path), "%s", p);
	/* file < env < flag, layer by layer */
	setup(&f);
	cr_assert_eq(run(&f, ARGS("--config=x")), MR_EIO); /* proves --config= is read */
	mr_config_release(&f.c);

	setup(&f);
	cr_assert_eq(run(&f, ARGS("--config", path)), 0);
	cr_assert_eq(f.v.port, 6000);
	mr_config_release(&f.c);

	setenv("MESHRUN_PORT", "7000", 1);
	setup(&f);
	cr_assert_eq(run(&f, ARGS("--config", path)), 0);
	cr_assert_eq(f.v.port, 7000);
	cr_assert_eq(f.v.ratio, 0.125); /* file value kept where env is silent */
	mr_config_release(&f.c);

	setup(&f);
	cr_assert_eq(run(&f, ARGS("--port", "9000", "--config", path)), 0);
	cr_assert_eq(f.v.port, 9000, "flags win even before --config");
	cr_assert_eq(mr_config_source(&f.c, "port"), MR_CONFIG_SRC_FLAG);
	cr_assert_eq(mr_config_source(&f.c, "ratio"), MR_CONFIG_SRC_FILE);
	mr_config_release(&f.c);

	/* MESHRUN_CONFIG names the file; --config overrides it */
	unsetenv("MESHRUN_PORT");
	setenv("MESHRUN_CONFIG", path, 1);
	setup(&f);
	cr_assert_eq(run(&f, NULL), 0);
	cr_assert_eq(f.v.port, 6000);
	mr_config_release(&f.c);
	snprintf(other, sizeof(other), "%s", write_file("{\"port\": 5000}"));
	setup(&f);
	cr_assert_eq(run(&f, ARGS("--config", other)), 0);
	cr_assert_eq(f.v.port, 5000);
	mr_config_release(&f.c);
	/* a later flag of the same option wins */
	setup(&f);
	cr_assert_eq(run(&f, ARGS("--port", "1", "--port=2")), 0);
	cr_assert_eq(f.v.port, 2);
	mr_config_release(&f.c);
	unlink(path);
	unlink(other);
}

Test(config, flag_errors)
{
	char long_job[] = "abcdefghijklmnopq"; /* 17 bytes, room for 15 */

	expect_error(ARGS("--port", "abc"), "--port", "--port: 'abc' is not an integer");
	expect_error(ARGS("--port=70000"), "--port", "--port: '70000' is out of range [0, 65535]");
	expect_error(ARGS("--port", "99999999999999999999"), "--port",
		     "--port: '99999999999999999999' is out of range [0, 65535]");
	expect_error(ARGS("--port", " 5"), "--port", "--port: ' 5' is not an integer");
	expect_error(ARGS("--bogus"), "--bogus", "--bogus: unknown option");
	expect_error(ARGS("--bogus=1"), "--bogus", "--bogus: unknown option");
	expect_error(ARGS("-x"), "-x", "-x: unknown option");
	expect_error(ARGS("--no-port"), "--no-port", "--no-port: unknown option");
	expect_error(ARGS("--port"), "--port", "--port: missing value");
	expect_error(ARGS("--config"), "--config", "--config: missing value");
	expect_error(ARGS("--ratio", "2"), "--ratio", "--ratio: '2' is out of range [0, 1]");
	expect_error(ARGS("--ratio", "x"), "--ratio", "--ratio: 'x' is not a number");
	expect_error(ARGS("--ratio", "nan"), "--ratio", "--ratio: 'nan' is not a number");
	expect_error(ARGS("--verbose=maybe"), "--verbose",
		     "--verbose: 'maybe' is not a boolean (use true or false)");
	expect_error(ARGS("--job", long_job), "--job",
		     "--job: 'abcdefghijklmnopq' is longer than 15 bytes");
	expect_error(ARGS("--timeout", "3x"), "--timeout",
		     "--timeout: '3x' is not a duration (use 500ms, 3s, 2m or 1h)");
	expect_error(ARGS("--timeout", "2h"), "--timeout",
		     "--timeout: '2h' is out of range [1ms, 1h]");
	expect_error(ARGS("--mode", "x"), "--mode", "--mode: 'x' is not one of: exec, runtime");
	expect_error(ARGS("foo"), "foo", "'foo': unexpected argument (use -- before a command)");
}

Test(config, long_values_are_cut_in_messages)
{
	char big[200];
	struct fixture f;

	memset(big, '7', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	setup(&f);
	cr_assert_lt(run(&f, ARGS("--port", big)), 0);
	cr_assert(strstr(f.eb.msg, "...' is out of range [0, 65535]"), "%s", f.eb.msg);
	cr_assert_lt(strlen(f.eb.msg), 120);
	mr_config_release(&f.c);
}

Test(config, env_errors)
{
	setenv("MESHRUN_PORT", "70000", 1);
	expect_error(NULL, "MESHRUN_PORT", "MESHRUN_PORT: '70000' is out of range [0, 65535]");
	setenv("MESHRUN_PORT", "1", 1);
	setenv("MESHRUN_MODE", "bad", 1);
	expect_error(NULL, "MESHRUN_MODE", "MESHRUN_MODE: 'bad' is not one of: exec, runtime");
	unsetenv("MESHRUN_MODE");
	setenv("MESHRUN_CONFIG", "/nonexistent/x.json", 1);
	expect_error(NULL, "MESHRUN_CONFIG",
		     "MESHRUN_CONFIG: unable to open '/nonexistent/x.json': No such file or directory");
}

static void expect_file_error(const char *json, const char *field, const char *fmt)
{
	char path[64], msg[256];

	snprintf(path, sizeof(path), "%s", write_file(json));
	snprintf(msg, sizeof(msg), fmt, path);
	expect_error(ARGS("--config", path), field, msg);
	unlink(path);
}

Test(config, file_errors)
{
	char path[64];
	struct fixture f;

	expect_file_error("{\"prot\": 1}", "prot", "%s: key 'prot' is not known");
	expect_file_error("{\"port\": 70000}", "port",
			  "%s: key 'port': '70000' is out of range [0, 65535]");
	expect_file_error("{\"port\": \"80\"}", "port", "%s: key 'port': expected an integer");
	expect_file_error("{\"verbose\": 1}", "verbose", "%s: key 'verbose': expected true or false");
	expect_file_error("{\"job\": 5}", "job", "%s: key 'job': expected a string");
	expect_file_error("{\"ratio\": null}", "ratio", "%s: key 'ratio': expected a number");
	expect_file_error("[1]", "--config", "%s: top level is not an object");
	expect_error(ARGS("--config", "/nonexistent/x.json"), "--config",
		     "--config: unable to open '/nonexistent/x.json': No such file or directory");
	/* a syntax error names file and line */
	snprintf(path, sizeof(path), "%s", write_file("{\n\"port\": 1,\n}"));
	setup(&f);
	cr_assert_lt(run(&f, ARGS("--config", path)), 0);
	char prefix[80];
	snprintf(prefix, sizeof(prefix), "%s:3: ", path);
	cr_assert_eq(strncmp(f.eb.msg, prefix, strlen(prefix)), 0, "%s", f.eb.msg);
	mr_config_release(&f.c);
	unlink(path);
	/* duplicate keys are rejected, not silently merged */
	snprintf(path, sizeof(path), "%s", write_file("{\"port\": 1, \"port\": 2}"));
	setup(&f);
	cr_assert_lt(run(&f, ARGS("--config", path)), 0);
	cr_assert(strstr(f.eb.msg, "duplicate"), "%s", f.eb.msg);
	mr_config_release(&f.c);
	unlink(path);
}

Test(config, dashdash_and_positional)
{
	struct fixture f;

	setup(&f);
	cr_assert_eq(run(&f, ARGS("--port", "1", "--", "python", "-c", "x", "--port", "2", "--help")),
		     0, "%s", f.eb.msg);
	cr_assert_eq(f.v.port, 1);
	cr_assert_eq(f.c.nargs, 6);
	cr_assert_eq(f.c.dashdash, 0);
	cr_assert_str_eq(f.c.args[0], "python");
	cr_assert_str_eq(f.c.args[3], "--port");
	cr_assert_str_eq(f.c.args[5], "--help");
	mr_config_release(&f.c);

	setup(&f);
	f.c.allow_positional = 1;
	cr_assert_eq(run(&f, ARGS("status", "ns/a", "--port", "3", "-", "--", "x")), 0);
	cr_assert_eq(f.v.port, 3);
	cr_assert_eq(f.c.nargs, 4);
	cr_assert_eq(f.c.dashdash, 3);
	cr_assert_str_eq(f.c.args[1], "ns/a");
	cr_assert_str_eq(f.c.args[2], "-");
	cr_assert_str_eq(f.c.args[3], "x");
	mr_config_release(&f.c);

	setup(&f);
	cr_assert_eq(run(&f, ARGS("--")), 0);
	cr_assert_eq(f.c.nargs, 0);
	cr_assert_eq(f.c.dashdash, 0);
	mr_config_release(&f.c);

	/* a value that looks like an option is still the value */
	setup(&f);
	cr_assert_eq(run(&f, ARGS("--job", "-h")), 0);
	cr_assert_str_eq(f.v.job, "-h");
	mr_config_release(&f.c);
}

static char *help_of(char **args, int *rc)
{
	struct fixture f;
	char *buf = NULL;
	size_t len = 0;

	setup(&f);
	f.c.help_out = open_memstream(&buf, &len);
	f.c.prog = "meshrun-agent";
	f.c.usage = "[options] [-- CMD ARGS...]";
	f.c.summary = "Joins a job and runs its workers.";
	*rc = run(&f, args);
	fclose(f.c.help_out);
	mr_config_release(&f.c);
	return buf;
}

Test(config, help)
{
	int rc;
	char *h = help_of(ARGS("--bogus", "--port", "x", "--help"), &rc);

	/* help wins over errors anywhere on the line */
	cr_assert_eq(rc, MR_CONFIG_HELP);
	const char *head = "usage: meshrun-agent [options] [-- CMD ARGS...]\n\n"
			   "Joins a job and runs its workers.\n\n"
			   "options (precedence: flag > env var > config file > default):\n";
	cr_assert(strncmp(h, head, strlen(head)) == 0, "%s", h);
	cr_assert(strstr(h, "  --port N\n        Listen port for health and metrics.\n"
			    "        [env MESHRUN_PORT; integer in [0, 65535]; default '8080']\n"),
		  "%s", h);
	cr_assert(strstr(h, "  --verbose, --no-verbose\n"), "%s", h);
	cr_assert(strstr(h, "  --max-bytes N\n"), "%s", h);
	cr_assert(strstr(h, "[env MESHRUN_JOB; string of at most 15 bytes; default none]"), "%s", h);
	cr_assert(strstr(h, "[env MESHRUN_TIMEOUT; duration in [1ms, 1h]; default '3s']"), "%s", h);
	cr_assert(strstr(h, "[env MESHRUN_MODE; one of: exec, runtime; default 'exec']"), "%s", h);
	cr_assert(strstr(h, "[env MESHRUN_RATIO; number in [0, 1]; default '0.5']"), "%s", h);
	cr_assert(strstr(h, "  --config FILE\n"), "%s", h);
	cr_assert(strstr(h, "  -h, --help\n"), "%s", h);
	/* every row is there, every line fits 79 columns, the long help wraps */
	for (size_t i = 0; i < NOPTS; i++)
		cr_assert(strstr(h, opts[i].help) || i == 6, "%s", opts[i].name);
	cr_assert(strstr(h, "        Heartbeat timeout. A member silent for longer than this is "
			    "declared\n        dead,"),
		  "%s", h);
	for (char *line = h, *nl; *line; line = nl + 1) {
		nl = strchr(line, '\n');
		cr_assert_not_null(nl);
		cr_assert_leq(nl - line, 79, "%.*s", (int)(nl - line), line);
	}
	free(h);
	h = help_of(ARGS("-h"), &rc);
	cr_assert_eq(rc, MR_CONFIG_HELP);
	free(h);
}

Test(config, set_format_roundtrip)
{
	struct fixture f, g;
	char buf[64];

	setup(&f);
	cr_assert_eq(run(&f, ARGS("--ratio", "0.1", "--timeout", "90s", "--grace", "1500ms",
				  "--job", "a b", "--mode", "runtime", "--no-fast")),
		     0);
	setup(&g);
	for (size_t i = 0; i < NOPTS; i++) {
		cr_assert_gt(mr_config_format(&f.c, opts[i].name, buf, sizeof(buf)), -1);
		cr_assert_eq(mr_config_set(&g.c, opts[i].name, buf, MR_CONFIG_SRC_API, NULL, &g.eb),
			     0, "%s: %s", opts[i].name, g.eb.msg);
	}
	cr_assert_eq(memcmp(&f.v, &g.v, offsetof(struct cfg, job)), 0);
	cr_assert_str_eq(g.v.job, "a b");
	cr_assert_eq(g.v.timeout_ms, 90000);
	cr_assert_eq(g.v.ratio, 0.1);
	cr_assert_eq(mr_config_format(&f.c, "timeout", buf, sizeof(buf)), 3);
	cr_assert_str_eq(buf, "90s");
	cr_assert_eq(mr_config_format(&f.c, "grace", buf, sizeof(buf)), 6);
	cr_assert_str_eq(buf, "1500ms");
	cr_assert_eq(mr_config_format(&f.c, "nope", buf, sizeof(buf)), MR_ENOTFOUND);
	cr_assert_eq(mr_config_source(&g.c, "port"), MR_CONFIG_SRC_API);
	cr_assert_eq(mr_config_set(&g.c, "port", "x", MR_CONFIG_SRC_API, "PET_NNODES", &g.eb),
		     MR_EPARSE);
	cr_assert_str_eq(g.eb.msg, "PET_NNODES: 'x' is not an integer");
	mr_errbuf_clear(&g.eb);
	cr_assert_eq(mr_config_set(&g.c, "nope", "1", MR_CONFIG_SRC_API, NULL, &g.eb),
		     MR_ENOTFOUND);
	cr_assert_str_eq(mr_config_source_name(MR_CONFIG_SRC_ENV), "env");
	mr_config_release(&f.c);
	mr_config_release(&g.c);
}

Test(config, bad_tables)
{
	struct cfg v;
	struct mr_config c;
	struct mr_errbuf eb = {{0}, {0}};
	const struct mr_config_opt bad_default[] = {
		MR_CONFIG_INT("port", struct cfg, port, "abc", 0, 10, "P."),
	};
	const struct mr_config_opt bad_bounds[] = {
		MR_CONFIG_INT("port", struct cfg, port, NULL, 10, 0, "P."),
	};
	const struct mr_config_opt dup[] = {
		MR_CONFIG_INT("port", struct cfg, port, NULL, 0, 10, "P."),
		MR_CONFIG_INT("port", struct cfg, port, NULL, 0, 10, "P."),
	};
	const struct mr_config_opt reserved[] = {
		MR_CONFIG_STRING("config", struct cfg, job, NULL, "C."),
	};
	const struct mr_config_opt bad_name[] = {
		MR_CONFIG_INT("Port", struct cfg, port, NULL, 0, 10, "P."),
	};

	cr_assert_eq(mr_config_init(&c, bad_default, 1, &v, &eb), MR_EPARSE);
	cr_assert_str_eq(eb.msg, "default of 'port': 'abc' is not an integer");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_config_init(&c, bad_bounds, 1, &v, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "option 'port': bounds are not valid");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_config_init(&c, dup, 2, &v, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "option 'port': name, flag or env var is repeated");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_config_init(&c, reserved, 1, &v, &eb), MR_EINVAL);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_config_init(&c, bad_name, 1, &v, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "option 0: name 'Port' is not valid");
	mr_config_release(&c);
}

Test(config, overridden_flag_and_env)
{
	struct cfg v;
	struct mr_config c;
	struct mr_errbuf eb = {{0}, {0}};
	const struct mr_config_opt t[] = {
		{.name = "nnodes", .type = MR_CONFIG_T_INT, .offset = offsetof(struct cfg, port),
		 .size = sizeof(int), .def = "1", .min = 1, .max = 100, .help = "Nodes.",
		 .flag = "--nodes", .env = "PET_NNODES"},
		{.name = "secret", .type = MR_CONFIG_T_STRING, .offset = offsetof(struct cfg, job),
		 .size = sizeof(v.job), .help = "No env var.", .env = ""},
	};
	char *argv[] = {"prog", "--nodes", "3", NULL};

	setenv("PET_NNODES", "2", 1);
	setenv("MESHRUN_SECRET", "leak", 1);
	cr_assert_eq(mr_config_init(&c, t, 2, &v, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_config_parse(&c, 1, argv, &eb), 0, "%s", eb.msg);
	cr_assert_eq(v.port, 2);
	cr_assert_str_eq(v.job, "");
	cr_assert_eq(mr_config_parse(&c, 3, argv, &eb), 0, "%s", eb.msg);
	cr_assert_eq(v.port, 3);
	mr_config_release(&c);
}
