/*
 * rdzv.c - rendezvous benchmark: N simulated agents against one controller.
 *
 * One thread, one epoll set (level-triggered: one recv per response),
 * non-blocking keep-alive sockets and a minimal hand-written HTTP/1.1
 * client (request writer, response parser with Content-Length). Two
 * scenarios.
 *
 * Rendezvous (default). Each agent runs the sequence an agent runs at
 * start-up:
 *
 *   POST join -> GET wait (long-poll) -> PUT kv peer/<rank>
 *   -> GET kv peer/<(rank+1)%world>?wait_ms -> POST heartbeat -> close
 *
 * after the job was created with min_nodes = max_nodes = N (the round closes
 * exactly when the last agent joins). Every reply is checked: distinct ranks
 * in [0,N) ordered by pod index, world_size == N, one generation, and each
 * KV get returns exactly the value the neighbour put.
 *
 * Recovery (--recover timeout|leave). N members run, one of them (the
 * victim, pod index --victim) dies, and the bench times how long it takes
 * until every survivor holds its rank in the new generation. The job is
 * elastic (min_nodes N-1, max_nodes N); the controller carries the live
 * survivors into the new round, so it closes with the N-1 of them once
 * its last-call window (--last-call) after the death has passed. Each
 * survivor makes the calls a real agent makes (agent/rdzv.c, rdzv_hb.c,
 * supervisor.c), with the same bodies:
 *
 *   POST join (with the job spec) -> GET wait -> POST heartbeat
 *   -> GET kv/meshrun/watch?generation=G&wait_ms&node_id (the heartbeat
 *      thread's watch, parked; 409 when the generation ends, whose
 *      "member" says the survivor is waiting in G+1 - or running there
 *      with its new rank once the round closed: then it is done; on a
 *      timeout the thread beats and parks it again)
 *   -> GET wait?generation=G+1&timeout_ms=1000 (the supervisor's slice,
 *      called again while "waiting") -> its new rank
 *
 * With --rejoin survivors ignore "member" and join again after the 409
 * (POST join, then the wait), as agents did before the carry.
 *
 * The victim joins first, alone, on a connection of its own, long-polls
 * its wait and beats once. With "timeout" that beat is its last call (its
 * connection is closed: a killed pod) and the controller declares it dead
 * heartbeat_timeout after it. 55 % of that timeout after the victim's
 * last call every survivor beats once more (a real agent beats every
 * heartbeat_timeout / 4; this beat keeps a survivor younger than the
 * victim in the controller's expiry order, and heard from within the last
 * half timeout when the victim dies, as the controller wants of a member
 * it carries; it leaves 45 % of the timeout to spare). With "leave" the
 * victim leaves once
 * every connection has sent its watch (what an agent does on SIGTERM: a
 * deleted pod). The last survivor's first join is held until the other
 * N-1 are in, so the first round closes with all N (max_nodes reached),
 * never by its last call. While waiting for the death the controller is
 * quiet: the survivors' watches are parked (a real agent parks its watch
 * until its next beat is due and then beats again; here a watch that runs
 * out is followed by a beat too, but it parks for the whole timeout).
 *
 * Checked in recovery: the first round as above (world N, pod order, the
 * victim included), every 409 names the next generation and the job's
 * restart count (1 after a death, 0 after a leave) and, unless --rejoin,
 * the survivor as a member of it (waiting, or running with its rank),
 * every rejoin lands in the new generation, the survivors get distinct
 * ranks in [0, N-1) in pod
 * order (the victim's slot closed up), world and num_nodes N-1; at the end
 * the job's status says generation G+1, running, N-1 nodes and members.
 * recover seconds = the death (timeout: heartbeat_timeout after the reply
 * to the victim's last call, or the first 409 if that came earlier; leave:
 * the leave sent) -> the last survivor's new rank.
 *
 * Any failure makes the exit status non-zero.
 *
 * Normally every agent has its own connection. When the fd limit is below N
 * (a container without CAP_SYS_RESOURCE keeps the hard limit), agents share
 * connections: each connection runs its agents phase by phase (all joins,
 * then all waits, ...), which keeps the per-agent requests and the
 * controller's per-member work identical and cannot deadlock; the output
 * says how many agents rode on one connection. In recovery that means one
 * parked watch per connection: the connection's other agents send theirs
 * after it was answered, and get their 409 at once.
 *
 * With --controller-bin the bench starts the controller itself (fresh data
 * dir and token in a temp dir, port 0 + --port-file) and reports its CPU
 * seconds and its RSS: the high-water mark when every agent has its
 * rendezvous reply, and the resident size once they are "running".
 *
 * With --progress each heartbeat carries what an in-process agent sends for
 * hang diagnosis (docs/API.md, "Progress"): one rank with its step,
 * micro-batch, busy and step time and three communicators (tp, dp and
 * world of a tp=8 mesh, which the job then has), and once every agent is
 * done the bench asks for the job's diagnosis (O(ranks x groups) on the
 * controller) and reports how long it took. Compare the controller's CPU
 * seconds with and without.
 *
 * The last line is `rdzv N=<n> seconds=<s>` (seconds from the first connect
 * to the last rendezvous reply), or `rdzv_recover N=<n> seconds=<s>`.
 * Output lines are key=value for scripts.
 *
 * With --tls-ca FILE every connection speaks TLS (GnuTLS, the same
 * library the controller serves with): one handshake per connection,
 * the server verified against FILE, then the same requests. Give the
 * controller its certificate after "--" (--tls-cert, --tls-key);
 * scripts/bench-rdzv.sh does with RDZV_TLS=1.
 *
 * Non-goals: being an agent (no retries through controller restarts, no
 * communicators, no workers), chunked transfer encoding, IPv6.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WBUF 1024         /* one request */
#define RBUF 2048         /* one response */
#define MAX_FAIL_PRINT 8  /* failures printed in full */
#define MAX_RETRIES 8     /* reconnects per connection */
#define BASE_KIB (50 * 1024)
#define SLICE_MS 1000     /* the agent's wait slice (agent/supervisor_int.h) */
#define WATCH_KEY "meshrun/watch" /* the agent's watch key (agent/rdzv_int.h) */

/* What one step of an agent sends. */
enum kind {
	K_JOIN, K_WAIT, K_PUT, K_GET, K_HB, K_HB2, K_WATCH, K_REJOIN, K_REWAIT, K_LEAVE, NKINDS
};
static const char *const kind_name[NKINDS] = {
	"join", "wait", "kv_put", "kv_get", "heartbeat", "heartbeat2", "watch", "rejoin",
	"rewait", "leave"};

/* Sequences of steps: the rendezvous scenario, and recovery's survivors
 * and victim (K_HB2: the survivors' beat after the victim's last call). */
static const uint8_t seq_rdzv[] = {K_JOIN, K_WAIT, K_PUT, K_GET, K_HB};
static const uint8_t seq_survivor_timeout[] = {K_JOIN, K_WAIT, K_HB, K_HB2, K_WATCH, K_REWAIT};
static const uint8_t seq_survivor_leave[] = {K_JOIN, K_WAIT, K_HB, K_WATCH, K_REWAIT};
/* --rejoin: survivors that join again after the 409 (agents before the
 * controller carried members, or ones that ignore "member") */
static const uint8_t seq_survivor_timeout_rejoin[] = {K_JOIN,  K_WAIT,   K_HB,    K_HB2,
						      K_WATCH, K_REJOIN, K_REWAIT};
static const uint8_t seq_survivor_leave_rejoin[] = {K_JOIN,   K_WAIT,  K_HB,
						    K_WATCH, K_REJOIN, K_REWAIT};
static const uint8_t seq_victim_timeout[] = {K_JOIN, K_WAIT, K_HB};
static const uint8_t seq_victim_leave[] = {K_JOIN, K_WAIT, K_HB, K_LEAVE};

enum cstate { C_IDLE, C_CONNECTING, C_HANDSHAKE, C_OPEN, C_HELD, C_DONE, C_DEAD };
enum recover { REC_NONE, REC_TIMEOUT, REC_LEAVE };

struct opts {
	char host[64];
	int port;
	const char *controller_bin;
	char **ctl_extra; /* after "--": extra controller flags */
	int n_extra;
	int n;
	char job[128];
	char token[256];
	int sources;
	int concurrency;
	int conns; /* 0 = min(n, fd budget) */
	double timeout_s;
	int keep_tmp;
	int progress; /* heartbeats carry progress (3 groups, tp=8 mesh) */
	int recover;  /* enum recover */
	int victim;   /* pod index of the member that dies; -1 = N/2 */
	int rejoin;   /* survivors join again after the 409, ignoring "member" */
	int hb_timeout_ms, last_call_ms; /* recovery's job */
	const char *tls_ca; /* TLS to the controller, verified against this CA */
};

struct conn {
	int fd;
	int lo, cnt, idx; /* agents lo .. lo+cnt-1, the current one lo+idx */
	const uint8_t *seq;
	uint8_t nseq;
	uint8_t state, phase; /* phase: index into seq; nseq = done */
	uint8_t beat;         /* recovery's watch step: a heartbeat comes next */
	uint8_t reopen;       /* C_HELD without a socket: connect when released */
	uint8_t watching;     /* recovery: its first watch went out */
	uint8_t want_out;     /* polled for EPOLLOUT (connecting, or a send left bytes) */
	uint16_t retries;
	uint32_t wlen, woff, rlen;
	int64_t t_step; /* start of the current agent's phase step, ns */
	gnutls_session_t tls; /* --tls-ca: the connection's session, else NULL */
	char *buf;      /* WBUF + RBUF + 1, a slice of bench.bufs */
};

