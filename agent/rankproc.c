/*
 * rankproc.c - a rank in a worker process of its own; see rankproc.h.
 */
#include "rankproc.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec.h"
#include "mr_file.h"
#include "mr_gpt_worker.h"
#include "mr_log.h"

#define WORKER_FD 3
#define PROGRESS_MS 200

enum { REC_STATS = 1, REC_PROGRESS = 2, REC_END = 3 };

struct rec_hdr {
	uint32_t kind, len;
};

/* The largest payload: END's code and reason. */
#define REC_MAX (sizeof(int32_t) + MR_ERRBUF_SIZE)
_Static_assert(sizeof(struct mr_worker_stats) <= REC_MAX, "STATS fits a record");
_Static_assert(sizeof(struct mr_worker_progress) <= REC_MAX + 4096, "PROGRESS fits");

/* The workloads a worker process can run, by struct mr_worker_ops.name. */
static const struct mr_worker_ops *const workloads[] = { &mr_gpt_worker };

/* Reads exactly len bytes; -1 at EOF or on an error. */
static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* ---- the agent's side ---- */

int mr__rankproc_prepare(struct mr_inproc *ip, struct mr_errbuf *eb)
{
	ssize_t n = readlink("/proc/self/exe", ip->exe, sizeof(ip->exe) - 1);

	if (n <= 0)
		return mr_errf(eb, MR_ESYS, "unable to find this program (/proc/self/exe) to "
					    "start rank workers: %s",
			       strerror(errno));
	ip->exe[n] = '\0';
	if (ip->kill_ms < 1000)
		ip->kill_ms = 1000;
	return 0;
}

/* What the worker needs to know, as one JSON object. */
static char *describe(const struct mr_inproc_rank *r)
{
	const struct mr_worker_env *e = &r->env;
	const struct mr_rdzv_opts *k = &r->owner->kvopts;
	json_t *d = json_pack(
		"{s:s, s:i, s:i, s:O?, s:{s:s?, s:s?, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, "
		"s:i, s:i, s:i, s:i, s:s?, s:s?, s:s?}, s:{s:s?, s:s?, s:s?, s:s?, s:s?, s:i, "
		"s:s?, s:I}}",
		"workload", r->owner->ops->name, "log_level", mr__log_level, "log_format",
		(int)mr_log_get_format(), "config",
		(json_t *)e->config, "env", "job", e->job, "run_id", e->run_id, "generation",
		e->generation, "restart_count", e->restart_count, "rank", e->rank, "world_size",
		e->world_size, "local_rank", e->local_rank, "local_world_size",
		e->local_world_size, "node_rank", e->node_rank, "num_nodes", e->num_nodes, "tp",
		e->tp, "pp", e->pp, "cp", e->cp, "ep", e->ep, "dp", e->dp, "host", e->host,
		"host_id", e->host_id, "checkpoint_dir", e->checkpoint_dir, "kv", "controller",
		k->controller, "job", k->job, "node_id", k->node_id, "host", k->host, "host_id",
		k->host_id, "pod_index", k->pod_index, "token", k->token, "call_timeout_ms",
		(json_int_t)k->call_timeout_ms);
	char *text = d ? json_dumps(d, JSON_COMPACT) : NULL;

	json_decref(d);
	return text;
}

/* Forks and executes the worker with fd as its WORKER_FD. Between fork
 * and execv: async-signal-safe calls only. */
static pid_t spawn(const char *exe, int fd)
{
	char *argv[] = { (char *)exe, MR_RANK_WORKER_ARG, NULL };
	pid_t parent = getpid(), pid = mr_exec_fork();

	if (pid != 0)
		return pid;
	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(128 + SIGKILL);
	if (fd == WORKER_FD ? fcntl(fd, F_SETFD, 0) < 0 : dup2(fd, WORKER_FD) < 0)
		_exit(126);
	close_range(WORKER_FD + 1, ~0U, 0);
	execv(exe, argv);
	_exit(127);
}

/* One record from the worker into r; END's code into *code. */
static void take(struct mr_inproc_rank *r, const struct rec_hdr *h, const char *p, int *code)
{
	pthread_mutex_lock(&r->lock);
	if (h->kind == REC_STATS && h->len == sizeof(r->stats)) {
		memcpy(&r->stats, p, sizeof(r->stats));
	} else if (h->kind == REC_PROGRESS && h->len == sizeof(r->progress)) {
		memcpy(&r->progress, p, sizeof(r->progress));
		r->has_progress = 1;
	} else if (h->kind == REC_PROGRESS) {
		r->has_progress = 0;
	} else if (h->kind == REC_END && h->len >= sizeof(int32_t)) {
		int32_t c;

		memcpy(&c, p, sizeof(c));
		*code = c;
		snprintf(r->err, sizeof(r->err), "%.*s", (int)(h->len - sizeof(c)), p + sizeof(c));
	}
	pthread_mutex_unlock(&r->lock);
}

