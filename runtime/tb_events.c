/*
 * tb_events.c - the TensorBoard event file writer (mr_tb_events.h): CRC-32C,
 * the record framing, and the few protobuf fields of Event and Summary
 * that scalars need, encoded by hand.
 *
 *   record  = uint64 len | uint32 masked_crc(len) | data | uint32 masked_crc(data)
 *   Event   = 1: wall_time (double) | 2: step (varint)
 *             | 3: file_version (string) or 5: summary (Summary)
 *               or 7: session_log (SessionLog { 1: status (varint), START = 1 })
 *   Summary = repeated 1: Value { 1: tag (string) | 2: simple_value (float) }
 *
 * Non-goals: other Event or Summary fields; buffering across steps (each
 * flush is one write(2), visible to a reader at once; nothing is fsync'd).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "mr_tb_events.h"

#define FILE_VERSION "brain.Event:2"

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		crc_table[i] = c;
	}
}

uint32_t mr_tb_crc32c(uint32_t crc, const void *buf, size_t n)
{
	const uint8_t *p = buf;

	pthread_once(&crc_once, crc_init);
	crc = ~crc;
	while (n--)
		crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

/* The record format's masked CRC (so a CRC of CRCs does not look valid). */
static uint32_t masked_crc(const void *buf, size_t n)
{
	uint32_t c = mr_tb_crc32c(0, buf, n);

	return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static size_t put_le(uint8_t *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return (size_t)bytes;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

/* A length-delimited field (wire type 2): key, length, bytes. */
static size_t put_bytes(uint8_t *p, int field, const void *data, size_t len)
{
	size_t n = put_varint(p, (uint64_t)field << 3 | 2);

	n += put_varint(p + n, len);
	memcpy(p + n, data, len);
	return n + len;
}

static double wall_time(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* Writes all of buf (write(2) may take part of it). */
static int write_all(int fd, const uint8_t *buf, size_t n)
{
	while (n > 0) {
		ssize_t k = write(fd, buf, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		buf += k;
		n -= (size_t)k;
	}
	return 0;
}

/* One record holding the Event of step: wall time, step, then body (the
 * rest of the Event's fields, already encoded). */
static int write_event(struct mr_tb *tb, int64_t step, const uint8_t *body, size_t len,
		       struct mr_errbuf *eb)
{
	uint8_t rec[12 + 32 + MR_TB_MAX_PENDING + 16 + 4], *data = rec + 12;
	uint64_t bits;
	double t = wall_time();
	size_t n = 0;

	data[n++] = 1 << 3 | 1; /* wall_time, 64-bit */
	memcpy(&bits, &t, sizeof(bits));
	n += put_le(data + n, bits, 8);
	data[n++] = 2 << 3 | 0; /* step, varint */
	n += put_varint(data + n, (uint64_t)step);
	memcpy(data + n, body, len);
	n += len;
	put_le(rec, n, 8);
	put_le(rec + 8, masked_crc(rec, 8), 4);
	put_le(data + n, masked_crc(data, n), 4);
	if (write_all(tb->fd, rec, 12 + n + 4) < 0)
		return mr_errf(eb, MR_EIO, "unable to write '%s': %s", tb->path, strerror(errno));
	return 0;
}

/* "'tensorboard_dir': " when the errors are reported under a key. */
static const char *key_prefix(char *buf, size_t cap, const char *field)
{
	if (field)
		snprintf(buf, cap, "'%s': ", field);
	else
		buf[0] = 0;
	return buf;
}

/* mkdir -p dir. */
static int make_dirs(const char *dir, const char *field, struct mr_errbuf *eb)
{
	char buf[4096], key[160];
	size_t n = strlen(dir);

	key_prefix(key, sizeof(key), field);
	if (n == 0 || n >= sizeof(buf))
		return mr_errf_field(eb, MR_EINVAL, field ? field : "",
				     "%sthe directory name is empty or too long", key);
	memcpy(buf, dir, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != 0)
			continue;
		buf[i] = 0;
		if (mkdir(buf, 0755) != 0 && errno != EEXIST)
			return mr_errf_field(eb, MR_EIO, field ? field : "",
					     "%sunable to create '%s': %s", key, buf,
					     strerror(errno));
		buf[i] = dir[i];
	}
	return 0;
}

int mr_tb_open(struct mr_tb *tb, const char *dir, const char *field, struct mr_errbuf *eb)
{
	char host[256] = "localhost", key[160];
	uint8_t body[32];
	long secs = (long)time(NULL);
	int rc, fd = -1;

	memset(tb, 0, sizeof(*tb));
	tb->fd = -1;
	if ((rc = make_dirs(dir, field, eb)) < 0)
		return rc;
	if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
		snprintf(host, sizeof(host), "localhost");
	host[sizeof(host) - 1] = 0;
	/* a new file per open: two opens in one second (a restart in the same
	 * process) take the next second's name, so the names still sort in
	 * the order the files were written */
	for (int i = 0; i < 100 && fd < 0; i++, secs++) {
		snprintf(tb->path, sizeof(tb->path), "%s/events.out.tfevents.%010ld.%s.%ld.meshrun",
			 dir, secs, host, (long)getpid());
		fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0)
		return mr_errf_field(eb, MR_EIO, field ? field : "", "%sunable to create '%s': %s",
				     key_prefix(key, sizeof(key), field), tb->path,
				     strerror(errno));
	tb->fd = fd;
	tb->open = 1;
	rc = write_event(tb, 0, body, put_bytes(body, 3, FILE_VERSION, strlen(FILE_VERSION)), eb);
	if (rc < 0) {
		close(fd);
		tb->open = 0;
		tb->fd = -1;
	}
	return rc;
}

int mr_tb_flush(struct mr_tb *tb, struct mr_errbuf *eb)
{
	uint8_t body[8 + MR_TB_MAX_PENDING];
	size_t n;

	if (!tb->open || tb->n == 0)
		return 0;
	n = put_bytes(body, 5, tb->pending, tb->n);
	tb->n = 0;
	return write_event(tb, tb->step, body, n, eb);
}

int mr_tb_scalar(struct mr_tb *tb, int64_t step, const char *tag, float value,
		 struct mr_errbuf *eb)
{
	uint8_t v[8 + MR_TB_MAX_TAG + 8];
	size_t tl = strlen(tag), n;
	uint32_t bits;
	int rc;

	if (!tb->open)
		return mr_errf(eb, MR_ESTATE, "the event file is not open");
	if (tl == 0 || tl > MR_TB_MAX_TAG)
		return mr_errf(eb, MR_EINVAL, "tensorboard tag '%.*s' must have 1 to %d bytes",
			       MR_TB_MAX_TAG, tag, MR_TB_MAX_TAG);
	n = put_bytes(v, 1, tag, tl);
	v[n++] = 2 << 3 | 5; /* simple_value, 32-bit */
	memcpy(&bits, &value, sizeof(bits));
	n += put_le(v + n, bits, 4);
	/* the Value as field 1 of the Summary: key, length, bytes */
	if (tb->n > 0 && (step != tb->step || tb->n + n + 4 > MR_TB_MAX_PENDING) &&
	    (rc = mr_tb_flush(tb, eb)) < 0)
		return rc;
	tb->step = step;
	tb->n += put_bytes(tb->pending + tb->n, 1, v, n);
	return 0;
}

int mr_tb_session_start(struct mr_tb *tb, int64_t step, struct mr_errbuf *eb)
{
	static const uint8_t start[] = { 1 << 3 | 0, 1 }; /* status: START */
	uint8_t body[8];
	int rc;

	if (!tb->open)
		return mr_errf(eb, MR_ESTATE, "the event file is not open");
	if ((rc = mr_tb_flush(tb, eb)) < 0)
		return rc;
	return write_event(tb, step, body, put_bytes(body, 7, start, sizeof(start)), eb);
}

void mr_tb_close(struct mr_tb *tb)
{
	if (!tb || !tb->open)
		return;
	mr_tb_flush(tb, NULL);
	close(tb->fd);
	tb->open = 0;
	tb->fd = -1;
}
