/*
 * mr_pp_sched.h - pipeline-parallel schedules as data: which forward and
 * backward passes a stage runs, in which order, what it sends and
 * receives around them, and a simulator that runs every stage's order
 * against the pipeline's dependencies (no compute, no communication).
 *
 * Terms. p stages (pipeline ranks) s = 0..p-1; m micro-batches per step
 * (the step's gradient accumulation); v model chunks per stage (virtual
 * stages; 1 except for interleaved). Chunk c of stage s is VIRTUAL STAGE
 * k = c*p + s, and virtual stages 0..p*v-1 hold the model's layers in
 * order (Megatron-Core): the activations of micro-batch i go 0 -> 1 ->
 * ... -> p*v-1, their gradients back.
 *
 * An action is {op, micro-batch, chunk}:
 *   F  forward of the micro-batch through the chunk;
 *   B  backward. For gpipe, 1f1b and interleaved the whole backward
 *      (input and weight gradients). For zb-h1 only the INPUT gradient
 *      (what the previous virtual stage waits for);
 *   W  zb-h1 only: the weight gradient of the micro-batch on the chunk.
 *
 * Schedules ("pp_schedule"):
 *   "gpipe"       F of micro-batches 0..m-1, then B of 0..m-1 (GPipe;
 *                 backward in micro-batch order as torch.distributed's
 *                 ScheduleGPipe).
 *   "1f1b"        Megatron-Core's non-interleaved 1F1B: warm-up of
 *                 w = min(p-s-1, m) forwards, then m-w pairs (F of the
 *                 next micro-batch, B of the oldest), then the w
 *                 remaining backwards. At most min(p-s, m) micro-batches'
 *                 activations live on stage s.
 *   "interleaved" Megatron-Core's interleaved 1F1B (micro-batch group
 *                 size per virtual stage p, its default): the stage's
 *                 m*v passes in each direction are numbered k = 0..m*v-1;
 *                 pass k is micro-batch (k / (p*v))*p + k % p on chunk
 *                 (k % (p*v)) / p, the chunk reversed (v-1-c) for
 *                 backwards. Warm-up w = min(2*(p-s-1) + (v-1)*p, m*v)
 *                 forwards, then m*v-w pairs (forward k+w, backward k),
 *                 then the remaining backwards. Needs v >= 2, p >= 2 and
 *                 m a multiple of p (as Megatron requires).
 *   "zb-h1"       Zero Bubble H1 (Qi et al., ICLR 2024, section 2.1):
 *                 1F1B's order of F and B, with W of micro-batch j placed
 *                 right after the B of micro-batch j+s (stage s defers
 *                 its first s weight-gradient passes: p-1 minus its 1F1B
 *                 warm-up); the W's with no such B (j+s >= m) close the
 *                 list in micro-batch order. With F = B = W the bubble is
 *                 a third of 1F1B's (idle (p-1)(F+B-W) per stage against
 *                 1F1B's (p-1)(F+B+W)), at 1F1B's activation memory (see
 *                 peak below).
 * With m < p, 1f1b and zb-h1 are valid: every stage's warm-up is capped
 * at m (it degenerates towards gpipe: all forwards, then all backwards on
 * the early stages), at most m micro-batches are in flight, and 1f1b's
 * bubble is still (p-1)/m (>= 1; zb-h1's is smaller, its W's still fill
 * some of it). gpipe takes any m >= 1.
 *
 * Every stage's list holds, for each micro-batch and chunk, exactly one
 * F and one B (and one W for zb-h1): 2*m*v actions (3*m for zb-h1), the
 * same count on every stage (mr_pp_len).
 *
 * Ownership: every output array is the caller's; nothing here keeps
 * state or allocates beyond one call (the simulator's scratch).
 * Non-goals: running the passes, moving tensors (the step driver does,
 * with the model and communicators), choosing m or v, layer splits
 * (mr_pp_split.h).
 */
