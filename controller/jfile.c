/*
 * jfile.c - file operations of the journal (see journal.h): the data dir's
 * lock, reading the journal, the atomic replace used by compaction
 * (tmp -> fsync -> rename -> fsync dir) and the preserved copy of a
 * corrupt journal.
 *
 * Non-goals: what the bytes mean (jrecord.c), when to compact (journal.c,
 * jcommit.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "journal_int.h"

int mr__jr_write_all(int fd, const void *buf, size_t n)
{
	const unsigned char *p = buf;

	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return MR_EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int mr__jr_sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int err = 0;

	if (fd < 0)
		return MR_EIO;
	if (fsync(fd))
		err = MR_EIO;
	close(fd);
	return err;
}

/* The holder's "pid host" from the lock file, or "pid unknown". */
static void lock_holder(int fd, char *out, size_t cap)
{
	char buf[300];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	long pid;
	char host[256];

	snprintf(out, cap, "pid unknown");
	if (n <= 0)
		return;
	buf[n] = 0;
	host[0] = 0;
	if (sscanf(buf, "%ld %255s", &pid, host) < 1 || pid <= 0)
		return;
	if (host[0])
		snprintf(out, cap, "pid %ld on '%s'", pid, host);
	else
		snprintf(out, cap, "pid %ld", pid);
}

int mr__jr_lock(const char *dir, int *out, struct mr_errbuf *eb)
{
	char path[PATH_MAX + 8], who[320], host[256] = "";
	int fd, n, ok;

	*out = -1;
	if (snprintf(path, sizeof(path), "%s/lock", dir) >= (int)sizeof(path))
		return mr_errf_field(eb, MR_EINVAL, "data_dir", "data dir '%.200s' is too long",
				     dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return mr_errf_field(eb, MR_EIO, "data_dir", "unable to open '%s': %s", path,
				     strerror(errno));
	while (flock(fd, LOCK_EX | LOCK_NB)) {
		if (errno == EINTR)
			continue;
		if (errno == EWOULDBLOCK) {
			lock_holder(fd, who, sizeof(who));
			close(fd);
			return mr_errf_field(eb, MR_ECONFLICT, "data_dir",
					     "data dir '%s' is in use by another controller (%s); "
					     "stop it first or give this one another --data-dir",
					     dir, who);
		}
		n = errno;
		close(fd);
		return mr_errf_field(eb, MR_EIO, "data_dir", "unable to lock '%s': %s", path,
				     strerror(n));
	}
	gethostname(host, sizeof(host) - 1);
	n = snprintf(who, sizeof(who), "%ld %s\n", (long)getpid(), host[0] ? host : "-");
	/* best effort: the pid only makes a second controller's message better */
	ok = ftruncate(fd, 0) == 0 && pwrite(fd, who, (size_t)n, 0) == n;
	(void)ok;
	*out = fd;
	return 0;
}

int mr__jr_read_file(const char *path, unsigned char **out, size_t *len, struct mr_errbuf *eb)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	unsigned char *buf = NULL;
	size_t n = 0, cap = 0;
	int err = 0;

	*out = NULL;
	*len = 0;
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		return mr_errf(eb, MR_EIO, "unable to open '%s': %s", path, strerror(errno));
	}
	for (;;) {
		ssize_t r;

		if (n == cap) {
			unsigned char *nb;

			cap = cap ? cap * 2 : 1 << 16;
			nb = realloc(buf, cap);
			if (!nb) {
				err = mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", path);
				goto out;
			}
			buf = nb;
		}
		r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			err = mr_errf(eb, MR_EIO, "unable to read '%s': %s", path, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	*out = buf;
	*len = n;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return err;
}

int mr__jr_replace(const char *tmp, const char *path, const char *dir, const void *buf,
		   size_t len, int do_fsync, int *out, int *renamed, struct mr_errbuf *eb)
{
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	int err = 0;

	*out = -1;
	*renamed = 0;
	if (fd < 0)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", tmp, strerror(errno));
	if (mr__jr_write_all(fd, buf, len) || (do_fsync && fsync(fd))) {
		err = mr_errf(eb, MR_EIO, "unable to write '%s': %s", tmp, strerror(errno));
		goto out;
	}
	if (rename(tmp, path)) {
		err = mr_errf(eb, MR_EIO, "unable to rename '%s' to '%s': %s", tmp, path,
			      strerror(errno));
		goto out;
	}
	*renamed = 1;
	*out = fd; /* the renamed file: appends go on in it */
	fd = -1;
	if (do_fsync && mr__jr_sync_dir(dir))
		err = mr_errf(eb, MR_EIO, "unable to sync the directory '%s': %s", dir,
			      strerror(errno));
out:
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	return err;
}

int mr__jr_preserve(const char *path, const char *dir, const void *buf, size_t len, char *out,
		    size_t cap, struct mr_errbuf *eb)
{
	long now = (long)time(NULL);
	int fd = -1, err = 0;

	for (int n = 0; n < 1000 && fd < 0; n++) {
		int k = n ? snprintf(out, cap, "%s.corrupt.%ld.%d", path, now, n)
			  : snprintf(out, cap, "%s.corrupt.%ld", path, now);

		if (k < 0 || (size_t)k >= cap)
			return mr_errf(eb, MR_EINVAL, "path '%.200s' is too long", path);
		fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST)
			return mr_errf(eb, MR_EIO, "unable to create '%s': %s", out,
				       strerror(errno));
	}
	if (fd < 0)
		return mr_errf(eb, MR_EEXISTS, "unable to find a free name for a copy of '%s'",
			       path);
	if (mr__jr_write_all(fd, buf, len) || fsync(fd)) {
		err = mr_errf(eb, MR_EIO, "unable to write '%s': %s", out, strerror(errno));
		close(fd);
		unlink(out); /* an incomplete copy is not a copy; the original is intact */
		return err;
	}
	close(fd);
	if (mr__jr_sync_dir(dir))
		return mr_errf(eb, MR_EIO, "unable to sync the directory '%s': %s", dir,
			       strerror(errno));
	return 0;
}