struct bench {
	struct opts o;
	int epfd;
	struct sockaddr_in dst;
	char auth[300];
	char jobpath[160];
	char spec[512];          /* recovery: the job spec an agent sends with join */
	struct conn *conns;      /* pool connections, then the victim's */
	char *bufs;              /* every connection's buffer, in one block: no
				  * malloc/free churn (glibc giving memory back
				  * costs a TLB shootdown on every CPU) */
	int nconns;              /* pool connections */
	int ntotal;              /* nconns + the victim's */
	int npool;               /* agents on pool connections */
	int next_conn, connecting, finished;
	int32_t *rank;           /* agent -> rank, -1 */
	int32_t *rank_agent;     /* rank -> agent, -1 */
	int64_t gen;
	uint32_t *lat[NKINDS];   /* microseconds */
	int nlat[NKINDS];
	int waits_done;
	int64_t t0, t_rdzv, t_end;
	long wait_again, get_again, reconnects;
	int failures;
	/* recovery (agents 0..N-2 survive; agent N-1 is the victim) */
	struct conn *victim;
	struct conn **held;      /* connections waiting for a gate (ntotal) */
	int nheld;
	int joins_ok, conns_watching, recovered, learned;
	int32_t *new_rank_agent; /* new rank -> agent, -1 */
	int64_t *t_learn, *t_new; /* agent -> when it got its 409 / its new rank */
	int64_t t_victim_last, t_pool, t_watching, t_death, t_first_stale, t_last_rejoin,
		t_recovered;
	long rewait_again, watch_timeouts, watch_beats;
	long carried_waiting, carried_running; /* 409s whose "member" said so */
	double cpu_watching_s, cpu_recovered_s, bench_cpu_watching_s, bench_cpu_recovered_s;
	double ucpu_watching_s, ucpu_recovered_s; /* the controller's user part */
	/* controller child */
	pid_t pid;
	char tmpdir[128];
	long hwm_wait_kib, rss_wait_kib, rss_idle_kib;
	double cpu_wait_s;
	double load_start; /* 1-minute load average: the machine may be shared */
	gnutls_certificate_credentials_t cred; /* --tls-ca */
	long handshakes;
};

/* ---- small helpers ---- */

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double secs(int64_t ns)
{
	return (double)ns / 1e9;
}