#ifndef MR_PP_SCHED_H
#define MR_PP_SCHED_H

#include "mr_err.h"

/* Bounds checked by mr_pp_check. p*v virtual stages each hold at least
 * one layer, so MR_PP_MAX_VSTAGES is far above any real model; with it
 * every message tag (mr_pp_comm.tag) fits an int. */
#define MR_PP_MAX_STAGES 1024
#define MR_PP_MAX_VIRTUAL 64
#define MR_PP_MAX_VSTAGES 4096    /* p*v */
#define MR_PP_MAX_MICRO (1 << 16) /* m, the worker's grad_accum bound */

enum mr_pp_kind { MR_PP_GPIPE, MR_PP_1F1B, MR_PP_INTERLEAVED, MR_PP_ZBH1, MR_PP__KIND_COUNT };

enum mr_pp_op { MR_PP_F, MR_PP_B, MR_PP_W };

struct mr_pp_action {
	enum mr_pp_op op;
	int mb;    /* micro-batch, 0..m-1 */
	int chunk; /* this stage's chunk, 0..v-1 (virtual stage chunk*p + stage) */
};

struct mr_pp_spec {
	enum mr_pp_kind kind;
	int p; /* stages ("pp") */
	int m; /* micro-batches per step ("grad_accum") */
	int v; /* chunks per stage ("pp_virtual"): >= 2 for interleaved, else 1 */
};

/* "gpipe", "1f1b", "interleaved", "zb-h1"; "?" out of range. */
const char *mr_pp_kind_name(enum mr_pp_kind k);
/* The kind named name; MR_EINVAL naming the field "pp_schedule" (and the
 * choices) when name is none of them or NULL. */
int mr_pp_kind_parse(const char *name, enum mr_pp_kind *out, struct mr_errbuf *eb);

/*
 * Checks that the spec can run, naming the field: "pp" (p outside
 * 1..MR_PP_MAX_STAGES), "grad_accum" (m outside 1..MR_PP_MAX_MICRO;
 * interleaved: m not a multiple of p), "pp_virtual" (v != 1 for gpipe,
 * 1f1b and zb-h1; v outside 2..MR_PP_MAX_VIRTUAL or p < 2 for
 * interleaved; p*v > MR_PP_MAX_VSTAGES), "pp_schedule" (unknown kind).
 * Returns 0 or MR_EINVAL.
 */
int mr_pp_check(const struct mr_pp_spec *sp, struct mr_errbuf *eb);

/* Actions in every stage's list: 2*m*v (3*m for zb-h1). A negative MR_E*
 * code (as mr_pp_check, eb may be NULL) when the spec is invalid. */
int mr_pp_len(const struct mr_pp_spec *sp, struct mr_errbuf *eb);

/*
 * Writes stage's ordered action list into out (cap entries; mr_pp_len of
 * them are needed) and returns the count, or a negative MR_E* code:
 * MR_EINVAL for a spec that fails mr_pp_check or a stage outside 0..p-1,
 * MR_ERANGE when cap is too small.
 */
int mr_pp_actions(const struct mr_pp_spec *sp, int stage, struct mr_pp_action *out, int cap,
		  struct mr_errbuf *eb);

/* ---- what a schedule keeps and costs (the runtime's slots, the planner) -- */

/*
 * Of stage's list: the most micro-batches alive at once (from a
 * micro-batch's first action on the stage to its last: the slots
 * parallel/pp.c assigns) into *slots, and the most (micro-batch, chunk)
 * pairs alive at once (from each F to its B: the activation sets kept)
 * into *pairs. gpipe and 1f1b by their formulas (m; min(p - s, m)); the
 * others by walking the list, of at most 2pv micro-batches (the counts
 * stop growing once m covers the warm-up). 0 or a negative MR_E* code.
 */
int mr_pp_in_flight(const struct mr_pp_spec *sp, int stage, int *slots, int *pairs,
		    struct mr_errbuf *eb);

