/*
 * port.c - a listener's port outside the ephemeral range (see mr_port.h).
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mr_port.h"

/* Whether port is free for a listener (SO_REUSEADDR: a TIME-WAIT socket
 * on it does not count). */
static int bindable(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), on = 1, ok;

	if (fd < 0)
		return 0;
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	ok = setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) == 0 &&
	     bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

int mr_port_free(void)
{
	static unsigned calls;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	unsigned seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL) ^
			(unsigned)clock() ^ __atomic_add_fetch(&calls, 0x9e3779b9u, __ATOMIC_RELAXED);
	int lo = 32768, hi = 60999;

	if (f) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2)
			lo = 32768;
		fclose(f);
	}
	if (lo - MR_PORT_MIN < 64)
		lo = MR_PORT_MIN + 64; /* an unusual range: still mostly outside it */
	for (int tries = 0; tries < 256; tries++) {
		int port = MR_PORT_MIN + (int)(rand_r(&seed) % (unsigned)(lo - MR_PORT_MIN));
		if (bindable(port))
			return port;
	}
	return -1;
}
