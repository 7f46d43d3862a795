/*
 * cuda_emul.c - a CPU emulation of the mr_cuda.h API, so that code built
 * on it (the device layer's cuda backend, device/cuda.c; the old device
 * GPT, runtime/cuda/gpt*.cu) can be exercised on a machine without a
 * GPU: link it instead of libmeshrun_cuda.a (the Makefile's gpu-emul
 * tests do).
 *
 * Memory: "device" memory is host memory (filled with 0xff bytes on
 * allocation, so a buffer used before it is written gives NaNs as garbage
 * would), but the host cannot reach it by accident. mr_cuda_alloc returns
 * a TAGGED pointer: the malloc'd address with bit 62 set (the mark), the
 * device index in bits 56..61, and bit 55. No user address has those
 * bits, and no such pointer can be dereferenced: on x86-64 it is
 * non-canonical; on arm64, whose top-byte-ignore would let bits 56..63
 * through, bit 55 puts it in the kernel's half. Any direct read or write
 * of it by host code faults (SIGSEGV; under ASan, a SEGV report with the
 * backtrace) - as it would on a real GPU, where device memory is not
 * host memory. Host code must go through mr_cuda_upload/download (the
 * device table's upload/download). Pointer arithmetic (p + offset) keeps
 * the tag, so tensor views into one allocation work as on the device.
 * Every entry below takes the tag off each device-pointer argument before
 * touching memory (D(), once per argument, pointers inside argument
 * structs included); D() aborts with the entry's name when given a
 * pointer that is not a device pointer of the context's device (a host
 * pointer where mr_cuda.h wants a device one, or another device's
 * memory), which a real GPU would answer with an illegal-address error.
 * Arguments named *_host, struct mr_moe_shape and the option structs are
 * host memory and used as they are.
 *
 * Devices: one by default; MR_CUDA_EMUL_DEVICES=N (1..64) reports N, so
 * that ranks of one job can open device local_rank;
 * MR_CUDA_EMUL_NODEV=1 reports none.
 *
 * Host reads: mr_cuda_emul_host_reads(device) counts, per device in this
 * process, the entries that bring device results to the host - downloads,
 * the MoE routing's read-back (count_host) and the grad norm's sums - so
 * a test can prove a stretch of work reads nothing on the host.
 *
 * A sticky error: MR_CUDA_EMUL_STICKY=DEV:N:FILE makes the N-th
 * mr_cuda_sync() of device DEV in a process fail as an illegal memory
 * access does on a GPU - and from then on every sync, allocation and
 * copy of that device in this process fails too, as a poisoned CUDA
 * context does until the process exits. It fires once per FILE (created
 * when it fires; if FILE exists it never fires), so a test can tell a
 * fresh process (which recovers) from a restart inside the same one
 * (which cannot).
 *
 * Counters and knobs for tests (cuda_emul.h): the mr_cuda_sync and
 * mr_cuda_stream_wait calls per device, and a "busy" switch that makes
 * mr_cuda_query answer "not ready" (a stream stuck behind a collective
 * that never ends) until a test clears it.
 *
 * Kernels: every kernel is its CPU twin (kernels/, optim/, kernels/moe.c)
 * run on fp32 copies of its inputs, its outputs stored back in the
 * context's activation type - bf16: rounded to nearest even once, where
 * the device rounds; fp32: as they are - with the = / += rule mr_cuda.h
 * documents for each argument. So an emulated run has the device's
 * rounding points but the CPU's summation order: what it checks is the
 * orchestration (offsets, layouts, call order, accumulation, the
 * optimizer step, which memory the host touches), not the CUDA kernels
 * (those are tests/gpu/test_cuda_kernels.c and test_cuda_attention.c on
 * a GPU). With fp32 activations an emulated op computes exactly what the
 * cpu device computes.
 *
 * Graphs: the CPU cannot replay a graph without the host code, so they
 * are made as strict as a record can make them. While capturing, every
 * entry records its call - name and a hash of its arguments (pointers as
 * passed, sizes, scalars, the fields of the argument structs and of the
 * AdamW range table) - and returns without computing (a GPU computes
 * nothing at capture either); the calls that need the host refuse with
 * MR_ENEEDHOST as device.cu's do. A launch re-runs the captured function
 * and aborts, naming the call, when it issues a call that differs from
 * the capture's - on a GPU the graph would have replayed the stale one -
 * or more or fewer calls. What the record cannot see: host state fn
 * changes (a GPU skips it at a launch; here it runs again).
 *
 * Non-goals: speed, asynchrony, bounds checks inside an allocation (ASan
 * builds catch those on the untagged buffers).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda/mr_cuda.h"
#include "cuda_emul.h"
#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"
#include "kernels/mr_moe.h"
#include "optim/mr_adamw.h"


/* The tag of a device pointer (see the header): the mark, the bit that
 * faults on arm64 too, the device index. */
#define TAG_BIT ((uintptr_t)1 << 62)
#define HALF_BIT ((uintptr_t)1 << 55)
#define DEV_SHIFT 56
#define DEV_MASK ((uintptr_t)63 << DEV_SHIFT)
#define MAX_DEVICES 64

/* A captured call: the entry's name and the hash of its arguments. */
struct graph_call {
	const char *fn;
	uint64_t args;
};

struct mr_cuda_graph {
	struct graph_call *calls;
	int n, cap;
};

enum graph_mode { EAGER, CAPTURE, REPLAY };

struct mr_cuda {
	enum mr_cuda_dtype act;
	int device;
	double *marks;      /* timing marks: the host clock in ms (mr_cuda_mark) */
	int nmarks, marks_used;
	char err[64];
	enum graph_mode mode;
	struct mr_cuda_graph *graph; /* being captured or replayed */
	int at;                      /* REPLAY: the next call's index */
	int nested;                  /* an entry calling another: one call */
	struct mr_cuda_adamw args;   /* mr_cuda_adamw_args's "device block" */
	int has_args;
};

static void *xalloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);

	if (!p)
		abort();
	return p;
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);

	if (!p)
		abort();
	return p;
}

/* The device pointer of cu's device for host address p. */
static void *tag(const struct mr_cuda *cu, void *p)
{
	return (void *)((uintptr_t)p | TAG_BIT | HALF_BIT | (uintptr_t)cu->device << DEV_SHIFT);
}

/* The host address behind device pointer p of cu's device (NULL stays
 * NULL); aborts naming entry fn when p is not one. */
static void *untag(const struct mr_cuda *cu, const void *p, const char *fn)
{
	uintptr_t u = (uintptr_t)p;

	if (!p)
		return NULL;
	if (!(u & TAG_BIT) || !(u & HALF_BIT) ||
	    (int)((u & DEV_MASK) >> DEV_SHIFT) != cu->device) {
		fprintf(stderr,
			"cuda_emul: %s: %p is not a device pointer of device %d (%s)\n", fn, p,
			cu->device, u & TAG_BIT ? "another device's" : "host memory");
		abort();
	}
	return (void *)(u & ~(TAG_BIT | HALF_BIT | DEV_MASK));
}

/* Inside an entry (its context is `cu`): the host address of device
 * argument p. Once per argument: an untagged pointer is host memory. */
#define D(p) untag(cu, (p), __func__)

/* ---- graphs: the record of a call ------------------------------------------- */

static uint64_t mix(uint64_t h, uint64_t v)
{
	int i;

	for (i = 0; i < 8; i++, v >>= 8) /* FNV-1a over v's bytes */
		h = (h ^ (v & 0xff)) * 0x100000001b3ull;
	return h;
}

static uint64_t h_int(long long v)
{
	return (uint64_t)v;
}

static uint64_t h_size(size_t v)
{
	return (uint64_t)v;
}

static uint64_t h_float(double v)
{
	uint64_t u;

	memcpy(&u, &v, sizeof(u));
	return u;
}

static uint64_t h_ptr(const volatile void *p)
{
	return (uint64_t)(uintptr_t)p;
}

/* Argument structs by their fields (their address is the caller's stack). */
static uint64_t h_attn(const struct mr_cuda_attn *a)
{
	uint64_t h = 0xcbf29ce484222325ull;

	h = mix(mix(mix(h, h_ptr(a->q)), h_ptr(a->k)), h_ptr(a->v));
	h = mix(mix(mix(mix(h, a->q_row), a->q_batch), a->kv_row), a->kv_batch);
	h = mix(mix(mix(mix(h, h_int(a->B)), h_int(a->NH)), h_int(a->hs)), h_int(a->tq));
	h = mix(mix(mix(mix(h, h_int(a->q_pos0)), h_int(a->tk)), h_int(a->k_pos0)),
		h_int(a->causal));
	return mix(mix(h, h_float(a->scale)), h_int(a->NKV));
}

static uint64_t h_moe(const struct mr_moe_shape *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	h = mix(mix(mix(mix(h, h_int(s->N)), h_int(s->C)), h_int(s->H)), h_int(s->E));
	return mix(mix(mix(h, h_int(s->k)), h_int(s->cap)), h_int(s->swiglu));
}

