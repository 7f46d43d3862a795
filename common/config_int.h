/*
 * config_int.h - internals shared by config.c, config_sources.c and
 * config_help.c (see mr_config.h).
 */
#ifndef MR_CONFIG_INT_H
#define MR_CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>

#include "mr_config.h"

#define NAME_MAX_LEN 64
#define SHOWN_MAX 64

/* "--max-restarts" / "MESHRUN_MAX_RESTARTS" of a row ("" when it has none). */
void mr__config_flag_of(const struct mr_config_opt *o, char *buf, size_t size);
void mr__config_env_of(const struct mr_config_opt *o, char *buf, size_t size);
/* Row index by option name, or by the text of a flag (len bytes); -1. */
int mr__config_find_opt(const struct mr_config *cfg, const char *name);
int mr__config_find_flag(const struct mr_config *cfg, const char *flag, size_t len);
/* "1500ms" / "2s" / "1m"; %g with enough digits to read back. */
void mr__config_format_ms(int64_t ms, char *buf, size_t size);
void mr__config_format_dbl(double v, char *buf, size_t size);
/* "a, b, c" of an enum's choices. */
void mr__config_choices_list(const char *const *choices, char *buf, size_t size);
/* Parses text as row o and stores it; origin ("flag --x") and shown name
 * go into the error message. */
int mr__config_apply(struct mr_config *cfg, const struct mr_config_opt *o, const char *text,
		     const char *origin, const char *name, struct mr_errbuf *eb);

#endif
