/*
 * test_manifest.c - a checkpoint's files on their own (runtime/ckpt,
 * docs/CHECKPOINTS.md), without a job: a one-rank checkpoint of known
 * values written by mr_ckpt_write_params, then
 *   - read back: the manifest's fields, every record verified, each tensor
 *     reassembled whole from its records (the tiling) equal to what was
 *     written;
 *   - the manifest's seal: one changed byte anywhere is a damaged manifest
 *     (MR_ECORRUPT naming manifest.json), and a resealed manifest (the
 *     CRC-32C recomputed here, as the format says) is read again, so the
 *     checks below reach the rules behind the seal;
 *   - the tiling rules, on resealed manifests: a record shortened (a gap
 *     in its tensor), a record overlapping another in the shard, a record
 *     past its shard's bytes: each refused naming the tensor or shard;
 *   - the shard: its header's magic, its step, a flipped data byte (the
 *     record's CRC) and a truncated file, each refused by mr_ckpt_verify
 *     naming the shard file and the reason.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/mr_ckpt.h"
#include "model/mr_gpt.h"
#include "mr_crc32c.h"
#include "proc.h"

static const struct mr_gpt_config cfg = { .vocab = 32, .max_seq = 8, .n_layer = 1,
					  .d_model = 16, .n_head = 2 };

static const char *root; /* the test's scratch directory */
static char step_dir[4200];
static float *params;
static size_t nparams;

