/*
 * mr_controller.h - the meshrun controller as a library: rendezvous, per-job
 * KV store, heartbeats, journal, metrics, served over HTTP (docs/API.md).
 *
 * mr_controller_start() locks opts.data_dir (one controller per dir),
 * replays and compacts the journal in it, then serves on
 * opts.listen:opts.port from one loop thread (mr_httpd); all controller
 * state lives on that thread. meshrun-controller (main.c) embeds it;
 * `meshrun local` runs that binary on a temporary dir.
 *
 * Ownership: opts is copied; the controller reads its token files once at
 * start. mr_controller_stop() answers suspended requests 503 and frees it.
 *
 * Non-goals: TLS, multiple controllers (no replication), running as a
 * Kubernetes operator.
 */
#ifndef MR_CONTROLLER_H
#define MR_CONTROLLER_H

#include <stdint.h>

#include "mr_config.h"
#include "mr_err.h"

struct mr_controller_opts {
	char listen[256];
	int port;
	char port_file[1024];
	char data_dir[1024];
	char token_file[1024];
	char read_token_file[1024];
	char tls_cert[1024], tls_key[1024], tls_client_ca[1024]; /* "" = plain HTTP */
	char token[256]; /* MESHRUN_TOKEN; the file wins when both are set */
	int fsync;
	int journal_recover;          /* keep the valid prefix of a corrupt journal */
	int journal_compact_factor;   /* compact while running past factor x snapshot; 0 = off */
	int64_t journal_compact_min;  /* ... and past this many bytes */
	int64_t max_body;
	int64_t max_value;
	int max_keys;
	int max_members;
	int max_jobs;
	int max_connections;
	int per_ip_connections;
	int64_t idle_timeout_ms;
	int conn_memory;
	int64_t last_call_ms;      /* defaults for jobs whose spec omits them */
	int64_t heartbeat_timeout_ms;
	int max_restarts;
	int64_t hang_timeout_ms;   /* hang diagnosis: no progress this long (0 = off) */
	double straggler_factor;   /* straggler: busy time above factor x median (0 = off) */
	int log_level; /* index into mr_controller_log_levels */
	int log_format; /* enum mr_log_format */
};

extern const char *const mr_controller_log_levels[];

/* Exit status of meshrun-controller when the data dir cannot be used: a
 * corrupt journal, or a dir locked by another controller (same as a
 * usage error). */
#define MR_CONTROLLER_EXIT_DATA 2

/* The config table of the controller; main() and `meshrun local` use it. */
extern const struct mr_config_opt mr_controller_config[];
extern const size_t mr_controller_config_len;
/* Defaults as if parsed from an empty command line. */
int mr_controller_opts_default(struct mr_controller_opts *o, struct mr_errbuf *eb);

/* File descriptors the controller keeps besides its connections and
 * reserve slots: stdio, the listen socket, epoll and event fds, the
 * journal and its lock, compaction files; with room to spare. */
#define MR_CONTROLLER_FD_MARGIN 64
/* Raises the soft RLIMIT_NOFILE to the hard one where allowed, then fits
 * o->max_connections to it (cfg: the parsed table, to know whether it was
 * set): not set, it becomes at most the limit less the reserve slots and
 * MR_CONTROLLER_FD_MARGIN; set, it must fit, else MR_ERANGE with eb naming
 * the source (flag, env var, file), the value and the limit (exit 2).
 * Logs event=max_connections once. */
int mr_controller_fit_fds(struct mr_controller_opts *o, const struct mr_config *cfg,
			  struct mr_errbuf *eb);

struct mr_controller;

/*
 * Starts the controller. Errors (eb says what and where):
 *   MR_ECONFLICT  the data dir is locked by another controller
 *   MR_ECORRUPT   the journal is corrupt (and not opts.journal_recover)
 *   others        token files, the data dir, the port, memory
 * meshrun-controller exits MR_CONTROLLER_EXIT_DATA for the first two
 * (the data dir needs an operator, or the other controller to go), 1 for
 * the others.
 */
int mr_controller_start(struct mr_controller **out, const struct mr_controller_opts *opts,
			struct mr_errbuf *eb);
int mr_controller_port(const struct mr_controller *c);
/* NULL is a no-op. Not from the loop thread. */
void mr_controller_stop(struct mr_controller *c);

#endif
