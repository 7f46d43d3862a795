/*
 * options.c - the configuration table of meshrun-controller (flags,
 * MESHRUN_* env vars, JSON config file; see mr_config.h).
 *
 * Defaults are sized for one controller serving 100,000 agents: connection
 * and member limits above that, 3 KiB of header memory per connection.
 * The connection limit must also fit the process's file descriptors
 * (mr_controller_fit_fds below).
 *
 * Non-goals: validating combinations beyond bounds (start does that).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "mr_controller.h"
#include "mr_httpd.h"
#include "mr_log.h"

const char *const mr_controller_log_levels[] = { "debug", "info", "warn", "error", "off",
						 NULL };

#define O struct mr_controller_opts
const struct mr_config_opt mr_controller_config[] = {
	MR_CONFIG_STRING("listen", O, listen, "0.0.0.0", "Address to listen on."),
	MR_CONFIG_INT("port", O, port, "29400", 0, 65535,
		      "TCP port; 0 picks a free one (see --port-file)."),
	MR_CONFIG_STRING("port_file", O, port_file, "",
			 "Write the bound port to this file once listening."),
	MR_CONFIG_STRING("data_dir", O, data_dir, "./meshrun-data",
			 "Directory of the journal (created if missing), locked by one "
			 "controller at a time (a second exits 2). In Kubernetes mount a "
			 "ReadWriteOnce volume at /var/lib/meshrun, set this to it, and use a "
			 "Deployment with strategy Recreate."),
	MR_CONFIG_STRING("token_file", O, token_file, "",
			 "File holding the bearer token every write needs (and every read "
			 "under /v1 unless read_token_file is set); /healthz, /readyz and "
			 "/metrics need none."),
	MR_CONFIG_STRING("read_token_file", O, read_token_file, "",
			 "File holding an extra token that may only read (GET)."),
	MR_CONFIG_STRING("tls_cert", O, tls_cert, "",
			 "PEM certificate (chain) to serve HTTPS with, with tls_key; the files "
			 "are read again when they change (a rotated Secret)."),
	MR_CONFIG_STRING("tls_key", O, tls_key, "", "PEM private key of tls_cert."),
	MR_CONFIG_STRING("tls_client_ca", O, tls_client_ca, "",
			 "PEM CA: every request but /healthz and /readyz must then come with "
			 "a client certificate it signed."),
	MR_CONFIG_STRING("token", O, token, "",
			 "Bearer token (prefer MESHRUN_TOKEN or --token-file)."),
	MR_CONFIG_BOOL("fsync", O, fsync, "true",
		       "fdatasync the journal before replying to a mutation (turn off only "
		       "for benchmarks)."),
	MR_CONFIG_BOOL("journal_recover", O, journal_recover, "false",
		       "Start even if the journal is corrupt: keep the records before the "
		       "first bad one and drop the rest, after copying the original beside it "
		       "(journal.corrupt.<unix-time>; never overwritten). Without it a corrupt "
		       "journal stops the start (exit 2). Remove it once recovered."),
	MR_CONFIG_INT("journal_compact_factor", O, journal_compact_factor, "4", 0, 1000,
		      "Compact the journal while running when it grows past this many times "
		      "the size of its last snapshot (and past --journal-compact-min); "
		      "0 = only at start."),
	MR_CONFIG_INT("journal_compact_min", O, journal_compact_min, "67108864", 0,
		      (int64_t)1 << 40,
		      "Bytes the journal must exceed before it is compacted while running."),
	MR_CONFIG_INT("max_body", O, max_body, "1048576", 1024, 1 << 30,
		      "Largest request body in bytes (413 above)."),
	MR_CONFIG_INT("max_value", O, max_value, "65536", 1, 1 << 30,
		      "Largest KV value in bytes (413 above)."),
	MR_CONFIG_INT("max_keys", O, max_keys, "1048576", 1, 1 << 30, "KV keys per job."),
	MR_CONFIG_INT("max_members", O, max_members, "200000", 1, 1000000, "Members per job."),
	MR_CONFIG_INT("max_jobs", O, max_jobs, "10000", 1, 1000000, "Jobs per controller."),
	MR_CONFIG_INT("max_connections", O, max_connections, "120000", 1, 10000000,
		      "Concurrent HTTP connections. Each is a file descriptor: at start the "
		      "soft fd limit (RLIMIT_NOFILE) is raised to the hard one, and when this "
		      "is not set the default becomes what fits, at most 120000: the limit "
		      "less the 16 reserve slots for probes and 64 for the controller's own "
		      "files (event max_connections in the log). A value set here that does "
		      "not fit is refused (exit 2)."),
	MR_CONFIG_INT("per_ip_connections", O, per_ip_connections, "0", 0, 10000000,
		      "Concurrent connections per client address (0 = unlimited)."),
	MR_CONFIG_DURATION("idle_timeout", O, idle_timeout_ms, "30s", 1000, 3600000,
			   "Idle connections (slow clients) are closed after this; parked "
			   "long-polls are exempt. Whole seconds."),
	MR_CONFIG_INT("conn_memory", O, conn_memory, "3072", 1024, 1 << 20,
		      "Header memory per connection in bytes."),
	MR_CONFIG_DURATION("last_call", O, last_call_ms, "3s", 0, 3600000,
			   "Default last-call window of a job spec."),
	MR_CONFIG_DURATION("heartbeat_timeout", O, heartbeat_timeout_ms, "30s", 100, 3600000,
			   "Default heartbeat timeout of a job spec."),
	MR_CONFIG_INT("max_restarts", O, max_restarts, "3", 0, 1000000,
		      "Default max_restarts of a job spec."),
	MR_CONFIG_DURATION("hang_timeout", O, hang_timeout_ms, "30s", 0, 86400000,
			   "Default hang_timeout_ms of a job spec: a running job none of whose "
			   "ranks made progress this long is diagnosed and reported stuck "
			   "(event job_stuck, metric meshrun_job_stuck); 0 = never."),
	MR_CONFIG_DOUBLE("straggler_factor", O, straggler_factor, "1.5", 0, 100,
			 "Default straggler_factor of a job spec: a rank whose busy time per "
			 "step stays above this times the job's median is a straggler; 0 = "
			 "never, else at least 1.01."),
	MR_CONFIG_ENUM("log_level", O, log_level, "info", mr_controller_log_levels,
		       "Log level."),
	MR_CONFIG_ENUM("log_format", O, log_format, "logfmt", mr_log_format_names,
		       "Log lines: logfmt (key=value) or json (one object per line)."),
};
#undef O

const size_t mr_controller_config_len = sizeof(mr_controller_config) /
					sizeof(mr_controller_config[0]);

int mr_controller_opts_default(struct mr_controller_opts *o, struct mr_errbuf *eb)
{
	struct mr_config cfg;
	int err = mr_config_init(&cfg, mr_controller_config, mr_controller_config_len, o, eb);

	mr_config_release(&cfg);
	return err;
}

/* The source of max_connections as an error names it. */
static void source_of(const struct mr_config *cfg, char *buf, size_t cap)
{
	switch (mr_config_source(cfg, "max_connections")) {
	case MR_CONFIG_SRC_FLAG:
		snprintf(buf, cap, "--max-connections");
		break;
	case MR_CONFIG_SRC_ENV:
		snprintf(buf, cap, "MESHRUN_MAX_CONNECTIONS");
		break;
	case MR_CONFIG_SRC_FILE:
		snprintf(buf, cap, "%s: max_connections", cfg->config_path);
		break;
	default:
		snprintf(buf, cap, "max_connections");
	}
}