static void fail(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct bench *b, const char *fmt, ...)
{
	va_list ap;
	if (b->failures++ >= MAX_FAIL_PRINT)
		return;
	fputs("rdzv: FAIL ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* Finds "key" : <value> in a flat JSON text (the first occurrence of the
 * key as a key, not as a string value); returns a pointer to the value. */
static const char *json_at(const char *body, const char *key)
{
	char pat[64];
	const char *p = body;
	int n = snprintf(pat, sizeof pat, "\"%s\"", key);
	if (n < 0 || (size_t)n >= sizeof pat)
		return NULL;
	while ((p = strstr(p, pat))) {
		p += n;
		while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
			p++;
		if (*p != ':')
			continue;
		p++;
		while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
			p++;
		return p;
	}
	return NULL;
}

static int json_long(const char *body, const char *key, long *out)
{
	const char *p = json_at(body, key);
	char *end;
	if (!p)
		return -1;
	*out = strtol(p, &end, 10);
	return end == p ? -1 : 0;
}

/* 1 if the string value of key equals want. */
static int json_str_is(const char *body, const char *key, const char *want)
{
	const char *p = json_at(body, key);
	size_t n = strlen(want);
	return p && *p == '"' && strncmp(p + 1, want, n) == 0 && p[1 + n] == '"';
}

/* Reads "Key:   123 kB" from /proc/<pid>/status; -1 if unknown. */
static long proc_status_kib(pid_t pid, const char *key)
{
	char path[64], line[256];
	long v = -1;
	size_t kl = strlen(key);
	FILE *f;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
			v = strtol(line + kl + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* utime + stime of pid in seconds from /proc/<pid>/stat (user gets utime
 * when not NULL); -1 if unknown. */
static double proc_cpu_split_s(pid_t pid, double *user)
{
	char path[64], buf[1024];
	unsigned long ut, st;
	const char *p;
	FILE *f;
	size_t n;
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	if (!(f = fopen(path, "r")))
		return -1;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	/* fields after the ")" of comm: state(3) ... utime(14) stime(15) */
	if (!(p = strrchr(buf, ')')) ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	if (user)
		*user = (double)ut / (double)sysconf(_SC_CLK_TCK);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double proc_cpu_s(pid_t pid)
{
	return proc_cpu_split_s(pid, NULL);
}

static double self_cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* ---- agents ---- */

/* The pod index of agent a: itself in the rendezvous scenario; in
 * recovery agents 0..N-2 are the survivors in pod order around the
 * victim's pod, agent N-1 the victim. A survivor's new rank is its agent
 * number. */
static int agent_pod(const struct bench *b, int a)
{
	if (!b->o.recover)
		return a;
	if (a == b->o.n - 1)
		return b->o.victim;
	return a < b->o.victim ? a : a + 1;
}

static void agent_value(char *out, size_t cap, int agent)
{
	snprintf(out, cap, "agent-%d@127.0.0.1:%d", agent, 29500 + agent % 30000);
}

static int cur_kind(const struct conn *c)
{
	return c->seq[c->phase];
}

/* ---- requests ---- */

/* The join body of agent/rdzv.c (mr_rdzv_join): node id, host, host id,
 * the health port, the pod index and the job spec. */
static int agent_join_body(struct bench *b, int pod, char *body, size_t cap)
{
	return snprintf(body, cap,
			"{\"node_id\":\"agent-%d\",\"host\":\"127.0.%d.%d\",\"host_id\":"
			"\"bench-boot-0123456789abcdef-ipc-%d\",\"ports\":{\"agent\":%d},"
			"\"pod_index\":%d,\"spec\":%s}",
			pod, pod / 250 % 250, 1 + pod % 250, pod, 29400 + pod % 30000, pod, b->spec);
}

/* Writes the request of the connection's current (phase, agent) to c->buf. */
static void build_request(struct bench *b, struct conn *c)
{
	int a = c->lo + c->idx, pod = agent_pod(b, a);
	char path[400], body[900];
	const char *method = "GET", *ctype = NULL;
	int blen = 0, n, kind = cur_kind(c);
	long wait_ms = (long)(b->o.timeout_s * 1000) + 60000;
	if (wait_ms > 300000)
		wait_ms = 300000;
	if ((kind == K_WATCH && c->beat) || kind == K_HB2)
		kind = K_HB; /* the heartbeat thread beats between watches */
	switch (kind) {
	case K_JOIN:
	case K_REJOIN:
		method = "POST";
		ctype = "application/json";
		snprintf(path, sizeof path, "%s/join", b->jobpath);
		if (b->o.recover)
			blen = agent_join_body(b, pod, body, sizeof body);
		else
			blen = snprintf(body, sizeof body,
					"{\"node_id\":\"agent-%d\",\"host\":\"127.0.0.1\","
					"\"ports\":{\"agent\":29400,\"comm\":%d},\"pod_index\":%d}",
					a, 29500 + a % 30000, a);
		break;
	case K_WAIT:
		snprintf(path, sizeof path, "%s/wait?node_id=agent-%d&generation=%lld&timeout_ms=%ld",
			 b->jobpath, pod, (long long)b->gen, wait_ms);
		break;
	case K_REWAIT:
		snprintf(path, sizeof path, "%s/wait?node_id=agent-%d&generation=%lld&timeout_ms=%d",
			 b->jobpath, pod, (long long)b->gen + 1, SLICE_MS);
		break;
	case K_WATCH:
		/* parked until the generation ends; the agent parks it until its
		 * next beat is due, the bench for the whole heartbeat timeout */
		snprintf(path, sizeof path,
			 "%s/kv/" WATCH_KEY "?generation=%lld&wait_ms=%d&node_id=agent-%d",
			 b->jobpath, (long long)b->gen,
			 b->o.hb_timeout_ms < 300000 ? b->o.hb_timeout_ms : 300000, pod);
		break;
	case K_LEAVE:
		method = "POST";
		ctype = "application/json";
		snprintf(path, sizeof path, "%s/leave", b->jobpath);
		blen = snprintf(body, sizeof body,
				"{\"node_id\":\"agent-%d\",\"generation\":%lld,"
				"\"reason\":\"agent stopped\"}",
				pod, (long long)b->gen);
		break;
	case K_PUT:
		method = "PUT";
		ctype = "application/octet-stream";
		snprintf(path, sizeof path, "%s/kv/peer/%d?generation=%lld", b->jobpath,
			 (int)b->rank[a], (long long)b->gen);
		agent_value(body, sizeof body, a);
		blen = (int)strlen(body);
		break;
	case K_GET:
		snprintf(path, sizeof path, "%s/kv/peer/%d?generation=%lld&wait_ms=%ld",
			 b->jobpath, (int)((b->rank[a] + 1) % b->o.n), (long long)b->gen, wait_ms);
		break;
	default:
		method = "POST";
		ctype = "application/json";
		snprintf(path, sizeof path, "%s/heartbeat", b->jobpath);
		if (b->o.progress) {
			/* rank r of tp=8: [kind, id, size, entered, op, peer, completed]
			 * for tp (kind 1), dp (3) and world (0); in dp's allreduce */
			int r = (int)b->rank[a];

			blen = snprintf(body, sizeof body,
					"{\"node_id\":\"agent-%d\",\"generation\":%lld,\"progress\":"
					"[{\"rank\":%d,\"step\":1200,\"micro\":3,\"busy_ms\":%.1f,"
					"\"step_ms\":1003.2,\"g\":[[1,%d,8,452100,1,-1,452100],"
					"[3,%d,%d,81200,1,-1,81199],[0,0,%d,1201,1,-1,1201]]}]}",
					a, (long long)b->gen, r, 800.0 + r % 17, r / 8, r % 8, b->o.n / 8,
					b->o.n);
		} else {
			blen = snprintf(body, sizeof body,
					"{\"node_id\":\"agent-%d\",\"generation\":%lld}", pod,
					(long long)b->gen);
		}
		break;
	}
	if (ctype)
		n = snprintf(c->buf, WBUF,
			     "%s %s HTTP/1.1\r\nHost: %s:%d\r\n%sContent-Type: %s\r\n"
			     "Content-Length: %d\r\n\r\n%s",
			     method, path, b->o.host, b->o.port, b->auth, ctype, blen, body);
	else
		n = snprintf(c->buf, WBUF, "%s %s HTTP/1.1\r\nHost: %s:%d\r\n%s\r\n", method, path,
			     b->o.host, b->o.port, b->auth);
	if (n >= WBUF)
		fail(b, "agent-%d %s: request of %d bytes does not fit %d", pod, kind_name[kind], n,
		     WBUF);
	c->wlen = (uint32_t)(n < WBUF ? n : WBUF - 1);
	c->woff = 0;
	if (kind == K_LEAVE)
		b->t_death = now_ns();
	if (cur_kind(c) == K_WATCH && !c->watching) {
		c->watching = 1;
		if (++b->conns_watching == b->nconns) {
			/* every connection has its watch out: the job runs, quietly */
			b->t_watching = now_ns();
			fprintf(stderr, "rdzv: every connection has its watch out, %.1f s after "
					"the victim's last call\n",
				secs(b->t_watching - b->t_victim_last));
			if (b->pid > 0)
				b->cpu_watching_s = proc_cpu_split_s(b->pid, &b->ucpu_watching_s);
			b->bench_cpu_watching_s = self_cpu_s();
		}
	}
}

/* ---- responses ---- */

struct resp {
	int status, close;
	char *body;
	size_t body_len;
};

/* >0: bytes of one whole response; 0: need more; -1: malformed or above
 * max bytes. */
static long parse_response(char *buf, size_t len, size_t max, struct resp *r)
{
	char *end = memmem(buf, len, "\r\n\r\n", 4), *line, *eol;
	long clen = -1;
	size_t hlen;
	if (!end)
		return len >= max ? -1 : 0;
	if (len < 12 || memcmp(buf, "HTTP/1.", 7) != 0)
		return -1;
	r->status = atoi(buf + 9);
	r->close = 0;
	for (line = (char *)memchr(buf, '\n', (size_t)(end - buf)) + 1; line < end; line = eol + 2) {
		eol = (char *)memmem(line, (size_t)(end + 2 - line), "\r\n", 2);
		if (strncasecmp(line, "content-length:", 15) == 0)
			clen = strtol(line + 15, NULL, 10);
		else if (strncasecmp(line, "connection:", 11) == 0 &&
			 memmem(line, (size_t)(eol - line), "close", 5))
			r->close = 1;
	}
	hlen = (size_t)(end + 4 - buf);
	if (clen < 0)
		clen = (r->status == 204 || r->status == 304) ? 0 : -1;
	if (clen < 0 || hlen + (size_t)clen > max)
		return -1;
	if (hlen + (size_t)clen > len)
		return 0;
	r->body = buf + hlen;
	r->body_len = (size_t)clen;
	return (long)(hlen + (size_t)clen);
}

static void sample_waiting(struct bench *b)
{
	b->t_rdzv = now_ns();
	if (b->pid > 0) {
		b->hwm_wait_kib = proc_status_kib(b->pid, "VmHWM");
		b->rss_wait_kib = proc_status_kib(b->pid, "VmRSS");
		b->cpu_wait_s = proc_cpu_s(b->pid);
	}
}

/* The restart count the job must report after the death. */
static long want_restarts(const struct bench *b)
{
	return b->o.recover == REC_TIMEOUT ? 1 : 0;
}

static int check_recovered(struct bench *b, int a, const char *body);

/* The 409's "member" (the watch names its node): a live survivor was
 * carried into the new round, so it is waiting there, or running with its
 * new rank once the round closed (checked like a wait's reply; it then
 * waits no more). */
static int check_member(struct bench *b, int a, const struct resp *r)
{
	const char *mem = json_at(r->body, "member");
	long gen;
	int rc;
	if (!mem || *mem != '{' || json_long(mem, "generation", &gen) < 0 ||
	    gen != b->gen + 1) {
		fail(b, "agent-%d watch: 409 '%.*s', want \"member\" in generation %lld "
			"(a live survivor is carried into the new round)",
		     agent_pod(b, a), (int)(r->body_len > 300 ? 300 : r->body_len), r->body,
		     (long long)b->gen + 1);
		return -1;
	}
	if (json_str_is(mem, "state", "waiting")) {
		b->carried_waiting++;
		return 1;
	}
	if (!json_str_is(mem, "state", "running"))
		return -2;
	rc = check_recovered(b, a, mem);
	if (rc > 0)
		b->carried_running++;
	return rc;
}

/* A survivor learned that the generation ended (409 on its watch or its
 * beat): it must name the next generation and the job's restarts. */
static int learned_stale(struct bench *b, int a, const struct resp *r)
{
	long gen, restarts;
	int64_t t = now_ns();
	if (!json_str_is(r->body, "code", "stale_generation") ||
	    json_long(r->body, "generation", &gen) < 0 ||
	    json_long(r->body, "restarts", &restarts) < 0 || gen != b->gen + 1 ||
	    restarts != want_restarts(b)) {
		fail(b, "agent-%d watch: 409 '%.*s', want stale_generation, generation %lld, "
			"restarts %ld",
		     agent_pod(b, a), (int)(r->body_len > 200 ? 200 : r->body_len), r->body,
		     (long long)b->gen + 1, want_restarts(b));
		return -1;
	}
	b->t_learn[a] = t;
	if (!b->t_first_stale) {
		b->t_first_stale = t;
		fprintf(stderr, "rdzv: the first survivor learned of generation %lld\n",
			(long long)b->gen + 1);
	}
	b->learned++;
	return b->o.rejoin ? 1 : check_member(b, a, r);
}

/* The first round's wait reply: rank = pod index, world N, generation G. */
static int check_running(struct bench *b, int a, const char *body)
{
	long gen, rank, world, node_rank;
	int pod = agent_pod(b, a);
	if (json_long(body, "rank_base", &rank) < 0 || json_long(body, "world_size", &world) < 0 ||
	    json_long(body, "node_rank", &node_rank) < 0 || json_long(body, "generation", &gen) < 0)
		return -2;
	if (world != b->o.n || gen != b->gen || rank < 0 || rank >= b->o.n || node_rank != rank) {
		fail(b, "agent-%d wait: rank %ld node_rank %ld world %ld generation %ld "
			"(want world %d generation %lld)",
		     pod, rank, node_rank, world, gen, b->o.n, (long long)b->gen);
		return -1;
	}
	if (b->rank_agent[rank] >= 0) {
		fail(b, "agent-%d wait: rank %ld already given to agent-%d", pod, rank,
		     agent_pod(b, b->rank_agent[rank]));
		return -1;
	}
	if (rank != pod) {
		fail(b, "agent-%d wait: rank %ld is not ordered by pod_index %d", pod, rank, pod);
		return -1;
	}
	b->rank[a] = (int32_t)rank;
	b->rank_agent[rank] = a;
	if (++b->waits_done == b->o.n)
		sample_waiting(b);
	return 1;
}

/* A survivor's wait in the new generation answered "running": generation
 * G+1, world and num_nodes N-1, a rank of its own in [0, N-1), in pod
 * order without the victim (= its agent number). */
static int check_recovered(struct bench *b, int a, const char *body)
{
	long gen, rank, world, nodes, node_rank, restarts;
	int pod = agent_pod(b, a), n1 = b->o.n - 1;
	if (json_long(body, "rank_base", &rank) < 0 || json_long(body, "world_size", &world) < 0 ||
	    json_long(body, "num_nodes", &nodes) < 0 || json_long(body, "node_rank", &node_rank) < 0 ||
	    json_long(body, "generation", &gen) < 0 || json_long(body, "restarts", &restarts) < 0)
		return -2;
	if (world != n1 || nodes != n1 || gen != b->gen + 1 || rank < 0 || rank >= n1 ||
	    node_rank != rank || restarts != want_restarts(b)) {
		fail(b, "agent-%d new round: rank %ld node_rank %ld world %ld num_nodes %ld "
			"generation %ld restarts %ld (want world %d generation %lld restarts %ld)",
		     pod, rank, node_rank, world, nodes, gen, restarts, n1, (long long)b->gen + 1,
		     want_restarts(b));
		return -1;
	}
	if (b->new_rank_agent[rank] >= 0) {
		fail(b, "agent-%d new round: rank %ld already given to agent-%d", pod, rank,
		     agent_pod(b, b->new_rank_agent[rank]));
		return -1;
	}
	if (rank != a) {
		fail(b, "agent-%d new round: rank %ld, want %d (pod order without pod %d)", pod, rank,
		     a, b->o.victim);
		return -1;
	}
	b->new_rank_agent[rank] = a;
	b->t_new[a] = now_ns();
	if (++b->recovered == n1) {
		b->t_recovered = b->t_new[a];
		if (b->pid > 0)
			b->cpu_recovered_s = proc_cpu_split_s(b->pid, &b->ucpu_recovered_s);
		b->bench_cpu_recovered_s = self_cpu_s();
	}
	return 1;
}

/* Checks one reply; 1 = step done, 0 = repeat the request, -1 = failure
 * (reported), -2 = unexpected reply (reported by the caller). */
static int handle_reply(struct bench *b, struct conn *c, const struct resp *r)
{
	int a = c->lo + c->idx, pod = agent_pod(b, a);
	const char *body = r->body;
	long gen, rank;
	char want[256];
	switch (cur_kind(c)) {
	case K_JOIN:
		if (r->status != 200 || json_long(body, "generation", &gen) < 0)
			return -2;
		if (b->gen < 0)
			b->gen = gen;
		if (gen != b->gen) {
			fail(b, "agent-%d join: generation %ld, others got %lld", pod, gen,
			     (long long)b->gen);
			return -1;
		}
		b->joins_ok++;
		return 1;
	case K_WAIT:
		if (r->status == 200 && json_str_is(body, "state", "waiting")) {
			b->wait_again++;
			return 0;
		}
		if (r->status != 200 || !json_str_is(body, "state", "running"))
			return -2;
		return check_running(b, a, body);
	case K_HB:
	case K_HB2:
		if (c == b->victim && r->status == 200) /* with "timeout", its last call: */
			b->t_victim_last = now_ns(); /* last seen no later than this */
		if (r->status == 409 && b->o.recover)
			fail(b, "agent-%d heartbeat: the generation ended before every survivor "
				"beat after the victim (raise --heartbeat-timeout)", pod);
		return r->status == 200 ? 1 : -2;
	case K_WATCH:
		if (r->status == 409) {
			c->beat = 0;
			return learned_stale(b, a, r);
		}
		if (c->beat && r->status == 200) { /* beaten: park the watch again */
			c->beat = 0;
			b->watch_beats++;
			return 0;
		}
		if (!c->beat && r->status == 404 && json_str_is(body, "code", "wait_timeout")) {
			c->beat = 1; /* the agent's heartbeat thread beats when it ran out */
			b->watch_timeouts++;
			return 0;
		}
		return -2;
	case K_REJOIN:
		if (r->status != 200 || json_long(body, "generation", &gen) < 0)
			return -2;
		if (gen != b->gen + 1 || !(json_str_is(body, "state", "waiting") ||
					   json_str_is(body, "state", "running"))) {
			fail(b, "agent-%d rejoin: generation %ld, want %lld waiting: '%.*s'", pod, gen,
			     (long long)b->gen + 1, (int)(r->body_len > 200 ? 200 : r->body_len),
			     body);
			return -1;
		}
		b->t_last_rejoin = now_ns();
		return 1;
	case K_REWAIT:
		if (r->status == 200 && json_str_is(body, "state", "waiting")) {
			b->rewait_again++;
			return 0;
		}
		if (r->status != 200 || !json_str_is(body, "state", "running"))
			return -2;
		return check_recovered(b, a, body);
	case K_LEAVE:
		if (r->status != 200 || json_long(body, "generation", &gen) < 0)
			return -2;
		if (gen != b->gen + 1 || !json_str_is(body, "state", "forming")) {
			fail(b, "agent-%d leave: '%.*s', want generation %lld forming", pod,
			     (int)(r->body_len > 200 ? 200 : r->body_len), body,
			     (long long)b->gen + 1);
			return -1;
		}
		return 1;
	case K_PUT:
		return r->status == 200 ? 1 : -2;
	case K_GET:
		if (r->status == 404 && json_str_is(body, "code", "wait_timeout")) {
			b->get_again++;
			return 0;
		}
		if (r->status != 200)
			return -2;
		rank = (b->rank[a] + 1) % b->o.n;
		if (b->rank_agent[rank] < 0) {
			fail(b, "agent-%d kv_get: peer/%ld has a value before its owner had a rank",
			     a, rank);
			return -1;
		}
		agent_value(want, sizeof want, b->rank_agent[rank]);
		if (r->body_len != strlen(want) || memcmp(body, want, r->body_len) != 0) {
			fail(b, "agent-%d kv_get: peer/%ld is '%.*s', want '%s'", a, rank,
			     (int)(r->body_len > 100 ? 100 : r->body_len), body, want);
			return -1;
		}
		return 1;
	default:
		return -2;
	}
}
/* ---- gates (recovery) ---- */

/* 1 if the connection's next request may go now: the last survivor's
 * first join waits for the other N-1 joins (so the first round closes
 * with max_nodes, never by its last call); with "timeout" the survivors'
 * second beat waits until 55 % of the timeout has passed since the
 * victim's last call; with "leave" the victim's leave waits for every
 * connection's watch. */
static int may_send(const struct bench *b, const struct conn *c)
{
	int kind = cur_kind(c);
	if (!b->o.recover)
		return 1;
	if (kind == K_JOIN && c->lo + c->idx == b->npool - 1)
		return b->joins_ok >= b->o.n - 1;
	if (kind == K_HB2)
		return b->t_victim_last &&
		       now_ns() >= b->t_victim_last + (int64_t)b->o.hb_timeout_ms * 1000000 / 100 * 55;
	if (kind == K_LEAVE)
		return b->conns_watching == b->nconns;
	return 1;
}

/* 1 once the survivors may connect: the victim is in first. */
static int pool_may_start(const struct bench *b)
{
	return !b->o.recover || b->joins_ok > 0;
}

/* ---- transport: the socket, or TLS over it ---- */

/* send(2) or a TLS record: bytes sent, or -errno (-EAGAIN: try again
 * when the socket is ready; a TLS error reads as -EPROTO). */
static ssize_t io_send(struct conn *c, const char *buf, size_t len)
{
	ssize_t n;

	if (!c->tls) {
		n = send(c->fd, buf, len, MSG_NOSIGNAL);
		return n < 0 ? -errno : n;
	}
	n = gnutls_record_send(c->tls, buf, len);
	if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
		return -EAGAIN;
	return n < 0 ? -EPROTO : n;
}

/* recv(2) or a TLS record: bytes, 0 at the end, or -errno as io_send. */
static ssize_t io_recv(struct conn *c, char *buf, size_t cap)
{
	ssize_t n;

	if (!c->tls) {
		n = recv(c->fd, buf, cap, 0);
		return n < 0 ? -errno : n;
	}
	n = gnutls_record_recv(c->tls, buf, cap);
	if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
		return -EAGAIN;
	if (n == GNUTLS_E_PREMATURE_TERMINATION)
		return 0;
	return n < 0 ? -EPROTO : n;
}

/* A client session on fd, verifying the controller's certificate for the
 * host it was asked for (127.0.0.1: an IP subjectAltName). */
static int tls_session(struct bench *b, int fd, gnutls_session_t *out)
{
	gnutls_session_t s;

	if (gnutls_init(&s, GNUTLS_CLIENT | GNUTLS_NONBLOCK) < 0)
		return -ENOMEM;
	if (gnutls_set_default_priority(s) < 0 ||
	    gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, b->cred) < 0) {
		gnutls_deinit(s);
		return -EPROTO;
	}
	gnutls_session_set_verify_cert(s, b->o.host, 0);
	gnutls_transport_set_int(s, fd);
	*out = s;
	return 0;
}

/* ---- connections ---- */

static void conn_close(struct bench *b, struct conn *c, int state)
{
	if (c->tls) {
		gnutls_deinit(c->tls);
		c->tls = NULL;
	}
	if (c->fd >= 0) {
		epoll_ctl(b->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
		c->fd = -1;
	}
	if (c->state == C_CONNECTING || c->state == C_HANDSHAKE)
		b->connecting--;
	c->state = (uint8_t)state;
	if (state == C_DONE || state == C_DEAD)
		b->finished++;
}

/* Connects and prepares the current step's request (nothing when its gate
 * is closed: the connection is held once connected). */
static int conn_open(struct bench *b, struct conn *c)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP};
	int one = 1, fd;
	long ci = c - b->conns;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (b->o.sources > 1) {
		struct sockaddr_in src = {.sin_family = AF_INET};
		src.sin_addr.s_addr = htonl(0x7f000001u + (uint32_t)(ci % b->o.sources));
		setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
		if (bind(fd, (struct sockaddr *)&src, sizeof src) < 0)
			goto err;
	}
	if (connect(fd, (struct sockaddr *)&b->dst, sizeof b->dst) < 0 && errno != EINPROGRESS)
		goto err;
	ev.data.u32 = (uint32_t)ci;
	if (epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		goto err;
	if (!b->t0)
		b->t0 = now_ns();
	c->fd = fd;
	c->want_out = 1;
	c->state = C_CONNECTING;
	c->rlen = 0;
	c->reopen = 0;
	b->connecting++;
	if (!c->t_step)
		c->t_step = now_ns();
	c->wlen = c->woff = 0;
	if (may_send(b, c))
		build_request(b, c); /* the current step, again after a reconnect */
	return 0;
err:
	one = -errno;
	close(fd);
	return one;
}

/* The connection broke: reconnect and resend, or give up. */
static void conn_retry(struct bench *b, struct conn *c, const char *why, int err)
{
	conn_close(b, c, C_IDLE);
	b->reconnects++;
	if (++c->retries > MAX_RETRIES || conn_open(b, c) < 0) {
		fail(b, "connection %ld (agents %d..%d) %s: %s", (long)(c - b->conns), c->lo,
		     c->lo + c->cnt - 1, why, strerror(err));
		conn_close(b, c, C_DEAD);
	}
}

/* Polls the connection for EPOLLOUT too, or not (level-triggered: only
 * while something waits to be sent). */
static void conn_want_out(struct bench *b, struct conn *c, int on)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0)};
	if (c->want_out == on)
		return;
	ev.data.u32 = (uint32_t)(c - b->conns);
	epoll_ctl(b->epfd, EPOLL_CTL_MOD, c->fd, &ev);
	c->want_out = (uint8_t)on;
}

static int conn_flush(struct bench *b, struct conn *c)
{
	while (c->woff < c->wlen) {
		ssize_t n = io_send(c, c->buf + c->woff, c->wlen - c->woff);
		if (n < 0) {
			if (n != -EAGAIN)
				return (int)n;
			conn_want_out(b, c, 1);
			return 0;
		}
		c->woff += (uint32_t)n;
	}
	conn_want_out(b, c, 0);
	return 0;
}

/* Parks an open connection with nothing to send until its gate opens. */
static void conn_hold(struct bench *b, struct conn *c)
{
	c->state = C_HELD;
	b->held[b->nheld++] = c;
}

/* Sends the current step's request, or holds the connection. */
static void conn_next(struct bench *b, struct conn *c)
{
	int rc;
	if (!may_send(b, c)) {
		conn_hold(b, c);
		return;
	}
	build_request(b, c);
	if ((rc = conn_flush(b, c)) < 0)
		conn_retry(b, c, "send", -rc);
}

/* Sends what held connections wait for once their gate is open. */
static void release_held(struct bench *b)
{
	int i = 0;
	while (i < b->nheld) {
		struct conn *c = b->held[i];
		if (!may_send(b, c)) {
			i++;
			continue;
		}
		b->held[i] = b->held[--b->nheld];
		if (c->reopen) { /* the controller closed it while it was held */
			c->state = C_IDLE;
			if (conn_open(b, c) < 0)
				conn_retry(b, c, "reconnect", errno);
		} else {
			c->state = C_OPEN;
			conn_next(b, c);
		}
	}
}

/* Skips the steps an agent need not make: a survivor whose 409 brought
 * its new rank does not wait for it. */
static void conn_skip(struct bench *b, struct conn *c)
{
	while (c->phase < c->nseq && cur_kind(c) == K_REWAIT && b->t_new[c->lo + c->idx]) {
		if (++c->idx == c->cnt) {
			c->idx = 0;
			c->phase++;
		}
	}
}

/* Records the finished step and moves to the next agent or phase. */
static void conn_advance(struct bench *b, struct conn *c)
{
	int64_t t = now_ns();
	int k = cur_kind(c);
	b->lat[k][b->nlat[k]++] = (uint32_t)((t - c->t_step) / 1000);
	if (++c->idx == c->cnt) {
		c->idx = 0;
		c->phase++;
	}
	c->t_step = t;
}

/* One recv per readiness event (level-triggered: a rest is reported
 * again); a whole response is checked and the next request sent. */
static void conn_readable(struct bench *b, struct conn *c)
{
	char *rb = c->buf + WBUF;
	struct resp r;
	long used;
	int rc;
	ssize_t n = io_recv(c, rb + c->rlen, RBUF - c->rlen);

	/* TLS may hold a decrypted rest the socket no longer signals */
	while (n > 0 && c->tls && gnutls_record_check_pending(c->tls) &&
	       c->rlen + (size_t)n < RBUF) {
		ssize_t more = io_recv(c, rb + c->rlen + n, RBUF - c->rlen - (size_t)n);

		if (more <= 0)
			break;
		n += more;
	}
	if (n < 0) {
		if (n != -EAGAIN)
			conn_retry(b, c, "recv", (int)-n);
		return;
	}
	if (n == 0) {
		conn_retry(b, c, "closed by the controller", ECONNRESET);
		return;
	}
	c->rlen += (uint32_t)n;
	used = parse_response(rb, c->rlen, RBUF, &r);
	if (used == 0)
		return;
	if (used < 0 || (size_t)used != c->rlen || c->woff < c->wlen) {
		fail(b, "connection %ld: malformed or unexpected response '%.*s'",
		     (long)(c - b->conns), (int)(c->rlen > 200 ? 200 : c->rlen), rb);
		conn_close(b, c, C_DEAD);
		return;
	}
	rb[c->rlen] = 0;
	c->rlen = 0;
	rc = handle_reply(b, c, &r);
	if (rc == -2)
		fail(b, "agent-%d %s: status %d body '%.*s'", agent_pod(b, c->lo + c->idx),
		     kind_name[cur_kind(c)], r.status, (int)(r.body_len > 200 ? 200 : r.body_len),
		     r.body);
	if (rc < 0) {
		conn_close(b, c, C_DEAD);
		return;
	}
	if (rc > 0) {
		conn_advance(b, c);
		conn_skip(b, c);
	}
	if (c->phase == c->nseq) {
		conn_close(b, c, C_DONE);
		return;
	}
	if (r.close) {
		conn_close(b, c, C_IDLE);
		if (conn_open(b, c) < 0)
			conn_retry(b, c, "reconnect", errno);
		return;
	}
	conn_next(b, c);
}

static void conn_event(struct bench *b, struct conn *c, uint32_t ev)
{
	int err = 0, rc;
	socklen_t len = sizeof err;
	if (c->state == C_HELD) {
		if (c->fd >= 0 && (ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
			if (c->tls) {
				gnutls_deinit(c->tls);
				c->tls = NULL;
			}
			epoll_ctl(b->epfd, EPOLL_CTL_DEL, c->fd, NULL);
			close(c->fd);
			c->fd = -1;
			c->reopen = 1;
		}
		return;
	}
	if (c->state == C_CONNECTING) {
		if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return;
		getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		if (err) {
			conn_retry(b, c, "connect", err);
			return;
		}
		if (b->cred) { /* TLS: the handshake first, still "connecting" */
			if ((rc = tls_session(b, c->fd, &c->tls)) < 0) {
				conn_retry(b, c, "tls", -rc);
				return;
			}
			c->state = C_HANDSHAKE;
		}
	}
	if (c->state == C_HANDSHAKE) {
		rc = gnutls_handshake(c->tls);
		if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) {
			conn_want_out(b, c, gnutls_record_get_direction(c->tls));
			return;
		}
		if (rc < 0) {
			fail(b, "connection %ld: TLS handshake: %s", (long)(c - b->conns),
			     gnutls_strerror(rc));
			conn_close(b, c, C_DEAD);
			return;
		}
		b->handshakes++;
	}
	if (c->state == C_CONNECTING || c->state == C_HANDSHAKE) {
		b->connecting--;
		c->state = C_OPEN;
		if (!c->wlen) { /* its gate was closed when it connected */
			conn_want_out(b, c, 0);
			conn_hold(b, c);
			return;
		}
	}
	if (c->state != C_OPEN)
		return;
	if ((rc = conn_flush(b, c)) < 0) {
		conn_retry(b, c, "send", -rc);
		return;
	}
	if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		conn_readable(b, c);
}

/* Runs every connection to the end or the deadline; 0 when all finished. */
static int run_agents(struct bench *b)
{
	struct epoll_event evs[1024];
	int64_t deadline = now_ns() + (int64_t)(b->o.timeout_s * 1e9);
	if (b->victim) {
		int rc = conn_open(b, b->victim);
		if (rc < 0) {
			fail(b, "victim's connection: %s", strerror(-rc));
			return -1;
		}
	}
	while (b->finished < b->ntotal) {
		int n, i;
		while (b->next_conn < b->nconns && b->connecting < b->o.concurrency &&
		       pool_may_start(b)) {
			struct conn *c = &b->conns[b->next_conn++];
			int rc;
			if (!b->t_pool)
				b->t_pool = now_ns();
			rc = conn_open(b, c);
			if (rc < 0) {
				fail(b, "connection %ld: %s", (long)(c - b->conns), strerror(-rc));
				conn_close(b, c, C_DEAD);
			}
		}
		if (now_ns() > deadline) {
			fail(b, "timed out after %.0f s with %d of %d connections unfinished",
			     b->o.timeout_s, b->ntotal - b->finished, b->ntotal);
			return -1;
		}
		n = epoll_wait(b->epfd, evs, 1024, 100);
		if (n < 0 && errno != EINTR)
			return -1;
		for (i = 0; i < n; i++)
			conn_event(b, &b->conns[evs[i].data.u32], evs[i].events);
		release_held(b);
	}
	b->t_end = now_ns();
	return 0;
}

/* ---- blocking one-shot request (job creation, readiness) ---- */

static int simple_request(struct bench *b, const char *method, const char *path,
			  const char *body, char *out, size_t cap)
{
	struct timeval tv = {.tv_sec = 10};
	char req[1024];
	struct resp r;
	struct conn c = {.fd = -1};
	size_t got = 0;
	long used = 0;
	int n, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), status = -1, hs;
	if (fd < 0)
		return -1;
	c.fd = fd;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&b->dst, sizeof b->dst) < 0)
		goto out;
	if (b->cred) { /* a blocking socket: the handshake runs to its end */
		if (tls_session(b, fd, &c.tls) < 0)
			goto out;
		do
			hs = gnutls_handshake(c.tls);
		while (hs == GNUTLS_E_INTERRUPTED);
		if (hs < 0) {
			fprintf(stderr, "rdzv: TLS handshake with the controller: %s\n",
				gnutls_strerror(hs));
			goto out;
		}
	}
	n = snprintf(req, sizeof req,
		     "%s %s HTTP/1.1\r\nHost: %s:%d\r\n%sContent-Type: application/json\r\n"
		     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
		     method, path, b->o.host, b->o.port, b->auth, body ? strlen(body) : 0,
		     body ? body : "");
	if (n < 0 || (size_t)n >= sizeof req || io_send(&c, req, (size_t)n) != n)
		goto out;
	while (got < cap - 1 && used == 0) {
		ssize_t k = io_recv(&c, out + got, cap - 1 - got);
		if (k <= 0)
			goto out;
		got += (size_t)k;
		used = parse_response(out, got, cap - 1, &r);
	}
	if (used > 0) {
		out[got] = 0;
		status = r.status;
	}
