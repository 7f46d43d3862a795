/*
 * shard.c - llm.c token shards (see mr_shard.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/mr_rng.h"
#include "data/mr_shard.h"
#include "mr_file.h"

#define HDR_INTS 256

#define CHUNK 4096 /* tokens converted per step (on the stack) */

/* The header of a shard of n tokens. */
static int write_header(FILE *f, int version, size_t n)
{
	int32_t hdr[HDR_INTS];

	memset(hdr, 0, sizeof(hdr));
	hdr[0] = MR_SHARD_MAGIC;
	hdr[1] = version;
	hdr[2] = (int32_t)n;
	return fwrite(hdr, sizeof(hdr), 1, f) == 1 ? 0 : -1;
}

int mr_shard_write(const char *path, const uint16_t *tok, size_t n, struct mr_errbuf *eb)
{
	FILE *f;
	int rc = 0;

	if (n > 0x7fffffff)
		return mr_errf(eb, MR_ERANGE, "'%s': %zu tokens exceed the format's limit", path, n);
	f = fopen(path, "wb");
	if (!f)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", path, strerror(errno));
	if (write_header(f, MR_SHARD_VERSION, n) < 0 || fwrite(tok, sizeof(uint16_t), n, f) != n)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", path, strerror(errno));
	if (fclose(f) != 0 && rc == 0)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", path, strerror(errno));
	return rc;
}

int mr_shard_write32(const char *path, const uint32_t *tok, size_t n, int version,
		     struct mr_errbuf *eb)
{
	uint32_t max = 0;
	uint16_t buf[CHUNK];
	FILE *f;
	size_t i;
	int rc = 0;

	if (n > 0x7fffffff)
		return mr_errf(eb, MR_ERANGE, "'%s': %zu tokens exceed the format's limit", path, n);
	for (i = 0; i < n; i++)
		max = tok[i] > max ? tok[i] : max;
	if (max > INT32_MAX)
		return mr_errf(eb, MR_ERANGE, "'%s': token %u is above the format's limit", path,
			       max);
	if (version == 0)
		version = max <= UINT16_MAX ? MR_SHARD_VERSION : MR_SHARD_VERSION_32;
	if (version != MR_SHARD_VERSION && version != MR_SHARD_VERSION_32)
		return mr_errf(eb, MR_EINVAL, "'%s': no shard version %d (1 or 2)", path, version);
	if (version == MR_SHARD_VERSION && max > UINT16_MAX)
		return mr_errf(eb, MR_ERANGE, "'%s': token %u does not fit a version 1 shard "
			       "(16-bit tokens)", path, max);
	f = fopen(path, "wb");
	if (!f)
		return mr_errf(eb, MR_EIO, "unable to create '%s': %s", path, strerror(errno));
	if (write_header(f, version, n) < 0)
		rc = -1;
	for (i = 0; rc == 0 && i < n; i += CHUNK) {
		size_t k = n - i < CHUNK ? n - i : CHUNK;

		if (version == MR_SHARD_VERSION_32) {
			rc = fwrite(tok + i, sizeof(uint32_t), k, f) == k ? 0 : -1;
			continue;
		}
		for (size_t j = 0; j < k; j++)
			buf[j] = (uint16_t)tok[i + j];
		rc = fwrite(buf, sizeof(uint16_t), k, f) == k ? 0 : -1;
	}
	if (rc < 0)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", path, strerror(errno));
	if (fclose(f) != 0 && rc == 0)
		rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", path, strerror(errno));
	return rc;
}

/* The count tokens after the header, widened to uint32. */
static int read_tokens(struct mr_shard *s, FILE *f, struct mr_errbuf *eb)
{
	uint16_t buf[CHUNK];
	size_t i;

	if (fseek(f, (long)(HDR_INTS * sizeof(int32_t)), SEEK_SET) != 0)
		return mr_errf(eb, MR_EIO, "shard '%s': read failed", s->path);
	if (s->version == MR_SHARD_VERSION_32)
		return fread(s->tok, sizeof(uint32_t), s->count, f) == s->count ? 0 :
			mr_errf(eb, MR_EIO, "shard '%s': read failed", s->path);
	for (i = 0; i < s->count; i += CHUNK) {
		size_t k = s->count - i < CHUNK ? s->count - i : CHUNK;

		if (fread(buf, sizeof(uint16_t), k, f) != k)
			return mr_errf(eb, MR_EIO, "shard '%s': read failed", s->path);
		for (size_t j = 0; j < k; j++)
			s->tok[i + j] = buf[j];
	}
	return 0;
}

int mr_shard_open(struct mr_shard *s, const char *path, int vocab, int T, uint64_t seed,
		  struct mr_errbuf *eb)
{
	int32_t hdr[HDR_INTS];
	FILE *f;
	long size;
	size_t i;
	uint64_t width;
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
	if (hdr[1] != MR_SHARD_VERSION && hdr[1] != MR_SHARD_VERSION_32) {
		rc = mr_errf(eb, MR_ECORRUPT, "shard '%s': unsupported version %d (this build reads "
			     "%d: uint16 tokens, and %d: uint32 tokens)", path, hdr[1],
			     MR_SHARD_VERSION, MR_SHARD_VERSION_32);
		goto out;
	}
	s->version = hdr[1];
	width = s->version == MR_SHARD_VERSION_32 ? 4 : 2;
	if (hdr[2] < 0 || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 ||
	    (uint64_t)size != (uint64_t)sizeof(hdr) + width * (uint64_t)hdr[2]) {
		rc = mr_errf(eb, MR_ECORRUPT,
			     "shard '%s': size does not match the header's %d tokens (version %d)",
			     path, hdr[2], s->version);
		goto out;
	}
	s->count = (size_t)hdr[2];
	if (s->count < (size_t)T + 1) {
		rc = mr_errf(eb, MR_ERANGE, "shard '%s': %zu tokens, need at least seq_len+1 = %d",
			     path, s->count, T + 1);
		goto out;
	}
	s->tok = malloc(s->count * sizeof(*s->tok));
	if (!s->tok) {
		rc = mr_errf(eb, MR_ENOMEM, "shard '%s': unable to allocate %zu tokens", path,
			     s->count);
		goto out;
	}
	if ((rc = read_tokens(s, f, eb)) < 0)
		goto out;
	for (i = 0; i < s->count; i++)
		if (vocab < 0 || s->tok[i] >= (uint32_t)vocab) {
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
		const uint32_t *w;

		if (e != s->epoch)
			shuffle(s, e);
		w = s->tok + s->perm[row % s->nwin] * (size_t)s->T;
		for (t = 0; t < s->T; t++) {
			inputs[(size_t)b * s->T + t] = (int)w[t];
			targets[(size_t)b * s->T + t] = (int)w[t + 1];
		}
	}
	return 0;
}