static uint64_t h_adamw(const struct mr_cuda_adamw *o)
{
	uint64_t h = 0xcbf29ce484222325ull;

	h = mix(mix(mix(mix(h, h_float(o->lr)), h_float(o->beta1)), h_float(o->beta2)),
		h_float(o->eps));
	return mix(mix(mix(h, h_float(o->weight_decay)), h_int(o->t)), h_float(o->grad_scale));
}

/* An argument's bits (an argument struct: CALL gets its h_* hash). */
#define ARG(x)                                                                              \
	_Generic((x), float: h_float, double: h_float, int: h_int, long: h_int,             \
		 unsigned: h_size, size_t: h_size, default: h_ptr)(x)

/* Whether entry fn, its arguments hashed to args, is done: recorded while
 * capturing (nothing runs); compared with the capture while replaying
 * (aborting on a difference; then it runs); eager: it runs. */
static int graph_call(struct mr_cuda *cu, const char *fn, uint64_t args)
{
	struct mr_cuda_graph *g = cu->graph;

	if (cu->mode == EAGER || cu->nested)
		return 0;
	if (cu->mode == CAPTURE) {
		if (g->n == g->cap) {
			g->cap = g->cap ? 2 * g->cap : 64;
			g->calls = realloc(g->calls, (size_t)g->cap * sizeof(*g->calls));
			if (!g->calls)
				abort();
		}
		g->calls[g->n++] = (struct graph_call){ fn, args };
		return 1;
	}
	if (cu->at >= g->n || strcmp(g->calls[cu->at].fn, fn) || g->calls[cu->at].args != args) {
		fprintf(stderr,
			"cuda_emul: graph launch: call %d is %s, the capture's was %s%s: on a GPU "
			"the graph would replay the captured call with stale arguments\n",
			cu->at, fn, cu->at < g->n ? g->calls[cu->at].fn : "(none)",
			cu->at < g->n && !strcmp(g->calls[cu->at].fn, fn) ? " with other arguments"
									   : "");
		abort();
	}
	cu->at++;
	return 0;
}

/* At the top of an entry: its call as a graph sees it (see graph_call). */
#define CALL(...)                                                                           \
	do {                                                                                \
		if (graph_call(cu, __func__,                                                \
			       hash_args(COUNT(__VA_ARGS__), EACH(ARG, __VA_ARGS__))))      \
			return 0;                                                           \
	} while (0)

/* The hash of n arguments, each a uint64_t. */
static uint64_t hash_args(int n, ...)
{
	uint64_t h = 0xcbf29ce484222325ull;
	va_list ap;
	int i;

	va_start(ap, n);
	for (i = 0; i < n; i++)
		h = mix(h, va_arg(ap, uint64_t));
	va_end(ap);
	return h;
}

/* EACH(F, a, b, ...) -> F(a), F(b), ... (up to 16 arguments). */
#define EACH_N(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, ...) N
#define COUNT(...) EACH_N(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define EACH(F, ...) EACH_(COUNT(__VA_ARGS__), F, __VA_ARGS__)
#define EACH_(n, F, ...) EACH__(n, F, __VA_ARGS__)
#define EACH__(n, F, ...) EACH_##n(F, __VA_ARGS__)
#define EACH_1(F, a) F(a)
#define EACH_2(F, a, ...) F(a), EACH_1(F, __VA_ARGS__)
#define EACH_3(F, a, ...) F(a), EACH_2(F, __VA_ARGS__)
#define EACH_4(F, a, ...) F(a), EACH_3(F, __VA_ARGS__)
#define EACH_5(F, a, ...) F(a), EACH_4(F, __VA_ARGS__)
#define EACH_6(F, a, ...) F(a), EACH_5(F, __VA_ARGS__)
#define EACH_7(F, a, ...) F(a), EACH_6(F, __VA_ARGS__)
#define EACH_8(F, a, ...) F(a), EACH_7(F, __VA_ARGS__)
#define EACH_9(F, a, ...) F(a), EACH_8(F, __VA_ARGS__)
#define EACH_10(F, a, ...) F(a), EACH_9(F, __VA_ARGS__)
#define EACH_11(F, a, ...) F(a), EACH_10(F, __VA_ARGS__)
#define EACH_12(F, a, ...) F(a), EACH_11(F, __VA_ARGS__)
#define EACH_13(F, a, ...) F(a), EACH_12(F, __VA_ARGS__)
#define EACH_14(F, a, ...) F(a), EACH_13(F, __VA_ARGS__)
#define EACH_15(F, a, ...) F(a), EACH_14(F, __VA_ARGS__)
#define EACH_16(F, a, ...) F(a), EACH_15(F, __VA_ARGS__)

/* At the top of an entry that needs the host: refused while capturing. */
#define HOST_ONLY(name)                                                                     \
	do {                                                                                \
		if (cu->mode == CAPTURE) {                                                  \
			snprintf(cu->err, sizeof(cu->err), "'%s' needs the host", (name));  \
			return MR_ENEEDHOST;                                                \
		}                                                                           \
	} while (0)

/* Bytes of one activation element. */
static size_t esz(const struct mr_cuda *cu)
{
	return cu->act == MR_CUDA_F32 ? sizeof(float) : sizeof(mr_bf16);
}

/* Element i of an activation buffer as fp32. */
static float ld1(const struct mr_cuda *cu, const void *x, size_t i)
{
	if (cu->act == MR_CUDA_F32)
		return ((const float *)x)[i];
	return mr_bf16_to_f32(((const mr_bf16 *)x)[i]);
}

/* Element i of an activation buffer := v (rounded once when bf16). */
static void st1(const struct mr_cuda *cu, void *x, size_t i, float v)
{
	if (cu->act == MR_CUDA_F32)
		((float *)x)[i] = v;
	else
		((mr_bf16 *)x)[i] = mr_bf16_from_f32(v);
}

/* fp32 copy of n activation elements (caller frees); NULL stays NULL. */
static float *ld(const struct mr_cuda *cu, const void *x, size_t n)
{
	float *f;
	size_t i;

	if (!x)
		return NULL;
	f = xalloc(n * sizeof(float));
	for (i = 0; i < n; i++)
		f[i] = ld1(cu, x, i);
	return f;
}

static void st(const struct mr_cuda *cu, void *dst, const float *f, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		st1(cu, dst, i, f[i]);
}

/* ---- context and memory ------------------------------------------------------ */

#define STICKY_MSG "an illegal memory access was encountered (emulated)"

static _Atomic int poisoned[MAX_DEVICES]; /* the device's context, this process */
static _Atomic long syncs[MAX_DEVICES];        /* mr_cuda_sync calls (cuda_emul.h) */
static _Atomic long stream_waits[MAX_DEVICES]; /* mr_cuda_stream_wait calls */
static _Atomic int busy[MAX_DEVICES];          /* mr_cuda_query answers "not ready" */
static _Atomic long host_reads[MAX_DEVICES];   /* see mr_cuda_emul_host_reads */
static _Atomic long gelu_fused[MAX_DEVICES];   /* see mr_cuda_emul_gelu_fused */

long mr_cuda_emul_gelu_fused(int device)
{
	return gelu_fused[device];
}

long mr_cuda_emul_host_reads(int device)
{
	return device >= 0 && device < MAX_DEVICES ? host_reads[device] : 0;
}

long mr_cuda_emul_syncs(int device)
{
	return syncs[device];
}

long mr_cuda_emul_stream_waits(int device)
{
	return stream_waits[device];
}

void mr_cuda_emul_set_busy(int device, int on)
{
	busy[device] = on;
}

/* MR_CUDA_EMUL_STICKY: 1 when sync number nsync of cu's device is the one
 * to fail. */
static int sticky_fires(const struct mr_cuda *cu, long nsync)
{
	const char *s = getenv("MR_CUDA_EMUL_STICKY");
	char file[512];
	int dev, fd;
	long n;

	if (!s || sscanf(s, "%d:%ld:%511s", &dev, &n, file) != 3 || dev != cu->device ||
	    nsync != n)
		return 0;
	fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return 0; /* fired before */
	close(fd);
	return 1;
}

/* In an entry that can report a sticky error: fails once it struck. */
#define POISONED(cu)                                                         \
	do {                                                                 \
		if (poisoned[(cu)->device]) {                                \
			snprintf((cu)->err, sizeof((cu)->err), STICKY_MSG);  \
			return MR_ESYS;                                      \
		}                                                            \
	} while (0)

int mr_cuda_device_count(struct mr_errbuf *eb)
{
	const char *s = getenv("MR_CUDA_EMUL_DEVICES");
	char *end;
	long n;

	if (getenv("MR_CUDA_EMUL_NODEV")) {
		mr_errf(eb, MR_ENOTSUP, "no cuda device: emulation told so");
		return 0;
	}
	if (!s || !*s)
		return 1;
	errno = 0;
	n = strtol(s, &end, 10);
	if (errno || *end || n < 1 || n > MAX_DEVICES) {
		mr_errf(eb, MR_ENOTSUP, "no cuda device: MR_CUDA_EMUL_DEVICES '%s' is not in 1..%d",
			s, MAX_DEVICES);
		return 0;
	}
	return (int)n;
}

