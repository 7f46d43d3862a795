/*
 * httpd_accept.c - the listen socket and the connection limit of the HTTP
 * server (see mr_httpd.h).
 *
 * libmicrohttpd runs without a listen socket of its own: the loop thread
 * accepts here and hands each socket over with MHD_add_connection(). Left
 * to itself, libmicrohttpd stops accepting at its connection limit, so
 * new clients wait in the backlog and a Kubernetes probe times out on a
 * controller that is only busy. Here every connection is accepted at once
 * and sorted:
 *
 *   - below max_connections: an ordinary connection;
 *   - past it, while fewer than `reserve` reserve slots are taken: a reserve
 *     connection, with a short idle timeout and a short deadline for its
 *     whole request (httpd_deadline.c); its request is served if the
 *     path is operational (/healthz, /readyz, /metrics), else answered
 *     503 "overloaded"; either way the connection closes after the reply
 *     (httpd.c, httpd_req.c);
 *   - past that too, or when accept() fails for lack of descriptors: a
 *     fixed 503 "overloaded" is written without reading the request, and
 *     the socket is closed.
 *
 * The counts follow libmicrohttpd's connection start/close notifications,
 * which it sends when a connection is really gone (cleaned up), so they
 * match its own count and its limit (max_connections + reserve) is never
 * what refuses a socket. The per-IP limit stays libmicrohttpd's (it closes
 * the extra connection).
 *
 * Non-goals: fairness between clients, load shedding by route.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "httpd_int.h"
#include "mr_log.h"

#define ACCEPT_BATCH 64         /* accepts per loop pass, then MHD runs */
#define OVERLOAD_LOG_MS 10000   /* at most one overload line per 10 s */

static const char overloaded_body[] =
	"{\"error\":{\"code\":\"overloaded\","
	"\"message\":\"the server is at its connection limit\",\"field\":null}}";

int mr__httpd_reserved_path(const char *path)
{
	return !strcmp(path, "/healthz") || !strcmp(path, "/readyz") ||
	       !strcmp(path, "/metrics");
}

struct mr__httpd_conn *mr__httpd_conn_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

void mr__httpd_on_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
		       enum MHD_ConnectionNotificationCode code)
{
	struct mr_httpd *srv = cls;
	struct mr__httpd_conn *c;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		srv->n_conns++;
		c = calloc(1, sizeof(*c));
		*socket_context = c;
		if (srv->adding_reserve) {
			/* without a record (out of memory) it is served but not
			 * counted as a reserve slot: nothing could uncount it */
			if (c) {
				c->reserve = 1;
				srv->n_reserve++;
			}
			MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
						  srv->reserve_timeout_s);
		}
		if (c) { /* the request (headers) must come in time */
			c->fd = srv->adding_fd;
			mr__httpd_dl_arm(srv, c,
					 c->reserve ? MR__HTTPD_PH_RESERVE : MR__HTTPD_PH_HEADER,
					 mr__httpd_now_ms());
		}
		return;
	}
	c = *socket_context;
	*socket_context = NULL;
	srv->n_conns--;
	if (!c)
		return;
	mr__httpd_dl_arm(srv, c, MR__HTTPD_PH_NONE, 0);
	if (c->reserve)
		srv->n_reserve--;
	if (c->open) {
		mr_log_debug("httpd_request_dropped", "where=close");
		mr__httpd_req_free(srv, c->open);
	}
	free(c);
}

/* The fixed 503: whatever the client sent so far is read first, so that
 * the close does not turn into a reset that loses the reply. */
static void refuse(struct mr_httpd *srv, int fd)
{
	char buf[4096];
	ssize_t w;
	int n;

	if (srv->tls) { /* no reply can be spoken before a handshake */
		close(fd);
		srv->n_refused++;
		return;
	}
	for (int i = 0; i < 4 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++)
		;
	n = snprintf(buf, sizeof(buf),
		     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
		     "Retry-After: 1\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
		     sizeof(overloaded_body) - 1, overloaded_body);
	w = send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	(void)w; /* best effort: the client may be gone */
	shutdown(fd, SHUT_WR);
	close(fd);
	srv->n_refused++;
}

static void log_overload(struct mr_httpd *srv)
{
	uint64_t now = mr__httpd_now_ms();

	if (srv->overload_logged_ms && now - srv->overload_logged_ms < OVERLOAD_LOG_MS)
		return;
	srv->overload_logged_ms = now;
	mr_log_warn("httpd_overloaded", "connections=%zu max=%u reserve_used=%zu refused=%llu "
		    "answered_503=%llu", srv->n_conns, srv->max_conns, srv->n_reserve,
		    srv->n_refused, srv->n_overload);
}

/* accept() failed with EMFILE/ENFILE: give up the spare descriptor for one
 * accept, refuse that client, take the spare back. Without this the listen
 * socket stays readable and the loop spins. */
static void refuse_without_fds(struct mr_httpd *srv)
{
	int fd;

	if (srv->spare_fd < 0)
		return;
	close(srv->spare_fd);
	fd = accept4(srv->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd >= 0)
		refuse(srv, fd);
	srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void mr__httpd_accept(struct mr_httpd *srv)
{
	for (int i = 0; i < ACCEPT_BATCH; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = accept4(srv->lfd, (struct sockaddr *)&ss, &sl,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE) {
				refuse_without_fds(srv);
				log_overload(srv);
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				mr_log_warn("httpd_accept_failed", "errno=%d", errno);
			return;
		}
		srv->adding_fd = fd; /* for the deadline (mr__httpd_on_conn) */
		if (srv->n_conns < srv->max_conns) {
			MHD_add_connection(srv->mhd, fd, (struct sockaddr *)&ss, sl);
		} else if (srv->n_reserve < srv->reserve) {
			srv->adding_reserve = 1;
			MHD_add_connection(srv->mhd, fd, (struct sockaddr *)&ss, sl);
			srv->adding_reserve = 0;
			log_overload(srv);
		} else {
			refuse(srv, fd);
			log_overload(srv);
		}
		/* MHD_add_connection closes the socket itself when it fails
		 * (per-IP limit, out of memory). */
		srv->adding_fd = -1;
	}
}

int mr__httpd_listen(struct mr_httpd *srv, const char *addr, int port, struct mr_errbuf *eb)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
	socklen_t sl;
	int one = 1, fd, rc = 0;

	memset(&ss, 0, sizeof(ss));
	if (!addr || inet_pton(AF_INET, addr, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		if (!addr)
			s4->sin_addr.s_addr = htonl(INADDR_ANY);
		sl = sizeof(*s4);
	} else if (inet_pton(AF_INET6, addr, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		sl = sizeof(*s6);
	} else {
		return mr_errf_field(eb, MR_EINVAL, "bind_addr",
				     "invalid bind address '%s': expected an ip address", addr);
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    (ss.ss_family == AF_INET6 &&
	     setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) ||
	    bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 4096) != 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &(socklen_t){sizeof(ss)}) != 0) {
		rc = mr_errf(eb, MR_EIO, "unable to listen on '%s:%d': %s", addr ? addr : "*",
			     port, strerror(errno));
		goto out;
	}
	srv->port = ntohs(ss.ss_family == AF_INET6 ? s6->sin6_port : s4->sin_port);
	srv->lfd = fd;
	fd = -1;
	srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
out:
	if (fd >= 0)
		close(fd);
	return rc;
}
