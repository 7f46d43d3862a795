/*
 * test_weights.c - the weights file: round trip of config and parameters,
 * deterministic init by seed, and bad files rejected naming the file.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "model/mr_gpt.h"
#include "model/mr_weights.h"

static const struct mr_gpt_config moe = { .vocab = 32, .max_seq = 16, .n_layer = 2, .d_model = 16,
					  .n_head = 2, .moe_every = 2, .n_experts = 3, .top_k = 2,
					  .capacity_factor = 1.5f, .aux_coef = 0.01f };

Test(weights, round_trip_and_seeded_init)
{
	const char *p = "/tmp/mr-test-weights.bin";
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt a, b;
	struct mr_gpt_config c;

	cr_assert_eq(mr_gpt_create(&a, &moe, 2, 8, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(&b, &moe, 2, 8, NULL, &eb), 0, "%s", eb.msg);
	mr_gpt_init_params(&a, 5);
	cr_expect_not_null(mr_gpt_find(&a, "h.1.moe.router.w"));
	cr_expect_null(mr_gpt_find(&a, "h.1.mlp.fc.w"));
	cr_expect_eq(mr_gpt_find(&a, "h.0.mlp.fc.w")->shape[0], 64);
	cr_expect_eq(mr_gpt_find(&a, "h.1.moe.fc.w")->shape[0], 3);
	cr_expect(mr_gpt_find(&a, "h.0.attn.qkv.w")->decay);
	cr_expect(!mr_gpt_find(&a, "h.0.ln1.w")->decay);
	cr_expect(!mr_gpt_find(&a, "h.0.attn.qkv.b")->decay);
	cr_assert_eq(mr_weights_write(&a, p, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_weights_read_config(p, &c, &eb), 0, "%s", eb.msg);
	cr_expect_eq(memcmp(&c, &moe, sizeof(c)), 0);
	cr_assert_eq(mr_weights_load(&b, p, &eb), 0, "%s", eb.msg);
	cr_expect_eq(memcmp(a.params, b.params, a.nparams * sizeof(float)), 0);
	mr_gpt_init_params(&b, 5);
	cr_expect_eq(memcmp(a.params, b.params, a.nparams * sizeof(float)), 0, "same seed");
	mr_gpt_init_params(&b, 6);
	cr_expect_neq(memcmp(a.params, b.params, a.nparams * sizeof(float)), 0, "other seed");
	/* LayerNorm weights are 1, biases 0 */
	cr_expect_eq(a.w.layer[0].ln1w[3], 1.0f);
	cr_expect_eq(a.w.layer[0].qkvb[3], 0.0f);
	mr_gpt_release(&a);
	mr_gpt_release(&b);
	unlink(p);
}

Test(weights, bad_files_name_the_file)
{
	const char *p = "/tmp/mr-test-weights-bad.bin";
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt a;
	struct mr_gpt_config c, other = moe;
	FILE *f;
	int32_t junk[256] = { 1, 2, 3 };

	f = fopen(p, "wb");
	cr_assert_not_null(f);
	fwrite(junk, 4, 256, f);
	fclose(f);
	cr_expect_eq(mr_weights_read_config(p, &c, &eb), MR_ECORRUPT);
	cr_expect(strstr(eb.msg, p) && strstr(eb.msg, "magic"), "%s", eb.msg);
	/* a file for another config does not load */
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_gpt_create(&a, &moe, 1, 4, NULL, &eb), 0);
	cr_assert_eq(mr_weights_write(&a, p, &eb), 0);
	mr_gpt_release(&a);
	other.n_experts = 4;
	cr_assert_eq(mr_gpt_create(&a, &other, 1, 4, NULL, &eb), 0);
	cr_expect_eq(mr_weights_load(&a, p, &eb), MR_EINVAL);
	cr_expect(strstr(eb.msg, p) != NULL, "%s", eb.msg);
	mr_gpt_release(&a);
	/* truncated: refused, and the model keeps its parameters */
	cr_assert_eq(truncate(p, 2000), 0);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_gpt_create(&a, &moe, 1, 4, NULL, &eb), 0);
	cr_assert_eq(mr_gpt_init_params(&a, 7), 0);
	{
		float *before = malloc(a.nparams * sizeof(float));
		cr_assert_not_null(before);
		memcpy(before, a.params, a.nparams * sizeof(float));
		cr_expect_eq(mr_weights_load(&a, p, &eb), MR_ECORRUPT);
		cr_expect(strstr(eb.msg, "truncated") != NULL, "%s", eb.msg);
		cr_expect(memcmp(before, a.params, a.nparams * sizeof(float)) == 0,
			  "a truncated file changed the parameters");
		free(before);
	}
	mr_gpt_release(&a);
	unlink(p);
}