/* No datasheet peak: MFU needs "peak_flops" on the emulated device. */
int mr_cuda_device_name(int device, char *buf, size_t n)
{
	snprintf(buf, n, "emulated GPU %d (CPU twins)", device);
	return 0;
}

/* A tagged pointer is device memory: the comm layer stages it through
 * host memory. NCCL cannot move emulated memory. */
int mr_cuda_is_device_ptr(const void *p)
{
	return ((uintptr_t)p & TAG_BIT) != 0;
}

int mr_cuda_nccl_capable(void)
{
	return 0;
}

int mr_cuda_create(struct mr_cuda **out, int device, struct mr_errbuf *eb)
{
	struct mr_errbuf why = { { 0 }, { 0 } };
	int n = mr_cuda_device_count(&why);

	*out = NULL;
	if (device < 0 || device >= n)
		return mr_errf(eb, MR_ENOTSUP, "cuda device '%d' not available (%d found%s%s)",
			       device, n, why.msg[0] ? "; " : "", why.msg);
	*out = calloc(1, sizeof(**out));
	if (!*out)
		return MR_ENOMEM;
	(*out)->device = device;
	return 0;
}

void mr_cuda_free(struct mr_cuda *cu)
{
	if (cu)
		free(cu->marks);
	free(cu);
}

int mr_cuda_marks(struct mr_cuda *cu, int n)
{
	free(cu->marks);
	cu->marks = n > 0 ? xcalloc((size_t)n, sizeof(*cu->marks)) : NULL;
	cu->nmarks = n > 0 ? n : 0;
	cu->marks_used = 0;
	return 0;
}

/* Every operation ran when it returned: a mark is the host clock. */
int mr_cuda_mark(struct mr_cuda *cu)
{
	struct timespec ts;

	if (cu->mode == CAPTURE || cu->marks_used >= cu->nmarks)
		return -1;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	cu->marks[cu->marks_used] = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
	return cu->marks_used++;
}

int mr_cuda_marks_read(struct mr_cuda *cu, double *ms, int n)
{
	HOST_ONLY("marks_read");
	int i, used = cu->marks_used < n ? cu->marks_used : n;

	for (i = 0; i < used; i++)
		ms[i] = cu->marks[i] - cu->marks[0];
	cu->marks_used = 0;
	return used;
}

/* ---- graphs (see the header) ---------------------------------------------------- */

int mr_cuda_capturing(const struct mr_cuda *cu)
{
	return cu->mode == CAPTURE;
}

void mr_cuda_graph_free(struct mr_cuda *cu, struct mr_cuda_graph *g)
{
	(void)cu;
	if (g)
		free(g->calls);
	free(g);
}

int mr_cuda_graph_capture(struct mr_cuda *cu, mr_cuda_work fn, void *ctx,
			  struct mr_cuda_graph **out)
{
	struct mr_cuda_graph *g;
	int rc;

	*out = NULL;
	HOST_ONLY("graph_capture");
	g = xcalloc(1, sizeof(*g));
	cu->mode = CAPTURE;
	cu->graph = g;
	rc = fn(ctx);
	cu->mode = EAGER;
	cu->graph = NULL;
	if (rc < 0) {
		mr_cuda_graph_free(cu, g);
		return rc;
	}
	*out = g;
	return 0;
}

int mr_cuda_graph_launch(struct mr_cuda *cu, struct mr_cuda_graph *g, mr_cuda_work fn, void *ctx)
{
	int rc;

	POISONED(cu);
	cu->mode = REPLAY;
	cu->graph = g;
	cu->at = 0;
	rc = fn(ctx);
	cu->mode = EAGER;
	cu->graph = NULL;
	if (rc == 0 && cu->at != g->n) {
		fprintf(stderr, "cuda_emul: graph launch: %d calls, the capture had %d\n", cu->at,
			g->n);
		abort();
	}
	return rc;
}

void mr_cuda_set_act(struct mr_cuda *cu, enum mr_cuda_dtype t)
{
	cu->act = t;
}

const char *mr_cuda_errmsg(const struct mr_cuda *cu)
{
	return cu ? cu->err : "no cuda context";
}

/* No asynchrony here: nothing to wait for. */
void *mr_cuda_stream(struct mr_cuda *cu)
{
	(void)cu;
	return NULL;
}

int mr_cuda_sync(struct mr_cuda *cu)
{
	HOST_ONLY("sync");
	if (sticky_fires(cu, ++syncs[cu->device]))
		poisoned[cu->device] = 1;
	POISONED(cu);
	return 0;
}

/* Every operation ran when it returned: a stream-ordered wait has nothing
 * to wait for (the work behind it is done), so it is only counted. There
 * are no events: ev must be NULL. */
int mr_cuda_stream_wait(struct mr_cuda *cu, void *ev)
{
	if (ev)
		abort(); /* an event from a real CUDA runtime */
	HOST_ONLY("stream_wait");
	stream_waits[cu->device]++;
	POISONED(cu);
	return 0;
}

/* The stream is idle unless a test keeps it busy (mr_cuda_emul_set_busy),
 * as a stream waiting on a collective that never ends would be. */
int mr_cuda_query(struct mr_cuda *cu, void *ev)
{
	if (ev)
		abort();
	HOST_ONLY("query");
	POISONED(cu);
	return !busy[cu->device];
}

void mr_cuda_event_free(struct mr_cuda *cu, void *ev)
{
	(void)cu;
	if (ev)
		abort();
}

int mr_cuda_using_lt(const struct mr_cuda *cu)
{
	(void)cu;
	return 0;
}

long mr_cuda_lt_fallbacks(const struct mr_cuda *cu, const char **why)
{
	(void)cu;
	if (why)
		*why = "";
	return 0;
}

void mr_cuda_disable_lt(struct mr_cuda *cu)
{
	(void)cu;
}

/* No cuDNN here: the layer entries are the CPU twins, nothing falls back. */
long mr_cuda_attn_fast_calls(const struct mr_cuda *cu)
{
	(void)cu;
	return 0;
}

long mr_cuda_attn_fallbacks(const struct mr_cuda *cu, const char **why)
{
	(void)cu;
	if (why)
		*why = "";
	return 0;
}

void mr_cuda_disable_cudnn(struct mr_cuda *cu)
{
	(void)cu;
}

int mr_cuda_alloc(struct mr_cuda *cu, void **p, size_t bytes)
{
	HOST_ONLY("alloc");
	void *h;

	POISONED(cu);
	h = xalloc(bytes);
	memset(h, 0xff, bytes);
	*p = tag(cu, h);
	return 0;
}

void mr_cuda_dfree(struct mr_cuda *cu, void *p)
{
	if (cu->mode == CAPTURE) { /* kept, as device.cu does */
		snprintf(cu->err, sizeof(cu->err), "'dfree' needs the host");
		return;
	}
	free(D(p));
}

/* Pinned host memory is host memory: an untagged buffer, garbage-filled
 * as cudaHostAlloc's would be. */
int mr_cuda_host_alloc(struct mr_cuda *cu, void **p, size_t bytes)
{
	HOST_ONLY("host_alloc");
	POISONED(cu);
	*p = xalloc(bytes);
	memset(*p, 0xff, bytes);
	return 0;
}

int mr_cuda_host_free(struct mr_cuda *cu, void *p)
{
	HOST_ONLY("host_free");
	(void)cu;
	if (mr_cuda_is_device_ptr(p))
		abort(); /* device memory given back as host memory */
	free(p);
	return 0;
}

int mr_cuda_memset0(struct mr_cuda *cu, void *p, size_t bytes)
{
	CALL(p, bytes);
	POISONED(cu);
	if (bytes)
		memset(D(p), 0, bytes);
	return 0;
}

int mr_cuda_upload(struct mr_cuda *cu, void *dst, const void *src_host, size_t bytes)
{
	HOST_ONLY("upload");
	POISONED(cu);
	if (bytes)
		memcpy(D(dst), src_host, bytes);
	return 0;
}

int mr_cuda_download(struct mr_cuda *cu, void *dst_host, const void *src, size_t bytes)
{
	HOST_ONLY("download");
	POISONED(cu);
	host_reads[cu->device]++;
	if (bytes)
		memcpy(dst_host, D(src), bytes);
	return 0;
}

int mr_cuda_copy(struct mr_cuda *cu, void *dst, const void *src, size_t bytes)
{
	CALL(dst, src, bytes);
	POISONED(cu);
	if (dst != src && bytes)
		memcpy(D(dst), D(src), bytes);
	return 0;
}

int mr_cuda_copy2d(struct mr_cuda *cu, void *dst, size_t dpitch, const void *src, size_t spitch,
		   size_t width, size_t rows)
{
	CALL(dst, dpitch, src, spitch, width, rows);
	char *d;
	const char *s;
	size_t r;

	if (!rows || !width)
		return 0;
	d = D(dst);
	s = D(src);
	for (r = 0; r < rows; r++)
		memcpy(d + r * dpitch, s + r * spitch, width);
	return 0;
}

int mr_cuda_f32_to_bf16(struct mr_cuda *cu, mr_bf16 *dst, const float *src, size_t n)
{
	CALL(dst, src, n);
	mr_bf16 *d = D(dst);
	const float *s = D(src);
	size_t i;

	for (i = 0; i < n; i++)
		d[i] = mr_bf16_from_f32(s[i]);
	return 0;
}

