/*
 * test_token.c - common/mr_token.h on real files: a Secret's token with
 * its trailing newline, one exactly at the buffer's size, and the
 * refusals - missing, empty, whitespace inside, longer than the buffer -
 * each naming the option and the file.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mr_token.h"

static char path[] = "/tmp/mr-token-XXXXXX";

static void put(const char *text)
{
	FILE *f = fopen(path, "w");

	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

static void setup(void)
{
	int fd = mkstemp(path);

	cr_assert_geq(fd, 0);
	close(fd);
}

static void teardown(void)
{
	unlink(path);
}

TestSuite(token, .init = setup, .fini = teardown);

Test(token, a_secret_with_its_newline_reads_as_the_token)
{
	struct mr_errbuf eb = { "", "" };
	char out[9];

	put("s3cret\n");
	cr_assert_eq(mr_token_read_file(path, out, sizeof(out), "token_file", &eb), 0, "%s",
		     eb.msg);
	cr_expect_str_eq(out, "s3cret");
	put("12345678 \n\t"); /* exactly cap - 1 bytes, then whitespace */
	cr_assert_eq(mr_token_read_file(path, out, sizeof(out), "token_file", &eb), 0, "%s",
		     eb.msg);
	cr_expect_str_eq(out, "12345678");
}

Test(token, refusals_name_the_option_and_the_file)
{
	const struct {
		const char *text; /* NULL: no file */
		int code;
		const char *says;
	} cases[] = {
		{ NULL, MR_EIO, "unable to read" },
		{ "\n \n", MR_EINVAL, "is empty" },
		{ "ab cd\n", MR_EINVAL, "inside the token" },
		{ "123456789", MR_ELIMIT, "more than 8 bytes" },
	};
	char out[9];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct mr_errbuf eb = { "", "" };

		if (cases[i].text)
			put(cases[i].text);
		else
			unlink(path);
		cr_expect_eq(mr_token_read_file(path, out, sizeof(out), "token_file", &eb),
			     cases[i].code, "case %zu: %s", i, eb.msg);
		cr_expect(strstr(eb.msg, cases[i].says) && strstr(eb.msg, "token_file") &&
				  strstr(eb.msg, path),
			  "case %zu: %s", i, eb.msg);
		cr_expect_str_eq(eb.field, "token_file");
	}
}
