/*
 * test_gpt_worker.c - the GPT workload through struct mr_worker_ops:
 * training lowers the loss on the synthetic task (dense and MoE), stats
 * are filled, runs are deterministic, bad configs name the field, abort()
 * from another thread stops step(), and a non-finite loss names the step
 * and the tensor.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "cpu/mr_pool.h"
#include "data/mr_shard.h"
#include "device/mr_device.h"
#include "mr_gpt_worker.h"
#include "mr_step.h"

static json_t *cfg(const char *js)
{
	json_error_t err;
	json_t *j = json_loads(js, 0, &err);

	cr_assert_not_null(j, "bad test json: %s", err.text);
	return j;
}

static int create(void **st, json_t *c, struct mr_errbuf *eb)
{
	struct mr_worker_env env;

	memset(&env, 0, sizeof(env));
	env.job = "ns/test";
	env.world_size = env.local_world_size = 1;
	env.tp = env.pp = env.cp = env.ep = env.dp = 1;
	env.config = c;
	return mr_gpt_worker.create(st, &env, eb);
}

#define SMALL "\"vocab_size\":32,\"n_layer\":2,\"d_model\":64,\"n_head\":4,\"seq_len\":32," \
	      "\"batch_size\":8,\"lr\":0.003,\"warmup_steps\":5,\"threads\":2," \
	      "\"peak_flops\":1e11"

static void train(const char *js, int steps, double *first, double *last,
		  struct mr_worker_stats *out)
{
	json_t *c = cfg(js);
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_stats st;
	void *w;
	int i, rc = MR_WORKER_MORE;

	memset(&st, 0, sizeof(st));
	cr_assert_eq(create(&w, c, &eb), 0, "%s", eb.msg);
	for (i = 0; i < steps; i++) {
		rc = mr_gpt_worker.step(w, &st, &eb);
		cr_assert(rc >= 0, "step %d: %s", i, eb.msg);
		if (i == 0)
			*first = st.loss;
	}
	cr_expect_eq(rc, MR_WORKER_DONE, "the last step reports done");
	*last = st.loss;
	*out = st;
	mr_gpt_worker.destroy(w);
	json_decref(c);
}

Test(gpt_worker, dense_training_lowers_loss_and_fills_stats)
{
	struct mr_worker_stats st;
	double first, last;

	train("{" SMALL ",\"steps\":80,\"eval_every\":40}", 80, &first, &last, &st);
	cr_expect(first > 3.0, "initial loss %f should be near log(32)", first);
	cr_expect(last < first - 1.0, "loss must fall: %f -> %f", first, last);
	cr_expect_eq(st.step, 80);
	cr_expect_eq(st.total_steps, 80);
	cr_expect_eq(st.tokens, 80 * 8 * 32);
	cr_expect(st.tokens_per_s > 0 && st.step_seconds > 0);
	cr_expect(st.mfu > 0 && st.mfu < 1, "mfu %f", st.mfu);
	cr_expect(st.lr > 0 && st.grad_norm > 0);
	cr_expect(isfinite(st.val_loss) && st.val_loss < first, "val loss %f", st.val_loss);
	cr_expect(st.mem_bytes[MR_MEM_PARAMS] > 0);
	cr_expect_eq(st.mem_bytes[MR_MEM_GRADS], st.mem_bytes[MR_MEM_PARAMS]);
	cr_expect_eq(st.mem_bytes[MR_MEM_OPTIM], 2 * st.mem_bytes[MR_MEM_PARAMS]);
	cr_expect(st.mem_bytes[MR_MEM_ACTS] > 0 && st.mem_bytes[MR_MEM_WORKSPACE] > 0);
}

Test(gpt_worker, moe_training_lowers_loss)
{
	struct mr_worker_stats st;
	double first, last;

	train("{" SMALL ",\"steps\":60,\"moe_every\":2,\"n_experts\":4,\"top_k\":2,"
	      "\"capacity_factor\":1.0}", 60, &first, &last, &st);
	cr_expect(last < first - 0.8, "loss must fall: %f -> %f", first, last);
	cr_expect(st.aux_loss > 0.9, "aux loss %f (1 when balanced)", st.aux_loss);
}

Test(gpt_worker, same_seed_same_losses)
{
	struct mr_worker_stats a, b;
	double f1, l1, f2, l2;

	train("{" SMALL ",\"steps\":5,\"seed\":7}", 5, &f1, &l1, &a);
	train("{" SMALL ",\"steps\":5,\"seed\":7}", 5, &f2, &l2, &b);
	cr_expect_eq(f1, f2);
	cr_expect_eq(l1, l2);
	cr_expect_eq(a.grad_norm, b.grad_norm);
}

static void expect_bad(const char *js, const char *field)
{
	json_t *c = cfg(js);
	struct mr_errbuf eb = { "", "" };
	void *w = (void *)&eb;
	int rc = create(&w, c, &eb);

	cr_expect(rc < 0, "%s must be rejected", js);
	cr_expect_null(w);
	cr_expect(strstr(eb.msg, field) != NULL, "message '%s' names '%s'", eb.msg, field);
	json_decref(c);
}

Test(gpt_worker, bad_configs_name_the_field)
{
	expect_bad("{\"d_model\":64,\"n_head\":5}", "n_head");
	expect_bad("{\"moe_every\":1,\"n_experts\":1,\"top_k\":2}", "top_k");
	expect_bad("{\"moe_every\":1,\"capacity_factor\":0}", "capacity_factor");
	expect_bad("{\"moe_every\":1,\"capacity_factor\":-1}", "capacity_factor");
	expect_bad("{\"moe_every\":1,\"moe_policy\":\"dropfree\"}", "moe_policy");
	expect_bad("{\"moe_every\":1,\"moe_policy\":2}", "moe_policy");
	expect_bad("{\"n_layer\":0}", "n_layer");
	expect_bad("{\"seq_len\":64,\"max_seq\":32}", "seq_len");
	expect_bad("{\"n_layers\":2}", "n_layers");
	expect_bad("{\"lr\":\"fast\"}", "lr");
	expect_bad("{\"zero\":4}", "zero");
	expect_bad("{\"sequence_parallel\":true}", "sequence_parallel");
	expect_bad("{\"device\":\"gpu\"}", "device");
	expect_bad("{\"precision\":\"fp16\"}", "precision");
	expect_bad("{\"device\":\"cpu\",\"precision\":\"bf16\"}", "precision");
	expect_bad("{\"comm_backend\":\"mpi\"}", "comm_backend");
	{
		/* where no GPU can be opened (or the build has no CUDA), create
		 * fails naming the device, before any communication */
		struct mr_dev d;
		struct mr_errbuf eb = { "", "" };
		if (mr_dev_open(&d, "cuda", 0, NULL, NULL, &eb) == 0)
			mr_dev_close(&d);
		else
			expect_bad("{\"device\":\"cuda\"}", "device");
	}
}