int mr_cuda_bf16_to_f32(struct mr_cuda *cu, float *dst, const mr_bf16 *src, size_t n)
{
	CALL(dst, src, n);
	float *d = D(dst);
	const mr_bf16 *s = D(src);
	size_t i;

	for (i = 0; i < n; i++)
		d[i] = mr_bf16_to_f32(s[i]);
	return 0;
}

/* ---- GEMM ---------------------------------------------------------------------- */

static float *ones_of(int N)
{
	float *o = xalloc(sizeof(float) * (size_t)N);
	int i;

	for (i = 0; i < N; i++)
		o[i] = 1.0f;
	return o;
}

int mr_cuda_matmul_fwd(struct mr_cuda *cu, void *out, const void *inp, const void *w,
		       const void *bias, int N, int IC, int OC)
{
	CALL(out, inp, w, bias, N, IC, OC);
	float *fi = ld(cu, D(inp), (size_t)N * IC), *fw = ld(cu, D(w), (size_t)OC * IC);
	float *fb = ld(cu, D(bias), (size_t)OC), *fo = xalloc(sizeof(float) * (size_t)N * OC);

	mr_matmul_fwd(NULL, fo, fi, fw, fb, N, IC, OC);
	st(cu, D(out), fo, (size_t)N * OC);
	free(fi);
	free(fw);
	free(fb);
	free(fo);
	return 0;
}

int mr_cuda_matmul_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
		       const void *dout, const void *inp, const void *w, int N, int IC, int OC,
		       int accumulate_dinp)
{
	CALL(dinp, dw, dbias, dout, inp, w, N, IC, OC, accumulate_dinp);
	float *fd = ld(cu, D(dout), (size_t)N * OC), *fi = ld(cu, D(inp), (size_t)N * IC);
	float *fw = ld(cu, D(w), (size_t)OC * IC), *ones = ones_of(N), *fdi = NULL;
	void *di = D(dinp);

	if (di)
		fdi = accumulate_dinp ? ld(cu, di, (size_t)N * IC)
				      : xcalloc((size_t)N * IC, sizeof(float));
	mr_matmul_bwd(NULL, fdi, D(dw), D(dbias), fd, fi, fw, N, IC, OC, accumulate_dinp, ones);
	if (di)
		st(cu, di, fdi, (size_t)N * IC);
	free(fd);
	free(fi);
	free(fw);
	free(fdi);
	free(ones);
	return 0;
}

/* The GELU_AUX_BIAS epilogue's rounding with bf16 activations: pre and
 * its GELU from the fp32 product, each stored once (fp32: the same
 * numbers as the GEMM, then the GELU of what it stored). */
int mr_cuda_matmul_gelu_fwd(struct mr_cuda *cu, void *out, void *pre, const void *inp,
			    const void *w, const void *bias, int N, int IC, int OC)
{
	CALL(out, pre, inp, w, bias, N, IC, OC);
	if (!out || !pre)
		return MR_EINVAL;
	size_t n = (size_t)N * OC;
	float *fi = ld(cu, D(inp), (size_t)N * IC), *fw = ld(cu, D(w), (size_t)OC * IC);
	float *fb = ld(cu, D(bias), (size_t)OC), *fo = xalloc(sizeof(float) * n);

	mr_matmul_fwd(NULL, fo, fi, fw, fb, N, IC, OC);
	st(cu, D(pre), fo, n); /* fp32: pre holds fo's values as they are */
	if (cu->act != MR_CUDA_F32)
		gelu_fused[cu->device]++;
	mr_gelu_fwd(NULL, fo, fo, n);
	st(cu, D(out), fo, n);
	free(fi);
	free(fw);
	free(fb);
	free(fo);
	return 0;
}

/* The DGELU epilogue's rounding: the product and its GELU gradient in
 * fp32, one store. */
int mr_cuda_matmul_dgelu_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
			     const void *dout, const void *inp, const void *w, const void *pre,
			     int N, int IC, int OC)
{
	CALL(dinp, dw, dbias, dout, inp, w, pre, N, IC, OC);
	size_t n = (size_t)N * IC;
	float *fd = ld(cu, D(dout), (size_t)N * OC), *fi = ld(cu, D(inp), n);
	float *fw = ld(cu, D(w), (size_t)OC * IC), *fp = ld(cu, D(pre), n);
	float *fdi = xcalloc(n, sizeof(float)), *ones = ones_of(N);

	if (!dinp || !pre)
		return MR_EINVAL;
	mr_matmul_bwd(NULL, fdi, D(dw), D(dbias), fd, fi, fw, N, IC, OC, 0, ones);
	mr_gelu_bwd(NULL, fdi, fp, fdi, n);
	st(cu, D(dinp), fdi, n);
	free(fd);
	free(fi);
	free(fw);
	free(fp);
	free(fdi);
	free(ones);
	return 0;
}

/* The batched entries: per item, the entry above on its slices. */
int mr_cuda_matmul_fwd_batched(struct mr_cuda *cu, void *out, const void *inp, const void *w,
			       const void *bias, int batch, int N, int IC, int OC)
{
	size_t e = esz(cu), sw = (size_t)OC * IC * e;
	int b, rc = 0;

	for (b = 0; b < batch && rc == 0; b++)
		rc = mr_cuda_matmul_fwd(cu, (char *)out + b * (size_t)N * OC * e,
					(const char *)inp + b * (size_t)N * IC * e,
					(const char *)w + b * sw,
					bias ? (const char *)bias + b * (size_t)OC * e : NULL, N, IC,
					OC);
	return rc;
}

int mr_cuda_matmul_gelu_fwd_batched(struct mr_cuda *cu, void *out, void *pre, const void *inp,
				    const void *w, const void *bias, int batch, int N, int IC,
				    int OC)
{
	size_t e = esz(cu), so = (size_t)N * OC * e, sw = (size_t)OC * IC * e;
	int b, rc = 0;

	for (b = 0; b < batch && rc == 0; b++)
		rc = mr_cuda_matmul_gelu_fwd(cu, (char *)out + b * so, (char *)pre + b * so,
					     (const char *)inp + b * (size_t)N * IC * e,
					     (const char *)w + b * sw,
					     bias ? (const char *)bias + b * (size_t)OC * e : NULL,
					     N, IC, OC);
	return rc;
}

int mr_cuda_matmul_bwd_batched(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
			       const void *dout, const void *inp, const void *w, int batch, int N,
			       int IC, int OC)
{
	size_t e = esz(cu), sw = (size_t)OC * IC;
	int b, rc = 0;

	for (b = 0; b < batch && rc == 0; b++)
		rc = mr_cuda_matmul_bwd(cu, dinp ? (char *)dinp + b * (size_t)N * IC * e : NULL,
					dw ? dw + b * sw : NULL,
					dbias ? dbias + b * (size_t)OC : NULL,
					(const char *)dout + b * (size_t)N * OC * e,
					(const char *)inp + b * (size_t)N * IC * e,
					(const char *)w + b * sw * e, N, IC, OC, 0);
	return rc;
}

int mr_cuda_matmul_dgelu_bwd_batched(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
				     const void *dout, const void *inp, const void *w,
				     const void *pre, int batch, int N, int IC, int OC)
{
	size_t e = esz(cu), sw = (size_t)OC * IC, si = (size_t)N * IC * e;
	int b, rc = 0;

	for (b = 0; b < batch && rc == 0; b++)
		rc = mr_cuda_matmul_dgelu_bwd(cu, (char *)dinp + b * si, dw ? dw + b * sw : NULL,
					      dbias ? dbias + b * (size_t)OC : NULL,
					      (const char *)dout + b * (size_t)N * OC * e,
					      (const char *)inp + b * si,
					      (const char *)w + b * sw * e,
					      (const char *)pre + b * si, N, IC, OC);
	return rc;
}

int mr_cuda_matmul_fwd_f32(struct mr_cuda *cu, float *out, const float *inp, const float *w,
			   const float *bias, int N, int IC, int OC)
{
	CALL(out, inp, w, bias, N, IC, OC);
	mr_matmul_fwd(NULL, D(out), D(inp), D(w), D(bias), N, IC, OC);
	return 0;
}

/* ---- embedding, layernorm, elementwise, cross-entropy -------------------------- */

int mr_cuda_encoder_fwd(struct mr_cuda *cu, void *out, const int *tok, const void *wte,
			const void *wpe, int B, int T, int C)
{
	CALL(out, tok, wte, wpe, B, T, C);
	size_t n = (size_t)B * T * C;
	const int *tk = D(tok);
	int V = 0, i;
	float *fe, *fp, *fo = xalloc(sizeof(float) * n);

	for (i = 0; i < B * T; i++) /* wte rows read: up to the largest token */
		if (tk[i] + 1 > V)
			V = tk[i] + 1;
	fe = ld(cu, D(wte), (size_t)V * C);
	fp = ld(cu, D(wpe), (size_t)T * C);
	mr_encoder_fwd(NULL, fo, tk, fe, fp, B, T, C);
	st(cu, D(out), fo, n);
	free(fe);
	free(fp);
	free(fo);
	return 0;
}