out:
	if (c.tls)
		gnutls_deinit(c.tls);
	close(fd);
	return status;
}

/* ---- controller child ---- */

static int read_port_file(const char *path)
{
	char buf[32] = {0};
	int fd = open(path, O_RDONLY | O_CLOEXEC), port = 0;
	if (fd >= 0) {
		if (read(fd, buf, sizeof buf - 1) > 0)
			port = atoi(buf);
		close(fd);
	}
	return port;
}

static int start_controller(struct bench *b)
{
	char dir[192], port_file[192], token_file[192], log_file[192], maxc[32], maxm[32];
	char *argv[64];
	int argc = 0, i, fd;
	int64_t deadline;
	snprintf(b->tmpdir, sizeof b->tmpdir, "/tmp/meshrun-bench-rdzv.XXXXXX");
	if (!mkdtemp(b->tmpdir))
		return -1;
	snprintf(dir, sizeof dir, "%s/data", b->tmpdir);
	snprintf(port_file, sizeof port_file, "%s/port", b->tmpdir);
	snprintf(token_file, sizeof token_file, "%s/token", b->tmpdir);
	snprintf(log_file, sizeof log_file, "%s/controller.log", b->tmpdir);
	mkdir(dir, 0700);
	if (!b->o.token[0])
		snprintf(b->o.token, sizeof b->o.token, "bench-%ld", (long)getpid());
	fd = open(token_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, b->o.token, strlen(b->o.token)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	snprintf(maxc, sizeof maxc, "%d", b->nconns + 64);
	snprintf(maxm, sizeof maxm, "%d", b->o.n > 100000 ? b->o.n : 100000);
	argv[argc++] = (char *)b->o.controller_bin;
	argv[argc++] = "--listen";
	argv[argc++] = "127.0.0.1";
	argv[argc++] = "--port";
	argv[argc++] = "0";
	argv[argc++] = "--port-file";
	argv[argc++] = port_file;
	argv[argc++] = "--data-dir";
	argv[argc++] = dir;
	argv[argc++] = "--token-file";
	argv[argc++] = token_file;
	argv[argc++] = "--max-connections";
	argv[argc++] = maxc;
	argv[argc++] = "--max-members";
	argv[argc++] = maxm;
	argv[argc++] = "--max-keys";
	argv[argc++] = maxm;
	for (i = 0; i < b->o.n_extra && argc < 63; i++)
		argv[argc++] = b->o.ctl_extra[i];
	argv[argc] = NULL;
	b->pid = fork();
	if (b->pid < 0)
		return -1;
	if (b->pid == 0) {
		fd = open(log_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(argv[0], argv);
		_exit(127);
	}
	deadline = now_ns() + 10000000000LL;
	while (now_ns() < deadline) {
		int st;
		char resp[512];
		if (waitpid(b->pid, &st, WNOHANG) == b->pid) {
			fprintf(stderr, "rdzv: controller exited at start (status %d), log: %s\n",
				st, log_file);
			b->pid = -1;
			return -1;
		}
		if (!b->o.port)
			b->o.port = read_port_file(port_file);
		if (b->o.port) {
			b->dst.sin_port = htons((uint16_t)b->o.port);
			if (simple_request(b, "GET", "/healthz", NULL, resp, sizeof resp) == 200)
				return 0;
		}
		usleep(20000);
	}
	fprintf(stderr, "rdzv: controller not ready after 10 s, log: %s\n", log_file);
	return -1;
}

/* SIGTERM, reap; prints the whole-life rusage of the child. */
static void stop_controller(struct bench *b)
{
	struct rusage ru;
	int st;
	char cmd[256];
	if (b->pid > 0) {
		kill(b->pid, SIGTERM);
		if (wait4(b->pid, &st, 0, &ru) == b->pid)
			printf("controller_life_cpu_seconds=%.3f controller_life_maxrss_kib=%ld "
			       "exit_status=%d\n",
			       (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
				       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6,
			       ru.ru_maxrss, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
		b->pid = -1;
	}
	if (b->tmpdir[0] && !b->o.keep_tmp) {
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", b->tmpdir);
		if (system(cmd) != 0)
			fprintf(stderr, "rdzv: could not remove %s\n", b->tmpdir);
	} else if (b->tmpdir[0]) {
		fprintf(stderr, "rdzv: kept %s\n", b->tmpdir);
	}
}

/* ---- report ---- */

static int cmp_u32(const void *x, const void *y)
{
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
	return (a > b) - (a < b);
}

static double pct_ms(const uint32_t *v, int n, double p)
{
	int i = (int)(p * (n - 1) + 0.5);
	return n ? v[i] / 1000.0 : 0;
}

static void print_latencies(struct bench *b)
{
	int k;
	for (k = 0; k < NKINDS; k++) {
		if (!b->nlat[k])
			continue;
		qsort(b->lat[k], (size_t)b->nlat[k], sizeof(uint32_t), cmp_u32);
		printf("latency_ms type=%s count=%d p50=%.2f p99=%.2f max=%.2f\n", kind_name[k],
		       b->nlat[k], pct_ms(b->lat[k], b->nlat[k], 0.5),
		       pct_ms(b->lat[k], b->nlat[k], 0.99), pct_ms(b->lat[k], b->nlat[k], 1.0));
	}
}

static void report(struct bench *b)
{
	printf("N=%d connections=%d agents_per_connection=%.2f sources=%d concurrency=%d "
	       "loadavg_at_start=%.2f\n",
	       b->o.n, b->nconns, (double)b->o.n / b->nconns, b->o.sources, b->o.concurrency,
	       b->load_start);
	printf("rendezvous_seconds=%.3f\n", secs(b->t_rdzv - b->t0));
	printf("total_seconds=%.3f\n", secs(b->t_end - b->t0));
	print_latencies(b);
	printf("repeats wait=%ld kv_get=%ld reconnects=%ld\n", b->wait_again, b->get_again,
	       b->reconnects);
	printf("bench_cpu_seconds=%.3f\n", self_cpu_s());
	if (b->pid > 0) {
		long rss_run, hwm_end;
		usleep(300000); /* let the controller drop the closed connections */
		rss_run = proc_status_kib(b->pid, "VmRSS");
		hwm_end = proc_status_kib(b->pid, "VmHWM");
		printf("controller_cpu_seconds=%.3f\n", proc_cpu_s(b->pid));
		printf("controller_cpu_seconds_at_rendezvous=%.3f\n", b->cpu_wait_s);
		printf("controller_rss_idle_kib=%ld\n", b->rss_idle_kib);
		printf("controller_hwm_waiting_kib=%ld per_member_over_50mib_bytes=%.0f "
		       "per_member_over_idle_bytes=%.0f\n",
		       b->hwm_wait_kib, (b->hwm_wait_kib - BASE_KIB) * 1024.0 / b->o.n,
		       (b->hwm_wait_kib - b->rss_idle_kib) * 1024.0 / b->o.n);
		printf("controller_rss_running_kib=%ld per_member_over_50mib_bytes=%.0f "
		       "per_member_over_idle_bytes=%.0f\n",
		       rss_run, (rss_run - BASE_KIB) * 1024.0 / b->o.n,
		       (rss_run - b->rss_idle_kib) * 1024.0 / b->o.n);
		printf("controller_hwm_end_kib=%ld\n", hwm_end);
	}
}

/* Milliseconds from t0 to each t[i] (i < n, all set), sorted, in v. */
static void since_ms(const int64_t *t, int n, int64_t t0, uint32_t *v)
{
	int i;
	for (i = 0; i < n; i++)
		v[i] = (uint32_t)(t[i] > t0 ? (t[i] - t0) / 1000 : 0);
	qsort(v, (size_t)n, sizeof *v, cmp_u32);
}

static int64_t max_i64(const int64_t *t, int n)
{
	int64_t m = 0;
	int i;
	for (i = 0; i < n; i++)
		m = t[i] > m ? t[i] : m;
	return m;
}

/* Recovery: the figures from the death on. */
static void report_recover(struct bench *b)
{
	int n1 = b->o.n - 1;
	int64_t hb_ns = (int64_t)b->o.hb_timeout_ms * 1000000;
	uint32_t *v = b->lat[K_PUT]; /* unused in recovery: N entries of scratch */

	if (b->o.recover == REC_TIMEOUT) {
		/* declared dead once silent for the timeout; the controller's
		 * clock moves in ticks, so the first 409 may come a little earlier */
		b->t_death = b->t_victim_last + hb_ns;
		if (b->t_first_stale < b->t_death)
			b->t_death = b->t_first_stale;
	}
	printf("N=%d survivors=%d connections=%d agents_per_connection=%.2f sources=%d "
	       "concurrency=%d loadavg_at_start=%.2f\n",
	       b->o.n, n1, b->nconns + 1, (double)n1 / b->nconns, b->o.sources,
	       b->o.concurrency, b->load_start);
	printf("recover=%s victim_pod=%d heartbeat_timeout_ms=%d last_call_ms=%d survivors=%s\n",
	       b->o.recover == REC_TIMEOUT ? "timeout" : "leave", b->o.victim, b->o.hb_timeout_ms,
	       b->o.last_call_ms, b->o.rejoin ? "rejoin" : "carried");
	printf("initial_rendezvous_seconds=%.3f\n", secs(b->t_rdzv - b->t_pool));
	if (b->o.recover == REC_TIMEOUT)
		printf("detect_ms=%.1f (first 409 after the victim's last reply + the timeout)\n",
		       secs(b->t_first_stale - (b->t_victim_last + hb_ns)) * 1e3);
	printf("recover_first_409_ms=%.1f\n", secs(b->t_first_stale - b->t_death) * 1e3);
	printf("recover_all_learned_seconds=%.3f\n", secs(max_i64(b->t_learn, n1) - b->t_death));
	if (b->o.rejoin)
		printf("recover_last_rejoin_seconds=%.3f\n", secs(b->t_last_rejoin - b->t_death));
	else
		printf("recover_carried waiting=%ld running=%ld (the 409's \"member\": still "
		       "forming / the new rank)\n",
		       b->carried_waiting, b->carried_running);
	{
		int64_t first = 0;
		for (int i = 0; i < n1; i++)
			if (b->t_new[i] && (!first || b->t_new[i] < first))
				first = b->t_new[i];
		printf("recover_first_rank_seconds=%.3f\n", secs(first - b->t_death));
	}
	printf("recover_seconds=%.3f (the last call window of %d ms included)\n",
	       secs(b->t_recovered - b->t_death), b->o.last_call_ms);
	since_ms(b->t_learn, n1, b->t_death, v);
	printf("survivor_ms event=learned p50=%.1f p99=%.1f max=%.1f\n", pct_ms(v, n1, 0.5),
	       pct_ms(v, n1, 0.99), pct_ms(v, n1, 1.0));
	since_ms(b->t_new, n1, b->t_death, v);
	printf("survivor_ms event=new_rank p50=%.1f p99=%.1f max=%.1f\n", pct_ms(v, n1, 0.5),
	       pct_ms(v, n1, 0.99), pct_ms(v, n1, 1.0));
	b->nlat[K_PUT] = 0;
	print_latencies(b);
	printf("repeats wait=%ld rewait=%ld watch_timeouts=%ld watch_beats=%ld reconnects=%ld\n",
	       b->wait_again, b->rewait_again, b->watch_timeouts, b->watch_beats, b->reconnects);
	printf("bench_cpu_seconds_recovery=%.3f\n",
	       b->bench_cpu_recovered_s - b->bench_cpu_watching_s);
	if (b->pid > 0) {
		printf("controller_cpu_seconds_recovery=%.3f user=%.3f system=%.3f (every watch out -> "
		       "the last new rank)\n",
		       b->cpu_recovered_s - b->cpu_watching_s,
		       b->ucpu_recovered_s - b->ucpu_watching_s,
		       (b->cpu_recovered_s - b->ucpu_recovered_s) -
			       (b->cpu_watching_s - b->ucpu_watching_s));
		printf("controller_cpu_seconds=%.3f controller_rss_kib=%ld controller_hwm_kib=%ld\n",
		       proc_cpu_s(b->pid), proc_status_kib(b->pid, "VmRSS"),
		       proc_status_kib(b->pid, "VmHWM"));
	}
}

/* The JSON value of "key" in text (spaces after the colon skipped), or "". */
static const char *json_after(const char *text, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof k, "\"%s\":", key);
	p = strstr(text, k);
	if (!p)
		return "";
	for (p += strlen(k); *p == ' '; p++)
		;
	return p;
}

/* Recovery: the job's status agrees with what the survivors were told.
 * 0 or -1. */
static int check_job_after(struct bench *b)
{
	static char out[1 << 14];
	long gen = -1, nodes = -1, world = -1, restarts = -1, total = -1;
	int status = simple_request(b, "GET", b->jobpath, NULL, out, sizeof out);

	if (status == 200) {
		json_long(out, "generation", &gen);
		json_long(out, "num_nodes", &nodes);
		json_long(out, "world_size", &world);
		json_long(out, "restarts", &restarts);
		json_long(out, "total", &total);
	}
	if (status != 200 || !json_str_is(out, "state", "running") || gen != b->gen + 1 ||
	    nodes != b->o.n - 1 || world != b->o.n - 1 || restarts != want_restarts(b) ||
	    total != b->o.n - 1) {
		fail(b, "job status after recovery: status %d '%.400s', want generation %lld, "
			"running, %d nodes and members, restarts %ld",
		     status, out, (long long)b->gen + 1, b->o.n - 1, want_restarts(b));
		return -1;
	}
	return 0;
}

/* --progress: one diagnosis of the whole job, timed; it must name no
 * culprit (every simulated rank is in the same allreduce) and count every
 * rank as reporting. 0 or -1. */
static int report_diagnosis(struct bench *b)
{
	static char out[1 << 16];
	char path[256];
	double cpu0 = b->pid > 0 ? proc_cpu_s(b->pid) : 0.0;
	int64_t t0 = now_ns();
	int status;

	snprintf(path, sizeof path, "%s/diagnosis", b->jobpath);
	status = simple_request(b, "GET", path, NULL, out, sizeof out);
	printf("progress=on groups_per_rank=3\n");
	printf("diagnosis_ms=%.1f status=%d\n", secs(now_ns() - t0) * 1e3, status);
	if (b->pid > 0)
		printf("controller_cpu_seconds_diagnosis=%.3f\n", proc_cpu_s(b->pid) - cpu0);
	if (status != 200 || atoi(json_after(out, "ranks_reporting")) != b->o.n ||
	    strncmp(json_after(out, "culprits"), "[]", 2) != 0) {
		fail(b, "diagnosis: status %d, expected %d ranks reporting and no culprit: %.300s",
		     status, b->o.n, out);
		return -1;
	}
	return 0;
}

/* ---- main ---- */

static void usage(FILE *f)
{
	fputs("usage: rdzv [--controller HOST:PORT | --controller-bin PATH] [--n N]\n"
	      "            [--job NS/NAME] [--token T] [--sources K] [--concurrency C]\n"
	      "            [--conns M] [--timeout S] [--progress] [--keep-tmp]\n"
	      "            [--recover timeout|leave [--victim POD] [--heartbeat-timeout MS]\n"
	      "             [--last-call MS] [--rejoin]] [-- CONTROLLER FLAGS...]\n"
	      "  --progress        heartbeats carry hang-diagnosis progress (1 rank, 3 groups;\n"
	      "                    the job's mesh is tp=8, N a multiple of 8), then one\n"
	      "                    diagnosis of the whole job is timed\n"
	      "  --recover         the recovery scenario: N members run, the one with pod\n"
	      "                    index --victim (N/2) is declared dead by its heartbeat\n"
	      "                    timeout (killed) or leaves (a deleted pod); the time until\n"
	      "                    every survivor has its rank in the new generation\n"
	      "  --heartbeat-timeout  recovery's job heartbeat_timeout_ms (30000)\n"
	      "  --last-call       recovery's job last_call_ms (500); the new round of N-1\n"
	      "                    closes this long after the death (the survivors are\n"
	      "                    carried into it), or after the last rejoin (--rejoin)\n"
	      "  --rejoin          survivors join again after the 409 and ignore its\n"
	      "                    \"member\", as agents did before the controller carried\n"
	      "                    live members into the next round\n"
	      "  --controller      a running controller (default 127.0.0.1:8080)\n"
	      "  --controller-bin  start this controller (temp data dir, port 0, token)\n"
	      "  --n               simulated agents (default 1000)\n"
	      "  --sources         127.0.0.x source addresses to spread sockets over (4)\n"
	      "  --concurrency     connects in flight at most (1000)\n"
	      "  --conns           connections (default min(N, fd limit - 256))\n"
	      "  --timeout         give up after S seconds (120)\n"
	      "  --tls-ca          TLS to the controller, verified against this PEM CA\n"
	      "                    (give the controller --tls-cert/--tls-key after --)\n",
	      f);
}

static int parse_opts(struct opts *o, int argc, char **argv)
{
	int i;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--")) {
			o->ctl_extra = argv + i + 1;
			o->n_extra = argc - i - 1;
			return 0;
		} else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(a, "--keep-tmp")) {
			o->keep_tmp = 1;
			continue;
		} else if (!strcmp(a, "--progress")) {
			o->progress = 1;
			continue;
		} else if (!strcmp(a, "--rejoin")) {
			o->rejoin = 1;
			continue;
		} else if (!v) {
			fprintf(stderr, "rdzv: '%s' needs a value\n", a);
			return -1;
		} else if (!strcmp(a, "--controller")) {
			const char *colon = strrchr(v, ':');
			if (!colon || (size_t)(colon - v) >= sizeof o->host) {
				fprintf(stderr, "rdzv: --controller: '%s' is not host:port\n", v);
				return -1;
			}
			snprintf(o->host, sizeof o->host, "%.*s", (int)(colon - v), v);
			o->port = atoi(colon + 1);
		} else if (!strcmp(a, "--controller-bin")) {
			o->controller_bin = v;
		} else if (!strcmp(a, "--n")) {
			o->n = atoi(v);
		} else if (!strcmp(a, "--job")) {
			snprintf(o->job, sizeof o->job, "%s", v);
		} else if (!strcmp(a, "--token")) {
			snprintf(o->token, sizeof o->token, "%s", v);
		} else if (!strcmp(a, "--sources")) {
			o->sources = atoi(v);
		} else if (!strcmp(a, "--concurrency")) {
			o->concurrency = atoi(v);
		} else if (!strcmp(a, "--conns")) {
			o->conns = atoi(v);
		} else if (!strcmp(a, "--timeout")) {
			o->timeout_s = atof(v);
		} else if (!strcmp(a, "--recover")) {
			if (!strcmp(v, "timeout")) {
				o->recover = REC_TIMEOUT;
			} else if (!strcmp(v, "leave")) {
				o->recover = REC_LEAVE;
			} else {
				fprintf(stderr, "rdzv: --recover: '%s' is not timeout or leave\n", v);
				return -1;
			}
		} else if (!strcmp(a, "--tls-ca")) {
			o->tls_ca = v;
		} else if (!strcmp(a, "--victim")) {
			o->victim = atoi(v);
		} else if (!strcmp(a, "--heartbeat-timeout")) {
			o->hb_timeout_ms = atoi(v);
		} else if (!strcmp(a, "--last-call")) {
			o->last_call_ms = atoi(v);
		} else {
			fprintf(stderr, "rdzv: '%s': unknown option\n", a);
			usage(stderr);
			return -1;
		}
		i++;
	}
	return 0;
}

