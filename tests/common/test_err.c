/*
 * test_err.c - the error table and error buffers (common/err.c).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "mr_err.h"

struct row {
	int value;
	const char *name;
	const char *msg;
};

static const struct row rows[] = {
#define ROW(name, value, msg) {value, "MR_E" #name, msg},
	MR_ERR_TABLE(ROW)
#undef ROW
};
#define NROWS (sizeof(rows) / sizeof(rows[0]))

Test(err, every_code_has_a_unique_name_and_a_message)
{
	cr_assert_gt(NROWS, 20);
	for (size_t i = 0; i < NROWS; i++) {
		const char *name = mr_err_name(rows[i].value);
		const char *msg = mr_strerror(rows[i].value);

		cr_assert_str_eq(name, rows[i].name);
		cr_assert_str_eq(msg, rows[i].msg);
		cr_assert_gt(strlen(msg), 0);
		/* messages for people: lowercase start, no full stop */
		cr_assert(msg[0] >= 'a' && msg[0] <= 'z', "%s", msg);
		cr_assert_neq(msg[strlen(msg) - 1], '.', "%s", msg);
		cr_assert_str_neq(msg, "unknown error");
		/* append-only numbering: 0, -1, -2, ... without gaps */
		cr_assert_eq(rows[i].value, -(int)i, "%s", name);
		for (size_t j = 0; j < i; j++) {
			cr_assert_str_neq(rows[j].name, name);
			cr_assert_neq(rows[j].value, rows[i].value);
		}
	}
	cr_assert_eq(MR_EOK, 0);
	cr_assert_str_eq(mr_err_name(MR_ETIMEDOUT), "MR_ETIMEDOUT");
	cr_assert_str_eq(mr_strerror(MR_ENOMEM), "out of memory");
}

Test(err, unknown_codes)
{
	cr_assert_str_eq(mr_strerror(1), "unknown error");
	cr_assert_str_eq(mr_strerror(-(int)NROWS), "unknown error");
	cr_assert_str_eq(mr_strerror(-100000), "unknown error");
	cr_assert_str_eq(mr_err_name(7), "MR_EUNKNOWN");
	cr_assert_str_eq(mr_err_name(-(int)NROWS), "MR_EUNKNOWN");
}

Test(err, first_message_wins)
{
	struct mr_errbuf eb = {{0}, {0}};

	cr_assert_eq(mr_errf(&eb, MR_EIO, "unable to open '%s'", "a.json"), MR_EIO);
	cr_assert_eq(mr_errf(&eb, MR_EINVAL, "later %d", 2), MR_EINVAL, "code passes through");
	cr_assert_str_eq(eb.msg, "unable to open 'a.json'");
	cr_assert_str_eq(eb.field, "");
	cr_assert_eq(mr_errf_field(&eb, MR_EPARSE, "port", "x"), MR_EPARSE);
	cr_assert_str_eq(eb.msg, "unable to open 'a.json'");
	cr_assert_str_eq(eb.field, "", "a later field does not attach to the first message");
	/* NULL buffers are fine */
	cr_assert_eq(mr_errf(NULL, MR_ERANGE, "x"), MR_ERANGE);
	cr_assert_eq(mr_errf_field(NULL, MR_ERANGE, "f", "x"), MR_ERANGE);
}

Test(err, field_is_recorded)
{
	struct mr_errbuf eb = {{0}, {0}};
	char longfield[300];

	cr_assert_eq(mr_errf_field(&eb, MR_EINVAL, "min_nodes", "'%s' must be at least %d", "min_nodes",
				   1),
		     MR_EINVAL);
	cr_assert_str_eq(eb.field, "min_nodes");
	cr_assert_str_eq(eb.msg, "'min_nodes' must be at least 1");
	mr_errbuf_clear(&eb);
	cr_assert_str_eq(eb.msg, "");
	cr_assert_str_eq(eb.field, "");
	/* after clear, a new message may be set; NULL field becomes "" */
	mr_errf_field(&eb, MR_EINVAL, NULL, "second");
	cr_assert_str_eq(eb.msg, "second");
	cr_assert_str_eq(eb.field, "");
	mr_errbuf_clear(&eb);
	/* a stale field never survives into a plain mr_errf message */
	strcpy(eb.field, "stale");
	mr_errf(&eb, MR_EIO, "plain");
	cr_assert_str_eq(eb.field, "");
	mr_errbuf_clear(&eb);
	/* bounded: long fields and messages are cut, NUL-terminated */
	memset(longfield, 'f', sizeof(longfield) - 1);
	longfield[sizeof(longfield) - 1] = '\0';
	mr_errf_field(&eb, MR_EINVAL, longfield, "%s%s", longfield, longfield);
	cr_assert_eq(strlen(eb.field), sizeof(eb.field) - 1);
	cr_assert_eq(strlen(eb.msg), sizeof(eb.msg) - 1);
	mr_errbuf_clear(NULL);
}