int mr_cuda_encoder_bwd(struct mr_cuda *cu, float *dwte, float *dwpe, const void *dout,
			const int *tok_host, int B, int T, int C, int V)
{
	CALL(dwte, dwpe, dout, tok_host, B, T, C); /* V: not read by a launch */
	float *fd;
	int i;

	for (i = 0; i < B * T; i++)
		if (tok_host[i] >= V) {
			snprintf(cu->err, sizeof(cu->err), "encoder_bwd: token '%d' out of range",
				 tok_host[i]);
			return MR_ERANGE;
		}
	fd = ld(cu, D(dout), (size_t)B * T * C);
	mr_encoder_bwd(NULL, D(dwte), D(dwpe), fd, tok_host, B, T, C);
	free(fd);
	return 0;
}

int mr_cuda_add_pos(struct mr_cuda *cu, void *out, const void *wpe, int n, int C, int period,
		    int off)
{
	CALL(out, wpe, n, C, period, off);
	void *o_ = D(out);
	const void *w = D(wpe);
	int i, c;

	for (i = 0; i < n; i++)
		for (c = 0; c < C; c++) {
			size_t o = (size_t)i * C + c, p = (size_t)(off + i % period) * C + c;
			st1(cu, o_, o, ld1(cu, o_, o) + ld1(cu, w, p));
		}
	return 0;
}

int mr_cuda_layernorm_fwd(struct mr_cuda *cu, void *out, float *mean, float *rstd,
			  const void *inp, const void *w, const void *b, int N, int C)
{
	CALL(out, mean, rstd, inp, w, b, N, C);
	size_t n = (size_t)N * C;
	float *fi = ld(cu, D(inp), n), *fw = ld(cu, D(w), (size_t)C), *fb = ld(cu, D(b), (size_t)C);
	float *fo = xalloc(sizeof(float) * n);

	mr_layernorm_fwd(NULL, fo, D(mean), D(rstd), fi, fw, fb, N, C);
	st(cu, D(out), fo, n);
	free(fi);
	free(fw);
	free(fb);
	free(fo);
	return 0;
}

/* The fused kernel's bits are the two kernels' (layernorm.cu). */
int mr_cuda_add_layernorm_fwd(struct mr_cuda *cu, void *y, void *out, float *mean, float *rstd,
			      const void *x, const void *w, const void *b, int N, int C)
{
	CALL(y, out, mean, rstd, x, w, b, N, C);
	int rc;

	cu->nested++;
	rc = mr_cuda_add_inplace(cu, y, x, (size_t)N * C);
	if (rc == 0)
		rc = mr_cuda_layernorm_fwd(cu, out, mean, rstd, y, w, b, N, C);
	cu->nested--;
	return rc;
}