/* Raises the soft limit to the hard one where allowed; *rl is what holds
 * after. An infinite hard limit cannot be the soft one: then the kernel's
 * ceiling (fs.nr_open) is tried. */
static void raise_nofile(struct rlimit *rl)
{
	struct rlimit up = *rl;
	unsigned long long nr_open = 0;
	FILE *f;

	if (rl->rlim_cur == rl->rlim_max)
		return;
	up.rlim_cur = rl->rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &up) == 0) {
		*rl = up;
		return;
	}
	f = fopen("/proc/sys/fs/nr_open", "r");
	if (f && fscanf(f, "%llu", &nr_open) == 1 && nr_open > rl->rlim_cur) {
		up.rlim_cur = (rlim_t)nr_open;
		if (setrlimit(RLIMIT_NOFILE, &up) == 0)
			*rl = up;
	}
	if (f)
		fclose(f);
}

/*
 * An explicit value that does not fit is refused rather than clamped: it
 * states the load the controller must carry (the agents of a large job),
 * and a clamped controller would start fine and answer 503 to some of
 * them later, at scale, far from the cause. Refused, the pod fails at
 * deploy time with the flag, the value and the limit in its log, like any
 * other config error.
 */
int mr_controller_fit_fds(struct mr_controller_opts *o, const struct mr_config *cfg,
			  struct mr_errbuf *eb)
{
	const unsigned long long keep = MR_HTTPD_RESERVE_DEFAULT + MR_CONTROLLER_FD_MARGIN;
	int set = mr_config_is_set(cfg, "max_connections");
	const char *how = "default";
	unsigned long long lim, fit;
	struct rlimit rl;
	char src[1100];

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return mr_errf(eb, MR_ESYS, "unable to read the file descriptor limit: %s",
			       strerror(errno));
	raise_nofile(&rl);
	lim = rl.rlim_cur == RLIM_INFINITY ? ~0ull : (unsigned long long)rl.rlim_cur;
	fit = lim > keep ? lim - keep : 0;
	source_of(cfg, src, sizeof(src));
	if (set && (unsigned long long)o->max_connections > fit)
		return mr_errf_field(eb, MR_ERANGE, src,
				     "%s: %d connections do not fit the file descriptor limit "
				     "%llu (%llu more are kept for the %d reserve slots and the "
				     "controller's own files): set at most %llu, or raise the "
				     "limit (ulimit -n, the container runtime's nofile)",
				     src, o->max_connections, lim, keep, MR_HTTPD_RESERVE_DEFAULT,
				     fit);
	if (!set && fit < 1)
		return mr_errf_field(eb, MR_ERANGE, src,
				     "the file descriptor limit %llu leaves no room for "
				     "connections: it must exceed %llu",
				     lim, keep);
	if (set)
		how = mr_config_source_name(mr_config_source(cfg, "max_connections"));
	if (!set && fit < (unsigned long long)o->max_connections) {
		o->max_connections = (int)fit;
		how = "fd_limit";
	}
	mr_log_info("max_connections",
		    "value=%d source=%s fd_limit=%llu fd_hard=%llu reserve=%d fd_margin=%d",
		    o->max_connections, how, lim,
		    rl.rlim_max == RLIM_INFINITY ? ~0ull : (unsigned long long)rl.rlim_max,
		    MR_HTTPD_RESERVE_DEFAULT, MR_CONTROLLER_FD_MARGIN);
	return 0;
}
