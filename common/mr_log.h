/*
 * mr_log.h - structured logging: one logfmt line per event on stderr.
 *
 *   ts=2026-11-21T22:40:00.123Z lvl=info comp=controller job=ns/a rank=3
 *   event=round_closed gen=2 world=8
 *
 * or, with mr_log_set_format(MR_LOG_JSON) (--log-format json), the same
 * pairs as one JSON object per line, numbers as numbers:
 *
 *   {"ts":"2026-11-21T22:40:00.123Z","lvl":"info","comp":"controller",
 *    "job":"ns/a","rank":3,"event":"round_closed","gen":2,"world":8}
 *
 * Fixed keys come first (ts lvl comp [job] [rank] event), then the caller's
 * own logfmt pairs. The level is checked before anything is formatted, so a
 * disabled debug line costs one comparison. A line is written with a single
 * write(2), so lines from threads and processes never interleave.
 *
 * comp and job are process-wide (mr_log_init); rank is per thread
 * (mr_log_set_rank) because one agent runs one runtime thread per local rank.
 *
 * Non-goals: files, rotation, sampling. Kubernetes collects stderr.
 */
#ifndef MR_LOG_H
#define MR_LOG_H

enum mr_log_level {
	MR_LOG_DEBUG = 0,
	MR_LOG_INFO = 1,
	MR_LOG_WARN = 2,
	MR_LOG_ERROR = 3,
	MR_LOG_OFF = 4,
};

extern int mr__log_level;

/* comp: short component name ("controller"); copied. */
void mr_log_init(const char *comp, enum mr_log_level level);
void mr_log_set_level(enum mr_log_level level);
/* job may be NULL to clear; copied. */
void mr_log_set_job(const char *job);
/* rank of the calling thread; -1 (the default) omits the key. */
void mr_log_set_rank(int rank);
/* "debug", "info", "warn", "error", "off" -> level, or -1. */
int mr_log_parse_level(const char *name);

enum mr_log_format { MR_LOG_LOGFMT = 0, MR_LOG_JSON = 1 };
/* Process-wide; logfmt by default. */
void mr_log_set_format(enum mr_log_format format);
enum mr_log_format mr_log_get_format(void);
/* The names of the formats, in enum order, NULL-terminated (config tables). */
extern const char *const mr_log_format_names[];

/*
 * Quote a value for logfmt if it needs it (spaces, quotes, '=', empty).
 * Returns a thread-local buffer valid until the 8th next call in the same
 * thread, so a line may quote up to 8 values.
 */
const char *mr_log_q(const char *value);

void mr__log(enum mr_log_level lvl, const char *event, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* fmt holds the extra logfmt pairs, e.g. "gen=%d world=%d"; may be "". */
#define mr_log(lvl, event, ...)                          \
	do {                                             \
		if ((int)(lvl) >= mr__log_level)         \
			mr__log((lvl), (event), __VA_ARGS__); \
	} while (0)
#define mr_log_debug(event, ...) mr_log(MR_LOG_DEBUG, event, __VA_ARGS__)
#define mr_log_info(event, ...) mr_log(MR_LOG_INFO, event, __VA_ARGS__)
#define mr_log_warn(event, ...) mr_log(MR_LOG_WARN, event, __VA_ARGS__)
#define mr_log_error(event, ...) mr_log(MR_LOG_ERROR, event, __VA_ARGS__)
/* An info line that every level but off shows: what a run ends with (its
 * summary), which --log-level warn must not hide. */
#define mr_log_always(event, ...)                                  \
	do {                                                       \
		if (mr__log_level < MR_LOG_OFF)                    \
			mr__log(MR_LOG_INFO, (event), __VA_ARGS__); \
	} while (0)

/* Async-signal-safe: writes "lvl=warn comp=<comp> event=<event>" with no
 * timestamp formatting and no allocation. For signal handlers only. */
void mr_log_signal(const char *event);

#endif
