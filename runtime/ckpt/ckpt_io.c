/*
 * ckpt_io.c - the checkpoint's file operations (see ckpt_int.h): durable
 * writes (temporary name, fsync, rename, fsync of the directory), records
 * read with pread and verified against their CRC-32C, step directories
 * listed and removed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_int.h"
#include "mr_crc32c.h"
#include "mr_file.h"

void mr__ckpt_step_dir(char *buf, size_t cap, const char *dir, long step)
{
	snprintf(buf, cap, "%s/step-%08ld", dir, step);
}

/* mkdir -p of a directory. */
int mr__ckpt_make_dirs(const char *dir, struct mr_errbuf *eb)
{
	char buf[4096];
	size_t i, n = strlen(dir);

	if (n == 0 || n >= sizeof(buf))
		return mr_errf_field(eb, MR_EINVAL, "ckpt_dir", "'ckpt_dir' is empty or too long");
	memcpy(buf, dir, n + 1);
	for (i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != 0)
			continue;
		buf[i] = 0;
		if (mkdir(buf, 0755) != 0 && errno != EEXIST)
			return mr_errf_field(eb, MR_EIO, "ckpt_dir", "unable to create '%s': %s", buf,
					     strerror(errno));
		buf[i] = dir[i];
	}
	return 0;
}

/* The durable write of head then body; direct: body is the whole file,
 * 4096-aligned in address and length, written with O_DIRECT where the
 * filesystem takes it (no copy into the page cache), else as usual. */
static int write_durably(const char *path, const void *head, size_t hn, const void *body,
			 size_t n, int direct, struct mr_errbuf *eb)
{
	char tmp[4200], dir[4200], *slash;
	int fd = -1, rc = 0, flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	/* a new file: whatever was at the temporary name (a FIFO would block
	 * the open) goes first */
	if (unlink(tmp) != 0 && errno != ENOENT)
		return mr_errf(eb, MR_EIO, "unable to remove '%s': %s", tmp, strerror(errno));
	if (direct && (fd = open(tmp, flags | O_DIRECT, 0644)) < 0)
		unlink(tmp); /* refused O_DIRECT (it may have created the file) */
	if (fd < 0)
		fd = open(tmp, flags, 0644);
	if (fd < 0)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", tmp, strerror(errno));
	if ((head && mr_file_write_all(fd, head, hn) != 0) || mr_file_write_all(fd, body, n) != 0)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", tmp, strerror(errno));
	if (rc == 0 && fsync(fd) != 0)
		rc = mr_errf(eb, MR_EIO, "unable to sync '%s': %s", tmp, strerror(errno));
	if (close(fd) != 0 && rc == 0)
		rc = mr_errf(eb, MR_EIO, "unable to close '%s': %s", tmp, strerror(errno));
	if (rc == 0 && rename(tmp, path) != 0)
		rc = mr_errf(eb, MR_EIO, "unable to rename '%s': %s", tmp, strerror(errno));
	if (rc < 0) {
		unlink(tmp);
		return rc;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash)
		*slash = 0;
	return mr_file_sync_dir(slash ? dir : ".", eb);
}

int mr__ckpt_write_file(const char *path, const void *head, size_t hn, const void *body,
			size_t n, struct mr_errbuf *eb)
{
	return write_durably(path, head, hn, body, n, 0, eb);
}

int mr__ckpt_write_image(const char *path, const void *buf, size_t n, struct mr_errbuf *eb)
{
	return write_durably(path, NULL, 0, buf, n, 1, eb);
}

int mr__ckpt_remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[4400];
	int rc = 0;

	if (!d)
		return errno == ENOENT ? 0 : MR_EIO;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (unlink(path) != 0 && rc == 0)
			rc = MR_EIO;
	}
	closedir(d);
	if (rmdir(dir) != 0 && rc == 0)
		rc = MR_EIO;
	return rc;
}

/* Whether entry e of dir is a directory (a file named like a step is
 * not one: it is nobody's checkpoint). */
