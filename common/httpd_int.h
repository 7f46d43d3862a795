/*
 * httpd_int.h - the server's structures, shared by httpd.c (daemon, loop,
 * libmicrohttpd callbacks), httpd_accept.c (the listen socket and the
 * connection limit), httpd_deadline.c (the deadlines of slow clients),
 * httpd_req.c (request accessors, replies, suspend) and httpd_path.c (the
 * request target); see mr_httpd.h.
 */
#ifndef MR_HTTPD_INT_H
#define MR_HTTPD_INT_H

#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "mr_httpd.h"

/* What a connection's armed deadline bounds (httpd_deadline.c). */
enum mr__httpd_phase {
	MR__HTTPD_PH_NONE,    /* no deadline: handler running, suspended, replying */
	MR__HTTPD_PH_HEADER,  /* the request headers, from accept or the last reply */
	MR__HTTPD_PH_BODY,    /* the body, with its minimum rate */
	MR__HTTPD_PH_RESERVE, /* a reserve slot's whole request */
};

struct hdr {
	struct hdr *next;
	char *value; /* points into name[] after its NUL */
	char name[];
};

/* The path of a request, split and decoded (httpd_path.c). */
struct mr__http_target {
	char *path;  /* "/" + the segments joined by '/' */
	char **segs; /* nsegs segments, then NULL */
	size_t nsegs;
	void *mem;   /* the one allocation holding all of it */
};

struct mr__httpd_conn;

struct mr_http_req {
	struct mr_httpd *srv;
	struct MHD_Connection *conn;
	struct mr__httpd_conn *c; /* the connection's record (NULL: out of memory) */
	char *raw;          /* the request target as sent (path and query), in
			     * this record's allocation */
	const char *url;    /* decoded path (tgt.path once parsed, else raw) */
	const char *method; /* libmicrohttpd's, valid for the request */
	struct mr__http_target tgt;
	char *body;
	size_t body_len, body_cap;
	size_t expect; /* Content-Length when sent: size of the first alloc */
	void *user;
	struct hdr *hdrs;
	struct mr_http_req *prev, *next; /* suspended list */
	unsigned char meth;
	unsigned char begun, in_handler, replied, suspend_req, suspended, resumed;
	unsigned char too_large, queue_failed;
	unsigned char reserve; /* on a reserve slot: close after the reply */
	unsigned char peer_done; /* peer filled (on first use: inet_ntop is not free) */
	char peer[INET6_ADDRSTRLEN];
};

struct post_item {
	struct post_item *next;
	void (*fn)(void *arg);
	void *arg;
};

struct mr_httpd {
	struct MHD_Daemon *mhd;
	int lfd;      /* our listen socket (libmicrohttpd has none) */
	int spare_fd; /* /dev/null, given up to accept one socket at EMFILE */
	mr_http_handler handler;
	mr_http_tick tick;
	void *user;
	size_t max_body;
	unsigned tick_ms;
	int port;
	int epfd, wakefd;
	pthread_t thread;
	int thread_started;

	pthread_mutex_t lock; /* guards the post queue and closed */
	struct post_item *post_head, *post_tail;
	int closed;
	atomic_int stop_req;

	/* loop thread only */
	unsigned max_conns, reserve;   /* limits, see mr_httpd.h */
	uint64_t header_ms, body_ms;   /* deadlines (httpd_deadline.c) */
	uint64_t reserve_req_ms;
	unsigned body_min_rate;        /* bytes per second that extend body_ms */
	struct mr__httpd_conn **dl_heap; /* armed connections, min-heap by deadline */
	size_t dl_n, dl_cap;
	struct mr__httpd_slow {
		unsigned long long dropped, logged; /* closed at the deadline; logged */
		uint64_t logged_ms;
	} slow[4]; /* per class: header, body, reserve, keepalive */
	unsigned reserve_timeout_s;    /* idle timeout on a reserve slot */
	size_t n_conns, n_reserve;     /* open connections; on reserve slots */
	int adding_reserve;            /* set around MHD_add_connection */
	int adding_fd;                 /* the socket being added, else -1 */
	unsigned long long n_refused;  /* answered 503 at accept */
	unsigned long long n_overload; /* answered 503 on a reserve slot */
	uint64_t overload_logged_ms;
	int stopping;
	struct mr_http_req *susp_head;
	size_t n_suspended, n_resumed;
	int resumed_since_run; /* MHD_run must run again without waiting */
	char last_log[256];
	struct mr__httpd_tls *tls;     /* NULL: plain HTTP */
};

