/*
 * file.c - file operations of the journal (see journal.h): the data dir's
 * lock, reading the journal, the atomic replace used by compaction
 * (tmp -> fsync -> rename -> fsync dir) and the preserved copy of a
 * corrupt journal.
 *
 * Non-goals: what the bytes mean (record.c), when to compact (open.c,
 * commit.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "journal_int.h"
#include "mr_file.h"

int mr__jr_lock(const char *dir, int *out, struct mr_errbuf *eb)
{
	char path[PATH_MAX + 8], holder[320], who[320], host[256] = "";
	struct mr_errbuf le = {0};
	int rc;

	*out = -1;
	if (snprintf(path, sizeof(path), "%s/lock", dir) >= (int)sizeof(path))
		return mr_errf_field(eb, MR_EINVAL, "data_dir", "data dir '%.200s' is too long",
				     dir);
	gethostname(host, sizeof(host) - 1);
	snprintf(holder, sizeof(holder), "pid %ld on '%s'", (long)getpid(), host[0] ? host : "-");
	rc = mr_file_lock(path, holder, out, who, sizeof(who), &le);
	if (rc == MR_ECONFLICT)
		return mr_errf_field(eb, MR_ECONFLICT, "data_dir",
				     "data dir '%s' is in use by another controller (%s); "
				     "stop it first or give this one another --data-dir",
				     dir, who);
	if (rc < 0)
		return mr_errf_field(eb, rc == MR_ENOTSUP ? MR_EIO : rc, "data_dir", "%s", le.msg);
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
	if (mr_file_write_all(fd, buf, len) || (do_fsync && fsync(fd))) {
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
	if (do_fsync && mr_file_sync_dir(dir, NULL))
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
	if (mr_file_write_all(fd, buf, len) || fsync(fd)) {
		err = mr_errf(eb, MR_EIO, "unable to write '%s': %s", out, strerror(errno));
		close(fd);
		unlink(out); /* an incomplete copy is not a copy; the original is intact */
		return err;
	}
	close(fd);
	if (mr_file_sync_dir(dir, NULL))
		return mr_errf(eb, MR_EIO, "unable to sync the directory '%s': %s", dir,
			       strerror(errno));
	return 0;
}
