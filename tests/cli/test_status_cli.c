/*
 * test_status_cli.c - `meshrun status [--why] JOB` checks the job name with
 * the controller's grammar (mr_jobname.h) before it builds a URL (issue
 * 26): a name with "..", a query, a fragment, an escape or a third
 * segment exits 2 naming the name and the rule, and no request is sent;
 * a valid name reaches exactly its own path.
 *
 * The "controller" is a fake on a loopback port that records each request
 * line and answers 404, so a name that gets through shows up at once.
 */
#include <criterion/criterion.h>

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <netinet/in.h>

#include "mr_jobname.h"
#include "proc.h"

/* ---- a fake controller ----------------------------------------------------- */

struct fake {
	int lfd, port;
	pthread_t th;
	atomic_int stop;
	pthread_mutex_t mu;
	char lines[4096]; /* request lines, one per line */
	int n;
};

static void fake_serve(struct fake *f, int fd)
{
	static const char body[] = "{\"error\":{\"code\":\"not_found\",\"message\":\"fake\"}}";
	char buf[4096] = "", reply[256], *eol;
	size_t got = 0;
	int n;

	while (got < sizeof(buf) - 1 && !strstr(buf, "\r\n\r\n")) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t k;

		if (poll(&p, 1, 5000) <= 0)
			break;
		k = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
		if (k <= 0)
			break;
		got += (size_t)k;
		buf[got] = '\0';
	}
	eol = strstr(buf, "\r\n");
	if (eol)
		*eol = '\0';
	pthread_mutex_lock(&f->mu);
	snprintf(f->lines + strlen(f->lines), sizeof(f->lines) - strlen(f->lines), "%s\n", buf);
	f->n++;
	pthread_mutex_unlock(&f->mu);
	n = snprintf(reply, sizeof(reply),
		     "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
		     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
		     sizeof(body) - 1);
	(void)!send(fd, reply, (size_t)n, MSG_NOSIGNAL);
	(void)!send(fd, body, sizeof(body) - 1, MSG_NOSIGNAL);
	close(fd);
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;

	while (!atomic_load(&f->stop)) {
		struct pollfd p = {.fd = f->lfd, .events = POLLIN};
		int fd;

		if (poll(&p, 1, 50) <= 0)
			continue;
		fd = accept(f->lfd, NULL, NULL);
		if (fd >= 0)
			fake_serve(f, fd);
	}
	return NULL;
}

static void fake_start(struct fake *f)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);

	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->mu, NULL);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(f->lfd >= 0);
	cr_assert_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(f->lfd, 16), 0);
	cr_assert_eq(getsockname(f->lfd, (struct sockaddr *)&sa, &sl), 0);
	f->port = ntohs(sa.sin_port);
	cr_assert_eq(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(struct fake *f)
{
	atomic_store(&f->stop, 1);
	pthread_join(f->th, NULL);
	close(f->lfd);
	pthread_mutex_destroy(&f->mu);
}

/* ---- running the CLI ----------------------------------------------------------- */

/* `meshrun status [--why] --controller <fake> name`; the exit code, the
 * output in out. */
static int status(struct fake *f, int why, const char *name, char *out, size_t cap)
{
	static const char *dir; /* one per test process, removed at exit */
	char url[64], log[512];
	const char *args[8];
	struct mr_proc p;
	int n = 0;

	if (!dir)
		dir = mr_test_scratch("mr-status");
	cr_assert_not_null(dir);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", f->port);
	snprintf(log, sizeof(log), "%s/status.log", dir);
	unlink(log);
	args[n++] = "status";
	if (why)
		args[n++] = "--why";
	args[n++] = "--controller";
	args[n++] = url;
	args[n++] = name;
	args[n] = NULL;
	cr_assert_eq(mr_proc_spawn(&p, "meshrun", args, NULL, log), 0);
	cr_assert_eq(mr_proc_reap(&p, 60000), 0, "meshrun status %s did not exit", name);
	mr_test_tail(log, out, cap);
	return WIFEXITED(p.status) ? WEXITSTATUS(p.status) : -1;
}

/* ---- tests ---------------------------------------------------------------------- */

Test(status_cli, bad_job_names_exit_2_before_any_request)
{
	static const char *const bad[] = {
		"zz/../team/a", /* libcurl folds "..": would show team/a */
		"team/a?x=1",   /* a query */
		"team/a#x",     /* a fragment */
		"team/a/kv",    /* a third segment */
		"team/a%2fb",   /* an escape */
		"../a",         "./a",    "Team/a", "team/A", "team",   "/team/a",
		"team/",        "team/a b", "team/-a", "team/a-", "team/.a", "",
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/x",
	};
	struct fake f;
	char out[4096];

	fake_start(&f);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		for (int why = 0; why < 2; why++) {
			cr_assert_eq(status(&f, why, bad[i], out, sizeof(out)), 2,
				     "status %s'%s' exited otherwise: %s (requests: %s)",
				     why ? "--why " : "", bad[i], out, f.lines);
			cr_assert(strstr(out, "invalid job name"), "%s", out);
			cr_assert(strstr(out, bad[i]), "the message does not name '%s': %s", bad[i],
				  out);
			cr_assert(strstr(out, MR_JOB_NAME_RULE), "the rule is missing: %s", out);
		}
	}
	pthread_mutex_lock(&f.mu);
	cr_assert_eq(f.n, 0, "requests were sent:\n%s", f.lines);
	pthread_mutex_unlock(&f.mu);
	fake_stop(&f);
}

Test(status_cli, a_valid_name_reaches_exactly_its_path)
{
	struct fake f;
	char out[4096];

	fake_start(&f);
	/* the fake answers 404: the CLI fails (1), but after the request */
	cr_assert_eq(status(&f, 1, "team-a/gpt.v2", out, sizeof(out)), 1, "%s", out);
	cr_assert_eq(status(&f, 0, "0ns/9", out, sizeof(out)), 1, "%s", out);
	pthread_mutex_lock(&f.mu);
	cr_assert(strstr(f.lines, "GET /v1/jobs/team-a/gpt.v2/diagnosis HTTP/1.1\n"), "%s",
		  f.lines);
	cr_assert(strstr(f.lines, "GET /v1/jobs/0ns/9?members=1&offset=0&limit=1000 HTTP/1.1\n"),
		  "%s", f.lines);
	pthread_mutex_unlock(&f.mu);
	fake_stop(&f);
}

Test(status_cli, the_grammar_is_the_controllers)
{
	char part[MR_JOB_PART_MAX + 2];

	cr_assert(mr_job_name_valid("a/b"));
	cr_assert(mr_job_name_valid("team-a/gpt.small-2"));
	cr_assert(mr_job_part_valid("a..b"), "dots inside a label are the controller's rule");
	cr_assert_not(mr_job_name_valid("a/b/c"));
	cr_assert_not(mr_job_name_valid("a//b"));
	cr_assert_not(mr_job_part_valid(".."));
	cr_assert_not(mr_job_part_valid(""));
	memset(part, 'a', sizeof(part) - 1);
	part[MR_JOB_PART_MAX] = '\0';
	cr_assert(mr_job_part_valid(part), "63 bytes is a part");
	part[MR_JOB_PART_MAX] = 'a';
	part[MR_JOB_PART_MAX + 1] = '\0';
	cr_assert_not(mr_job_part_valid(part), "64 bytes is not");
}
