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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/mr_weights.h"
#include "parity.h"
#include "proc.h"

#define STEPS 8

static char tmp[256];

static void scratch(void)
{
	const char *d = mr_test_scratch("mr-ckpt");

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
}

/* A job's shape: ranks and mesh flags, and its workload keys beyond the
 * common ones. */
struct job {
	int nodes, nproc;
	const char *flags; /* e.g. "--tp 2 --pp 2" */
	const char *keys;  /* e.g. "\"zero\": 1" */
};

/* Runs job with outputs tag.loss, tag.bin, tag.out in tmp and the
 * checkpoints in tmp/<ckdir>; the exit code. */
static int run(const struct job *j, const char *tag, const char *ckdir)
{
	char cmd[4096], *bin = realpath(mr_proc_build_dir(), NULL);
	int st;

	snprintf(cmd, sizeof(cmd),
		 "cd '%s' && timeout 300 '%s/meshrun' local --nodes %d --nproc-per-node %d %s "
		 "--workload-config '{\"n_layer\": 4, \"d_model\": 32, \"n_head\": 4, "
		 "\"vocab_size\": 64, \"seq_len\": 16, \"batch_size\": 2, \"steps\": %d, "
		 "\"lr\": 0.003, \"warmup_steps\": 2, \"threads\": 1, \"seed\": 7, "
		 "\"comm_timeout_ms\": 30000, \"loss_log\": \"%s.loss\", \"save_weights\": "
		 "\"%s.bin\", \"ckpt_dir\": \"%s\", \"ckpt_every\": 1, \"ckpt_keep\": %d%s%s}' "
		 ">'%s.out' 2>&1",
		 tmp, bin ? bin : "build", j->nodes, j->nproc, j->flags, STEPS, tag, tag, ckdir,
		 STEPS, j->keys ? ", " : "", j->keys ? j->keys : "", tag);
	free(bin);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *tail_of(const char *tag)
{
	static char buf[3000];
	char path[512];

	snprintf(path, sizeof(path), "%s/%s.out", tmp, tag);
	mr_test_tail(path, buf, sizeof(buf));
	return buf;
}

/* Whether tmp/<tag>.out has a line containing every one of a, b. */
static int logged(const char *tag, const char *a, const char *b)
{
	char path[512], *line = NULL;
	size_t cap = 0;
	FILE *f;
	int found = 0;

	snprintf(path, sizeof(path), "%s/%s.out", tmp, tag);
	if (!(f = fopen(path, "r")))
		return 0;
	while (!found && getline(&line, &cap, f) > 0)
		found = strstr(line, a) && (!b || strstr(line, b));
	free(line);
	fclose(f);
	return found;
}

static int exists(const char *name)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", tmp, name);
	return access(path, F_OK) == 0;
}

static int same_file(const char *a, const char *b)
{
	char cmd[1200];

	snprintf(cmd, sizeof(cmd), "cmp -s '%s/%s' '%s/%s'", tmp, a, tmp, b);
	return system(cmd) == 0;
}

static void sh(const char *fmt, const char *arg)
{
	char cmd[1200], c2[1600];

	snprintf(cmd, sizeof(cmd), fmt, arg);
	snprintf(c2, sizeof(c2), "cd '%s' && %s", tmp, cmd);
	cr_assert_eq(system(c2), 0, "%s", c2);
}

/* The steps 1..STEPS of tmp/<tag>.loss: loss and grad norm. */
static void read_losses(const char *tag, double *loss, double *norm)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.loss", tmp, tag);
	f = fopen(path, "r");
	cr_assert_not_null(f, "no loss log %s", path);
	for (int i = 0; i < STEPS; i++) {
		long long step;
		cr_assert_eq(fscanf(f, "%lld %lf %*g %lf %*g", &step, &loss[i], &norm[i]), 3,
			     "%s: line %d unreadable", path, i + 1);
		cr_assert_eq(step, i + 1, "%s: line %d is step %lld", path, i + 1, step);
	}
	fclose(f);
}

/* The full run ("full", checkpoints in ck) and the run resumed at step 3
 * after the later checkpoints are gone ("again"): equal byte for byte. */
