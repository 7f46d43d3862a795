/*
 * file.c - whole writes, directory fsync, regular files opened safely and
 * the holder-naming lock (see mr_file.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mr_file.h"

int mr_file_write_all(int fd, const void *buf, size_t n)
{
	const char *p = buf;

	while (n > 0) {
		ssize_t w = write(fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (w == 0)
				errno = EIO;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int mr_file_sync_dir(const char *dir, struct mr_errbuf *eb)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return mr_errf(eb, MR_EIO, "unable to open '%s': %s", dir, strerror(errno));
	if (fsync(fd) != 0)
		rc = mr_errf(eb, MR_EIO, "unable to sync '%s': %s", dir, strerror(errno));
	close(fd);
	return rc;
}

int mr_file_open_regular(const char *path, const char *what, size_t *size,
			 struct mr_errbuf *eb)
{
	const char *sp = what ? " " : "";
	struct stat st;
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), err;

	what = what ? what : "";
	if (fd < 0)
		return mr_errf(eb, errno == ENOENT || errno == ENOTDIR ? MR_ENOTFOUND : MR_EIO,
			       "unable to open %s%s'%s': %s", what, sp, path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		err = errno;
		close(fd);
		return mr_errf(eb, MR_EIO, "unable to stat %s%s'%s': %s", what, sp, path,
			       strerror(err));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return mr_errf(eb, MR_ECORRUPT, "%s%s'%s' is not a regular file (%s)", what, sp, path,
			       S_ISFIFO(st.st_mode)  ? "a FIFO"
			       : S_ISDIR(st.st_mode) ? "a directory"
			       : S_ISSOCK(st.st_mode) ? "a socket"
						     : "a device");
	}
	/* reads of a regular file never block on O_NONBLOCK, but leave the
	 * descriptor as callers expect it */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	if (size)
		*size = (size_t)st.st_size;
	return fd;
}

int mr_file_read_small(const char *path, const char *what, size_t cap, char **buf, size_t *len,
		       struct mr_errbuf *eb)
{
	size_t size = 0, got = 0;
	int fd = mr_file_open_regular(path, what, &size, eb);
	char *b;

	*buf = NULL;
	if (len)
		*len = 0;
	if (fd < 0)
		return fd;
	if (size > cap) {
		close(fd);
		return mr_errf(eb, MR_ELIMIT, "%s '%s' is over %zu bytes", what ? what : "file",
			       path, cap);
	}
	if (!(b = malloc(size + 1))) {
		close(fd);
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", path);
	}
	while (got < size) {
		ssize_t n = read(fd, b + got, size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	if (got != size) {
		free(b);
		return mr_errf(eb, MR_EIO, "unable to read %s '%s'", what ? what : "file", path);
	}
	b[size] = '\0';
	*buf = b;
	if (len)
		*len = size;
	return 0;
}

/* The holder line the lock file holds, or "unknown". */
static void holder_of(int fd, char *who, size_t cap)
{
	ssize_t n;

	if (!who || cap == 0)
		return;
	n = pread(fd, who, cap - 1, 0);
	if (n < 0)
		n = 0;
	who[n] = '\0';
	who[strcspn(who, "\n")] = '\0';
	if (!who[0])
		snprintf(who, cap, "unknown");
}

int mr_file_lock(const char *path, const char *holder, int *out, char *who, size_t cap,
		 struct mr_errbuf *eb)
{
	int fd, err, ok;
	size_t n = strlen(holder);

	*out = -1;
	fd = open(path, O_RDWR | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0)
		return mr_errf(eb, MR_EIO, "unable to open '%s': %s", path, strerror(errno));
	while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		if (errno == EINTR)
			continue;
		err = errno;
		if (err == EWOULDBLOCK) {
			holder_of(fd, who, cap);
			close(fd);
			return mr_errf(eb, MR_ECONFLICT, "'%s' is held by %s", path,
				       who ? who : "another process");
		}
		close(fd);
		if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS)
			return mr_errf(eb, MR_ENOTSUP, "unable to lock '%s': %s", path,
				       strerror(err));
		return mr_errf(eb, MR_EIO, "unable to lock '%s': %s", path, strerror(err));
	}
	/* best effort: the text only makes a refused process's message better */
	ok = ftruncate(fd, 0) == 0 && pwrite(fd, holder, n, 0) == (ssize_t)n &&
	     pwrite(fd, "\n", 1, (off_t)n) == 1;
	(void)ok;
	*out = fd;
	return 0;
}
