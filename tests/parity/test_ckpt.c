/*
 * test_ckpt.c - checkpoints in real jobs (`meshrun local` on loopback):
 * exact resume, resharding to another mesh, and damaged or foreign
 * checkpoints (runtime/ckpt/mr_ckpt.h).
 *
 * Every job saves after every step (keeping them all). Exact resume: the
 * checkpoints after step 3 are removed so that a second run of the same
 * job resumes at step 3 - as if it had been killed right after that save
 * - and trains 4..8. Its
 * loss log (every step's loss, aux loss, grad norm and lr at full
 * precision) and final weights file must equal the uninterrupted run's
 * byte for byte: every mode, the ZeRO shards and the pipeline stages
 * included.
 *
 * Resharding: step 4 of one mesh continues on another; steps 5..8 must
 * equal the run that kept its mesh within the parity bound (loss and
 * grad norm relative 1e-5: only the order of float sums differs), and
 * the weights per tensor within tests/support/parity.h's bound.
 *
 * Damage: a truncated shard, a flipped byte, a manifest missing a record:
 * the job logs the file and the reason, resumes from the previous
 * checkpoint and still ends equal to the uninterrupted run. Nothing
 * loadable, or a checkpoint of another model: the job fails before any
 * step, naming the reason or the field.
 */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/mr_weights.h"
#include "mr_gpt_worker.h"
#include "ckjob.h"
#include "parity.h"
#include "proc.h"

#define STEPS 8

/* Every step saved and kept, in `ckdir`. */
static int run(const struct mr_ckjob *j, const char *tag, const char *ckdir)
{
	char keys[256];

	snprintf(keys, sizeof(keys),
		 "\"comm_timeout_ms\": 30000, \"ckpt_dir\": \"%s\", \"ckpt_every\": 1, "
		 "\"ckpt_keep\": %d", ckdir, STEPS);
	return mr_ckjob_run(j, tag, STEPS, keys);
}

