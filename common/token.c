/*
 * token.c - bearer token files; see mr_token.h.
 */
#include "mr_token.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int mr_token_read_file(const char *path, char *out, size_t cap, const char *field,
		       struct mr_errbuf *eb)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t len = 0;
	char extra;
	ssize_t n;

	out[0] = '\0';
	if (fd < 0)
		return mr_errf_field(eb, MR_EIO, field, "%s: unable to read token file '%s': %s",
				     field, path, strerror(errno));
	while (len < cap - 1) {
		n = read(fd, out + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;

			close(fd);
			out[0] = '\0';
			return mr_errf_field(eb, MR_EIO, field,
					     "%s: unable to read token file '%s': %s", field, path,
					     strerror(e));
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	out[len] = '\0';
	/* anything but whitespace past cap - 1 bytes is a token too long */
	while (len == cap - 1 && (n = read(fd, &extra, 1)) == 1) {
		if (!is_space(extra)) {
			close(fd);
			out[0] = '\0';
			return mr_errf_field(eb, MR_ELIMIT, field,
					     "%s: token file '%s' holds more than %zu bytes", field,
					     path, cap - 1);
		}
	}
	close(fd);
	while (len && is_space(out[len - 1]))
		out[--len] = '\0';
	if (!len)
		return mr_errf_field(eb, MR_EINVAL, field, "%s: token file '%s' is empty", field,
				     path);
	for (size_t i = 0; i < len; i++) {
		if (is_space(out[i]) || (unsigned char)out[i] < 0x20) {
			out[0] = '\0';
			return mr_errf_field(eb, MR_EINVAL, field,
					     "%s: token file '%s' has whitespace or a control "
					     "character inside the token",
					     field, path);
		}
	}
	return 0;
}