int mr_cuda_layernorm_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *db, const void *dout,
			  const void *inp, const void *w, const float *mean, const float *rstd,
			  int N, int C)
{
	CALL(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
	size_t n = (size_t)N * C;
	void *di = D(dinp);
	float *fdi = ld(cu, di, n), *fd = ld(cu, D(dout), n), *fi = ld(cu, D(inp), n);
	float *fw = ld(cu, D(w), (size_t)C);
	float *ws = xalloc(sizeof(float) * (mr_layernorm_ws_floats(NULL, C) + 1));

	mr_layernorm_bwd(NULL, fdi, D(dw), D(db), fd, fi, fw, D(mean), D(rstd), N, C, ws);
	st(cu, di, fdi, n);
	free(fdi);
	free(fd);
	free(fi);
	free(fw);
	free(ws);
	return 0;
}

int mr_cuda_rmsnorm_fwd(struct mr_cuda *cu, void *out, float *rstd, const void *inp,
			const void *w, int N, int C, float eps)
{
	CALL(out, rstd, inp, w, N, C, eps);
	size_t n = (size_t)N * C;
	float *fi = ld(cu, D(inp), n), *fw = ld(cu, D(w), (size_t)C);
	float *fo = xalloc(sizeof(float) * n);

	mr_rmsnorm_fwd(NULL, fo, D(rstd), fi, fw, N, C, eps);
	st(cu, D(out), fo, n);
	free(fi);
	free(fw);
	free(fo);
	return 0;
}

int mr_cuda_rmsnorm_bwd(struct mr_cuda *cu, void *dinp, float *dw, const void *dout,
			const void *inp, const void *w, const float *rstd, int N, int C)
{
	CALL(dinp, dw, dout, inp, w, rstd, N, C);
	size_t n = (size_t)N * C;
	void *di = D(dinp);
	float *fdi = ld(cu, di, n), *fd = ld(cu, D(dout), n), *fi = ld(cu, D(inp), n);
	float *fw = ld(cu, D(w), (size_t)C);
	float *ws = xalloc(sizeof(float) * (mr_rmsnorm_ws_floats(NULL, C) + 1));

	mr_rmsnorm_bwd(NULL, fdi, D(dw), fd, fi, fw, D(rstd), N, C, ws);
	st(cu, di, fdi, n);
	free(fdi);
	free(fd);
	free(fi);
	free(fw);
	free(ws);
	return 0;
}

/* The rows' whole span (the twin rotates only the heads; the rest goes
 * back as it came, bf16 -> fp32 -> bf16 being exact). */
static int rope_emul(struct mr_cuda *cu, void *x, size_t stride, int N, int nheads, int Dh,
		     const int *pos, const float *inv_freq, int fwd)
{
	size_t n = (size_t)(N - 1) * stride + (size_t)nheads * Dh;
	void *h = D(x);
	float *f;

	if (N <= 0 || nheads <= 0 || Dh <= 0 || Dh % 2 || stride < (size_t)nheads * Dh)
		return MR_EINVAL;
	f = ld(cu, h, n);

	(fwd ? mr_rope_fwd : mr_rope_bwd)(NULL, f, stride, N, nheads, Dh, D(pos), D(inv_freq));
	st(cu, h, f, n);
	free(f);
	return 0;
}

int mr_cuda_rope_fwd(struct mr_cuda *cu, void *x, size_t stride, int N, int nheads, int D,
		     const int *pos, const float *inv_freq)
{
	CALL(x, stride, N, nheads, D, pos, inv_freq);
	return rope_emul(cu, x, stride, N, nheads, D, pos, inv_freq, 1);
}

int mr_cuda_rope_bwd(struct mr_cuda *cu, void *dx, size_t stride, int N, int nheads, int D,
		     const int *pos, const float *inv_freq)
{
	CALL(dx, stride, N, nheads, D, pos, inv_freq);
	return rope_emul(cu, dx, stride, N, nheads, D, pos, inv_freq, 0);
}

int mr_cuda_swiglu_fwd(struct mr_cuda *cu, void *out, const void *ab, int N, int F)
{
	CALL(out, ab, N, F);
	float *fab = ld(cu, D(ab), (size_t)N * 2 * F), *fo = xalloc(sizeof(float) * N * F);

	mr_swiglu_fwd(NULL, fo, fab, N, F);
	st(cu, D(out), fo, (size_t)N * F);
	free(fab);
	free(fo);
	return 0;
}

int mr_cuda_swiglu_bwd(struct mr_cuda *cu, void *dab, const void *ab, const void *dout, int N,
		       int F)
{
	CALL(dab, ab, dout, N, F);
	float *fab = ld(cu, D(ab), (size_t)N * 2 * F), *fd = ld(cu, D(dout), (size_t)N * F);
	float *fdab = xalloc(sizeof(float) * (size_t)N * 2 * F);

	/* not in place: the CPU twin reads a row's a after writing its da
	 * (the device kernel holds both in registers, so dab may alias ab) */
	mr_swiglu_bwd(NULL, fdab, fab, fd, N, F);
	st(cu, D(dab), fdab, (size_t)N * 2 * F);
	free(fab);
	free(fd);
	free(fdab);
	return 0;
}

int mr_cuda_gelu_fwd(struct mr_cuda *cu, void *out, const void *inp, size_t n)
{
	CALL(out, inp, n);
	float *f = ld(cu, D(inp), n);

	mr_gelu_fwd(NULL, f, f, n);
	st(cu, D(out), f, n);
	free(f);
	return 0;
}

int mr_cuda_gelu_bwd(struct mr_cuda *cu, void *dinp, const void *inp, const void *dout,
		     size_t n)
{
	CALL(dinp, inp, dout, n);
	float *fi = ld(cu, D(inp), n), *fd = ld(cu, D(dout), n);

	mr_gelu_bwd(NULL, fd, fi, fd, n);
	st(cu, D(dinp), fd, n);
	free(fi);
	free(fd);
	return 0;
}

int mr_cuda_residual_fwd(struct mr_cuda *cu, void *out, const void *a, const void *b, size_t n)
{
	CALL(out, a, b, n);
	void *o = D(out);
	const void *x = D(a), *y = D(b);
	size_t i;

	for (i = 0; i < n; i++)
		st1(cu, o, i, ld1(cu, x, i) + ld1(cu, y, i));
	return 0;
}

int mr_cuda_add_inplace(struct mr_cuda *cu, void *y, const void *x, size_t n)
{
	CALL(y, x, n);
	int rc;

	cu->nested++;
	rc = mr_cuda_residual_fwd(cu, y, y, x, n);
	cu->nested--;
	return rc;
}

int mr_cuda_add_bias(struct mr_cuda *cu, void *rows, const void *bias, int n, int C)
{
	CALL(rows, bias, n, C);
	void *r = D(rows);
	const void *b = D(bias);
	int i, c;

	for (i = 0; i < n; i++)
		for (c = 0; c < C; c++) {
			size_t o = (size_t)i * C + c;
			st1(cu, r, o, ld1(cu, r, o) + ld1(cu, b, (size_t)c));
		}
	return 0;
}

int mr_cuda_fill_cols(struct mr_cuda *cu, void *x, int N, int V, int from, float value)
{
	CALL(x, N, V, from, value);
	void *h = D(x);
	int i, v;

	for (i = 0; i < N; i++)
		for (v = from; v < V; v++)
			st1(cu, h, (size_t)i * V + v, value);
	return 0;
}

int mr_cuda_add_f32(struct mr_cuda *cu, float *y, const float *x, size_t n)
{
	CALL(y, x, n);
	float *hy = D(y);
	const float *hx = D(x);
	size_t i;

	for (i = 0; i < n; i++)
		hy[i] += hx[i];
	return 0;
}

int mr_cuda_crossentropy_fwd(struct mr_cuda *cu, float *losses, float *lse, const void *logits,
			     const int *targets, int N, int V)
{
	CALL(losses, lse, logits, targets, N, V);
	float *f = ld(cu, D(logits), (size_t)N * V);

	mr_crossentropy_fwd(NULL, D(losses), D(lse), f, D(targets), N, V);
	free(f);
	return 0;
}

int mr_cuda_crossentropy_bwd_inplace(struct mr_cuda *cu, void *logits, const float *lse,
				     const int *targets, int N, int V, float dscale)
{
	CALL(logits, lse, targets, N, V, dscale);
	void *h = D(logits);
	float *f = ld(cu, h, (size_t)N * V);

	mr_crossentropy_bwd_inplace(NULL, f, D(lse), D(targets), N, V, dscale);
	st(cu, h, f, (size_t)N * V);
	free(f);
	return 0;
}

int mr_cuda_crossentropy_rowmax(struct mr_cuda *cu, float *mx, const void *logits, int N, int V)
{
	CALL(mx, logits, N, V);
	float *f = ld(cu, D(logits), (size_t)N * V);

	mr_crossentropy_rowmax(NULL, D(mx), f, N, V);
	free(f);
	return 0;
}

int mr_cuda_crossentropy_sumexp(struct mr_cuda *cu, float *sum, float *tlogit, const void *logits,
				const float *mx, const int *targets, int N, int V)
{
	CALL(sum, tlogit, logits, mx, targets, N, V);
	float *f = ld(cu, D(logits), (size_t)N * V);

	mr_crossentropy_sumexp(NULL, D(sum), D(tlogit), f, D(mx), D(targets), N, V);
	free(f);
	return 0;
}

int mr_cuda_crossentropy_finish(struct mr_cuda *cu, float *losses, float *lse, const float *mx,
				const float *sum, const float *tlogit, int N)
{
	CALL(losses, lse, mx, sum, tlogit, N);
	float *hl = D(losses), *he = D(lse);
	const float *hm = D(mx), *hs = D(sum), *ht = D(tlogit);
	int i;

	for (i = 0; i < N; i++) {
		he[i] = hm[i] + logf(hs[i] > 0.0f ? hs[i] : 1.0f);
		hl[i] = he[i] - ht[i];
	}
	return 0;
}

/* ---- attention (per batch and head through the CPU head kernels) -------------- */

/* n rows of hs values at element base (row stride `row`) as a contiguous
 * fp32 (n, hs). */
static float *gather(const struct mr_cuda *cu, const void *x, size_t base, size_t row, int n,
		     int hs)
{
	float *f = xalloc(sizeof(float) * (size_t)n * hs);
	int i, c;

	for (i = 0; i < n; i++)
		for (c = 0; c < hs; c++)
			f[(size_t)i * hs + c] = ld1(cu, x, base + i * row + c);
	return f;
}

/* Rows at element base += f (n, hs): fp32 gradients as they are, the
 * activation type rounding each sum once. */
static void add_rows(const struct mr_cuda *cu, void *x, int f32, size_t base, size_t row,
		     const float *f, int n, int hs)
{
	int i, c;

	for (i = 0; i < n; i++)
		for (c = 0; c < hs; c++) {
			size_t o = base + i * row + c;
			float v = f[(size_t)i * hs + c];
			if (f32)
				((float *)x)[o] += v;
			else
				st1(cu, x, o, ld1(cu, x, o) + v);
		}
}

/* The attention arguments with host addresses for q, k, v. */
static struct mr_cuda_attn attn_host(struct mr_cuda *cu, const struct mr_cuda_attn *a)
{
	struct mr_cuda_attn h = *a;

	h.q = D(a->q);
	h.k = D(a->k);
	h.v = D(a->v);
	return h;
}

/* Key/value heads of a (0: NH). */
static int attn_nkv(const struct mr_cuda_attn *a)
{
	return a->NKV ? a->NKV : a->NH;
}

/* The key/value head query head h reads. */
static int kv_head(const struct mr_cuda_attn *a, int h)
{
	return h / (a->NH / attn_nkv(a));
}

/* Query head h of batch b and the key/value head it reads (a holds host
 * addresses). */
static struct mr_attn_head head_of(const struct mr_cuda *cu, const struct mr_cuda_attn *a,
				   int b, int h, int bq, int bk, float **q, float **k, float **v)
{
	struct mr_attn_head hd;
	int hs = a->hs;

	*q = gather(cu, a->q, b * a->q_batch + (size_t)h * hs, a->q_row, a->tq, hs);
	*k = gather(cu, a->k, b * a->kv_batch + (size_t)kv_head(a, h) * hs, a->kv_row, a->tk, hs);
	*v = gather(cu, a->v, b * a->kv_batch + (size_t)kv_head(a, h) * hs, a->kv_row, a->tk, hs);
	memset(&hd, 0, sizeof(hd));
	hd.q = *q;
	hd.k = *k;
	hd.v = *v;
	hd.q_stride = hd.kv_stride = (size_t)hs;
	hd.tq = a->tq;
	hd.q_pos0 = a->q_pos0;
	hd.tk = a->tk;
	hd.k_pos0 = a->k_pos0;
	hd.hs = hs;
	hd.causal = a->causal;
	hd.scale = a->scale;
	hd.bq = bq;
	hd.bk = bk;
	return hd;
}

/* The device kernels' shape limits. */
static int attn_shape_ok(const struct mr_cuda_attn *a)
{
	return a->B > 0 && a->NH > 0 && a->tq > 0 && a->tk > 0 && a->hs > 0 && a->hs % 32 == 0 &&
	       a->hs <= 128 && (long)a->B * a->NH <= 65535 && a->NKV >= 0 && a->NKV <= a->NH &&
	       a->NH % attn_nkv(a) == 0;
}

/* Forward into out of the activation type (f32 0) or fp32 (f32 1); every
 * pointer is a host address. */
static int attn_fwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, void *out, int f32,
		    size_t o_row, size_t o_batch, float *lse)
{
	float *ws, *fo, *q, *k, *v;
	int b, h, i, c, hs = a->hs;

	if (!attn_shape_ok(a)) {
		snprintf(cu->err, sizeof(cu->err), "unsupported shape for 'attn_fwd'");
		return MR_EINVAL;
	}
	ws = xalloc(sizeof(float) * mr_attn_head_ws_floats(MR_ATTN_FWD_BQ, MR_ATTN_FWD_BK, hs));
	fo = xalloc(sizeof(float) * (size_t)a->tq * hs);
	for (b = 0; b < a->B; b++)
		for (h = 0; h < a->NH; h++) {
			struct mr_attn_head hd = head_of(cu, a, b, h, MR_ATTN_FWD_BQ,
							 MR_ATTN_FWD_BK, &q, &k, &v);
			mr_attn_head_fwd(&hd, fo, (size_t)hs,
					 lse + ((size_t)b * a->NH + h) * a->tq, ws);
			for (i = 0; i < a->tq; i++)
				for (c = 0; c < hs; c++) {
					size_t o = b * o_batch + i * o_row + (size_t)h * hs + c;
					float x = fo[(size_t)i * hs + c];
					if (f32)
						((float *)out)[o] = x;
					else
						st1(cu, out, o, x);
				}
			free(q);
			free(k);
			free(v);
		}
	free(ws);
	free(fo);
	return 0;
}

int mr_cuda_attn_fwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, void *out, size_t o_row,
		     size_t o_batch, float *lse)
{
	CALL(h_attn(a), out, o_row, o_batch, lse);
	struct mr_cuda_attn h = attn_host(cu, a);

	return attn_fwd(cu, &h, D(out), 0, o_row, o_batch, D(lse));
}

