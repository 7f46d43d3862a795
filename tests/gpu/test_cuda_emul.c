/*
 * test_cuda_emul.c - the net of the CPU emulation of mr_cuda.h
 * (tests/gpu/cuda_emul.c): its device pointers are tagged so that host
 * code cannot read or write them directly, as on a real GPU. Checks that
 * the tag is there (bit 62; the pointer is no host address), that memory
 * still moves through upload/download/copies - at offsets too, since
 * tensor views are pointer arithmetic - and, in forked children, that a
 * direct host write or read really dies of SIGSEGV and that a host
 * pointer (or another device's) handed to an entry aborts naming it.
 * Also the device count (MR_CUDA_EMUL_DEVICES).
 *
 * Emulation only (Makefile: built with -DMR_CUDA_EMUL, never against the
 * real library, whose pointers are untagged device addresses).
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_harness.h"

#define TAG_BIT ((uintptr_t)1 << 62)

/* How a forked child ended, and (err) what it wrote on stderr. */
struct child {
	int status;
	char err[512];
};

/* Runs fn(arg) in a child with SIGSEGV at its default action (so neither
 * Criterion nor ASan turns the fault into something else) and stderr in
 * c->err. */
static void in_child(void (*fn)(void *), void *arg, struct child *c)
{
	int fd[2];
	ssize_t got;
	size_t n = 0;
	pid_t pid;

	memset(c, 0, sizeof(*c));
	cr_assert_eq(pipe(fd), 0);
	pid = fork();
	cr_assert_geq(pid, 0, "fork");
	if (pid == 0) {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		sigaction(SIGSEGV, &sa, NULL);
		sigaction(SIGBUS, &sa, NULL);
		close(fd[0]);
		dup2(fd[1], 2);
		fn(arg);
		_exit(0);
	}
	close(fd[1]);
	while (n < sizeof(c->err) - 1 &&
	       (got = read(fd[0], c->err + n, sizeof(c->err) - 1 - n)) > 0)
		n += (size_t)got;
	close(fd[0]);
	cr_assert_eq(waitpid(pid, &c->status, 0), pid);
}

static void died_of(const struct child *c, int sig, const char *what)
{
	cr_assert(WIFSIGNALED(c->status) && WTERMSIG(c->status) == sig,
		  "%s: the child did not die of signal %d (status %#x, stderr '%s')", what, sig,
		  c->status, c->err);
}

Test(cuda_emul, device_pointers_are_tagged_and_move_through_copies)
{
	size_t n = 300, i;
	float *h = rand_bf(n, 1.0f), *back = xmalloc(n * sizeof(float));
	float *want = xmalloc(n * sizeof(float));
	float *d, *e;

	need_gpu();
	d = dev_alloc(n * sizeof(float));
	e = dev_alloc(n * sizeof(float));
	cr_assert((uintptr_t)d & TAG_BIT, "%p carries no tag", (void *)d);
	cr_assert((uintptr_t)(d + 17) & TAG_BIT, "arithmetic lost the tag");
	cr_assert_gt((uintptr_t)d >> 56, 0, "%p could be a host address", (void *)d);
	cr_assert((uintptr_t)d & (uintptr_t)1 << 55, "%p would not fault on arm64", (void *)d);
	/* whole, then at offsets: views into an allocation are p + off */
	cr_assert_eq(mr_cuda_upload(cu, d, h, n * sizeof(float)), 0);
	cr_assert_eq(mr_cuda_download(cu, back, d, n * sizeof(float)), 0);
	cr_assert(memcmp(back, h, n * sizeof(float)) == 0, "round trip differs");
	cr_assert_eq(mr_cuda_memset0(cu, d + 100, 50 * sizeof(float)), 0);
	cr_assert_eq(mr_cuda_upload(cu, d + 10, h + 200, 5 * sizeof(float)), 0);
	cr_assert_eq(mr_cuda_download(cu, back, d, n * sizeof(float)), 0);
	for (i = 0; i < n; i++) {
		float w = i >= 100 && i < 150 ? 0.0f : i >= 10 && i < 15 ? h[200 + i - 10] : h[i];
		cr_assert_eq(back[i], w, "[%zu] %g != %g", i, back[i], w);
	}
	/* device to device, plain and strided, through offsets; want is d */
	memcpy(want, back, n * sizeof(float));
	cr_assert_eq(mr_cuda_copy(cu, e, d, n * sizeof(float)), 0);
	cr_assert_eq(mr_cuda_copy2d(cu, e + 1, 4 * sizeof(float), d + 2, 3 * sizeof(float),
				    sizeof(float), 10),
		     0);
	cr_assert_eq(mr_cuda_download(cu, back, e, n * sizeof(float)), 0);
	for (i = 0; i < 10; i++)
		cr_assert_eq(back[1 + 4 * i], want[2 + 3 * i], "copy2d row %zu", i);
	cr_assert_eq(back[2], want[2], "copy2d wrote between rows");
	/* a kernel entry reads and writes through the tags too */
	cr_assert_eq(mr_cuda_scale(cu, e + 50, 10, -2.0f), 0);
	cr_assert_eq(mr_cuda_download(cu, back, e, n * sizeof(float)), 0);
	cr_assert_eq(back[55], -2.0f * want[55]);
	cr_assert_eq(back[49], want[49]);
	mr_cuda_dfree(cu, d);
	mr_cuda_dfree(cu, e);
	mr_cuda_dfree(cu, NULL);
	free(h);
	free(back);
	free(want);
	gpu_teardown();
}