/* Raises the fd limit as far as allowed; returns the soft limit. */
static long raise_nofile(long want)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	if ((rlim_t)want > rl.rlim_max) {
		struct rlimit up = {(rlim_t)want, (rlim_t)want};
		if (setrlimit(RLIMIT_NOFILE, &up) == 0)
			return want;
	}
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
	getrlimit(RLIMIT_NOFILE, &rl);
	return (long)rl.rlim_cur;
}

static int check_opts(struct opts *o)
{
	const char *slash = strchr(o->job, '/');
	if (o->n < 2 || o->sources < 1 || o->sources > 250 || o->concurrency < 1 || !slash ||
	    strchr(slash + 1, '/') || (o->progress && o->n % 8)) {
		fprintf(stderr, "rdzv: need --n >= 2 (a multiple of 8 with --progress), --sources "
				"1..250, --concurrency >= 1, --job ns/name\n");
		return -1;
	}
	if (!o->recover)
		return 0;
	if (o->victim < 0)
		o->victim = o->n / 2;
	if (o->progress || o->victim >= o->n || o->hb_timeout_ms < 100 ||
	    o->hb_timeout_ms > 3600000 || o->last_call_ms < 0 || o->last_call_ms > 3600000) {
		fprintf(stderr, "rdzv: --recover: need --victim in [0, N), --heartbeat-timeout "
				"100..3600000, --last-call 0..3600000, no --progress\n");
		return -1;
	}
	return 0;
}

