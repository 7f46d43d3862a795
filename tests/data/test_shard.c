/*
 * test_shard.c - llm.c token shards: write/read round trip, shuffled
 * epochs that visit every window once and depend only on the seed, and
 * every malformed file rejected with a message naming it; version 2
 * (uint32 tokens): the same batches as version 1 for the same tokens,
 * tokens past 65,535, the writer's choice of version.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/mr_shard.h"

static char dir[] = "/tmp/mr-shard-XXXXXX";

static void setup(void)
{
	cr_assert_not_null(mkdtemp(dir));
}

static void path_of(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", dir, name);
}

static void write_raw(const char *path, const int32_t *hdr, const void *body, size_t len)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f);
	cr_assert_eq(fwrite(hdr, 4, 256, f), 256);
	if (len)
		cr_assert_eq(fwrite(body, 1, len, f), len);
	fclose(f);
}

Test(shard, epochs_visit_every_window_once_deterministically)
{
	uint16_t tok[1 + 10 * 8];
	char p[512];
	struct mr_shard a, b;
	struct mr_errbuf eb = { "", "" };
	int in[10 * 8], tg[10 * 8], in2[10 * 8], tg2[10 * 8], seen[10] = { 0 }, i, r;

	setup();
	for (i = 0; i < (int)(sizeof(tok) / sizeof(tok[0])); i++)
		tok[i] = (uint16_t)(i % 200);
	path_of(p, sizeof(p), "ok.bin");
	cr_assert_eq(mr_shard_write(p, tok, sizeof(tok) / sizeof(tok[0]), &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_shard_open(&a, p, 256, 8, 42, &eb), 0, "%s", eb.msg);
	cr_assert_eq(a.nwin, 10);
	/* one epoch = 10 rows: each window once, targets = inputs shifted */
	cr_assert_eq(mr_shard_batch(&a, 0, 10, in, tg, &eb), 0);
	for (r = 0; r < 10; r++) {
		int w = in[r * 8] / 8;
		cr_expect_eq(in[r * 8] % 8, 0);
		seen[w]++;
		for (i = 0; i < 8; i++) {
			cr_expect_eq(in[r * 8 + i], w * 8 + i);
			cr_expect_eq(tg[r * 8 + i], w * 8 + i + 1);
		}
	}
	for (i = 0; i < 10; i++)
		cr_expect_eq(seen[i], 1, "window %d seen %d times", i, seen[i]);
	/* same seed: same order, even when read in different batch sizes */
	cr_assert_eq(mr_shard_open(&b, p, 256, 8, 42, &eb), 0);
	for (r = 0; r < 10; r++)
		cr_assert_eq(mr_shard_batch(&b, (uint64_t)r, 1, in2 + r * 8, tg2 + r * 8, &eb), 0);
	cr_expect_eq(memcmp(in, in2, sizeof(in)), 0);
	mr_shard_close(&b);
	/* another seed: another order; another epoch: another order */
	cr_assert_eq(mr_shard_open(&b, p, 256, 8, 43, &eb), 0);
	cr_assert_eq(mr_shard_batch(&b, 0, 10, in2, tg2, &eb), 0);
	cr_expect_neq(memcmp(in, in2, sizeof(in)), 0);
	cr_assert_eq(mr_shard_batch(&a, 10, 10, in2, tg2, &eb), 0);
	cr_expect_neq(memcmp(in, in2, sizeof(in)), 0);
	mr_shard_close(&a);
	mr_shard_close(&b);
	unlink(p);
	rmdir(dir);
}

static void expect_bad(const char *name, const int32_t *hdr, const void *body, size_t len,
		       const char *why)
{
	char p[512];
	struct mr_shard s;
	struct mr_errbuf eb = { "", "" };

	path_of(p, sizeof(p), name);
	write_raw(p, hdr, body, len);
	cr_expect(mr_shard_open(&s, p, 100, 4, 1, &eb) < 0, "%s must be rejected", name);
	cr_expect(strstr(eb.msg, p) != NULL, "message '%s' names the file", eb.msg);
	cr_expect(strstr(eb.msg, why) != NULL, "message '%s' says '%s'", eb.msg, why);
	unlink(p);
}

Test(shard, malformed_files_are_rejected_naming_the_file)
{
	int32_t hdr[256];
	uint16_t body[16];
	char p[512];
	struct mr_shard s;
	struct mr_errbuf eb = { "", "" };
	int i;

	setup();
	for (i = 0; i < 16; i++)
		body[i] = (uint16_t)i;
	memset(hdr, 0, sizeof(hdr));
	hdr[0] = 20240520;
	hdr[1] = 1;
	hdr[2] = 16;
	hdr[0] = 1234;
	expect_bad("magic.bin", hdr, body, sizeof(body), "magic");
	hdr[0] = 20240520;
	hdr[1] = 3;
	expect_bad("version.bin", hdr, body, sizeof(body), "unsupported version 3");
	hdr[1] = 2; /* a v2 header over a v1 body: 16 uint32 need 64 bytes */
	expect_bad("v2size.bin", hdr, body, sizeof(body), "size does not match");
	hdr[1] = 1;
	expect_bad("short.bin", hdr, body, sizeof(body) - 2, "size");
	hdr[2] = 15;
	expect_bad("long.bin", hdr, body, sizeof(body), "size");
	hdr[2] = 16;
	body[7] = 150;
	expect_bad("vocab.bin", hdr, body, sizeof(body), "token 150 at index 7");
	body[7] = 7;
	hdr[2] = 4;
	expect_bad("tiny.bin", hdr, body, 8, "need at least");
	path_of(p, sizeof(p), "missing.bin");
	cr_expect_eq(mr_shard_open(&s, p, 100, 4, 1, &eb), MR_ENOTFOUND); /* permanent, not retried */
	cr_expect(strstr(eb.msg, "missing.bin") != NULL);
	rmdir(dir);
}

