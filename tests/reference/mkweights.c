/*
 * mkweights.c - writes a freshly initialised meshrun weights file for
 * gen_reference.py (built and run by `make reference`, not a test).
 *
 *   mkweights OUT SEED VOCAB MAXT L C NH MOE_EVERY E TOPK CAPF AUXCOEF
 *
 * Non-goals: anything but that one file.
 */
#include <stdio.h>
#include <stdlib.h>

#include "model/mr_gpt.h"
#include "model/mr_weights.h"

int main(int argc, char **argv)
{
	struct mr_gpt_config c;
	struct mr_gpt m;
	struct mr_errbuf eb = { "", "" };
	int rc;

	if (argc != 13) {
		fprintf(stderr, "usage: mkweights OUT SEED VOCAB MAXT L C NH MOE_EVERY E TOPK "
				"CAPF AUXCOEF\n");
		return 2;
	}
	c.vocab = atoi(argv[3]);
	c.max_seq = atoi(argv[4]);
	c.n_layer = atoi(argv[5]);
	c.d_model = atoi(argv[6]);
	c.n_head = atoi(argv[7]);
	c.moe_every = atoi(argv[8]);
	c.n_experts = atoi(argv[9]);
	c.top_k = atoi(argv[10]);
	c.capacity_factor = strtof(argv[11], NULL);
	c.aux_coef = strtof(argv[12], NULL);
	rc = mr_gpt_create(&m, &c, 1, 1, NULL, &eb);
	if (rc < 0) {
		fprintf(stderr, "mkweights: %s\n", eb.msg);
		return 1;
	}
	mr_gpt_init_params(&m, strtoull(argv[2], NULL, 10));
	rc = mr_weights_write(&m, argv[1], &eb);
	mr_gpt_release(&m);
	if (rc < 0) {
		fprintf(stderr, "mkweights: %s\n", eb.msg);
		return 1;
	}
	return 0;
}