/* The steps 1..STEPS of <scratch>/<tag>.loss: loss and grad norm. */
static void read_losses(const char *tag, double *loss, double *norm)
{
	char path[512], head[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.loss", mr_ckjob_dir(), tag);
	f = fopen(path, "r");
	cr_assert_not_null(f, "no loss log %s", path);
	cr_assert(fgets(head, sizeof(head), f) && !strcmp(head, MR_LOSS_LOG_HEADER "\n"),
		  "%s: no header line", path);
	for (int i = 0; i < STEPS; i++) {
		long long step;
		cr_assert_eq(fscanf(f, "%lld %lf %*g %lf %*g %*s", &step, &loss[i], &norm[i]), 3,
			     "%s: line %d unreadable", path, i + 2);
		cr_assert_eq(step, i + 1, "%s: line %d is step %lld", path, i + 1, step);
	}
	fclose(f);
}

/* The full run ("full", checkpoints in ck) and the run resumed at step 3
 * after the later checkpoints are gone ("again"): equal byte for byte. */
static void exact_resume(const struct mr_ckjob *j)
{
	cr_assert_eq(run(j, "full", "ck"), 0, "%s", mr_ckjob_tail("full"));
	/* the log as the killed run would have left it: the resume trims it */
	mr_ckjob_sh("test -d ck/step-00000008 && rm -r ck/step-0000000[4-8] && cp full.loss again.loss%s",
	   "");
	cr_assert_eq(run(j, "again", "ck"), 0, "%s", mr_ckjob_tail("again"));
	cr_expect(mr_ckjob_count("again", "checkpoint_resumed", "step=3"), "no resume at step 3:\n%s",
		  mr_ckjob_tail("again"));
	cr_expect(mr_ckjob_same("full.loss", "again.loss"), "the resumed run's losses differ");
	cr_expect(mr_ckjob_same("full.bin", "again.bin"), "the resumed run's weights differ");
}

Test(ckpt, resume_dp2_is_exact) { exact_resume(&(struct mr_ckjob){ 1, 2, "", NULL }); }
Test(ckpt, resume_tp2_dp2_zero2_is_exact)
{
	exact_resume(&(struct mr_ckjob){ 2, 2, "--tp 2 --sequence-parallel", "\"zero\": 2" });
}
Test(ckpt, resume_pp2_tp2_zero1_is_exact)
{
	exact_resume(&(struct mr_ckjob){ 1, 4, "--tp 2 --pp 2",
				    "\"zero\": 1, \"grad_accum\": 4, \"pp_schedule\": \"1f1b\"" });
}
Test(ckpt, resume_cp2_ep2_moe_zero3_is_exact)
{
	exact_resume(&(struct mr_ckjob){ 2, 2, "--cp 2 --ep 2",
				    "\"zero\": 3, \"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, "
				    "\"moe_policy\": \"dropless\"" });
}

/* Step 4 of `from` continued on `to`: steps 5..8 against from's own. */
static void reshard(const struct mr_ckjob *from, const struct mr_ckjob *to)
{
	double la[STEPS], na[STEPS], lb[STEPS], nb[STEPS];
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config c;
	struct mr_gpt a, b;
	char path[512], why[192];
	int s, i;

	cr_assert_eq(run(from, "from", "ck"), 0, "%s", mr_ckjob_tail("from"));
	mr_ckjob_sh("mkdir ck2 && cp -r ck/step-00000004 ck2/ && cp from.loss to.loss%s", "");
	cr_assert_eq(run(to, "to", "ck2"), 0, "%s", mr_ckjob_tail("to"));
	cr_expect(mr_ckjob_count("to", "checkpoint_resumed", "step=4"), "no resume at step 4:\n%s",
		  mr_ckjob_tail("to"));
	read_losses("from", la, na);
	read_losses("to", lb, nb);
	for (s = 4; s < STEPS; s++) {
		cr_expect(fabs(lb[s] - la[s]) <= 1e-5 * fabs(la[s]), "step %d: loss %.9g vs %.9g",
			  s + 1, lb[s], la[s]);
		cr_expect(fabs(nb[s] - na[s]) <= 1e-5 * fabs(na[s]),
			  "step %d: grad norm %.9g vs %.9g", s + 1, nb[s], na[s]);
	}
	snprintf(path, sizeof(path), "%s/from.bin", mr_ckjob_dir());
	cr_assert_eq(mr_weights_read_config(path, &c, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(&a, &c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(&b, &c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_weights_load(&a, path, &eb), 0, "%s", eb.msg);
	snprintf(path, sizeof(path), "%s/to.bin", mr_ckjob_dir());
	cr_assert_eq(mr_weights_load(&b, path, &eb), 0, "%s", eb.msg);
	for (i = 0; i < a.ntensors; i++) {
		const struct mr_gpt_tensor *t = &a.tensors[i];
		cr_expect(!mr_parity_tensor(t, b.params + t->off, a.params + t->off,
					    MR_PARITY_WEIGHT_TOL, why, sizeof(why)),
			  "%s", why);
	}
	mr_gpt_release(&a);
	mr_gpt_release(&b);
}

Test(ckpt, reshard_tp2_pp2_dp2_zero3_to_pp4_dp2_zero1, .timeout = 600)
{
	reshard(&(struct mr_ckjob){ 2, 4, "--tp 2 --pp 2",
			       "\"zero\": 3, \"grad_accum\": 4, \"pp_schedule\": \"1f1b\"" },
		&(struct mr_ckjob){ 2, 4, "--pp 4",
			       "\"zero\": 1, \"grad_accum\": 4, \"pp_schedule\": \"1f1b\"" });
}

Test(ckpt, reshard_dp4_to_dp2_keeps_the_global_batch)
{
	/* dp4 x 1 micro-batch = dp2 x 2: the same rows every step */
	reshard(&(struct mr_ckjob){ 2, 2, "", "\"zero\": 1" },
		&(struct mr_ckjob){ 1, 2, "", "\"zero\": 3, \"grad_accum\": 2" });
}

Test(ckpt, reshard_dp1_to_dp2_splits_the_micro_batch)
{
	/* one micro-batch of 2 rows a step = dp2 x one micro-batch of 1 row */
	reshard(&(struct mr_ckjob){ 1, 1, "", NULL }, &(struct mr_ckjob){ 1, 2, "", NULL });
	cr_expect(mr_ckjob_count("to", "elastic_batch", "batch_size=1"), "%s",
		  mr_ckjob_tail("to"));
}

Test(ckpt, reshard_ep2_tp2_to_ep1_tp1)
{
	static const char *moe = "\"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, "
				 "\"moe_policy\": \"dropless\"";
	char from[256], to[256];

	snprintf(from, sizeof(from), "%s, \"zero\": 1", moe);
	snprintf(to, sizeof(to), "%s, \"grad_accum\": 2", moe);
	reshard(&(struct mr_ckjob){ 1, 4, "--tp 2 --ep 2", from }, &(struct mr_ckjob){ 1, 1, "", to });
}

/* Replicated key/value heads (2 over tp4: pairs of ranks share one, and
 * one of each pair writes it) continue at tp2 (split heads) and tp1, and
 * back; MQA (one head, held whole by every rank) from tp2 to tp4. */
#define LLAMA_KV2 "\"arch\": \"llama\", \"ffn_hidden\": 64, \"n_kv_head\": 2"
#define LLAMA_MQA "\"arch\": \"llama\", \"ffn_hidden\": 64, \"n_kv_head\": 1"
Test(ckpt, reshard_llama_tp4_kv_replicated_to_tp1)
{
	reshard(&(struct mr_ckjob){ 1, 4, "--tp 4 --sequence-parallel", LLAMA_KV2 ", \"zero\": 1" },
		&(struct mr_ckjob){ 1, 1, "", LLAMA_KV2 });
}
Test(ckpt, reshard_llama_tp4_kv_replicated_to_tp2)
{
	reshard(&(struct mr_ckjob){ 1, 4, "--tp 4", LLAMA_KV2 },
		&(struct mr_ckjob){ 1, 2, "--tp 2 --sequence-parallel", LLAMA_KV2 });
}
Test(ckpt, reshard_llama_tp1_to_tp4_kv_replicated)
{
	reshard(&(struct mr_ckjob){ 1, 1, "", LLAMA_KV2 },
		&(struct mr_ckjob){ 1, 4, "--tp 4 --sequence-parallel", LLAMA_KV2 });
}
Test(ckpt, reshard_llama_mqa_tp2_to_tp4)
{
	reshard(&(struct mr_ckjob){ 1, 2, "--tp 2", LLAMA_MQA },
		&(struct mr_ckjob){ 1, 4, "--tp 4", LLAMA_MQA });
}

/* The full run; of its checkpoints 1, 2, 3 and 6 are kept and `damage`
 * is applied to step 6: the run again skips it (logging `names`), resumes
 * at step 3 and ends equal to the full run. */
static void damaged(const char *damage, const char *names)
{
	struct mr_ckjob j = { 1, 2, "", "\"zero\": 1" };

	cr_assert_eq(run(&j, "full", "ck"), 0, "%s", mr_ckjob_tail("full"));
	mr_ckjob_sh("rm -r ck/step-0000000[4578] && cp full.loss again.loss%s", "");
	mr_ckjob_sh(damage, "ck/step-00000006");
	cr_assert_eq(run(&j, "again", "ck"), 0, "%s", mr_ckjob_tail("again"));
	cr_expect(mr_ckjob_count("again", "checkpoint_skipped", names), "no skip naming '%s':\n%s",
		  names, mr_ckjob_tail("again"));
	cr_expect(mr_ckjob_count("again", "checkpoint_resumed", "step=3"), "no resume at step 3:\n%s",
		  mr_ckjob_tail("again"));
	cr_expect(mr_ckjob_same("full.loss", "again.loss"), "the resumed run's losses differ");
	cr_expect(mr_ckjob_same("full.bin", "again.bin"), "the resumed run's weights differ");
}

Test(ckpt, truncated_shard_falls_back_to_the_previous)
{
	damaged("truncate -s -4 %s/rank-00000.bin", "rank-00000.bin");
}

Test(ckpt, flipped_byte_falls_back_to_the_previous)
{
	/* one byte of the first record's data */
	damaged("printf '\\377' | dd of=%s/rank-00000.bin bs=1 seek=200 conv=notrunc 2>/dev/null",
		"checksum mismatch");
}

/* Runs python3 tests/support/manifest_edit.py [--unsealed] on the step
 * directory damaged() passes, with code editing the manifest `m`. */
static void edit_manifest(int sealed, const char *code, const char *names)
{
	static char tool[PATH_MAX];
	char cmd[6000];

	if (!tool[0])
		cr_assert_not_null(realpath("tests/support/manifest_edit.py", tool));
	snprintf(cmd, sizeof(cmd), "python3 '%s' %s %%s \"%s\"", tool,
		 sealed ? "" : "--unsealed", code);
	damaged(cmd, names);
}

Test(ckpt, manifest_missing_a_record_falls_back_to_the_previous)
{
	/* the first shard's first record dropped from the manifest */
	edit_manifest(1, "m['shards'][0]['records'].pop(0)", "exactly once");
}

Test(ckpt, manifest_with_overlapping_records_falls_back_to_the_previous)
{
	/* wpe's parameters as its first half twice (from the record's two
	 * halves of bytes): the right count, not every element */
	edit_manifest(1, "t=[x['name'] for x in m['tensors']].index('wpe'); "
		      "rs=[s['records'] for s in m['shards'] if any(r[0]==t for r in "
		      "s['records'])][0]; "
		      "i=[k for k,r in enumerate(rs) if r[0]==t and r[1]==0][0]; r=rs[i]; "
		      "h=r[7]//2; rs[i:i+1]=[r[:7]+[h]+r[8:], r[:7]+[h,r[8]+4*h]+r[9:]]",
		      "exactly once");
}

Test(ckpt, records_sharing_bytes_of_a_shard_fall_back_to_the_previous)
{
	/* record 1 given record 0's offset and CRC: every slice still
	 * covered once, but AdamW's m would be read from the parameters */
	edit_manifest(1, "r=m['shards'][0]['records']; r[1][8]=r[0][8]; r[1][9]=r[0][9]",
		      "overlap");
}

Test(ckpt, flipped_bit_in_the_manifest_falls_back_to_the_previous)
{
	/* "n_layer":4 -> "n_layer":5 is one bit: a damaged manifest, not
	 * another model */
	damaged("sed -i 's/\"n_layer\":4/\"n_layer\":5/' %s/manifest.json",
		"checksum mismatch");
}

Test(ckpt, config_checksum_not_matching_the_model_falls_back_to_the_previous)
{
	edit_manifest(1, "m['config_crc32c']=1", "config_crc32c");
}

Test(ckpt, nothing_loadable_fails_the_job_naming_why)
{
	struct mr_ckjob j = { 1, 2, "", NULL };

	cr_assert_eq(run(&j, "full", "ck"), 0, "%s", mr_ckjob_tail("full"));
	mr_ckjob_sh("for d in ck/step-*; do rm $d/rank-00000.bin; done%s", "");
	cr_expect_neq(run(&j, "again", "ck"), 0, "the job must fail");
	cr_expect(mr_ckjob_count("again", "no loadable checkpoint", "rank-00000.bin"),
		  "no message naming the missing shard:\n%s", mr_ckjob_tail("again"));
	cr_expect(!mr_ckjob_exists("again.loss"), "a step was trained");
}

Test(ckpt, another_model_is_refused_naming_the_field)
{
	struct mr_ckjob a = { 1, 2, "--tp 2", NULL };
	char cmd[4096], *bin = realpath(mr_proc_build_dir(), NULL);
	int rc;

	cr_assert_eq(run(&a, "full", "ck"), 0, "%s", mr_ckjob_tail("full"));
	/* the same job but three layers */
	snprintf(cmd, sizeof(cmd),
		 "cd '%s' && timeout 300 '%s/meshrun' local --nodes 1 --nproc-per-node 2 "
		 "--workload-config '{\"n_layer\": 3, \"d_model\": 32, \"n_head\": 4, "
		 "\"vocab_size\": 64, \"seq_len\": 16, \"batch_size\": 2, \"steps\": 8, "
		 "\"threads\": 1, \"loss_log\": \"again.loss\", \"ckpt_dir\": \"ck\"}' "
		 ">again.out 2>&1",
		 mr_ckjob_dir(), bin ? bin : "build");
	free(bin);
	rc = system(cmd);
	cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "the job must fail as a config error");
	cr_expect(mr_ckjob_count("again", "another model", "n_layer"), "no message naming n_layer:\n%s",
		  mr_ckjob_tail("again"));
	/* refused before launch (a fixed-size job's resume is checked first) */
	cr_expect(!mr_ckjob_count("again", "controller on", "job"), "a job was started:\n%s",
		  mr_ckjob_tail("again"));
	cr_expect(!mr_ckjob_exists("again.loss"), "a step was trained");
}