/* Every batch of rows [0, rows) of a and b, one row at a time. */
static void expect_same_batches(struct mr_shard *a, struct mr_shard *b, int rows, int T)
{
	int in[64], tg[64], in2[64], tg2[64];
	struct mr_errbuf eb = { "", "" };

	cr_assert_leq(T, 64);
	for (int r = 0; r < rows; r++) {
		cr_assert_eq(mr_shard_batch(a, (uint64_t)r, 1, in, tg, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_shard_batch(b, (uint64_t)r, 1, in2, tg2, &eb), 0, "%s", eb.msg);
		cr_expect_eq(memcmp(in, in2, (size_t)T * sizeof(int)), 0, "row %d inputs differ", r);
		cr_expect_eq(memcmp(tg, tg2, (size_t)T * sizeof(int)), 0, "row %d targets differ", r);
	}
}

static long file_size(const char *p)
{
	FILE *f = fopen(p, "rb");
	long n;

	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fclose(f);
	return n;
}

Test(shard, v1_and_v2_files_with_the_same_tokens_give_the_same_batches)
{
	uint32_t tok[1 + 12 * 8];
	char p1[512], p2[512];
	struct mr_shard a, b;
	struct mr_errbuf eb = { "", "" };
	size_t n = sizeof(tok) / sizeof(tok[0]);

	setup();
	for (size_t i = 0; i < n; i++)
		tok[i] = (uint32_t)((i * 37) % 250);
	path_of(p1, sizeof(p1), "v1.bin");
	path_of(p2, sizeof(p2), "v2.bin");
	cr_assert_eq(mr_shard_write32(p1, tok, n, 0, &eb), 0, "%s", eb.msg); /* fits: v1 */
	cr_assert_eq(mr_shard_write32(p2, tok, n, MR_SHARD_VERSION_32, &eb), 0, "%s", eb.msg);
	cr_expect_eq(file_size(p1), 1024 + 2 * (long)n);
	cr_expect_eq(file_size(p2), 1024 + 4 * (long)n);
	cr_assert_eq(mr_shard_open(&a, p1, 256, 8, 7, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_shard_open(&b, p2, 256, 8, 7, &eb), 0, "%s", eb.msg);
	cr_expect_eq(a.version, 1);
	cr_expect_eq(b.version, 2);
	cr_assert_eq(a.count, b.count);
	expect_same_batches(&a, &b, 30, 8); /* past the first epoch too */
	mr_shard_close(&a);
	mr_shard_close(&b);
	unlink(p1);
	unlink(p2);
	rmdir(dir);
}

Test(shard, ids_past_16_bits_round_trip_through_a_v2_shard)
{
	uint32_t tok[1 + 6 * 4];
	char p[512];
	struct mr_shard s;
	struct mr_errbuf eb = { "", "" };
	int in[6 * 4], tg[6 * 4], seen = 0;
	size_t n = sizeof(tok) / sizeof(tok[0]);

	setup();
	for (size_t i = 0; i < n; i++)
		tok[i] = 128000u + (uint32_t)i * 10u; /* Llama 3's specials start at 128000 */
	path_of(p, sizeof(p), "big.bin");
	cr_assert_eq(mr_shard_write32(p, tok, n, MR_SHARD_VERSION, &eb), MR_ERANGE,
		     "a 16-bit shard cannot hold 128000");
	cr_expect(strstr(eb.msg, "does not fit a version 1 shard") != NULL, "%s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_shard_write32(p, tok, n, 0, &eb), 0, "%s", eb.msg); /* picks v2 */
	cr_assert_eq(mr_shard_open(&s, p, 128256, 4, 3, &eb), 0, "%s", eb.msg);
	cr_expect_eq(s.version, 2);
	cr_assert_eq(mr_shard_batch(&s, 0, 6, in, tg, &eb), 0, "%s", eb.msg);
	for (int r = 0; r < 6; r++) {
		int w = (in[r * 4] - 128000) / 10 / 4;

		seen |= 1 << w;
		for (int t = 0; t < 4; t++) {
			cr_expect_eq(in[r * 4 + t], 128000 + (w * 4 + t) * 10);
			cr_expect_eq(tg[r * 4 + t], 128000 + (w * 4 + t + 1) * 10);
		}
	}
	cr_expect_eq(seen, 0x3f, "every window once: %#x", seen);
	mr_shard_close(&s);
	/* today's vocabulary check, now for 32-bit tokens: 128000 + 10*k is
	 * past a model of vocab 128100 from index 10 on */
	cr_expect_eq(mr_shard_open(&s, p, 128100, 4, 3, &eb), MR_ERANGE);
	cr_expect(strstr(eb.msg, p) != NULL, "message '%s' names the file", eb.msg);
	cr_expect(strstr(eb.msg, "token 128100 at index 10") != NULL, "%s", eb.msg);
	cr_expect(strstr(eb.msg, "vocab_size 128100") != NULL, "%s", eb.msg);
	unlink(p);
	rmdir(dir);
}
