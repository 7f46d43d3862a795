/*
 * test_layers.c - attaching the parallel layers (layers/mr_layers.h):
 * every missing group refused naming its key, with nothing left held,
 * and the MoE exchange wired to tp as the blocks expect.
 *
 * The layers' arithmetic, through the model, is test_tp.c's, test_cp.c's
 * and test_ep.c's: they would fail if cp or ep were wired wrong.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "layers/mr_layers.h"

static const struct mr_layers_shape shape = { .B = 2, .T = 16, .C = 32, .V = 64, .n_head = 4,
					      .n_kv_head = 2, .n_experts = 4 };

/* attach at place p must fail naming key; L comes back zeroed */
static void refused(struct mr_place *p, const char *key)
{
	struct mr_dev dev;
	struct mr_mem mem;
	struct mr_layers L;
	struct mr_errbuf eb = { "", "" };
	struct mr_layers zero;

	cr_assert_eq(mr_dev_open(&dev, "cpu", 0, NULL, NULL, &eb), 0, "%s", eb.msg);
	memset(&mem, 0, sizeof(mem));
	memset(&zero, 0, sizeof(zero));
	memset(&L, 0xff, sizeof(L));
	cr_assert_eq(mr_layers_attach(&L, p, &dev, &mem, &shape, &eb), MR_EINVAL, "%s", key);
	cr_assert_str_eq(eb.field, key, "%s", eb.msg);
	cr_assert(strstr(eb.msg, key), "the message names '%s': %s", key, eb.msg);
	cr_assert(memcmp(&L, &zero, sizeof(L)) == 0, "nothing held after refusing %s", key);
	mr_dev_close(&dev);
}

Test(layers, a_degree_without_its_group_is_refused_naming_the_key)
{
	static const enum mr_axis axes[] = { MR_AXIS_TP, MR_AXIS_CP, MR_AXIS_EP };
	static const char *const keys[] = { "tp", "cp", "ep" };

	for (int i = 0; i < 3; i++) {
		struct mr_place p;

		mr_place_one(&p);
		p.size[axes[i]] = 2;
		refused(&p, keys[i]);
	}
}

Test(layers, replicated_key_value_heads_without_their_group_are_refused)
{
	struct mr_place p;

	/* tp 4 over 2 key/value heads: two ranks share each head */
	mr_place_tp(&p, 4, 1, (struct mr_comm *)&p, 0);
	refused(&p, "n_kv_head");
}

Test(layers, tp_sums_the_routers_input_gradient_and_rank_0_alone_adds_it)
{
	struct mr_dev dev;
	struct mr_mem mem;
	struct mr_errbuf eb = { "", "" };

	cr_assert_eq(mr_dev_open(&dev, "cpu", 0, NULL, NULL, &eb), 0, "%s", eb.msg);
	memset(&mem, 0, sizeof(mem));
	for (int r = 0; r < 2; r++) {
		struct mr_place p;
		struct mr_layers L;

		/* the communicator is not called while attaching: any pointer */
		mr_place_tp(&p, 2, r, (struct mr_comm *)&p, 1);
		cr_assert_eq(mr_layers_attach(&L, &p, &dev, &mem, &shape, &eb), 0, "%s", eb.msg);
		cr_assert_eq(L.tp.size, 2);
		cr_assert_eq(L.tp.rank, r);
		cr_assert_eq(L.tp.sp, 1);
		cr_assert_eq(L.tp.T, shape.T);
		cr_assert_eq(L.xchg.reduce, mr_tp_moe_reduce);
		cr_assert_eq(L.xchg.reduce_ctx, &L.tp);
		cr_assert_eq(L.xchg.router_dx_off, r != 0);
		cr_assert_null(L.xchg.fn, "no expert parallel: the exchange is the identity");
		cr_assert_null(L.xchg.count_reduce);
		cr_assert_null(L.tp.kv, "2 heads over tp 2 split, none shared");
		mr_layers_release(&L);
	}
	mr_dev_close(&dev);
}