/* The shell's code for a worker that ended without END. */
static int died(struct mr_inproc_rank *r, pid_t pid, int status, int killed)
{
	int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status)
		   : WIFEXITED(status) && WEXITSTATUS(status) ? WEXITSTATUS(status)
							      : 1;

	if (WIFSIGNALED(status))
		snprintf(r->err, sizeof(r->err), "worker process %d was killed by signal %d%s",
			 (int)pid, WTERMSIG(status), killed ? " (it outlived its abort)" : "");
	else
		snprintf(r->err, sizeof(r->err), "worker process %d exited with %d before it "
						 "reported an end",
			 (int)pid, code);
	if (!killed)
		mr_log_error("worker_process_died", "pid=%d code=%d msg=%s", (int)pid, code,
			     mr_log_q(r->err));
	return code;
}

int mr__rankproc_run(struct mr_inproc_rank *r)
{
	struct mr_inproc *ip = r->owner;
	char *text = describe(r), buf[REC_MAX + 4096];
	long long abort_at = 0;
	int sv[2], code = -1, killed = 0, status = 0;
	uint32_t len;
	pid_t pid;

	mr_log_set_rank(r->env.rank);
	if (!text || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		snprintf(r->err, sizeof(r->err), "unable to prepare the worker process: %s",
			 text ? strerror(errno) : "out of memory");
		free(text);
		mr_log_error("worker_failed", "err=%s msg=%s", mr_err_name(MR_ESYS),
			     mr_log_q(r->err));
		return 1;
	}
	pid = spawn(ip->exe, sv[1]);
	close(sv[1]);
	if (pid < 0) {
		snprintf(r->err, sizeof(r->err), "unable to start the worker process: %s",
			 strerror(errno));
		free(text);
		close(sv[0]);
		mr_log_error("worker_failed", "err=%s msg=%s", mr_err_name(MR_ESYS),
			     mr_log_q(r->err));
		return 1;
	}
	setpgid(pid, pid); /* both sides, so no signal races the child */
	mr_log_info("worker_process_started", "pid=%d local_rank=%d", (int)pid,
		    r->env.local_rank);
	len = (uint32_t)strlen(text);
	/* a worker that died at once shows as EOF below */
	if (mr_file_write_all(sv[0], &len, sizeof(len)) == 0)
		(void)mr_file_write_all(sv[0], text, len);
	free(text);
	pthread_mutex_lock(&r->lock);
	r->pid = pid;
	r->sock = sv[0];
	if (atomic_load(&ip->aborting)) /* the abort that came before the socket */
		mr__rankproc_tell(r, 'a');
	pthread_mutex_unlock(&r->lock);
	for (;;) {
		struct pollfd p = { sv[0], POLLIN, 0 };
		struct rec_hdr h;
		int n = poll(&p, 1, 250);

		if (n < 0 && errno != EINTR)
			break;
		if (atomic_load(&ip->aborting) && !abort_at)
			abort_at = mr__inproc_now_ms();
		if (abort_at && !killed && mr__inproc_now_ms() - abort_at > ip->kill_ms) {
			mr_log_warn("worker_process_killed", "pid=%d reason=%s", (int)pid,
				    mr_log_q("still running after its abort"));
			kill(pid, SIGKILL);
			killed = 1;
		}
		if (n <= 0)
			continue;
		if (read_all(sv[0], &h, sizeof(h)) < 0 || h.len > sizeof(buf) ||
		    read_all(sv[0], buf, h.len) < 0)
			break; /* EOF: it exited (or broke the protocol, and is stopped) */
		take(r, &h, buf, &code);
	}
	pthread_mutex_lock(&r->lock);
	r->sock = -1;
	r->has_progress = 0;
	pthread_mutex_unlock(&r->lock);
	close(sv[0]); /* a worker still running takes it as an abort */
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return code >= 0 ? code : died(r, pid, status, killed);
}