static void write_device(void *p)
{
	*(volatile float *)p = 1.0f;
}

static void read_device(void *p)
{
	volatile float x = ((volatile float *)p)[3];

	(void)x;
}

/* The net is really there: a host access of a device pointer faults. */
Test(cuda_emul, host_access_to_device_memory_faults)
{
	struct child c;
	float *d;

	need_gpu();
	d = dev_alloc(64 * sizeof(float));
	in_child(write_device, d, &c);
	died_of(&c, SIGSEGV, "a host write");
	in_child(read_device, d + 8, &c);
	died_of(&c, SIGSEGV, "a host read at an offset");
	/* and a control: the same write to host memory lives */
	{
		float *h = xmalloc(64 * sizeof(float));
		in_child(write_device, h, &c);
		cr_assert(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0, "status %#x",
			  c.status);
		free(h);
	}
	mr_cuda_dfree(cu, d);
	gpu_teardown();
}

static void upload_to_host(void *p)
{
	float src[4] = { 1, 2, 3, 4 };

	mr_cuda_upload(cu, p, src, sizeof(src));
}

static void scale_host(void *p)
{
	mr_cuda_scale(cu, p, 4, 2.0f);
}

/* A host pointer where mr_cuda.h wants a device one is refused loudly. */
Test(cuda_emul, host_pointer_as_device_argument_aborts)
{
	float h[4] = { 0 };
	struct child c;

	need_gpu();
	in_child(upload_to_host, h, &c);
	died_of(&c, SIGABRT, "upload to a host pointer");
	cr_assert(strstr(c.err, "mr_cuda_upload") && strstr(c.err, "host memory"), "%s", c.err);
	in_child(scale_host, h, &c);
	died_of(&c, SIGABRT, "a kernel on a host pointer");
	cr_assert(strstr(c.err, "mr_cuda_scale"), "%s", c.err);
	gpu_teardown();
}

struct two {
	struct mr_cuda *other;
	void *p;
};

static void upload_other_device(void *arg)
{
	struct two *t = arg;
	float src = 1.0f;

	mr_cuda_upload(t->other, t->p, &src, sizeof(src));
}

Test(cuda_emul, device_count_and_pointers_of_another_device)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_cuda *c1 = NULL, *c3 = NULL;
	struct child ch;
	struct two t;
	void *p0 = NULL, *p3 = NULL;

	unsetenv("MR_CUDA_EMUL_DEVICES");
	cr_assert_eq(mr_cuda_device_count(&eb), 1, "one device by default");
	setenv("MR_CUDA_EMUL_DEVICES", "4", 1);
	cr_assert_eq(mr_cuda_device_count(&eb), 4);
	cr_assert_eq(mr_cuda_create(&c3, 3, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_cuda_create(&c1, 4, &eb), MR_ENOTSUP);
	cr_assert(strstr(eb.msg, "'4'") && strstr(eb.msg, "4 found"), "%s", eb.msg);
	cr_assert_eq(mr_cuda_create(&c1, 1, &eb), 0, "%s", eb.msg);
	need_gpu(); /* cu: device 0 */
	cr_assert_eq(mr_cuda_alloc(cu, &p0, 16), 0);
	cr_assert_eq(mr_cuda_alloc(c3, &p3, 16), 0);
	cr_assert_neq((uintptr_t)p0 >> 56, (uintptr_t)p3 >> 56, "devices 0 and 3 tag alike");
	t.other = c1;
	t.p = p0;
	in_child(upload_other_device, &t, &ch);
	died_of(&ch, SIGABRT, "device 0's memory on device 1");
	cr_assert(strstr(ch.err, "another device"), "%s", ch.err);
	mr_cuda_dfree(c3, p3);
	mr_cuda_dfree(cu, p0);
	mr_cuda_free(c3);
	mr_cuda_free(c1);
	/* a bad count is no device, with the reason */
	mr_errbuf_clear(&eb);
	setenv("MR_CUDA_EMUL_DEVICES", "0", 1);
	cr_assert_eq(mr_cuda_device_count(&eb), 0);
	cr_assert(strstr(eb.msg, "MR_CUDA_EMUL_DEVICES"), "%s", eb.msg);
	setenv("MR_CUDA_EMUL_DEVICES", "2x", 1);
	cr_assert_eq(mr_cuda_device_count(&eb), 0);
	unsetenv("MR_CUDA_EMUL_DEVICES");
	gpu_teardown();
}
