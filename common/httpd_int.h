/*
 * httpd_int.h - the server's structures, shared by httpd.c (daemon, loop,
 * libmicrohttpd callbacks) and httpd_req.c (request accessors, replies,
 * suspend); see mr_httpd.h.
 */
#ifndef MR_HTTPD_INT_H
#define MR_HTTPD_INT_H

#include <arpa/inet.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "mr_httpd.h"

struct hdr {
	struct hdr *next;
	char *value; /* points into name[] after its NUL */
	char name[];
};

struct mr_http_req {
	struct mr_httpd *srv;
	struct MHD_Connection *conn;
	const char *url;    /* libmicrohttpd's, valid for the request */
	const char *method; /* likewise */
	char *body;
	size_t body_len, body_cap;
	size_t expect; /* Content-Length when sent: size of the first alloc */
	void *user;
	struct hdr *hdrs;
	struct mr_http_req *prev, *next; /* suspended list */
	unsigned char meth;
	unsigned char in_handler, replied, suspend_req, suspended, resumed;
	unsigned char too_large, queue_failed;
	char peer[INET6_ADDRSTRLEN];
};

struct post_item {
	struct post_item *next;
	void (*fn)(void *arg);
	void *arg;
};

struct mr_httpd {
	struct MHD_Daemon *mhd;
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
	int stopping;
	struct mr_http_req *susp_head;
	size_t n_suspended, n_resumed;
	int resumed_since_run; /* MHD_run must run again without waiting */
	char last_log[256];
};

/* Takes req off the suspended list (loop thread). */
void mr__httpd_susp_unlink(struct mr_httpd *srv, struct mr_http_req *req);
/* Frees the reply headers added with mr_http_add_header. */
void mr__httpd_free_hdrs(struct mr_http_req *req);

#endif