int mr_cuda_attn_fwd_f32(struct mr_cuda *cu, const struct mr_cuda_attn *a, float *out,
			 size_t o_row, size_t o_batch, float *lse)
{
	CALL(h_attn(a), out, o_row, o_batch, lse);
	struct mr_cuda_attn h = attn_host(cu, a);

	return attn_fwd(cu, &h, D(out), 1, o_row, o_batch, D(lse));
}

int mr_cuda_attn_merge(struct mr_cuda *cu, float *out_a, float *lse_a, const float *out_b,
		       const float *lse_b, int B, int NH, int tq, int hs, size_t o_row,
		       size_t o_batch)
{
	CALL(out_a, lse_a, out_b, lse_b, B, NH, tq, hs, o_row, o_batch);
	float *oa = D(out_a), *la = D(lse_a);
	const float *ob = D(out_b), *lb = D(lse_b);
	int b, h;

	for (b = 0; b < B; b++)
		for (h = 0; h < NH; h++) {
			size_t o = b * o_batch + (size_t)h * hs, r = ((size_t)b * NH + h) * tq;
			mr_attn_merge(oa + o, o_row, la + r, ob + o, o_row, lb + r, tq, hs);
		}
	return 0;
}

int mr_cuda_attn_delta(struct mr_cuda *cu, float *delta, const void *dout, const void *out,
		       int B, int NH, int tq, int hs, size_t o_row, size_t o_batch)
{
	CALL(delta, dout, out, B, NH, tq, hs, o_row, o_batch);
	float *hd = D(delta);
	const void *d = D(dout), *y = D(out);
	int b, h, i, c;

	for (b = 0; b < B; b++)
		for (h = 0; h < NH; h++)
			for (i = 0; i < tq; i++) {
				size_t o = b * o_batch + i * o_row + (size_t)h * hs;
				float s = 0.0f;
				for (c = 0; c < hs; c++)
					s += ld1(cu, d, o + c) * ld1(cu, y, o + c);
				hd[((size_t)b * NH + h) * tq + i] = s;
			}
	return 0;
}

/* Backward adding into dq/dk/dv of the activation type (f32 0) or fp32;
 * every pointer is a host address. */
static int attn_bwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, const void *dout,
		    size_t o_row, size_t o_batch, const float *lse, const float *delta, void *dq,
		    size_t dq_row, size_t dq_batch, void *dk, void *dv, size_t dkv_row,
		    size_t dkv_batch, int f32)
{
	float *ws, *q, *k, *v, *d, *fq, *fk, *fv;
	int b, h, hs = a->hs;

	if (!attn_shape_ok(a)) {
		snprintf(cu->err, sizeof(cu->err), "unsupported shape for 'attn_bwd'");
		return MR_EINVAL;
	}
	ws = xalloc(sizeof(float) * mr_attn_head_ws_floats(MR_ATTN_BWD_BQ, MR_ATTN_BWD_BK, hs));
	for (b = 0; b < a->B; b++)
		for (h = 0; h < a->NH; h++) {
			struct mr_attn_head hd = head_of(cu, a, b, h, MR_ATTN_BWD_BQ,
							 MR_ATTN_BWD_BK, &q, &k, &v);
			size_t r = ((size_t)b * a->NH + h) * a->tq;
			size_t kvo = b * dkv_batch + (size_t)kv_head(a, h) * hs;

			d = gather(cu, dout, b * o_batch + (size_t)h * hs, o_row, a->tq, hs);
			fq = xcalloc((size_t)a->tq * hs, sizeof(float));
			fk = xcalloc((size_t)a->tk * hs, sizeof(float));
			fv = xcalloc((size_t)a->tk * hs, sizeof(float));
			mr_attn_head_bwd(&hd, d, (size_t)hs, lse + r, delta + r, fq, (size_t)hs, fk,
					 fv, (size_t)hs, ws);
			add_rows(cu, dq, f32, b * dq_batch + (size_t)h * hs, dq_row, fq, a->tq, hs);
			/* a key/value head's query heads add in head order */
			add_rows(cu, dk, f32, kvo, dkv_row, fk, a->tk, hs);
			add_rows(cu, dv, f32, kvo, dkv_row, fv, a->tk, hs);
			free(q);
			free(k);
			free(v);
			free(d);
			free(fq);
			free(fk);
			free(fv);
		}
	free(ws);
	return 0;
}

int mr_cuda_attn_bwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, const void *dout,
		     size_t o_row, size_t o_batch, const float *lse, const float *delta, void *dq,
		     size_t dq_row, size_t dq_batch, void *dk, void *dv, size_t dkv_row,
		     size_t dkv_batch)
{
	CALL(h_attn(a), dout, o_row, o_batch, lse, delta, dq, dq_row, dq_batch, dk, dv, dkv_row,
	     dkv_batch);
	struct mr_cuda_attn h = attn_host(cu, a);

	return attn_bwd(cu, &h, D(dout), o_row, o_batch, D(lse), D(delta), D(dq), dq_row,
			dq_batch, D(dk), D(dv), dkv_row, dkv_batch, 0);
}

int mr_cuda_attn_bwd_f32(struct mr_cuda *cu, const struct mr_cuda_attn *a, const void *dout,
			 size_t o_row, size_t o_batch, const float *lse, const float *delta,
			 float *dq, size_t dq_row, size_t dq_batch, float *dk, float *dv,
			 size_t dkv_row, size_t dkv_batch)
{
	CALL(h_attn(a), dout, o_row, o_batch, lse, delta, dq, dq_row, dq_batch, dk, dv, dkv_row,
	     dkv_batch);
	struct mr_cuda_attn h = attn_host(cu, a);

	return attn_bwd(cu, &h, D(dout), o_row, o_batch, D(lse), D(delta), D(dq), dq_row,
			dq_batch, D(dk), D(dv), dkv_row, dkv_batch, 1);
}

/* The layer entries: the CPU layer twins on the whole packed qkv
 * (B,T,C+2*NKV*hs) (the device's limits on the head size still apply). */
static int layer_ok(struct mr_cuda *cu, int B, int T, int C, int NH, int NKV)
{
	struct mr_cuda_attn a;

	memset(&a, 0, sizeof(a));
	a.B = B;
	a.NH = NH;
	a.NKV = NKV;
	a.tq = a.tk = T;
	a.hs = NH > 0 && C % NH == 0 ? C / NH : 0;
	if (NKV > 0 && attn_shape_ok(&a))
		return 1;
	snprintf(cu->err, sizeof(cu->err), "unsupported shape for 'attn_layer'");
	return 0;
}

/* Elements of the layer's qkv (B,T,C+2*NKV*hs). */
static size_t layer_qkv(int B, int T, int C, int NH, int NKV)
{
	return (size_t)B * T * ((size_t)C + 2 * (size_t)NKV * (size_t)(C / NH));
}

int mr_cuda_attn_layer_fwd(struct mr_cuda *cu, void *out, float *lse, const void *qkv, int B,
			   int T, int C, int NH, int NKV)
{
	CALL(out, lse, qkv, B, T, C, NH, NKV);
	size_t n = (size_t)B * T * C;
	float *fq, *fo, *ws;

	if (!layer_ok(cu, B, T, C, NH, NKV))
		return MR_EINVAL;
	fq = ld(cu, D(qkv), layer_qkv(B, T, C, NH, NKV));
	fo = xalloc(sizeof(float) * n);
	ws = xalloc(sizeof(float) * mr_attn_layer_ws_floats(NULL, T, C / NH));
	mr_attn_layer_fwd(NULL, fo, D(lse), fq, B, T, C, NH, NKV, ws);
	st(cu, D(out), fo, n);
	free(fq);
	free(fo);
	free(ws);
	return 0;
}

