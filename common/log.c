/* log.c - logfmt lines on stderr; see mr_log.h. */
#include "mr_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOG_LINE_MAX 4096
#define LOG_QUOTE_SLOTS 8
#define LOG_QUOTE_MAX 512

int mr__log_level = MR_LOG_INFO;
static char log_comp[32] = "meshrun";
static char log_job[256]; /* logfmt-quoted if needed */
static _Thread_local int log_rank = -1;

static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

void mr_log_init(const char *comp, enum mr_log_level level)
{
	snprintf(log_comp, sizeof(log_comp), "%s", comp ? comp : "meshrun");
	mr__log_level = level;
}

void mr_log_set_level(enum mr_log_level level)
{
	mr__log_level = level;
}

void mr_log_set_job(const char *job)
{
	/* stored already quoted for logfmt: quoting at log time would use up
	 * one of the caller's mr_log_q() slots */
	snprintf(log_job, sizeof(log_job), "%s", job && *job ? mr_log_q(job) : "");
}

void mr_log_set_rank(int rank)
{
	log_rank = rank;
}

int mr_log_parse_level(const char *name)
{
	for (int i = 0; i <= MR_LOG_OFF; i++)
		if (name && strcmp(name, level_names[i]) == 0)
			return i;
	return -1;
}

const char *mr_log_q(const char *value)
{
	static _Thread_local char slots[LOG_QUOTE_SLOTS][LOG_QUOTE_MAX];
	static _Thread_local unsigned next;
	char *out = slots[next++ % LOG_QUOTE_SLOTS];
	size_t n = 0;

	if (!value)
		value = "";
	if (*value && !strpbrk(value, " \"=\t\r\n\\"))
		return value;
	out[n++] = '"';
	for (const char *p = value; *p && n < LOG_QUOTE_MAX - 3; p++) {
		if (*p == '"' || *p == '\\') {
			out[n++] = '\\';
			out[n++] = *p;
		} else if (*p == '\n' || *p == '\r' || *p == '\t') {
			out[n++] = ' ';
		} else {
			out[n++] = *p;
		}
	}
	out[n++] = '"';
	out[n] = '\0';
	return out;
}

void mr__log(enum mr_log_level lvl, const char *event, const char *fmt, ...)
{
	char line[LOG_LINE_MAX];
	struct timespec ts;
	struct tm tm;
	size_t n;
	int k;
	va_list ap;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(line, sizeof(line), "ts=%Y-%m-%dT%H:%M:%S", &tm);
	k = snprintf(line + n, sizeof(line) - n, ".%03ldZ lvl=%s comp=%s", ts.tv_nsec / 1000000,
		     level_names[(unsigned)lvl < MR_LOG_OFF ? lvl : MR_LOG_ERROR], log_comp);
	n += (size_t)k;
	if (log_job[0] && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " job=%s", log_job);
	if (log_rank >= 0 && n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " rank=%d", log_rank);
	if (n < sizeof(line))
		n += (size_t)snprintf(line + n, sizeof(line) - n, " event=%s", event);
	if (fmt && fmt[0] && n + 1 < sizeof(line)) {
		line[n++] = ' ';
		va_start(ap, fmt);
		k = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
		va_end(ap);
		if (k > 0)
			n += (size_t)k;
		else
			n--; /* no pairs ("%s", ""): no trailing space */
	}
	if (n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, n);
}

void mr_log_signal(const char *event)
{
	char line[256];
	size_t n = 0;
	const char *parts[] = {"lvl=warn comp=", log_comp, " event=", event, "\n"};

	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		size_t len = strlen(parts[i]);
		if (n + len >= sizeof(line))
			break;
		memcpy(line + n, parts[i], len);
		n += len;
	}
	(void)!write(STDERR_FILENO, line, n);
}
