/*
 * proc.c - spawn, wait-for-port, signal and reap for integration tests
 * (see proc.h).
 */
#include "proc.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

long long mr_test_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *mr_proc_build_dir(void)
{
	const char *b = getenv("MESHRUN_BUILD");

	return b && *b ? b : "build";
}

int mr_proc_spawn(struct mr_proc *p, const char *bin, const char *const *args,
		  const char *const *env, const char *log_path)
{
	char path[1024];
	const char *argv[64];
	int n = 0;
	pid_t pid;

	memset(p, 0, sizeof(*p));
	if (bin[0] == '/') /* a script of the repository, say */
		snprintf(path, sizeof(path), "%s", bin);
	else
		snprintf(path, sizeof(path), "%s/%s", mr_proc_build_dir(), bin);
	argv[n++] = path;
	for (int i = 0; args && args[i] && n < 63; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	if (log_path)
		snprintf(p->log, sizeof(p->log), "%s", log_path);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		/* dies with the test process, even when an assertion aborts it */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() == 1)
			_exit(127);
		if (log_path) {
			int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);

			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
				close(fd);
			}
		}
		for (int i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		execv(path, (char *const *)argv);
		_exit(127);
	}
	p->pid = pid;
	return 0;
}

int mr_proc_alive(struct mr_proc *p)
{
	int st;
	pid_t r;

	if (p->pid <= 0)
		return 0;
	r = waitpid(p->pid, &st, WNOHANG);
	if (r == p->pid) {
		p->status = st;
		p->pid = 0;
		return 0;
	}
	return 1;
}

int mr_proc_wait_port(struct mr_proc *p, const char *path, int timeout_ms)
{
	long long end = mr_test_now_ms() + timeout_ms;

	while (mr_test_now_ms() < end) {
		FILE *f = fopen(path, "r");
		int port = -1;

		if (f) {
			if (fscanf(f, "%d", &port) != 1)
				port = -1;
			fclose(f);
		}
		if (port > 0)
			return port;
		if (!mr_proc_alive(p))
			return -1;
		usleep(10000);
	}
	return -1;
}

int mr_proc_kill(struct mr_proc *p, int sig)
{
	if (p->pid <= 0)
		return -1;
	return kill(p->pid, sig);
}

int mr_proc_reap(struct mr_proc *p, int timeout_ms)
{
	long long end = mr_test_now_ms() + timeout_ms;

	if (p->pid <= 0)
		return -1;
	while (mr_test_now_ms() < end) {
		if (!mr_proc_alive(p))
			return 0;
		usleep(5000);
	}
	kill(p->pid, SIGKILL);
	waitpid(p->pid, &p->status, 0);
	p->pid = 0;
	return 1;
}

void mr_proc_stop(struct mr_proc *p)
{
	if (p->pid <= 0)
		return;
	mr_proc_kill(p, SIGTERM);
	mr_proc_reap(p, 5000);
}

int mr_test_tmpdir(char *buf, size_t cap, const char *prefix)
{
	if (snprintf(buf, cap, "/tmp/%s-XXXXXX", prefix) >= (int)cap)
		return -1;
	return mkdtemp(buf) ? 0 : -1;
}

void mr_test_rmdir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[1024];

	if (!d)
		return;
	while ((e = readdir(d))) {
		struct stat st;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
			mr_test_rmdir(path);
		else
			unlink(path);
	}
	closedir(d);
	rmdir(dir);
}

static char scratch_dir[256];

static void scratch_remove(void)
{
	mr_test_rmdir(scratch_dir);
}

const char *mr_test_scratch(const char *prefix)
{
	int first = !scratch_dir[0];

	if (mr_test_tmpdir(scratch_dir, sizeof(scratch_dir), prefix) != 0)
		return NULL;
	if (first)
		atexit(scratch_remove);
	return scratch_dir;
}

void mr_test_tail(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	long n;

	buf[0] = 0;
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, n > (long)cap - 1 ? n - (long)cap + 1 : 0, SEEK_SET);
	n = (long)fread(buf, 1, cap - 1, f);
	buf[n > 0 ? n : 0] = 0;
	fclose(f);
}

/* ---- test HTTP client ---- */

#include <curl/curl.h>
#include <pthread.h>