static void exact_resume(const struct job *j)
{
	scratch();
	cr_assert_eq(run(j, "full", "ck"), 0, "%s", tail_of("full"));
	/* the log as the killed run would have left it: the resume trims it */
	sh("test -d ck/step-00000008 && rm -r ck/step-0000000[4-8] && cp full.loss again.loss%s",
	   "");
	cr_assert_eq(run(j, "again", "ck"), 0, "%s", tail_of("again"));
	cr_expect(logged("again", "checkpoint_resumed", "step=3"), "no resume at step 3:\n%s",
		  tail_of("again"));
	cr_expect(same_file("full.loss", "again.loss"), "the resumed run's losses differ");
	cr_expect(same_file("full.bin", "again.bin"), "the resumed run's weights differ");
}

Test(ckpt, resume_dp2_is_exact) { exact_resume(&(struct job){ 1, 2, "", NULL }); }
Test(ckpt, resume_tp2_dp2_zero2_is_exact)
{
	exact_resume(&(struct job){ 2, 2, "--tp 2 --sequence-parallel", "\"zero\": 2" });
}
Test(ckpt, resume_pp2_tp2_zero1_is_exact)
{
	exact_resume(&(struct job){ 1, 4, "--tp 2 --pp 2",
				    "\"zero\": 1, \"grad_accum\": 4, \"pp_schedule\": \"1f1b\"" });
}
Test(ckpt, resume_cp2_ep2_moe_zero3_is_exact)
{
	exact_resume(&(struct job){ 2, 2, "--cp 2 --ep 2",
				    "\"zero\": 3, \"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, "
				    "\"moe_policy\": \"dropless\"" });
}

