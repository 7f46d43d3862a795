/*
 * mr_err.h - meshrun error codes.
 *
 * Every fallible meshrun function returns int: 0 on success, a negative
 * MR_E* code on failure. Codes are append-only: a number, once released,
 * never changes meaning (logs, metrics and exit paths depend on it).
 * mr_strerror() gives the message for people, mr_err_name() the stable name
 * for programs ("MR_ETIMEDOUT").
 *
 * Non-goals: carrying detail. A function that has more to say writes it to
 * an error buffer the caller passes (struct mr_errbuf) or logs it.
 */
#ifndef MR_ERR_H
#define MR_ERR_H

#include <stddef.h>

/* X(name, value, message) - append new codes at the end only. */
#define MR_ERR_TABLE(X)                                                   \
	X(OK, 0, "success")                                               \
	X(NOMEM, -1, "out of memory")                                     \
	X(INVAL, -2, "invalid argument")                                  \
	X(RANGE, -3, "value out of range")                                \
	X(PARSE, -4, "malformed input")                                   \
	X(IO, -5, "i/o error")                                            \
	X(NOTFOUND, -6, "not found")                                      \
	X(EXISTS, -7, "already exists")                                   \
	X(TIMEDOUT, -8, "timed out")                                      \
	X(ABORTED, -9, "aborted")                                         \
	X(CONN, -10, "connection failed")                                 \
	X(PROTO, -11, "protocol error")                                   \
	X(STALE, -12, "stale generation")                                 \
	X(AUTH, -13, "not authorized")                                    \
	X(LIMIT, -14, "limit exceeded")                                   \
	X(STATE, -15, "operation not allowed in this state")              \
	X(CONFLICT, -16, "conflict")                                      \
	X(CLOSED, -17, "closed")                                          \
	X(PEER, -18, "peer failed")                                       \
	X(NOTSUP, -19, "not supported")                                   \
	X(CORRUPT, -20, "data corrupt")                                   \
	X(SYS, -21, "system call failed")                                 \
	X(NONFINITE, -22, "non-finite value")                             \
	X(NEEDHOST, -23, "needs the host while a device graph is captured")

enum mr_err {
#define MR__ERR_ENUM(name, value, msg) MR_E##name = (value),
	MR_ERR_TABLE(MR__ERR_ENUM)
#undef MR__ERR_ENUM
};

/* Message for people; never NULL ("unknown error" for unknown codes). */
const char *mr_strerror(int err);
/* Stable name for programs, e.g. "MR_ETIMEDOUT"; never NULL. */
const char *mr_err_name(int err);

/*
 * A fixed-size buffer that a failing function fills with one lowercase
 * line naming the subject and the reason ("--port: 'abc' is not an
 * integer"). The first message wins; later ones are dropped so the root
 * cause is kept.
 */
#define MR_ERRBUF_SIZE 512
struct mr_errbuf {
	char msg[MR_ERRBUF_SIZE];
	char field[128]; /* the offending field/flag/key, "" if none */
};

/* Sets the message if none is set yet; returns err so callers can write
 * `return mr_errf(eb, MR_EINVAL, "...", ...);`. eb may be NULL. */
int mr_errf(struct mr_errbuf *eb, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The same, also recording the offending field (used for HTTP 400 bodies
 * and config errors). */
int mr_errf_field(struct mr_errbuf *eb, int err, const char *field, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void mr_errbuf_clear(struct mr_errbuf *eb);

#endif
