/*
 * test_file.c - common/mr_file.h on real files: a regular file opened and
 * a FIFO, a directory or a missing path refused at once (never waited
 * on); a small file read whole, over its cap refused; whole writes; the
 * lock held by one descriptor refused to a second, naming the holder,
 * and free again once the first is closed.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mr_file.h"
#include "proc.h"

static const char *dir; /* the test's scratch directory */

static void setup(void)
{
	cr_assert_not_null(dir = mr_test_scratch("mr-file"));
}

TestSuite(file, .init = setup);

static const char *path_of(const char *name)
{
	static char p[256];

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return p;
}

static void write_text(const char *name, const char *text)
{
	int fd = open(path_of(name), O_WRONLY | O_CREAT | O_TRUNC, 0600);

	cr_assert_geq(fd, 0);
	cr_assert_eq(mr_file_write_all(fd, text, strlen(text)), 0);
	close(fd);
}

Test(file, a_small_file_is_read_whole_and_one_over_its_cap_refused)
{
	struct mr_errbuf eb = { "", "" };
	char *buf;
	size_t len;

	write_text("cert.pem", "-----BEGIN CERTIFICATE-----\nabc\n");
	cr_assert_eq(mr_file_read_small(path_of("cert.pem"), "tls_cert", 1024, &buf, &len, &eb), 0,
		     "%s", eb.msg);
	cr_expect_eq(len, 32u);
	cr_expect_str_eq(buf, "-----BEGIN CERTIFICATE-----\nabc\n");
	free(buf);

	cr_expect_eq(mr_file_read_small(path_of("cert.pem"), "tls_cert", 31, &buf, &len, &eb),
		     MR_ELIMIT);
	cr_expect_null(buf);
	cr_expect(strstr(eb.msg, "tls_cert") && strstr(eb.msg, "cert.pem") &&
			  strstr(eb.msg, "over 31 bytes"),
		  "%s", eb.msg);

	write_text("empty", "");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_file_read_small(path_of("empty"), NULL, 8, &buf, &len, &eb), 0, "%s",
		     eb.msg);
	cr_expect_eq(len, 0u);
	cr_expect_str_eq(buf, "");
	free(buf);
}

Test(file, what_is_not_a_regular_file_is_refused_at_once)
{
	struct mr_errbuf eb = { "", "" };
	size_t len;
	char *buf;

	cr_assert_eq(mkfifo(path_of("fifo"), 0600), 0);
	/* a FIFO with no writer: opening it for a blocking read would wait */
	cr_expect_eq(mr_file_read_small(path_of("fifo"), "token", 64, &buf, &len, &eb),
		     MR_ECORRUPT);
	cr_expect(strstr(eb.msg, "a FIFO") && strstr(eb.msg, "token"), "%s", eb.msg);

	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_file_open_regular(dir, "shard", NULL, &eb), MR_ECORRUPT);
	cr_expect(strstr(eb.msg, "a directory"), "%s", eb.msg);

	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_file_open_regular(path_of("absent"), "manifest", NULL, &eb), MR_ENOTFOUND);
	cr_expect(strstr(eb.msg, "manifest") && strstr(eb.msg, "absent"), "%s", eb.msg);

	size_t size = 0;
	write_text("f", "12345");
	int fd = mr_file_open_regular(path_of("f"), NULL, &size, NULL);
	cr_assert_geq(fd, 0);
	cr_expect_eq(size, 5u);
	cr_expect_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "the descriptor is left non-blocking");
	close(fd);
}

Test(file, the_lock_names_its_holder_and_frees_on_close)
{
	struct mr_errbuf eb = { "", "" };
	char who[64];
	int fd1 = -1, fd2 = -1;

	cr_assert_eq(mr_file_lock(path_of("lock"), "pid 1 on 'a'", &fd1, who, sizeof(who), &eb), 0,
		     "%s", eb.msg);
	cr_expect_eq(mr_file_lock(path_of("lock"), "pid 2 on 'b'", &fd2, who, sizeof(who), &eb),
		     MR_ECONFLICT);
	cr_expect(strstr(who, "pid 1 on 'a'"), "the holder read back: '%s'", who);
	close(fd1);
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_file_lock(path_of("lock"), "pid 2 on 'b'", &fd2, who, sizeof(who), &eb), 0,
		     "%s", eb.msg);
	close(fd2);
}
