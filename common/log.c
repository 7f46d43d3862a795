/* log.c - logfmt (or JSON) lines on stderr; see mr_log.h. */
#include "mr_log.h"

#include <ctype.h>
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
static enum mr_log_format log_format = MR_LOG_LOGFMT;
const char *const mr_log_format_names[] = {"logfmt", "json", NULL};

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

void mr_log_set_format(enum mr_log_format format)
{
	log_format = format;
}

enum mr_log_format mr_log_get_format(void)
{
	return log_format;
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

/* 1 when the bare value v[0..n) is a JSON number (RFC 8259 grammar). */
static int json_number(const char *v, size_t n)
{
	size_t i = 0;

	if (i < n && v[i] == '-')
		i++;
	if (i < n && v[i] == '0')
		i++;
	else if (i < n && v[i] >= '1' && v[i] <= '9')
		while (i < n && isdigit((unsigned char)v[i]))
			i++;
	else
		return 0;
	if (i < n && v[i] == '.') {
		if (++i >= n || !isdigit((unsigned char)v[i]))
			return 0;
		while (i < n && isdigit((unsigned char)v[i]))
			i++;
	}
	if (i < n && (v[i] == 'e' || v[i] == 'E')) {
		if (++i < n && (v[i] == '+' || v[i] == '-'))
			i++;
		if (i >= n || !isdigit((unsigned char)v[i]))
			return 0;
		while (i < n && isdigit((unsigned char)v[i]))
			i++;
	}
	return i == n;
}

/* Appends s[0..len) as JSON string contents (escaped). */
static size_t json_put(char *out, size_t n, size_t cap, const char *s, size_t len)
{
	for (size_t i = 0; i < len && n + 8 < cap; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\') {
			out[n++] = '\\';
			out[n++] = (char)c;
		} else if (c < 0x20) {
			n += (size_t)snprintf(out + n, cap - n, "\\u%04x", c);
		} else {
			out[n++] = (char)c;
		}
	}
	return n;
}

/*
 * The logfmt line (as mr__log formats it: key=value pairs, values bare
 * or double-quoted with \" and \\ escapes) as one JSON object and a
 * newline; a bare numeric value stays a number, everything else is a
 * string, a word with no '=' a key with the value true. Returns the
 * length written to out.
 */
static size_t logfmt_to_json(const char *line, char *out, size_t cap)
{
	const char *p = line;
	size_t n = 0;
	int first = 1;

	out[n++] = '{';
	while (*p && n + 16 < cap) {
		const char *key = p, *val;
		size_t klen, vlen;

		while (*p && *p != '=' && *p != ' ')
			p++;
		klen = (size_t)(p - key);
		if (klen == 0) {
			p += *p != '\0';
			continue;
		}
		n += (size_t)snprintf(out + n, cap - n, "%s\"", first ? "" : ",");
		first = 0;
		n = json_put(out, n, cap, key, klen);
		n += (size_t)snprintf(out + n, cap - n, "\":");
		if (*p != '=') {
			n += (size_t)snprintf(out + n, cap - n, "true");
			continue;
		}
		p++;
		if (*p == '"') {
			out[n++] = '"';
			for (p++; *p && *p != '"' && n + 8 < cap; p++) {
				if (*p == '\\' && p[1])
					p++;
				n = json_put(out, n, cap, p, 1);
			}
			p += *p == '"';
			out[n++] = '"';
			continue;
		}
		val = p;
		while (*p && *p != ' ')
			p++;
		vlen = (size_t)(p - val);
		if (json_number(val, vlen)) {
			memcpy(out + n, val, vlen);
			n += vlen;
		} else {
			out[n++] = '"';
			n = json_put(out, n, cap, val, vlen);
			out[n++] = '"';
		}
	}
	if (n + 2 >= cap) /* cut: keep the object closed */
		n = cap - 3;
	out[n++] = '}';
	out[n++] = '\n';
	return n;
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
	if (log_format == MR_LOG_JSON) {
		static _Thread_local char json[6 * LOG_LINE_MAX + 64]; /* never cut: \u00XX at worst */

		line[n] = '\0';
		n = logfmt_to_json(line, json, sizeof(json));
		(void)!write(STDERR_FILENO, json, n);
		return;
	}
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