static int setup(struct bench *b)
{
	long nofile = raise_nofile(b->o.n + 1024L);
	int i, k, n = b->o.n;
	if (check_opts(&b->o) < 0)
		return -1;
	b->npool = b->o.recover ? n - 1 : n;
	b->nconns = b->o.conns > 0 ? b->o.conns : b->npool;
	if (b->nconns > nofile - 257)
		b->nconns = (int)(nofile - 257);
	if (b->nconns > b->npool)
		b->nconns = b->npool;
	if (b->nconns < 1)
		return -1;
	if (b->nconns < b->npool)
		fprintf(stderr, "rdzv: fd limit %ld < N: %d agents share %d connections "
				"(%.2f per connection)\n",
			nofile, b->npool, b->nconns, (double)b->npool / b->nconns);
	b->ntotal = b->nconns + (b->o.recover ? 1 : 0);
	b->conns = calloc((size_t)b->ntotal, sizeof *b->conns);
	b->held = calloc((size_t)b->ntotal, sizeof *b->held);
	b->bufs = malloc((size_t)b->ntotal * (WBUF + RBUF + 1));
	b->rank = malloc(sizeof(int32_t) * (size_t)n);
	b->rank_agent = malloc(sizeof(int32_t) * (size_t)n);
	b->new_rank_agent = malloc(sizeof(int32_t) * (size_t)n);
	b->t_learn = calloc((size_t)n, sizeof(int64_t));
	b->t_new = calloc((size_t)n, sizeof(int64_t));
	for (k = 0; k < NKINDS; k++)
		if (!(b->lat[k] = malloc(sizeof(uint32_t) * (size_t)n)))
			return -1;
	if (!b->conns || !b->held || !b->bufs || !b->rank || !b->rank_agent || !b->new_rank_agent || !b->t_learn ||
	    !b->t_new)
		return -1;
	for (i = 0; i < n; i++)
		b->rank[i] = b->rank_agent[i] = b->new_rank_agent[i] = -1;
	for (i = 0; i < b->ntotal; i++)
		b->conns[i].buf = b->bufs + (size_t)i * (WBUF + RBUF + 1);
	for (i = 0; i < b->nconns; i++) {
		struct conn *c = &b->conns[i];
		c->fd = -1;
		c->lo = (int)((long long)b->npool * i / b->nconns);
		c->cnt = (int)((long long)b->npool * (i + 1) / b->nconns) - c->lo;
		if (b->o.recover == REC_TIMEOUT && b->o.rejoin) {
			c->seq = seq_survivor_timeout_rejoin;
			c->nseq = sizeof seq_survivor_timeout_rejoin;
		} else if (b->o.recover == REC_TIMEOUT) {
			c->seq = seq_survivor_timeout;
			c->nseq = sizeof seq_survivor_timeout;
		} else if (b->o.recover && b->o.rejoin) {
			c->seq = seq_survivor_leave_rejoin;
			c->nseq = sizeof seq_survivor_leave_rejoin;
		} else if (b->o.recover) {
			c->seq = seq_survivor_leave;
			c->nseq = sizeof seq_survivor_leave;
		} else {
			c->seq = seq_rdzv;
			c->nseq = sizeof seq_rdzv;
		}
	}
	if (b->o.recover) {
		struct conn *c = b->victim = &b->conns[b->nconns];
		c->fd = -1;
		c->lo = n - 1;
		c->cnt = 1;
		c->seq = b->o.recover == REC_TIMEOUT ? seq_victim_timeout : seq_victim_leave;
		c->nseq = b->o.recover == REC_TIMEOUT ? sizeof seq_victim_timeout
						      : sizeof seq_victim_leave;
	}
	snprintf(b->jobpath, sizeof b->jobpath, "/v1/jobs/%s", b->o.job);
	b->dst.sin_family = AF_INET;
	if (inet_pton(AF_INET, b->o.host, &b->dst.sin_addr) != 1) {
		fprintf(stderr, "rdzv: '%s' is not an IPv4 address\n", b->o.host);
		return -1;
	}
	b->dst.sin_port = htons((uint16_t)b->o.port);
	b->gen = -1;
	b->pid = -1;
	b->epfd = epoll_create1(EPOLL_CLOEXEC);
	return b->epfd < 0 ? -1 : 0;
}