static int is_dir(const char *dir, const struct dirent *e)
{
	char path[4400];
	struct stat st;

	if (e->d_type != DT_UNKNOWN)
		return e->d_type == DT_DIR;
	snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
	return lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int newest_first(const void *a, const void *b)
{
	long x = *(const long *)a, y = *(const long *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

int mr__ckpt_steps(const char *dir, long *steps, int cap, struct mr_errbuf *eb)
{
	long *all = NULL, *grown;
	size_t n = 0, room = 0;
	DIR *d = opendir(dir);
	struct dirent *e;
	int out;

	if (!d) {
		if (errno == ENOENT)
			return 0;
		return mr_errf(eb, MR_EIO, "unable to list '%s': %s", dir, strerror(errno));
	}
	while ((e = readdir(d))) {
		char *end;
		long s;
		if (strncmp(e->d_name, "step-", 5) != 0)
			continue;
		s = strtol(e->d_name + 5, &end, 10);
		if (*end || end == e->d_name + 5 || s < 0 || !is_dir(dir, e))
			continue;
		if (n == room) {
			room = room ? 2 * room : 16;
			if (!(grown = realloc(all, room * sizeof(*all)))) {
				free(all);
				closedir(d);
				return mr_errf(eb, MR_ENOMEM, "out of memory listing '%s'", dir);
			}
			all = grown;
		}
		all[n++] = s;
	}
	closedir(d);
	if (n)
		qsort(all, n, sizeof(*all), newest_first);
	out = n < (size_t)cap ? (int)n : cap;
	if (out)
		memcpy(steps, all, (size_t)out * sizeof(*steps));
	free(all);
	return out;
}

void mr__ckpt_close_fds(int *fds, int n)
{
	for (int i = 0; fds && i < n; i++)
		if (fds[i] >= 0) {
			close(fds[i]);
			fds[i] = -1;
		}
}

int mr__ckpt_open_shard(const struct mr_ckpt_manifest *mf, int s, struct mr_errbuf *eb)
{
	const struct mr_ckpt_shard *sh = &mf->shards[s];
	char path[4200], head[CKPT_HEADER];
	uint32_t ver, rank;
	int64_t step;
	size_t size;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", mf->dir, sh->file);
	if ((fd = mr_file_open_regular(path, NULL, &size, eb)) < 0)
		return fd;
	if ((uint64_t)size != sh->bytes) {
		close(fd);
		return mr_errf(eb, MR_ECORRUPT,
			       "'%s' is %zu bytes, the manifest says %llu (truncated or replaced)",
			       path, size, (unsigned long long)sh->bytes);
	}
	if (pread(fd, head, sizeof(head), 0) != (ssize_t)sizeof(head) ||
	    memcmp(head, CKPT_MAGIC, 8) != 0) {
		close(fd);
		return mr_errf(eb, MR_ECORRUPT, "'%s' is not a meshrun checkpoint shard", path);
	}
	memcpy(&ver, head + 8, 4);
	memcpy(&rank, head + 12, 4);
	memcpy(&step, head + 16, 8);
	if (ver != MR_CKPT_VERSION || (int)rank != sh->rank || step != mf->step) {
		close(fd);
		return mr_errf(eb, MR_ECORRUPT,
			       "'%s' is version %u of rank %u at step %lld; the manifest wants "
			       "version %d of rank %d at step %ld (a shard of another checkpoint)",
			       path, ver, rank, (long long)step, MR_CKPT_VERSION, sh->rank, mf->step);
	}
	return fd;
}

int mr__ckpt_read_rec(const struct mr_ckpt_manifest *mf, const struct mr_ckpt_rec *r,
		      int *fds, float *out, struct mr_errbuf *eb)
{
	size_t bytes = (size_t)r->n * sizeof(float), done = 0;
	int fd = fds[r->shard];

	if (fd < 0 && (fd = fds[r->shard] = mr__ckpt_open_shard(mf, r->shard, eb)) < 0) {
		fds[r->shard] = -1;
		return fd;
	}
	while (done < bytes) {
		ssize_t got = pread(fd, (char *)out + done, bytes - done, (off_t)(r->offset + done));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return mr_errf(eb, MR_ECORRUPT, "'%s/%s': record at byte %llu cut short",
				       mf->dir, mf->shards[r->shard].file,
				       (unsigned long long)r->offset);
		done += (size_t)got;
	}
	if (mr_crc32c(0, out, bytes) != r->crc)
		return mr_errf(eb, MR_ECORRUPT,
			       "'%s/%s': checksum mismatch in %s of tensor '%s' at byte %llu",
			       mf->dir, mf->shards[r->shard].file,
			       r->kind == MR_CKPT_PARAM ? "the parameters"
			       : r->kind == MR_CKPT_ADAM_M ? "AdamW m"
							   : "AdamW v",
			       mf->tensors[r->tensor].name, (unsigned long long)r->offset);
	return 0;
}