static void curl_init_once(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t on_body(char *p, size_t sz, size_t n, void *u)
{
	struct mr_test_resp *r = u;
	size_t len = sz * n, room = sizeof(r->body) - 1 - r->len;
	size_t take = len < room ? len : room;

	memcpy(r->body + r->len, p, take);
	r->len += take;
	r->body[r->len] = 0;
	return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *u)
{
	struct mr_test_resp *r = u;
	size_t len = sz * n;

	if (len > 6 && strncasecmp(p, "ETag:", 5) == 0) {
		size_t i = 5, j = 0;

		while (i < len && p[i] == ' ')
			i++;
		while (i < len && p[i] != '\r' && p[i] != '\n' && j + 1 < sizeof(r->etag))
			r->etag[j++] = p[i++];
		r->etag[j] = 0;
	}
	return len;
}

long mr_test_http(struct mr_test_resp *r, const char *method, const char *url,
		  const void *body, size_t len, const char *const *hdrs, long timeout_ms)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	struct curl_slist *sl = NULL;
	CURL *c;

	pthread_once(&once, curl_init_once);
	memset(r, 0, sizeof(*r));
	c = curl_easy_init();
	if (!c)
		return 0;
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
	if (!strcmp(method, "HEAD"))
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	if (body || !strcmp(method, "POST") || !strcmp(method, "PUT")) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
	}
	sl = curl_slist_append(sl, "Expect:");
	for (int i = 0; hdrs && hdrs[i]; i++)
		sl = curl_slist_append(sl, hdrs[i]);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, sl);
	if (curl_easy_perform(c) == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	curl_slist_free_all(sl);
	curl_easy_cleanup(c);
	return r->status;
}

int mr_test_connect(int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

int mr_test_connect_ok(int port)
{
	int fd = mr_test_connect(port);

	cr_assert(fd >= 0, "unable to connect to port %d", port);
	return fd;
}

size_t mr_test_read_all(int fd, char *buf, size_t cap)
{
	size_t got = 0;

	while (got < cap - 1) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t n;

		if (poll(&p, 1, 10000) <= 0)
			break;
		n = recv(fd, buf + got, cap - 1 - got, 0);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	buf[got] = '\0';
	return got;
}

int mr_test_raw_request(int port, const char *req, char *buf, size_t cap)
{
	int fd = mr_test_connect(port), status = 0;
	size_t len = strlen(req);

	buf[0] = '\0';
	if (fd < 0)
		return -1;
	if (send(fd, req, len, MSG_NOSIGNAL) == (ssize_t)len)
		mr_test_read_all(fd, buf, cap);
	close(fd);
	if (sscanf(buf, "HTTP/1.1 %d", &status) != 1)
		status = 0;
	return status;
}

char *mr_test_slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (buf = calloc(1, (size_t)n + 1)) && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (buf && len)
		*len = (size_t)n;
	return buf;
}

int mr_test_sh(const char *dir, char **out, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = mr_test_vsh(dir, out, fmt, ap);
	va_end(ap);
	return rc;
}

int mr_test_vsh(const char *dir, char **out, const char *fmt, va_list ap)
{
	char *body = NULL, *cmd = NULL, log[PATH_MAX], *text;
	int st;

	cr_assert_geq(vasprintf(&body, fmt, ap), 0);
	snprintf(log, sizeof(log), "%s/.sh-%d.log", dir, (int)getpid());
	cr_assert_geq(asprintf(&cmd, "cd '%s' && { %s ; } >'%s' 2>&1", dir, body, log), 0);
	st = system(cmd);
	text = mr_test_slurp(log, NULL);
	unlink(log);
	cr_assert_not_null(text, "%s: no output file", body);
	cr_assert(!strstr(text, "Sanitizer") && !strstr(text, "runtime error:"), "%s: %s", body,
		  text);
	free(cmd);
	free(body);
	if (out)
		*out = text;
	else
		free(text);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *mr_test_repo_file(const char *rel)
{
	static char path[PATH_MAX + 256];
	char dir[PATH_MAX];

	if (!realpath(mr_proc_build_dir(), dir))
		snprintf(dir, sizeof(dir), ".");
	for (;;) {
		char *slash;

		snprintf(path, sizeof(path), "%s/%s", dir, rel);
		if (access(path, R_OK) == 0)
			return path;
		slash = strrchr(dir, '/');
		if (!slash || slash == dir)
			break;
		*slash = '\0';
	}
	snprintf(path, sizeof(path), "%s", rel);
	return path;
}