static void set_auth(struct bench *b)
{
	if (b->o.token[0])
		snprintf(b->auth, sizeof b->auth, "Authorization: Bearer %s\r\n", b->o.token);
}

/* The job's spec: the rendezvous scenario's, or recovery's elastic one
 * (what the agent's job_spec() sends with every join). */
static void job_spec(struct bench *b, char *body, size_t cap)
{
	if (b->o.recover)
		snprintf(body, cap,
			 "{\"name\":\"%.127s\",\"min_nodes\":%d,\"max_nodes\":%d,"
			 "\"nproc_per_node\":1,\"mesh\":{\"tp\":1,\"pp\":1,\"cp\":1,\"ep\":1,"
			 "\"dp\":0},\"last_call_ms\":%d,\"heartbeat_timeout_ms\":%d,"
			 "\"max_restarts\":3}",
			 b->o.job, b->o.n - 1, b->o.n, b->o.last_call_ms, b->o.hb_timeout_ms);
	else
		snprintf(body, cap,
			 "{\"name\":\"%.127s\",\"min_nodes\":%d,\"max_nodes\":%d,\"nproc_per_node\":1,"
			 "\"heartbeat_timeout_ms\":%ld,\"last_call_ms\":1000%s}",
			 b->o.job, b->o.n, b->o.n, (long)(b->o.timeout_s * 1000) + 600000,
			 b->o.progress ? ",\"mesh\":{\"tp\":8}" : "");
}

