/*
 * shard.c - llm.c token shards (see mr_shard.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/mr_shard.h"
#include "mr_file.h"
#include "mr_rng.h"

#define HDR_INTS 256

int mr_shard_write(const char *path, const uint16_t *tok, size_t n, struct mr_errbuf *eb)
{
	int32_t hdr[HDR_INTS];
	FILE *f;
	int rc = 0;

	if (n > 0x7fffffff)
		return mr_errf(eb, MR_ERANGE, "'%s': %zu tokens exceed the format's limit", path, n);
	memset(hdr, 0, sizeof(hdr));
	hdr[0] = MR_SHARD_MAGIC;
	hdr[1] = MR_SHARD_VERSION;
	hdr[2] = (int32_t)n;
	f = fopen(path, "wb");
	if (!f)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", path, strerror(errno));
	if (fwrite(hdr, sizeof(hdr), 1, f) != 1 || fwrite(tok, sizeof(uint16_t), n, f) != n)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", path, strerror(errno));
	if (fclose(f) != 0 && rc == 0)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", path, strerror(errno));
	return rc;
}

int mr_shard_open(struct mr_shard *s, const char *path, int vocab, int T, uint64_t seed,
		  struct mr_errbuf *eb)
{
	int32_t hdr[HDR_INTS];
	FILE *f;
	long size;
	size_t i;
	int rc = 0, fd;

	memset(s, 0, sizeof(*s));
	s->epoch = -1;
	if (T < 1)
		return mr_errf_field(eb, MR_EINVAL, "seq_len", "'seq_len' must be >= 1");
	/* a regular file only (a FIFO would block the open); a missing file
	 * stays missing: not worth a retry */
	if ((fd = mr_file_open_regular(path, "shard", NULL, eb)) < 0)
		return fd;
	if (!(f = fdopen(fd, "rb"))) {
		close(fd);
		return mr_errf(eb, MR_ENOMEM, "unable to open shard '%s': %s", path,
			       strerror(errno));
	}
	snprintf(s->path, sizeof(s->path), "%s", path);
	if (fread(hdr, sizeof(hdr), 1, f) != 1) {
		rc = mr_errf(eb, MR_ECORRUPT, "shard '%s': truncated header (need 1024 bytes)", path);
		goto out;
	}
	if (hdr[0] != MR_SHARD_MAGIC) {
		rc = mr_errf(eb, MR_ECORRUPT, "shard '%s': bad magic %d (want %d)", path, hdr[0],
			     MR_SHARD_MAGIC);
		goto out;
	}
	if (hdr[1] != MR_SHARD_VERSION) {
		rc = mr_errf(eb, MR_ECORRUPT, "shard '%s': unsupported version %d (want %d)", path,
			     hdr[1], MR_SHARD_VERSION);
		goto out;
	}
	if (hdr[2] < 0 || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 ||
	    (uint64_t)size != (uint64_t)sizeof(hdr) + 2 * (uint64_t)hdr[2]) {
		rc = mr_errf(eb, MR_ECORRUPT,
			     "shard '%s': size does not match the header's %d tokens", path, hdr[2]);
		goto out;
	}
	s->count = (size_t)hdr[2];
	if (s->count < (size_t)T + 1) {
		rc = mr_errf(eb, MR_ERANGE, "shard '%s': %zu tokens, need at least seq_len+1 = %d",
			     path, s->count, T + 1);
		goto out;
	}
	s->tok = malloc(s->count * sizeof(uint16_t));
	if (!s->tok) {
		rc = mr_errf(eb, MR_ENOMEM, "shard '%s': unable to allocate %zu tokens", path,
			     s->count);
		goto out;
	}
	if (fseek(f, (long)sizeof(hdr), SEEK_SET) != 0 ||
	    fread(s->tok, sizeof(uint16_t), s->count, f) != s->count) {
		rc = mr_errf(eb, MR_EIO, "shard '%s': read failed", path);
		goto out;
	}
	for (i = 0; i < s->count; i++)
		if (s->tok[i] >= vocab) {
			rc = mr_errf(eb, MR_ERANGE,
				     "shard '%s': token %u at index %zu is not below vocab_size %d",
				     path, s->tok[i], i, vocab);
			goto out;
		}
	s->T = T;
	s->seed = seed;
	s->nwin = (s->count - 1) / (size_t)T;
	s->perm = malloc(s->nwin * sizeof(size_t));
	if (!s->perm)
		rc = mr_errf(eb, MR_ENOMEM, "shard '%s': unable to allocate the order", path);
out:
	fclose(f);
	if (rc < 0)
		mr_shard_close(s);
	return rc;
}

void mr_shard_close(struct mr_shard *s)
{
	free(s->tok);
	free(s->perm);
	s->tok = NULL;
	s->perm = NULL;
}

static void shuffle(struct mr_shard *s, long epoch)
{
	struct mr_rng r;
	size_t i;

	for (i = 0; i < s->nwin; i++)
		s->perm[i] = i;
	mr_rng_seed(&r, s->seed, 0x5348u + (uint64_t)epoch);
	for (i = s->nwin; i > 1; i--) {
		size_t j = (size_t)mr_rng_below(&r, i), t = s->perm[i - 1];
		s->perm[i - 1] = s->perm[j];
		s->perm[j] = t;
	}
	s->epoch = epoch;
}

int mr_shard_batch(struct mr_shard *s, uint64_t first_row, int B, int *inputs, int *targets,
		   struct mr_errbuf *eb)
{
	int b, t;

	if (!s->tok)
		return mr_errf(eb, MR_ESTATE, "shard '%s' is not open", s->path);
	for (b = 0; b < B; b++) {
		uint64_t row = first_row + (uint64_t)b;
		long e = (long)(row / s->nwin);
		const uint16_t *w;

		if (e != s->epoch)
			shuffle(s, e);
		w = s->tok + s->perm[row % s->nwin] * (size_t)s->T;
		for (t = 0; t < s->T; t++) {
			inputs[(size_t)b * s->T + t] = w[t];
			targets[(size_t)b * s->T + t] = w[t + 1];
		}
	}
	return 0;
}