/*
 * The step's makespan in closed form, for the planner: m micro-batches
 * whose forward costs f and backward b + w on a whole stage (w: the
 * weight-gradient part zb-h1 defers; the other schedules run it inside B).
 * gpipe, 1f1b: (m + p - 1)(f + b + w); interleaved: m(f + b + w) +
 * (p - 1)(f + b + w)/v; zb-h1: m(f + b + w) + (p - 1) max(f + b - w, f, b).
 * Equal to mr_pp_simulate's makespan of the same costs split over the
 * chunks (f/v ...) for gpipe, 1f1b and interleaved, and for zb-h1 with
 * m >= p and w <= min(f, b) (tests/parallel/test_pp_sched.c).
 */
double mr_pp_makespan(const struct mr_pp_spec *sp, double f, double b, double w);

/*
 * The share of a micro-batch's backward compute that kind's W action
 * runs: zb-h1's weight gradients, a half (a linear layer's dX = dY W^T
 * and dW = dY^T X cost the same FLOPs; B keeps the first, W the second);
 * 0 for the kinds whose B runs the whole backward. The planner's w of
 * mr_pp_makespan.
 */
double mr_pp_weight_share(enum mr_pp_kind kind);

/* ---- communication ---------------------------------------------------- */

enum mr_pp_msg {
	MR_PP_ACT,  /* activations (the residual rows), forward after an F */
	MR_PP_GRAD, /* their gradient, backward after a B */
};

/*
 * One point-to-point transfer a stage's action implies. Around an action
 * on virtual stage k (q = p*v virtual stages):
 *   F, k > 0:    receive ACT from virtual stage k-1 before it;
 *   F, k < q-1:  send ACT to virtual stage k+1 after it;
 *   B, k < q-1:  receive GRAD from virtual stage k+1 before it;
 *   B, k > 0:    send GRAD to virtual stage k-1 after it;
 *   W:           nothing (it only reads what B kept).
 * The neighbour of virtual stage k is stage (k +- 1) mod p: with
 * interleaving the last stage's chunk c feeds the first stage's chunk
 * c+1 (and p = 1 would talk to itself, which interleaved refuses).
 */
struct mr_pp_comm {
	int send;            /* 1: send after the action; 0: receive before it */
	enum mr_pp_msg what;
	int peer;            /* the other stage */
	int mb;              /* micro-batch */
	int chunk;           /* this stage's chunk (of the action) */
	int action;          /* index of the action in the stage's list */
	int tag;             /* the same on both ends and unique among one step's
			      * messages: (mb * p*v + receiving virtual stage) * 2 + what */
};

/* Transfers a stage's list can imply at most: 2 per F and B action
 * (2*mr_pp_len, a bound); negative MR_E* for an invalid spec. */
int mr_pp_comms_bound(const struct mr_pp_spec *sp, struct mr_errbuf *eb);

/*
 * The transfers of stage's list acts (n actions, as mr_pp_actions wrote
 * it) in the order the stage meets them: for each action, its receive
 * (needed before it runs) then its send (posted when it is done). A
 * runtime can post the receives of the next actions early, while it
 * computes; the matching send on the peer has the same tag, what and mb.
 * Returns the count written to out (cap entries), or MR_EINVAL (bad spec,
 * stage, or an action out of range) / MR_ERANGE (cap too small).
 */
int mr_pp_comms(const struct mr_pp_spec *sp, int stage, const struct mr_pp_action *acts,
		int n, struct mr_pp_comm *out, int cap, struct mr_errbuf *eb);

/* ---- simulation ------------------------------------------------------- */

/* Time of one action on one chunk. For lists without W (gpipe, 1f1b,
 * interleaved) a B costs b + w: the whole backward. */
struct mr_pp_cost {
	double f, b, w;
};

