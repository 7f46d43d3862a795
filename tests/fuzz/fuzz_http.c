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
 * Seeds: tests/fuzz/corpus/http/ (well-formed requests of every route).
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	char buf[4096];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

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