/* Step 4 of `from` continued on `to`: steps 5..8 against from's own. */
static void reshard(const struct job *from, const struct job *to)
{
	double la[STEPS], na[STEPS], lb[STEPS], nb[STEPS];
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config c;
	struct mr_gpt a, b;
	char path[512], why[192];
	int s, i;

	scratch();
	cr_assert_eq(run(from, "from", "ck"), 0, "%s", tail_of("from"));
	sh("mkdir ck2 && cp -r ck/step-00000004 ck2/ && cp from.loss to.loss%s", "");
	cr_assert_eq(run(to, "to", "ck2"), 0, "%s", tail_of("to"));
	cr_expect(logged("to", "checkpoint_resumed", "step=4"), "no resume at step 4:\n%s",
		  tail_of("to"));
	read_losses("from", la, na);
	read_losses("to", lb, nb);
	for (s = 4; s < STEPS; s++) {
		cr_expect(fabs(lb[s] - la[s]) <= 1e-5 * fabs(la[s]), "step %d: loss %.9g vs %.9g",
			  s + 1, lb[s], la[s]);
		cr_expect(fabs(nb[s] - na[s]) <= 1e-5 * fabs(na[s]),
			  "step %d: grad norm %.9g vs %.9g", s + 1, nb[s], na[s]);
	}
	snprintf(path, sizeof(path), "%s/from.bin", tmp);
	cr_assert_eq(mr_weights_read_config(path, &c, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(&a, &c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(&b, &c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_weights_load(&a, path, &eb), 0, "%s", eb.msg);
	snprintf(path, sizeof(path), "%s/to.bin", tmp);
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
	reshard(&(struct job){ 2, 4, "--tp 2 --pp 2",
			       "\"zero\": 3, \"grad_accum\": 4, \"pp_schedule\": \"1f1b\"" },
		&(struct job){ 2, 4, "--pp 4",
			       "\"zero\": 1, \"grad_accum\": 4, \"pp_schedule\": \"1f1b\"" });
}

Test(ckpt, reshard_dp4_to_dp2_keeps_the_global_batch)
{
	/* dp4 x 1 micro-batch = dp2 x 2: the same rows every step */
	reshard(&(struct job){ 2, 2, "", "\"zero\": 1" },
		&(struct job){ 1, 2, "", "\"zero\": 3, \"grad_accum\": 2" });
}

Test(ckpt, reshard_ep2_tp2_to_ep1_tp1)
{
	static const char *moe = "\"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, "
				 "\"moe_policy\": \"dropless\"";
	char from[256], to[256];

	snprintf(from, sizeof(from), "%s, \"zero\": 1", moe);
	snprintf(to, sizeof(to), "%s, \"grad_accum\": 2", moe);
	reshard(&(struct job){ 1, 4, "--tp 2 --ep 2", from }, &(struct job){ 1, 1, "", to });
}

/* The full run; of its checkpoints 1, 2, 3 and 6 are kept and `damage`
 * is applied to step 6: the run again skips it (logging `names`), resumes
 * at step 3 and ends equal to the full run. */
static void damaged(const char *damage, const char *names)
{
	struct job j = { 1, 2, "", "\"zero\": 1" };

	scratch();
	cr_assert_eq(run(&j, "full", "ck"), 0, "%s", tail_of("full"));
	sh("rm -r ck/step-0000000[4578] && cp full.loss again.loss%s", "");
	sh(damage, "ck/step-00000006");
	cr_assert_eq(run(&j, "again", "ck"), 0, "%s", tail_of("again"));
	cr_expect(logged("again", "checkpoint_skipped", names), "no skip naming '%s':\n%s",
		  names, tail_of("again"));
	cr_expect(logged("again", "checkpoint_resumed", "step=3"), "no resume at step 3:\n%s",
		  tail_of("again"));
	cr_expect(same_file("full.loss", "again.loss"), "the resumed run's losses differ");
	cr_expect(same_file("full.bin", "again.bin"), "the resumed run's weights differ");
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

Test(ckpt, manifest_missing_a_record_falls_back_to_the_previous)
{
	/* the first shard's first record dropped from the manifest */
	damaged("python3 -c \"import json,sys; p=sys.argv[1]+'/manifest.json'; "
		"m=json.load(open(p)); m['shards'][0]['records'].pop(0); "
		"json.dump(m, open(p,'w'))\" %s",
		"exactly once");
}

Test(ckpt, manifest_with_overlapping_records_falls_back_to_the_previous)
{
	/* wpe's parameters as its first half twice: the right count, not
	 * every element */
	damaged("python3 -c \"import json,sys; p=sys.argv[1]+'/manifest.json'; "
		"m=json.load(open(p)); t=[x['name'] for x in m['tensors']].index('wpe'); "
		"rs=[s['records'] for s in m['shards'] if any(r[0]==t for r in s['records'])][0]; "
		"i=[k for k,r in enumerate(rs) if r[0]==t and r[1]==0][0]; r=rs[i]; h=r[7]//2; "
		"rs[i:i+1]=[r[:7]+[h]+r[8:], r[:7]+[h]+r[8:]]; "
		"json.dump(m, open(p,'w'))\" %s",
		"exactly once");
}

Test(ckpt, nothing_loadable_fails_the_job_naming_why)
{
	struct job j = { 1, 2, "", NULL };

	scratch();
	cr_assert_eq(run(&j, "full", "ck"), 0, "%s", tail_of("full"));
	sh("for d in ck/step-*; do rm $d/rank-00000.bin; done%s", "");
	cr_expect_neq(run(&j, "again", "ck"), 0, "the job must fail");
	cr_expect(logged("again", "no loadable checkpoint", "rank-00000.bin"),
		  "no message naming the missing shard:\n%s", tail_of("again"));
	cr_expect(!exists("again.loss"), "a step was trained");
}

Test(ckpt, another_model_is_refused_naming_the_field)
{
	struct job a = { 1, 2, "--tp 2", NULL };
	char cmd[4096], *bin = realpath(mr_proc_build_dir(), NULL);

	scratch();
	cr_assert_eq(run(&a, "full", "ck"), 0, "%s", tail_of("full"));
	/* the same job but three layers */
	snprintf(cmd, sizeof(cmd),
		 "cd '%s' && timeout 300 '%s/meshrun' local --nodes 1 --nproc-per-node 2 "
		 "--workload-config '{\"n_layer\": 3, \"d_model\": 32, \"n_head\": 4, "
		 "\"vocab_size\": 64, \"seq_len\": 16, \"batch_size\": 2, \"steps\": 8, "
		 "\"threads\": 1, \"loss_log\": \"again.loss\", \"ckpt_dir\": \"ck\"}' "
		 ">again.out 2>&1",
		 tmp, bin ? bin : "build");
	free(bin);
	cr_expect_neq(system(cmd), 0, "the job must fail");
	cr_expect(logged("again", "another model", "n_layer"), "no message naming n_layer:\n%s",
		  tail_of("again"));
	cr_expect(logged("again", "worker_failed", "MR_EINVAL"), "not a config error:\n%s",
		  tail_of("again"));
	cr_expect(!exists("again.loss"), "a step was trained");
}