void mr__rankproc_tell(struct mr_inproc_rank *r, char what)
{
	if (r->sock >= 0)
		(void)send(r->sock, &what, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* ---- the worker's side ---- */

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static const struct mr_worker_ops *w_ops;
static void *w_state;
static atomic_int w_aborting;

static void send_rec(uint32_t kind, const void *a, size_t alen, const void *b, size_t blen)
{
	struct rec_hdr h = { kind, (uint32_t)(alen + blen) };

	pthread_mutex_lock(&out_lock);
	/* the agent gone: the control thread sees EOF and aborts */
	if (mr_file_write_all(WORKER_FD, &h, sizeof(h)) == 0 &&
	    mr_file_write_all(WORKER_FD, a, alen) == 0 && blen)
		(void)mr_file_write_all(WORKER_FD, b, blen);
	pthread_mutex_unlock(&out_lock);
}

static void worker_state(void *arg, void *state)
{
	(void)arg;
	pthread_mutex_lock(&state_lock);
	w_state = state;
	pthread_mutex_unlock(&state_lock);
	if (!state)
		send_rec(REC_PROGRESS, "", 0, NULL, 0);
}

static void worker_stats(void *arg, const struct mr_worker_stats *st)
{
	(void)arg;
	send_rec(REC_STATS, st, sizeof(*st), NULL, 0);
}

/* Carries out the agent's requests; reports progress between them. */
static void *control_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct pollfd p = { WORKER_FD, POLLIN, 0 };
		struct mr_worker_progress pr;
		int n = poll(&p, 1, PROGRESS_MS), have = 0;

		if (n < 0 && errno == EINTR)
			continue;
		if (n != 0) {
			char c = 'a';
			ssize_t k = n > 0 ? read(WORKER_FD, &c, 1) : -1;

			if (k < 0 && errno == EINTR)
				continue;
			pthread_mutex_lock(&state_lock);
			if (k <= 0 || c == 'a')
				atomic_store(&w_aborting, 1);
			if (w_state && c == 'p' && k > 0)
				(w_ops->preempt ? w_ops->preempt : w_ops->abort)(w_state);
			else if (w_state && atomic_load(&w_aborting))
				w_ops->abort(w_state);
			pthread_mutex_unlock(&state_lock);
			if (k <= 0)
				return NULL; /* the agent is gone: the run unwinds */
			continue;
		}
		pthread_mutex_lock(&state_lock);
		if (w_state && w_ops->progress) {
			w_ops->progress(w_state, &pr);
			have = 1;
		}
		pthread_mutex_unlock(&state_lock);
		if (have)
			send_rec(REC_PROGRESS, &pr, sizeof(pr), NULL, 0);
	}
}

static const char *str(const json_t *o, const char *key)
{
	return json_string_value(json_object_get(o, key));
}

static int num(const json_t *o, const char *key)
{
	return (int)json_integer_value(json_object_get(o, key));
}

int mr_rank_worker_main(void)
{
	static const struct mr__rank_sink sink = { NULL, worker_state, worker_stats };
	struct mr_worker_env env;
	struct mr_rdzv_opts kv;
	char err[MR_ERRBUF_SIZE], *text;
	json_t *d, *e, *k;
	pthread_t ctl;
	uint32_t len;
	int32_t code;

	signal(SIGPIPE, SIG_IGN);
	if (read_all(WORKER_FD, &len, sizeof(len)) < 0 || len > (64u << 20) ||
	    !(text = malloc(len)) || read_all(WORKER_FD, text, len) < 0) {
		fprintf(stderr, "meshrun: " MR_RANK_WORKER_ARG " runs only as the agent's worker "
				"(fd %d: its socket)\n",
			WORKER_FD);
		return 2;
	}
	d = json_loadb(text, len, 0, NULL);
	free(text);
	e = json_object_get(d, "env");
	k = json_object_get(d, "kv");
	for (size_t i = 0; d && i < sizeof(workloads) / sizeof(workloads[0]); i++)
		if (!strcmp(workloads[i]->name, str(d, "workload") ? str(d, "workload") : ""))
			w_ops = workloads[i];
	if (!w_ops || !json_is_object(e) || !json_is_object(k)) {
		fprintf(stderr, "meshrun: " MR_RANK_WORKER_ARG ": the agent's description is not "
				"one this program understands\n");
		return 2;
	}
	mr_log_init("agent", (enum mr_log_level)num(d, "log_level"));
	mr_log_set_format((enum mr_log_format)num(d, "log_format"));
	mr_log_set_job(str(e, "job"));
	env = (struct mr_worker_env){
		.job = str(e, "job"), .run_id = str(e, "run_id"),
		.generation = num(e, "generation"), .restart_count = num(e, "restart_count"),
		.rank = num(e, "rank"), .world_size = num(e, "world_size"),
		.local_rank = num(e, "local_rank"), .local_world_size = num(e, "local_world_size"),
		.node_rank = num(e, "node_rank"), .num_nodes = num(e, "num_nodes"),
		.tp = num(e, "tp"), .pp = num(e, "pp"), .cp = num(e, "cp"), .ep = num(e, "ep"),
		.dp = num(e, "dp"), .host = str(e, "host"), .host_id = str(e, "host_id"),
		.checkpoint_dir = str(e, "checkpoint_dir"), .config = json_object_get(d, "config"),
		.cancel = &w_aborting,
	};
	kv = (struct mr_rdzv_opts){
		.controller = str(k, "controller"), .job = str(k, "job"),
		.node_id = str(k, "node_id"), .host = str(k, "host"), .host_id = str(k, "host_id"),
		.pod_index = num(k, "pod_index"), .token = str(k, "token"),
		.call_timeout_ms = (long)json_integer_value(json_object_get(k, "call_timeout_ms")),
	};
	if (json_is_null(env.config))
		env.config = NULL;
	if (pthread_create(&ctl, NULL, control_main, NULL) != 0) {
		fprintf(stderr, "meshrun: " MR_RANK_WORKER_ARG ": unable to start a thread\n");
		return 1;
	}
	pthread_detach(ctl);
	code = mr__rank_run(w_ops, &env, &kv, &w_aborting, &sink, err, sizeof(err));
	send_rec(REC_END, &code, sizeof(code), err, strlen(err));
	json_decref(d);
	return code;
}