/*
 * Result of a simulation. busy, peak, peak_w and start are the caller's
 * arrays (NULL: not wanted): p entries each, start p*n (stage-major, n
 * actions per stage).
 *
 * Bubble fraction: with busy_s the time stage s computes (the sum of its
 * actions' costs) and makespan the time the last action anywhere ends
 * (all stages start at 0, communication takes no time),
 *
 *     bubble = (p * makespan - sum_s busy_s) / sum_s busy_s,
 *
 * the idle time of all stages over their compute time (Megatron's
 * "bubble time fraction"); 0 when nothing costs anything. The simulator
 * gives (p-1)/m for gpipe and 1f1b whatever F and B cost (any m >= 1),
 * (p-1)/(v*m) for interleaved, and for zb-h1 with m >= p
 * (p-1) * max(F+B-W, F, B) / (m*(F+B+W)) - the paper's (p-1)(F+B-W) idle
 * time per stage when W <= min(F, B); with F = B = W a third of 1F1B's.
 *
 * Activations (peak): a micro-batch's activations on a chunk are alive
 * from its F until its B on that chunk; peak[s] is the largest number of
 * (micro-batch, chunk) pairs alive at once on stage s (for v = 1:
 * micro-batches in flight). It depends only on the list order. For zb-h1
 * this counts until B because B frees most of them: W needs only a subset
 * (the inputs of the linear layers and the output gradients it got from
 * B; the ZB paper's per-pass activation memory table and section 2.1
 * make this argument for why ZB-H1 stays within 1F1B's peak memory).
 * peak_w[s] counts until the last pass that needs anything, W (== peak
 * without W): the paper's "in-flight micro-batches", which ZB-H1 keeps
 * equal on every stage, min(p, m), i.e. 1F1B's first stage. So a zb-h1
 * stage holds at most peak[s] full activation sets (p-s, as 1F1B) plus
 * peak_w[s]-peak[s] W-subsets, and its first stage exactly 1F1B's.
 */
struct mr_pp_sim {
	double makespan;
	double busy_total; /* sum of busy over stages */
	double bubble;     /* defined above */
	int peak_max;      /* max over stages of peak */
	double *busy;      /* (p) or NULL */
	int *peak;         /* (p) or NULL */
	int *peak_w;       /* (p) or NULL */
	double *start;     /* (p*n) or NULL: start time of each action */
};

/*
 * Simulates the schedule sp with costs c: each stage runs its list in
 * order, one action at a time; an action starts when the stage is free
 * and its dependencies are done:
 *   F of micro-batch i on virtual stage k:  F of i on k-1 (k > 0);
 *   B of i on k:  F of i on k, and B of i on k+1 (k < p*v-1);
 *   W of i on k:  B of i on k.
 * Fills out's numbers and the arrays it points to. Returns 0, or
 * MR_EINVAL (invalid spec, negative or non-finite costs), MR_ENOMEM,
 * MR_ESTATE (deadlock; cannot happen for a valid spec).
 */
int mr_pp_simulate(const struct mr_pp_spec *sp, const struct mr_pp_cost *c,
		   struct mr_pp_sim *out, struct mr_errbuf *eb);

/*
 * The same for lists the caller wrote: lists[s] holds n[s] actions of
 * stage s, for p stages with v chunks and m micro-batches. Each list must
 * hold every (F, B) of each (micro-batch, chunk) exactly once, and W
 * either for all or for none of them (W present: B costs c->b, else
 * c->b + c->w); otherwise MR_EINVAL naming the stage and the action. A
 * list whose next action can never run is MR_ESTATE, the message naming
 * the stuck stage, its action and what it waits for - never a hang.
 * out->start, when set, needs p * max(n) entries (stage s at s * max(n)).
 */
int mr_pp_simulate_lists(int p, int v, int m, const struct mr_pp_action *const *lists,
			 const int *n, const struct mr_pp_cost *c, struct mr_pp_sim *out,
			 struct mr_errbuf *eb);

#endif