/* httpd_tls.c: the credentials of a TLS server (see mr_httpd.h). */
struct mr__httpd_tls;
struct MHD_OptionItem;
int mr__httpd_tls_open(struct mr__httpd_tls **out, const struct mr_httpd_opts *o,
		       struct mr_errbuf *eb);
/* Writes libmicrohttpd's TLS options into opts; returns how many. */
int mr__httpd_tls_options(struct mr__httpd_tls *t, struct MHD_OptionItem *opts);
/* Reads the files again if they changed (at most once a second). */
void mr__httpd_tls_check(struct mr__httpd_tls *t, uint64_t now_ms);
/* 1 when no client CA is set, or the peer's certificate verified. */
int mr__httpd_tls_client_ok(struct mr__httpd_tls *t, struct MHD_Connection *conn);
void mr__httpd_tls_close(struct mr__httpd_tls *t);

/* httpd_path.c: splits raw[0..len) (the path, without the query) into
 * decoded segments; on failure eb names the segment ("path[3]") and t is
 * empty. Release with mr__http_target_release. */
int mr__http_target_parse(struct mr__http_target *t, const char *raw, size_t len,
			  struct mr_errbuf *eb);
void mr__http_target_release(struct mr__http_target *t);
/* Checks every name and value of the raw query q[0..len) with the same
 * rules; on failure eb names the argument (or "query" for a bad name). */
int mr__http_query_check(const char *q, size_t len, struct mr_errbuf *eb);

/* httpd_accept.c: binds and listens (srv->lfd); returns 0 or fills eb. */
int mr__httpd_listen(struct mr_httpd *srv, const char *addr, int port, struct mr_errbuf *eb);
/* Accepts what is pending on srv->lfd and hands each socket to
 * libmicrohttpd, or answers it 503 and closes it past the limits. */
void mr__httpd_accept(struct mr_httpd *srv);
/*
 * What the server keeps per connection (libmicrohttpd's socket context):
 * whether it sits on a reserve slot, the request record on_uri made that
 * libmicrohttpd has not reported completed yet, and its deadline.
 * libmicrohttpd 0.9.75 can drop a request it rejects without that report
 * (found by fuzz_http); the record is then freed when the connection's
 * next request starts or when it closes.
 */
struct mr__httpd_conn {
	int reserve;
	int fd; /* the socket (libmicrohttpd's): shut down at a deadline */
	struct mr_http_req *open;
	uint64_t deadline_ms;   /* armed: closed past it (body: re-checked, see below) */
	uint64_t body_start_ms; /* the body phase's start */
	size_t body_bytes;      /* body bytes received so far */
	size_t heap_idx;        /* index in srv->dl_heap while armed */
	unsigned char phase;    /* enum mr__httpd_phase */
	unsigned char served;   /* a request of it completed (keep-alive) */
};
/* libmicrohttpd's connection start/close notification: keeps the counts,
 * makes and frees the connection's record. */
void mr__httpd_on_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
		       enum MHD_ConnectionNotificationCode code);
/* conn's record, or NULL (out of memory when it opened). */
struct mr__httpd_conn *mr__httpd_conn_of(struct MHD_Connection *conn);
/* Frees a request record (httpd.c). */
void mr__httpd_req_free(struct mr_httpd *srv, struct mr_http_req *req);
/* 1 if path is one of the operational paths served on reserve slots. */
int mr__httpd_reserved_path(const char *path);

/* httpd_deadline.c: arms c's deadline for phase (NONE disarms), from now
 * (monotonic ms). Loop thread; c may be NULL (no record: no deadline). */
void mr__httpd_dl_arm(struct mr_httpd *srv, struct mr__httpd_conn *c,
		      enum mr__httpd_phase phase, uint64_t now);
/* Shuts down the connections past their deadline (libmicrohttpd then sees
 * the end and closes them) and logs the drops; O(1) when none is due. */
void mr__httpd_dl_expire(struct mr_httpd *srv, uint64_t now);
/* Frees the heap (the connections are gone). */
void mr__httpd_dl_release(struct mr_httpd *srv);
/* Monotonic milliseconds. */
uint64_t mr__httpd_now_ms(void);

/* Takes req off the suspended list (loop thread). */
void mr__httpd_susp_unlink(struct mr_httpd *srv, struct mr_http_req *req);
/* Frees the reply headers added with mr_http_add_header. */
void mr__httpd_free_hdrs(struct mr_http_req *req);

#endif