/* A llama's rope scaling keys reach the model: its checkpoint manifest
 * records them (and a bad pair is refused naming the key). */
Test(gpt_worker, llama_rope_scaling_keys_reach_the_checkpoint)
{
	char dir[] = "/tmp/mr-rope-XXXXXX", js[768], cmd[256];
	struct mr_worker_stats st;
	double first, last;

	cr_assert_not_null(mkdtemp(dir));
	snprintf(js, sizeof(js),
		 "{" SMALL ",\"steps\":2,\"arch\":\"llama\",\"n_kv_head\":2,"
		 "\"rope_scaling\":\"llama3\",\"rope_factor\":32,\"rope_original_max_pos\":16,"
		 "\"ckpt_dir\":\"%s\",\"ckpt_every\":2}", dir);
	train(js, 2, &first, &last, &st);
	cr_expect(isfinite(last));
	snprintf(cmd, sizeof(cmd),
		 "grep -rqF '\"rope_scaling_factor\":32' %s && "
		 "grep -rqF '\"rope_original_max_pos\":16' %s", dir, dir);
	cr_expect_eq(system(cmd), 0, "the manifest lacks the rope scaling keys");
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_expect_eq(system(cmd), 0);
	expect_bad("{\"arch\":\"llama\",\"rope_scaling\":\"llama3\","
		   "\"rope_low_freq_factor\":4}", "rope_high_freq_factor");
	expect_bad("{\"arch\":\"llama\",\"n_kv_head\":3}", "n_kv_head");
	expect_bad("{\"arch\":\"mistral\"}", "arch");
}

static void *abort_later(void *w)
{
	struct timespec ts = { 0, 20 * 1000 * 1000 };

	nanosleep(&ts, NULL);
	mr_gpt_worker.abort(w);
	return NULL;
}