int main(int argc, char **argv)
{
	static struct bench bench;
	struct bench *b = &bench;
	char resp[2048];
	int status, rc = 1;
	snprintf(b->o.host, sizeof b->o.host, "127.0.0.1");
	b->o.port = 8080;
	b->o.n = 1000;
	snprintf(b->o.job, sizeof b->o.job, "bench/rdzv-%ld", (long)getpid());
	b->o.sources = 4;
	b->o.concurrency = 1000;
	b->o.timeout_s = 120;
	b->o.victim = -1;
	b->o.hb_timeout_ms = 30000;
	b->o.last_call_ms = 500;
	signal(SIGPIPE, SIG_IGN);
	if (parse_opts(&b->o, argc, argv) < 0)
		return 2;
	if (b->o.tls_ca) {
		int g = gnutls_certificate_allocate_credentials(&b->cred);

		if (g >= 0)
			g = gnutls_certificate_set_x509_trust_file(b->cred, b->o.tls_ca,
								   GNUTLS_X509_FMT_PEM);
		if (g <= 0) {
			fprintf(stderr, "rdzv: --tls-ca: no CA certificate in '%s': %s\n",
				b->o.tls_ca, g < 0 ? gnutls_strerror(g) : "none found");
			return 2;
		}
	}
	if (b->o.controller_bin)
		b->o.port = 0;
	if (getloadavg(&b->load_start, 1) != 1)
		b->load_start = -1;
	if (setup(b) < 0) {
		fprintf(stderr, "rdzv: setup failed\n");
		return 2;
	}
	set_auth(b);
	if (b->o.controller_bin) {
		if (start_controller(b) < 0)
			goto out;
		set_auth(b);
		b->rss_idle_kib = proc_status_kib(b->pid, "VmRSS");
		fprintf(stderr, "rdzv: started %s pid %d on 127.0.0.1:%d\n", b->o.controller_bin,
			(int)b->pid, b->o.port);
	}
	job_spec(b, b->spec, sizeof b->spec);
	status = simple_request(b, "POST", "/v1/jobs", b->spec, resp, sizeof resp);
	if (status != 200 && status != 201) {
		fprintf(stderr, "rdzv: creating job '%s' failed: status %d: %.300s\n", b->o.job,
			status, status > 0 ? resp : "no response");
		goto out;
	}
	if (run_agents(b) == 0 && b->failures == 0) {
		if (b->o.recover) {
			report_recover(b);
			rc = check_job_after(b);
		} else {
			report(b);
			rc = b->o.progress ? report_diagnosis(b) : 0;
		}
	} else if (!b->t_end) {
		int k;
		for (k = 0; k < NKINDS; k++)
			if (b->nlat[k])
				fprintf(stderr, "rdzv: %s completed %d times of %d agents\n",
					kind_name[k], b->nlat[k], b->o.n);
	}
out:
	stop_controller(b);
	if (b->failures)
		fprintf(stderr, "rdzv: %d failure(s)\n", b->failures);
	if (b->cred) {
		printf("tls=on handshakes=%ld\n", b->handshakes);
		gnutls_certificate_free_credentials(b->cred);
	}
	if (rc == 0 && b->o.recover)
		printf("rdzv_recover N=%d seconds=%.3f\n", b->o.n, secs(b->t_recovered - b->t_death));
	else if (rc == 0)
		printf("rdzv N=%d seconds=%.3f\n", b->o.n, secs(b->t_rdzv - b->t0));
	fflush(stdout);
	return rc;
}
