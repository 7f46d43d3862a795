/*
 * json_read.h - the fast path of reading a request body into jansson
 * values (json_read.c says which bodies it takes).
 *
 * Non-goals: writing JSON (core/json_write.h).
 */
#ifndef MR_CTL_JSON_READ_H
#define MR_CTL_JSON_READ_H

#include <jansson.h>
#include <stddef.h>

/* A request body that is a plain object (json_read.c says which) as
 * jansson would parse it; NULL for anything else, which jansson then
 * reads and judges. */
json_t *mr__json_read_object(const char *buf, size_t len);

#endif
