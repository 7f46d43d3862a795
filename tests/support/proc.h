/*
 * proc.h - helpers for integration tests that run real meshrun binaries.
 *
 * Spawn a binary from $MESHRUN_BUILD (set by scripts/test.sh; falls back to
 * "build") with extra arguments and environment, capture its stderr to a
 * file, wait for the port it writes with --port-file, send signals, and
 * reap it with a timeout (SIGKILL past it), so no test leaves a process
 * behind. A child gets SIGKILL when the test process dies (PR_SET_PDEATHSIG),
 * so a failed assertion does not orphan a server.
 *
 * Ownership: struct mr_proc is the caller's; mr_proc_reap() must be called
 * once per spawned process (mr_proc_stop() does kill + reap).
 *
 * Non-goals: pipes to stdin/stdout, process groups, portability beyond Linux.
 */
#ifndef MR_TEST_PROC_H
#define MR_TEST_PROC_H

#include <stdarg.h>
#include <stddef.h>
#include <sys/types.h>

struct mr_proc {
	pid_t pid;      /* 0 = not running */
	int status;     /* wait status after reap */
	char log[512];  /* stderr+stdout of the child, "" = inherited */
};

/* Directory holding the build outputs (absolute if MESHRUN_BUILD is). */
const char *mr_proc_build_dir(void);

/* Starts $MESHRUN_BUILD/<bin> (or bin itself when absolute) with args (NULL-terminated, may be NULL) and
 * extra env entries "K=V" (NULL-terminated, may be NULL) on top of the
 * current environment. Output goes to log_path (NULL = inherit). 0 or -1. */
int mr_proc_spawn(struct mr_proc *p, const char *bin, const char *const *args,
		  const char *const *env, const char *log_path);

/* Waits until path holds a port number (as written by --port-file) and the
 * process is still alive; returns the port or -1 after timeout_ms. */
int mr_proc_wait_port(struct mr_proc *p, const char *path, int timeout_ms);

int mr_proc_kill(struct mr_proc *p, int sig);
/* Waits for exit up to timeout_ms, then SIGKILLs and waits. Returns 0 if it
 * exited by itself in time, 1 if it had to be killed, -1 if not running. */
int mr_proc_reap(struct mr_proc *p, int timeout_ms);
/* SIGTERM + reap (5 s). */
void mr_proc_stop(struct mr_proc *p);
/* 1 while the process runs (not yet exited). */
int mr_proc_alive(struct mr_proc *p);

/* ---- raw HTTP over a socket, for what a client library would not send ---- */

/* A TCP connection to 127.0.0.1:port; the fd, or -1. */
int mr_test_connect(int port);
/* The same, failing the test when the connection cannot be made. */
int mr_test_connect_ok(int port);
/* Reads from fd until the peer closes it or 10 s pass without data into
 * buf (NUL-terminated); returns the bytes read. */
size_t mr_test_read_all(int fd, char *buf, size_t cap);
/* Sends req (text) on a new connection and reads the reply until the
 * server closes it (see mr_test_read_all); returns the HTTP status, 0 if
 * there was none (or -1 when the connection failed). */
int mr_test_raw_request(int port, const char *req, char *buf, size_t cap);

/* Makes a fresh directory under /tmp, prefix like "mr-ctl"; writes its path
 * into buf. 0 or -1. */
int mr_test_tmpdir(char *buf, size_t cap, const char *prefix);
/* rm -r of a directory (made by mr_test_tmpdir). */
void mr_test_rmdir(const char *dir);
/* The test's scratch directory: a fresh mr_test_tmpdir removed when the
 * process exits (Criterion runs each test in a process of its own). The
 * path stays valid; NULL when it cannot be made. */
const char *mr_test_scratch(const char *prefix);
/* The last cap - 1 bytes of the file at path into buf ("" when absent):
 * a log's end for a failure message. */
void mr_test_tail(const char *path, char *buf, size_t cap);
/* The absolute path of rel (e.g. "scripts/pods.sh"), a file of the
 * repository, found in the build directory's parents; rel itself when
 * none has it. Static storage: valid until the next call. */
const char *mr_test_repo_file(const char *rel);
/* Monotonic milliseconds. */
long long mr_test_now_ms(void);
/* A Criterion test option: skipped by the sanitizer pass of make test
 * (MR_SANITIZED), for a test whose code paths another test runs there. */
#ifdef MR_SANITIZED
#define MR_NOT_UNDER_SAN .disabled = 1
#else
#define MR_NOT_UNDER_SAN .disabled = 0
#endif
/* A whole file, NUL-terminated (malloc'd), its length in *len (may be
 * NULL); NULL when it cannot be read. */
char *mr_test_slurp(const char *path, size_t *len);
/* A shell command (printf format) run in dir: stdout and stderr together
 * in *out (malloc'd; out NULL: dropped), the exit code returned (-1: no
 * exit). A sanitizer report in the output fails the test. */
int mr_test_sh(const char *dir, char **out, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int mr_test_vsh(const char *dir, char **out, const char *fmt, va_list ap)
	__attribute__((format(printf, 3, 0)));

#endif

/* ---- a small blocking HTTP client for tests (libcurl) ---- */
struct mr_test_resp {
	long status;     /* 0 = transport error (refused, timeout) */
	char body[65536 + 1]; /* NUL-terminated; truncated past the buffer */
	size_t len;
	char etag[64];
};

/* method "GET"/"POST"/...; url absolute; body may be NULL; hdrs is a
 * NULL-terminated list of "Name: value" (may be NULL). timeout_ms bounds the
 * whole call. Returns r->status. */
long mr_test_http(struct mr_test_resp *r, const char *method, const char *url,
		  const void *body, size_t len, const char *const *hdrs, long timeout_ms);
