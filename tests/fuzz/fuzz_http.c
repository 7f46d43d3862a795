/*
 * fuzz_http.c - libFuzzer harness: raw bytes over a real socket into an
 * in-process controller (libmicrohttpd parsing, mr_httpd, routing, auth,
 * body validation and every handler, all under ASan/UBSan in this process).
 *
 * The controller starts once (loopback, ephemeral port, journal in a temp
 * dir without fsync, small limits so state stays bounded, a token so both
 * the authorised and the rejected paths run). Each input is sent as is on
 * a new connection, the write side is shut, and the reply is drained until
 * the server closes or pauses (see below). A crash, leak or sanitizer report in
 * the controller fails the run; hangs are caught by libFuzzer's -timeout.
 *
 * The same bytes also go straight into the request-target decoder
 * (httpd_path.c), up to the first space or line end, and its invariants
 * are checked: an accepted path has no control byte, its segments are
 * exactly the '/'-separated pieces of the raw path, and the decoded path
 * is "/" plus the segments joined by '/'; a refused one names a field.
 *
 * Seeds: tests/fuzz/corpus/http/ (well-formed requests of every route;
 * percent-encoded paths and queries, good and bad: %2F, %00, malformed
 * escapes, control bytes; conflicting Content-Length and Transfer-Encoding).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "httpd_int.h"
#include "mr_controller.h"
#include "mr_log.h"

static struct mr_controller *ctl;
static int port;

static void stop(void)
{
	mr_controller_stop(ctl);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct mr_controller_opts o;
	struct mr_errbuf eb = {0};
	char dir[] = "/tmp/mr-fuzz-http-XXXXXX";

	(void)argc;
	(void)argv;
	mr_log_init("controller", MR_LOG_OFF);
	if (!mkdtemp(dir) || mr_controller_opts_default(&o, &eb)) {
		fprintf(stderr, "fuzz_http: setup failed: %s\n", eb.msg);
		abort();
	}
	snprintf(o.listen, sizeof(o.listen), "127.0.0.1");
	o.port = 0;
	snprintf(o.data_dir, sizeof(o.data_dir), "%s", dir);
	snprintf(o.token, sizeof(o.token), "fuzz-token");
	o.fsync = 0;
	o.max_jobs = 16;
	o.max_members = 64;
	o.max_keys = 256;
	o.max_value = 4096;
	o.max_body = 16384;
	o.idle_timeout_ms = 1000;
	o.log_level = MR_LOG_OFF;
	if (mr_controller_start(&ctl, &o, &eb)) {
		fprintf(stderr, "fuzz_http: controller did not start: %s\n", eb.msg);
		abort();
	}
	port = mr_controller_port(ctl);
	atexit(stop);
	return 0;
}

/* The target of the request line ("GET <target> HTTP/1.1"), or the whole
 * input when there is no space, through the decoder: checks invariants. */
static void check_target(const uint8_t *data, size_t size)
{
	const char *d = (const char *)data, *sp = memchr(d, ' ', size), *t, *q;
	struct mr__http_target tg;
	struct mr_errbuf eb = {0};
	size_t len, nslash = 0, o = 1;
	char *raw;

	t = sp ? sp + 1 : d;
	len = size - (size_t)(t - d);
	for (size_t i = 0; i < len; i++) {
		if (t[i] == ' ' || t[i] == '\r' || t[i] == '\n') {
			len = i;
			break;
		}
	}
	raw = malloc(len + 1);
	if (!raw)
		return;
	memcpy(raw, t, len);
	raw[len] = '\0';
	len = strlen(raw); /* libmicrohttpd never hands over a NUL */
	q = strchr(raw, '?');
	if (q)
		len = (size_t)(q - raw);
	if (mr__http_target_parse(&tg, raw, len, &eb) != 0) {
		if (!eb.field[0] || !eb.msg[0])
			abort(); /* a refusal must name the field */
	} else {
		for (size_t i = 1; i < len; i++)
			nslash += raw[i] == '/';
		if (tg.nsegs != nslash + 1 || tg.segs[tg.nsegs] || tg.path[0] != '/')
			abort();
		for (size_t k = 0; k < tg.nsegs; k++) {
			size_t n = strlen(tg.segs[k]);

			for (size_t i = 0; i < n; i++)
				if ((unsigned char)tg.segs[k][i] < 0x20 || tg.segs[k][i] == 0x7f)
					abort();
			if (k)
				o++; /* the '/' between segments */
			if (memcmp(tg.path + o, tg.segs[k], n) != 0)
				abort();
			o += n;
		}
		if (tg.path[o] != '\0')
			abort();
		mr__http_target_release(&tg);
	}
	if (q) {
		mr_errbuf_clear(&eb);
		if (mr__http_query_check(q + 1, strlen(q + 1), &eb) != 0 && !eb.field[0])
			abort();
	}
	free(raw);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	char buf[4096];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	check_target(data, size);
	if (fd < 0)
		return 0;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		size_t off = 0;

		while (off < size) {
			ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);

			if (w <= 0)
				break;
			off += (size_t)w;
		}
		shutdown(fd, SHUT_WR);
		/* up to 100 ms for the reply to start, then until the server
		 * pauses (a reply is written at once, long-polls are short) */
		for (int wait_ms = 100;; wait_ms = 5) {
			struct pollfd p = {.fd = fd, .events = POLLIN};

			if (poll(&p, 1, wait_ms) <= 0 || recv(fd, buf, sizeof(buf), 0) <= 0)
				break;
		}
	}
	close(fd);
	return 0;
}