int mr_cuda_attn_layer_bwd(struct mr_cuda *cu, void *dqkv, const void *dout, const void *qkv,
			   const void *out, const float *lse, int B, int T, int C, int NH, int NKV)
{
	CALL(dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
	size_t n = (size_t)B * T * C, nqkv;
	float *fd, *fq, *fo, *fdq, *ws;

	if (!layer_ok(cu, B, T, C, NH, NKV))
		return MR_EINVAL;
	nqkv = layer_qkv(B, T, C, NH, NKV);
	fd = ld(cu, D(dout), n);
	fq = ld(cu, D(qkv), nqkv);
	fo = ld(cu, D(out), n);
	fdq = xalloc(sizeof(float) * nqkv);
	ws = xalloc(sizeof(float) * mr_attn_layer_ws_floats(NULL, T, C / NH));
	mr_attn_layer_bwd(NULL, fdq, fd, fq, fo, D(lse), B, T, C, NH, NKV, ws);
	st(cu, D(dqkv), fdq, nqkv);
	free(fd);
	free(fq);
	free(fo);
	free(fdq);
	free(ws);
	return 0;
}

/* ---- mixture of experts (kernels/moe.c's pieces) --------------------------------- */

/* A struct mr_moe_acts over the tensors the entries name (host
 * addresses). */
static struct mr_moe_acts moe_view(float *probs, const int *topi, const float *gate,
				   const int *slot, int *count, const int *routed)
{
	struct mr_moe_acts a;

	memset(&a, 0, sizeof(a));
	a.probs = probs;
	a.topi = (int *)(uintptr_t)topi;
	a.gate = (float *)(uintptr_t)gate;
	a.slot = (int *)(uintptr_t)slot;
	a.count = count;
	a.routed = (int *)(uintptr_t)routed;
	return a;
}

int mr_cuda_moe_route(struct mr_cuda *cu, const struct mr_moe_shape *s, float *probs, int *topi,
		      float *gate, int *slot, int *count, int *routed, int *stat, const void *x,
		      const void *routerw, int *count_host, float *aux_host, int *dropped_host)
{
	if (count_host) /* the host path's counts go to the host */
		HOST_ONLY("moe_route");
	else
		CALL(h_moe(s), probs, topi, gate, slot, count, routed, stat, x, routerw);
	float *fx = ld(cu, D(x), (size_t)s->N * s->C);
	float *fw = ld(cu, D(routerw), (size_t)s->E * s->C);
	struct mr_moe_acts a = moe_view(D(probs), D(topi), D(gate), D(slot), D(count), D(routed));

	if (!count_host && !stat)
		return MR_EINVAL;
	mr_matmul_fwd(NULL, a.probs, fx, fw, NULL, s->N, s->C, s->E);
	mr_moe_route(s, &a);
	if (count_host) { /* the host path's read-back */
		host_reads[cu->device]++;
		memcpy(count_host, a.count, sizeof(int) * (size_t)s->E);
		*aux_host = a.aux;
		*dropped_host = a.dropped;
	} else {
		int *hs = D(stat);

		memcpy(&hs[0], &a.aux, sizeof(float));
		hs[1] = a.dropped;
	}
	free(fx);
	free(fw);
	return 0;
}

int mr_cuda_moe_aux(struct mr_cuda *cu, const struct mr_moe_shape *s, int *stat,
		    const float *probs, const int *routed, int ranks)
{
	CALL(h_moe(s), stat, probs, routed, ranks);
	float aux;

	if (ranks < 1 || !stat)
		return MR_EINVAL;
	aux = mr_moe_aux(s, D(probs), D(routed), ranks);
	memcpy(D(stat), &aux, sizeof(float));
	return 0;
}

int mr_cuda_moe_dispatch(struct mr_cuda *cu, const struct mr_moe_shape *s, void *xin,
			 const void *x, const int *topi, const int *slot)
{
	CALL(h_moe(s), xin, x, topi, slot);
	size_t row = (size_t)s->C * esz(cu);
	char *hin = D(xin);
	const char *hx = D(x);
	const int *ti = D(topi), *sl = D(slot);
	int a;

	/* a copy of rows: the same bytes in either activation type */
	for (a = 0; a < s->N * s->k; a++)
		if (sl[a] >= 0)
			memcpy(hin + ((size_t)ti[a] * s->cap + sl[a]) * row,
			       hx + (size_t)(a / s->k) * row, row);
	return 0;
}

int mr_cuda_moe_combine(struct mr_cuda *cu, const struct mr_moe_shape *s, void *y,
			const void *rows, const int *topi, const int *slot, const float *gate)
{
	CALL(h_moe(s), y, rows, topi, slot, gate);
	size_t ny = (size_t)s->N * s->C;
	float *fr = ld(cu, D(rows), (size_t)s->E * s->cap * s->C), *fy = xalloc(sizeof(float) * ny);
	struct mr_moe_acts a = moe_view(NULL, D(topi), D(gate), D(slot), NULL, NULL);

	mr_moe_combine(s, &a, gate != NULL, fy, fr);
	st(cu, D(y), fy, ny);
	free(fr);
	free(fy);
	return 0;
}

int mr_cuda_moe_combine_bwd(struct mr_cuda *cu, const struct mr_moe_shape *s, void *dyo,
			    float *dgate, const void *dy, const void *yo, const int *topi,
			    const int *slot, const float *gate)
{
	CALL(h_moe(s), dyo, dgate, dy, yo, topi, slot, gate);
	size_t nr = (size_t)s->E * s->cap * s->C;
	void *hdyo = D(dyo);
	float *fdy = ld(cu, D(dy), (size_t)s->N * s->C), *fyo = ld(cu, D(yo), nr);
	float *fdyo = ld(cu, hdyo, nr); /* rows it does not write keep their bytes */
	struct mr_moe_acts a = moe_view(NULL, D(topi), D(gate), D(slot), NULL, NULL);

	mr_moe_combine_bwd(s, &a, fdyo, D(dgate), fdy, fyo);
	st(cu, hdyo, fdyo, nr);
	free(fdy);
	free(fyo);
	free(fdyo);
	return 0;
}

int mr_cuda_moe_router_bwd(struct mr_cuda *cu, const struct mr_moe_shape *s, void *dlogits,
			   const float *probs, const int *topi, const float *gate,
			   const float *dgate, const int *routed, float aux_scale)
{
	CALL(h_moe(s), dlogits, probs, topi, gate, dgate, routed, aux_scale);
	size_t n = (size_t)s->N * s->E;
	float *f = xalloc(sizeof(float) * n);
	struct mr_moe_acts a = moe_view(D(probs), D(topi), D(gate), NULL, NULL, D(routed));

	mr_moe_router_bwd(s, &a, f, D(dgate), aux_scale);
	st(cu, D(dlogits), f, n);
	free(f);
	return 0;
}

/* ---- optimizer (optim/mr_adamw.h's arithmetic) ---------------------------------- */

int mr_cuda_adamw_step(struct mr_cuda *cu, float *p, void *pc, const float *g, float *m,
		       float *v, size_t n, const struct mr_cuda_adamw *o)
{
	CALL(p, pc, g, m, v, n, h_adamw(o));
	struct mr_adamw_config c;
	float *hp = D(p), *gs = NULL;
	const float *hg = D(g);
	size_t i;

	if (o->t < 1)
		return MR_EINVAL;
	memset(&c, 0, sizeof(c));
	c.beta1 = o->beta1;
	c.beta2 = o->beta2;
	c.eps = o->eps;
	c.weight_decay = o->weight_decay;
	if (o->grad_scale != 1.0f) {
		gs = xalloc(sizeof(float) * (n ? n : 1));
		for (i = 0; i < n; i++)
			gs[i] = hg[i] * o->grad_scale;
	}
	mr_adamw_update_range(&c, o->t, o->lr, hp, gs ? gs : hg, D(m), D(v), n,
			      o->weight_decay > 0.0f);
	if (pc && pc != (void *)p)
		st(cu, D(pc), hp, n);
	free(gs);
	return 0;
}

/* The scalars as device.cu keeps them: a block every later multi reads. */
int mr_cuda_adamw_args(struct mr_cuda *cu, const struct mr_cuda_adamw *o)
{
	HOST_ONLY("adamw_args");
	if (o->t < 1)
		return MR_EINVAL;
	cu->args = *o;
	cu->has_args = 1;
	return 0;
}

/* The range table as the call's arguments: what the device's table holds. */
static uint64_t ranges_hash(const struct mr_cuda_adamw_range *r, int k)
{
	uint64_t h = mix(0xcbf29ce484222325ull, h_int(k));
	int i;

	for (i = 0; i < k; i++) {
		h = mix(mix(mix(mix(h, h_ptr(r[i].p)), h_ptr(r[i].pc)), h_ptr(r[i].g)),
			h_ptr(r[i].m));
		h = mix(mix(mix(h, h_ptr(r[i].v)), h_size(r[i].n)), h_int(r[i].decay));
	}
	return h;
}

int mr_cuda_adamw_multi(struct mr_cuda *cu, const struct mr_cuda_adamw_range *r, int k)
{
	struct mr_cuda_adamw c = cu->args;
	int i, rc = 0;

	if (graph_call(cu, __func__, ranges_hash(r, k)))
		return 0;
	if (k < 0)
		return MR_EINVAL;
	if (k > 0 && !cu->has_args)
		return MR_ESTATE;
	cu->nested++;
	for (i = 0; i < k && rc == 0; i++) {
		c.weight_decay = r[i].decay ? cu->args.weight_decay : 0.0f;
		rc = mr_cuda_adamw_step(cu, r[i].p, r[i].pc, r[i].g, r[i].m, r[i].v, r[i].n, &c);
	}
	cu->nested--;
	return rc;
}

int mr_cuda_grad_sumsq(struct mr_cuda *cu, const float *g, size_t n, double *sumsq_host)
{
	HOST_ONLY("grad_sumsq");
	host_reads[cu->device]++;
	*sumsq_host = mr_grad_sumsq(D(g), n);
	return 0;
}

int mr_cuda_grad_sumsq_ranges(struct mr_cuda *cu, const float *g, const size_t *off,
			      const size_t *n, int k, double *out_host)
{
	HOST_ONLY("grad_sumsq_ranges");
	const float *hg = D(g);
	int i;

	host_reads[cu->device]++;
	for (i = 0; i < k; i++)
		out_host[i] = mr_grad_sumsq(hg + off[i], n[i]);
	return 0;
}

int mr_cuda_scale(struct mr_cuda *cu, float *g, size_t n, float scale)
{
	CALL(g, n, scale);
	float *hg = D(g);
	size_t i;

	for (i = 0; i < n; i++)
		hg[i] *= scale;
	return 0;
}
