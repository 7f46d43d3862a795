/*
 * mr_json.h - small helpers on jansson for request bodies and config files.
 *
 * Every getter validates type and bounds and, on failure, fills the errbuf
 * with a message and the offending field name, so a caller can answer
 * `400 {"error":{"code":"invalid_field","field":"min_nodes",...}}` or exit
 * 2 naming the config key. Absent optional fields leave *out untouched.
 *
 * Non-goals: schemas, pointers/paths, streaming.
 */
#ifndef MR_JSON_H
#define MR_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "mr_err.h"

/* Parses buf (len bytes, not NUL-terminated necessarily) and requires a
 * top-level object. *out is a new reference. */
int mr_json_parse_object(const char *buf, size_t len, json_t **out, struct mr_errbuf *eb);
/* Rejects keys not in allowed (NULL-terminated list), naming the first. */
int mr_json_check_keys(const json_t *obj, const char *const *allowed, struct mr_errbuf *eb);

int mr_json_get_int(const json_t *obj, const char *field, int required, int64_t min,
		    int64_t max, int64_t *out, struct mr_errbuf *eb);
int mr_json_get_double(const json_t *obj, const char *field, int required, double min,
		       double max, double *out, struct mr_errbuf *eb);
int mr_json_get_bool(const json_t *obj, const char *field, int required, int *out,
		     struct mr_errbuf *eb);
/* *out points into obj (valid while obj lives); max_len in bytes. */
int mr_json_get_str(const json_t *obj, const char *field, int required, size_t max_len,
		    const char **out, struct mr_errbuf *eb);
/* Borrowed reference to a nested object. */
int mr_json_get_obj(const json_t *obj, const char *field, int required, json_t **out,
		    struct mr_errbuf *eb);

/* Compact serialisation; malloc'd, free() it. NULL on OOM. */
char *mr_json_dump(const json_t *obj, size_t *len);

#endif
