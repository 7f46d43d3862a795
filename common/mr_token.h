/*
 * mr_token.h - reading a bearer token from a file (a Kubernetes Secret
 * mounted as a volume, a file written by a provisioner).
 *
 * Every binary that talks to or is the controller takes --token-file (and
 * MESHRUN_TOKEN_FILE through its config table); they all read it here, so
 * an unreadable, empty or oversized file is one error, worded the same way
 * everywhere and naming the file.
 *
 * Non-goals: watching the file for rotation, other secret stores.
 */
#ifndef MR_TOKEN_H
#define MR_TOKEN_H

#include <stddef.h>

#include "mr_err.h"

/*
 * Reads the token in path into out (cap bytes, NUL included), dropping
 * trailing whitespace (a Secret written with `echo` ends in a newline).
 * field names the option for the error ("token_file"). Returns 0, or
 * MR_EIO (unreadable), MR_EINVAL (empty, or whitespace inside) or
 * MR_ELIMIT (longer than cap - 1) with eb naming the file.
 */
int mr_token_read_file(const char *path, char *out, size_t cap, const char *field,
		       struct mr_errbuf *eb);

#endif
