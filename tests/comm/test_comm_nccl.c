/*
 * test_comm_nccl.c - the NCCL backend: skipped cleanly without NCCL or a
 * CUDA device (this machine), exercised on a GPU machine (make test-gpu).
 *
 * Non-goals: multi-GPU collectives (need >= 2 devices; run by test-gpu).
 */
#include <criterion/criterion.h>

#include "kv_mem.h"
#include "comm/mr_comm.h"

Test(comm_nccl, world1_barrier_or_clean_skip)
{
	struct mr_kv kv;
	struct kv_mem *m = kv_mem_new(&kv);
	struct mr_comm_config cfg = { .backend = "nccl", .id = "nccl1", .rank = 0,
				      .world_size = 1, .kv = &kv, .timeout_ms = 20000 };
	struct mr_comm *c = NULL;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int rc = mr_comm_init(&c, &cfg, &eb);

	if (rc == MR_ENOTSUP) {
		cr_assert_null(c);
		cr_assert(strstr(eb.msg, "nccl") != NULL, "%s", eb.msg);
		kv_mem_free(m);
		cr_skip_test("nccl backend unavailable here: %s", eb.msg);
	}
	cr_assert_eq(rc, 0, "%s", eb.msg);
	cr_assert_str_eq(mr_comm_backend(c), "nccl");
	cr_assert_eq(mr_comm_barrier(c), 0);
	mr_comm_abort(c);
	cr_assert_eq(mr_comm_barrier(c), MR_EABORTED);
	mr_comm_free(c);
	kv_mem_free(m);
}