static void setup(void)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt m;

	cr_assert_not_null(root = mr_test_scratch("mr-manifest"));
	cr_assert_eq(mr_gpt_create(&m, &cfg, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	nparams = m.nparams;
	params = malloc(nparams * sizeof(float));
	cr_assert_not_null(params);
	for (size_t i = 0; i < nparams; i++)
		params[i] = (float)i * 0.25f - 3.0f;
	mr_gpt_release(&m);
	cr_assert_eq(mr_ckpt_write_params(root, &cfg, 7, params, &eb), 0, "%s", eb.msg);
	snprintf(step_dir, sizeof(step_dir), "%s/step-00000007", root);
}

static void teardown(void)
{
	free(params);
}

TestSuite(manifest, .init = setup, .fini = teardown);

static char *file_of(const char *name, size_t *n)
{
	char path[4400];

	snprintf(path, sizeof(path), "%s/%s", step_dir, name);
	char *s = mr_test_slurp(path, n);
	cr_assert_not_null(s, "no %s", path);
	return s;
}

static void put_file(const char *name, const char *s, size_t n)
{
	char path[4400];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", step_dir, name);
	cr_assert_not_null(f = fopen(path, "wb"));
	cr_assert_eq(fwrite(s, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

/* text with its seal recomputed: the CRC-32C of every byte before
 * ",\"manifest_crc32c\":" (docs/CHECKPOINTS.md), written as manifest.json */
static void reseal(char *text)
{
	char *at = strstr(text, ",\"manifest_crc32c\":");
	char out[1 << 16];

	cr_assert_not_null(at, "no seal in the manifest");
	*at = 0;
	int n = snprintf(out, sizeof(out), "%s,\"manifest_crc32c\":%u}\n", text,
			 mr_crc32c(0, text, strlen(text)));
	cr_assert_lt((size_t)n, sizeof(out));
	put_file("manifest.json", out, (size_t)n);
}

/* The manifest read must fail MR_ECORRUPT with msg naming each of what. */
static void refused(const char *why, const char *what1, const char *what2)
{
	struct mr_ckpt_manifest mf;
	struct mr_errbuf eb = { "", "" };
	int rc = mr_ckpt_manifest_read(&mf, step_dir, &eb);

	if (rc == 0)
		mr_ckpt_manifest_release(&mf);
	cr_expect_eq(rc, MR_ECORRUPT, "%s: read gave %d (%s)", why, rc, eb.msg);
	cr_expect(strstr(eb.msg, what1), "%s: the message does not name '%s': %s", why, what1,
		  eb.msg);
	cr_expect(!what2 || strstr(eb.msg, what2), "%s: the message does not name '%s': %s", why,
		  what2, eb.msg);
}

Test(manifest, a_written_checkpoint_reads_back_whole)
{
	struct mr_ckpt_manifest mf;
	struct mr_errbuf eb = { "", "" };
	uint64_t bytes = 0;
	size_t seen = 0;

	cr_assert_eq(mr_ckpt_manifest_read(&mf, step_dir, &eb), 0, "%s", eb.msg);
	cr_expect_eq(mf.step, 7);
	cr_expect_eq(mf.world, 1);
	cr_expect_eq(mf.nshards, 1);
	cr_expect_null(mr_ckpt_model_diff(&mf.model, &cfg), "the model read back differs: %s",
		       mr_ckpt_model_diff(&mf.model, &cfg));
	cr_assert_eq(mr_ckpt_verify(&mf, &bytes, &eb), 0, "%s", eb.msg);
	cr_expect_eq(bytes, nparams * sizeof(float), "verified %llu bytes of %zu",
		     (unsigned long long)bytes, nparams * sizeof(float));
	/* every tensor whole, in table order, equal to what was written */
	for (int i = 0; i < mf.ntensors; i++) {
		const struct mr_ckpt_tensor *t = &mf.tensors[i];
		size_t n = 1;
		for (int d = 0; d < t->ndim; d++)
			n *= (size_t)t->full[d];
		float *full = malloc(n * sizeof(float));
		cr_assert_not_null(full);
		cr_assert_eq(mr_ckpt_read_full(&mf, i, 0, full, &eb), 0, "%s", eb.msg);
		cr_expect_arr_eq(full, params + seen, n * sizeof(float), "tensor %s differs",
				 t->name);
		seen += n;
		free(full);
	}
	cr_expect_eq(seen, nparams);
	/* no optimizer state in a params-only checkpoint (full: tensor 0's
	 * element count, as the call may write) */
	float *m0 = calloc(nparams, sizeof(float));
	cr_assert_not_null(m0);
	cr_expect_eq(mr_ckpt_read_full(&mf, 0, 1, m0, &eb), MR_ENOTFOUND);
	free(m0);
	mr_ckpt_manifest_release(&mf);
}

Test(manifest, one_changed_byte_breaks_the_seal)
{
	size_t n;
	char *text = file_of("manifest.json", &n);
	char *p = strstr(text, "\"step\":7");

	cr_assert_not_null(p, "no step in %s", text);
	p[7] = '8';
	put_file("manifest.json", text, n);
	refused("a changed step", "manifest.json", "checksum mismatch");
	/* the same change resealed is an intact manifest of another step */
	reseal(text);
	struct mr_ckpt_manifest mf;
	struct mr_errbuf eb = { "", "" };
	cr_assert_eq(mr_ckpt_manifest_read(&mf, step_dir, &eb), 0, "resealed: %s", eb.msg);
	cr_expect_eq(mf.step, 8);
	/* ... whose shard says step 7: verify names the shard */
	cr_expect_lt(mr_ckpt_verify(&mf, NULL, &eb), 0, "a shard of step 7 verified for step 8");
	cr_expect(strstr(eb.msg, "rank-00000.bin"), "%s", eb.msg);
	mr_ckpt_manifest_release(&mf);
	free(text);
}

/* The first record of the manifest text: its ten numbers' positions. */
static char *first_record(char *text)
{
	char *r = strstr(text, "\"records\":[[");

	cr_assert_not_null(r, "no records in the manifest");
	return r + strlen("\"records\":[[");
}

/* Rewrites field k (0-based) of the first record to value, resealed. */
static void set_record_field(char *text, int k, unsigned long long value)
{
	char *r = first_record(text), *end, out[1 << 16];
	int i;

	for (i = 0; i < k; i++)
		r = strchr(r, ',') + 1;
	end = r + strcspn(r, ",]");
	int n = snprintf(out, sizeof(out), "%.*s%llu%s", (int)(r - text), text, value, end);
	cr_assert_lt((size_t)n, sizeof(out));
	strcpy(text, out);
	reseal(text);
}

static unsigned long long record_field(char *text, int k)
{
	char *r = first_record(text);

	for (int i = 0; i < k; i++)
		r = strchr(r, ',') + 1;
	return strtoull(r, NULL, 10);
}

Test(manifest, the_tiling_rules_hold_behind_the_seal)
{
	size_t n;
	char *orig = file_of("manifest.json", &n), text[1 << 16];
	unsigned long long cnt, off;

	cr_assert_lt(n, sizeof(text));
	memcpy(text, orig, n + 1);
	cnt = record_field(text, 7);
	off = record_field(text, 8);
	cr_assert_gt(cnt, 1u);

	/* a shortened record leaves elements of its tensor without a record */
	set_record_field(text, 7, cnt - 1);
	refused("a shortened record", "tensor 'wte'", "exactly once");

	/* a record starting inside the next one's bytes of the shard */
	memcpy(text, orig, n + 1);
	set_record_field(text, 8, off + 4);
	refused("an overlapping record", "rank-00000.bin", "overlap");

	/* a record past its shard's bytes */
	memcpy(text, orig, n + 1);
	set_record_field(text, 8, 1ull << 40);
	refused("a record past the shard", "'wte'", "past the end of 'rank-00000.bin'");

	/* and the original, resealed by this test, reads: the reseal is right */
	memcpy(text, orig, n + 1);
	reseal(text);
	struct mr_ckpt_manifest mf;
	struct mr_errbuf eb = { "", "" };
	cr_expect_eq(mr_ckpt_manifest_read(&mf, step_dir, &eb), 0, "resealed original: %s",
		     eb.msg);
	mr_ckpt_manifest_release(&mf);
	free(orig);
}

/* verify must fail naming the shard and reason after damage was done. */
static void verify_refuses(const char *why, const char *reason)
{
	struct mr_ckpt_manifest mf;
	struct mr_errbuf eb = { "", "" };

	cr_assert_eq(mr_ckpt_manifest_read(&mf, step_dir, &eb), 0, "%s", eb.msg);
	cr_expect_lt(mr_ckpt_verify(&mf, NULL, &eb), 0, "%s: verified", why);
	cr_expect(strstr(eb.msg, "rank-00000.bin"), "%s: the shard is not named: %s", why, eb.msg);
	cr_expect(strstr(eb.msg, reason), "%s: '%s' is not said: %s", why, reason, eb.msg);
	mr_ckpt_manifest_release(&mf);
}

Test(manifest, a_damaged_shard_is_named_with_the_reason)
{
	size_t n;
	char *shard = file_of("rank-00000.bin", &n);
	char *copy = malloc(n);

	cr_assert_not_null(copy);
	cr_assert_gt(n, 64u);
	cr_expect_eq(memcmp(shard, "MRCKPT01", 8), 0, "the magic is not MRCKPT01");

	memcpy(copy, shard, n);
	copy[0] = 'X';
	put_file("rank-00000.bin", copy, n);
	verify_refuses("a wrong magic", "not a meshrun checkpoint shard");

	memcpy(copy, shard, n);
	copy[64 + 5] ^= 0x10;
	put_file("rank-00000.bin", copy, n);
	verify_refuses("a flipped data byte", "checksum mismatch in the parameters of tensor");

	put_file("rank-00000.bin", shard, n - 4);
	verify_refuses("a truncated shard", "bytes");

	put_file("rank-00000.bin", shard, n);
	struct mr_ckpt_manifest mf;
	struct mr_errbuf eb = { "", "" };
	cr_assert_eq(mr_ckpt_manifest_read(&mf, step_dir, &eb), 0, "%s", eb.msg);
	cr_expect_eq(mr_ckpt_verify(&mf, NULL, &eb), 0, "the restored shard: %s", eb.msg);
	mr_ckpt_manifest_release(&mf);
	free(copy);
	free(shard);
}
