/*
 * test_safetensors.c - the safetensors reader and writer on their own
 * (runtime/ckpt/mr_safetensors.h): files written by hand byte for byte
 * from the format's definition, so the reader is not checked against its
 * own writer only.
 *   - a good file: every field read back, F16 / BF16 / F64 converted to
 *     float32, metadata found, the raw bytes as written;
 *   - hostile files: each breaks one rule of the format (a header longer
 *     than the file, not an object, a duplicate name, an unknown dtype,
 *     too many or negative dimensions, offsets reversed or of the wrong
 *     length, ranges that overlap, leave a gap or stop before the end,
 *     metadata that is not strings) and must be refused as corrupt with a
 *     message naming the field or tensor - never read past the file;
 *   - the writer: a file read back equal, an existing path refused
 *     without overwrite, a bad spec refused naming the tensor, an aborted
 *     write leaving nothing behind.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/mr_safetensors.h"
#include "proc.h"

static const char *dir; /* the test's scratch directory */

static void setup(void)
{
	cr_assert_not_null(dir = mr_test_scratch("mr-st"));
}

TestSuite(safetensors, .init = setup);

/* Writes <dir>/<name>: the 8-byte little-endian length of header (or
 * hlen when not ~0), header, then n data bytes; returns the path. */
static const char *put_file(const char *name, const char *header, uint64_t hlen,
			    const void *data, size_t n)
{
	static char path[512];
	uint64_t len = hlen != ~(uint64_t)0 ? hlen : strlen(header);
	unsigned char le[8];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	for (int i = 0; i < 8; i++)
		le[i] = (unsigned char)(len >> (8 * i));
	f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(le, 1, 8, f), 8u);
	cr_assert_eq(fwrite(header, 1, strlen(header), f), strlen(header));
	if (n)
		cr_assert_eq(fwrite(data, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
	return path;
}

Test(safetensors, a_file_written_by_hand_reads_back_every_field)
{
	/* a: F32 [2,2]; b: BF16 [3] (1.0, -2.0, 0.5); c: F16 [2] (1.5, -0.25);
	 * d: F64 [1] (3.25) */
	unsigned char data[16 + 6 + 4 + 8];
	float a[4] = { 1.0f, -2.5f, 3.0f, 0.125f };
	const uint16_t bf[3] = { 0x3f80, 0xc000, 0x3f00 }, h[2] = { 0x3e00, 0xb400 };
	double d = 3.25;
	struct mr_st_file f;
	struct mr_errbuf eb = { "", "" };
	float out[4], raw[4];

	memcpy(data, a, 16);
	memcpy(data + 16, bf, 6);
	memcpy(data + 22, h, 4);
	memcpy(data + 26, &d, 8);
	const char *path = put_file(
		"good.safetensors",
		"{\"__metadata__\": {\"format\": \"pt\"}, "
		"\"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]}, "
		"\"b\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [16, 22]}, "
		"\"c\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [22, 26]}, "
		"\"d\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [26, 34]}}    ",
		~(uint64_t)0, data, sizeof(data));

	cr_assert_eq(mr_st_open(&f, path, &eb), 0, "%s", eb.msg);
	cr_expect_eq(f.ntensors, 4);
	cr_expect_str_eq(mr_st_meta(&f, "format"), "pt");
	cr_expect_null(mr_st_meta(&f, "absent"));
	cr_expect_eq(mr_st_find(&f, "zz"), -1);

	int i = mr_st_find(&f, "a");
	cr_assert_geq(i, 0);
	cr_expect_eq(f.t[i].ndim, 2);
	cr_expect_eq(f.t[i].shape[0], 2);
	cr_expect_eq(f.t[i].count, 4u);
	cr_assert_eq(mr_st_read_f32(&f, i, out, &eb), 0, "%s", eb.msg);
	cr_expect_arr_eq(out, a, sizeof(a));
	cr_assert_eq(mr_st_read_raw(&f, i, raw, &eb), 0, "%s", eb.msg);
	cr_expect_arr_eq(raw, a, sizeof(a));

	cr_assert_eq(mr_st_read_f32(&f, mr_st_find(&f, "b"), out, &eb), 0, "%s", eb.msg);
	cr_expect(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.5f, "bf16: %g %g %g",
		  (double)out[0], (double)out[1], (double)out[2]);
	cr_assert_eq(mr_st_read_f32(&f, mr_st_find(&f, "c"), out, &eb), 0, "%s", eb.msg);
	cr_expect(out[0] == 1.5f && out[1] == -0.25f, "f16: %g %g", (double)out[0],
		  (double)out[1]);
	cr_assert_eq(mr_st_read_f32(&f, mr_st_find(&f, "d"), out, &eb), 0, "%s", eb.msg);
	cr_expect(out[0] == 3.25f, "f64: %g", (double)out[0]);
	mr_st_close(&f);
}

/* One hostile file: refused with code, the message naming what. */
struct hostile {
	const char *why, *header;
	uint64_t hlen;    /* ~0: the header's own length */
	size_t data;      /* data bytes after the header */
	int code;
	const char *names;
};

Test(safetensors, hostile_files_are_refused_naming_what_is_wrong)
{
	static const unsigned char zeros[64];
	const uint64_t own = ~(uint64_t)0;
	const struct hostile cases[] = {
		{ "header past the file", "{}", 4096, 0, MR_ECORRUPT, "header" },
		{ "header over the bound", "{}", (uint64_t)MR_ST_MAX_HEADER + 1, 0, MR_ELIMIT,
		  "header" },
		{ "not an object", "[1, 2]", own, 0, MR_ECORRUPT, "'{'" },
		{ "not JSON", "{\"a\": ", own, 0, MR_ECORRUPT, "not valid JSON" },
		{ "duplicate name",
		  "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
		  "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
		  own, 8, MR_ECORRUPT, "a" },
		{ "unknown dtype",
		  "{\"w\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", own, 4,
		  MR_ECORRUPT, "w" },
		{ "negative dimension",
		  "{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", own,
		  4, MR_ECORRUPT, "w" },
		{ "too many dimensions",
		  "{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
		  "\"data_offsets\": [0, 4]}}",
		  own, 4, MR_ECORRUPT, "w" },
		{ "offsets reversed",
		  "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", own, 4,
		  MR_ECORRUPT, "w" },
		{ "length not the shape's",
		  "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", own, 4,
		  MR_ECORRUPT, "w" },
		{ "ranges overlap",
		  "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
		  "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
		  own, 12, MR_ECORRUPT, "'a' and 'b' overlap" },
		{ "a gap between ranges",
		  "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
		  "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
		  own, 12, MR_ECORRUPT, "tensor 'b': a gap" },
		{ "data after the last range",
		  "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", own, 8,
		  MR_ECORRUPT, "after the last tensor" },
		{ "range past the file",
		  "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", own, 4,
		  MR_ECORRUPT, "tensor 'a': 'data_offsets' end" },
		{ "metadata not strings",
		  "{\"__metadata__\": {\"k\": 1}, "
		  "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
		  own, 4, MR_ECORRUPT, "metadata 'k'" },
		{ "shape not a list",
		  "{\"w\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", own, 4,
		  MR_ECORRUPT, "w" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct hostile *c = &cases[i];
		struct mr_st_file f;
		struct mr_errbuf eb = { "", "" };
		char name[32];
		int rc;

		snprintf(name, sizeof(name), "bad%zu.safetensors", i);
		rc = mr_st_open(&f, put_file(name, c->header, c->hlen, zeros, c->data), &eb);
		if (rc == 0)
			mr_st_close(&f);
		cr_expect_eq(rc, c->code, "%s: got %d (%s), not %d", c->why, rc, eb.msg, c->code);
		cr_expect(strstr(eb.msg, name) != NULL, "%s: the message does not name the file: %s",
			  c->why, eb.msg);
		cr_expect(strstr(eb.msg, c->names) != NULL, "%s: the message does not name '%s': %s",
			  c->why, c->names, eb.msg);
	}
	/* a file shorter than the length prefix */
	char path[512];
	snprintf(path, sizeof(path), "%s/short.safetensors", dir);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	fwrite("abc", 1, 3, f);
	fclose(f);
	struct mr_st_file sf;
	struct mr_errbuf eb = { "", "" };
	cr_expect_eq(mr_st_open(&sf, path, &eb), MR_ECORRUPT, "a 3-byte file: %s", eb.msg);
}

static int files_in(const char *d)
{
	DIR *dp = opendir(d);
	struct dirent *e;
	int n = 0;

	cr_assert_not_null(dp);
	while ((e = readdir(dp)))
		n += e->d_name[0] != '.';
	closedir(dp);
	return n;
}

Test(safetensors, the_writer_commits_whole_files_and_refuses_what_it_must)
{
	struct mr_st_spec specs[2] = { { "w", 2, { 2, 3 } }, { "b", 1, { 3 } } };
	const char *meta[] = { "format", "pt", NULL };
	float w[6] = { 1, 2, 3, 4, 5, 6 }, b[3] = { -1, 0.5f, 7 }, out[6];
	struct mr_errbuf eb = { "", "" };
	struct mr_st_writer wr;
	struct mr_st_file f;
	char path[512];

	snprintf(path, sizeof(path), "%s/out.safetensors", dir);
	cr_assert_eq(mr_st_writer_open(&wr, path, specs, 2, meta, 0, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_st_writer_put(&wr, w, 6, &eb), 0, "%s", eb.msg);
	cr_expect_eq(access(path, F_OK), -1, "the file appeared before commit");
	cr_assert_eq(mr_st_writer_put(&wr, b, 3, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_st_writer_commit(&wr, &eb), 0, "%s", eb.msg);
	cr_expect_eq(files_in(dir), 1, "a temporary file was left behind");

	cr_assert_eq(mr_st_open(&f, path, &eb), 0, "%s", eb.msg);
	cr_expect_str_eq(mr_st_meta(&f, "format"), "pt");
	cr_assert_eq(mr_st_read_f32(&f, mr_st_find(&f, "w"), out, &eb), 0, "%s", eb.msg);
	cr_expect_arr_eq(out, w, sizeof(w));
	cr_assert_eq(mr_st_read_f32(&f, mr_st_find(&f, "b"), out, &eb), 0, "%s", eb.msg);
	cr_expect_arr_eq(out, b, sizeof(b));
	mr_st_close(&f);

	/* an existing file, without overwrite */
	cr_expect_eq(mr_st_writer_open(&wr, path, specs, 2, NULL, 0, &eb), MR_EEXISTS,
		     "an existing file was not refused: %s", eb.msg);
	/* a duplicate name and a negative dimension, named */
	struct mr_st_spec dup[2] = { { "w", 1, { 1 } }, { "w", 1, { 1 } } };
	mr_errbuf_clear(&eb); /* the first error of a buffer wins */
	cr_expect_lt(mr_st_writer_open(&wr, path, dup, 2, NULL, 1, &eb), 0);
	cr_expect(strstr(eb.msg, "w") != NULL, "%s", eb.msg);
	struct mr_st_spec neg[1] = { { "neg", 1, { -2 } } };
	mr_errbuf_clear(&eb);
	cr_expect_lt(mr_st_writer_open(&wr, path, neg, 1, NULL, 1, &eb), 0);
	cr_expect(strstr(eb.msg, "neg") != NULL, "%s", eb.msg);
	/* a wrong count is refused; an abort leaves the old file alone */
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_st_writer_open(&wr, path, specs, 2, NULL, 1, &eb), 0, "%s", eb.msg);
	cr_expect_lt(mr_st_writer_put(&wr, w, 5, &eb), 0, "a short tensor was taken");
	mr_st_writer_abort(&wr);
	cr_expect_eq(files_in(dir), 1, "an aborted write left a file");
	cr_assert_eq(mr_st_open(&f, path, &eb), 0, "the committed file is gone: %s", eb.msg);
	mr_st_close(&f);
}
