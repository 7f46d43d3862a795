/*
 * http.h - the agent's health and metrics server on mr_httpd:
 *
 *   GET /healthz   200 "ok" while the process is alive and its loop runs
 *   GET /readyz    200 when the round is closed and the workers run,
 *                  503 otherwise (body: the lifecycle state)
 *   GET /metrics   Prometheus text 0.0.4 of the supervisor's registry
 *
 * Every other path is 404, every other method 405.
 * Threading: handlers run on the server's loop thread and only read
 * atomics and the (thread-safe) metrics registry of the supervisor.
 * Ownership: the supervisor must outlive the server.
 * Non-goals: authentication (the endpoints are read-only and public inside
 * the pod network), TLS.
 */
#ifndef MR_AGENT_HTTP_H
#define MR_AGENT_HTTP_H

#include "mr_httpd.h"
#include "supervisor.h"

/* Starts serving on addr:port (port 0 = ephemeral). */
int mr_agent_http_start(struct mr_httpd **out, struct mr_supervisor *sv, const char *addr,
			int port, struct mr_errbuf *eb);

#endif