Test(gpt_worker, abort_from_another_thread_stops_step)
{
	json_t *c = cfg("{" SMALL ",\"steps\":100000}");
	struct mr_errbuf eb = { "", "" };
	struct mr_worker_stats st;
	pthread_t th;
	void *w;
	int rc, i;

	cr_assert_eq(create(&w, c, &eb), 0, "%s", eb.msg);
	cr_assert_eq(pthread_create(&th, NULL, abort_later, w), 0);
	for (i = 0; i < 100000; i++) {
		rc = mr_gpt_worker.step(w, &st, &eb);
		if (rc < 0)
			break;
	}
	pthread_join(th, NULL);
	cr_expect_eq(rc, MR_EABORTED, "rc %d", rc);
	cr_expect(i < 100000);
	cr_expect_eq(mr_gpt_worker.step(w, &st, &eb), MR_EABORTED, "stays aborted");
	mr_gpt_worker.destroy(w);
	mr_gpt_worker.destroy(NULL);
	json_decref(c);
}

Test(gpt_worker, nonfinite_loss_names_step_and_tensor)
{
	struct mr_gpt_config c = { .vocab = 16, .max_seq = 8, .n_layer = 2, .d_model = 16,
				   .n_head = 2 };
	struct mr_adamw_config oc = { 1e-3f, 0.1f, 0, 10, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f,
					MR_LR_COSINE, 0.0f };
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt m;
	struct mr_step st;
	struct mr_step_result r;
	int in[2 * 8], tg[2 * 8], i;

	for (i = 0; i < 16; i++) {
		in[i] = i % 16;
		tg[i] = (i + 1) % 16;
	}
	cr_assert_eq(mr_gpt_create(&m, &c, 2, 8, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_step_init(&st, &m, &oc, NULL, NULL, 1, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_step_run(&st, in, tg, 1, &r, &eb), 0, "%s", eb.msg);
	m.w.layer[1].fcprojw[3] = NAN;
	cr_expect_eq(mr_step_run(&st, in, tg, 1, &r, &eb), MR_ENONFINITE);
	cr_expect(strstr(eb.msg, "step 1") != NULL, "%s", eb.msg);
	cr_expect(strstr(eb.msg, "h.1.mlp.proj.w") != NULL, "%s", eb.msg);
	/* an out-of-range token is an error naming it, not a crash */
	mr_errbuf_clear(&eb);
	in[5] = 16;
	cr_expect_eq(mr_gpt_forward(&m, in, tg, &eb), MR_ERANGE);
	cr_expect(strstr(eb.msg, "position 5") != NULL, "%s", eb.msg);
	mr_step_release(&st);
	mr_gpt_release(&m);
}

Test(gpt_worker, trains_from_llmc_shards_and_rejects_bad_ones)
{
	static uint16_t tok[20000];
	char js[1024];
	struct mr_worker_stats st;
	struct mr_errbuf eb = { "", "" };
	const char *tr = "/tmp/mr-test-train-shard.bin", *bad = "/tmp/mr-test-bad-shard.bin";
	double first, last;
	json_t *c;
	void *w;
	int i;

	/* a cyclic sequence of period 7: learnable as a bigram */
	for (i = 0; i < 20000; i++)
		tok[i] = (uint16_t)((i * 5) % 7 + 3);
	cr_assert_eq(mr_shard_write(tr, tok, 20000, &eb), 0, "%s", eb.msg);
	snprintf(js, sizeof(js), "{" SMALL ",\"steps\":30,\"train_data\":\"%s\","
		 "\"val_data\":\"%s\",\"eval_every\":30}", tr, tr);
	train(js, 30, &first, &last, &st);
	cr_expect(last < first - 1.5, "loss must fall: %f -> %f", first, last);
	cr_expect(st.val_loss < first - 1.5, "val loss %f", st.val_loss);
	/* token 40 >= vocab_size 32 */
	tok[123] = 40;
	cr_assert_eq(mr_shard_write(bad, tok, 20000, &eb), 0);
	snprintf(js, sizeof(js), "{" SMALL ",\"train_data\":\"%s\"}", bad);
	c = cfg(js);
	cr_expect_eq(create(&w, c, &eb), MR_ERANGE);
	cr_expect(strstr(eb.msg, bad) != NULL && strstr(eb.msg, "index 123") != NULL, "%s",
		  eb.msg);
	json_decref(c);
	unlink(tr);
	unlink(bad);
}
