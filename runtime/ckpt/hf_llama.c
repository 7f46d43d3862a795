/*
 * hf_llama.c - a llama model's parameters <-> a Hugging Face Llama
 * directory (see mr_hf_llama.h): the name table, config.json both ways,
 * the weights as one safetensors file or as shards with their index.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/mr_hf_llama.h"
#include "ckpt/mr_safetensors.h"
#include "mr_file.h"
#include "mr_json.h"

#define CONFIG "config.json"
#define SINGLE "model.safetensors"
#define INDEX "model.safetensors.index.json"
#define GENCFG "generation_config.json"
#define MAX_JSON (64u << 20) /* bytes of config.json or the index */
#define MAX_SHARDS 100000

/* Our tensor name -> Hugging Face's. */
static const struct {
	const char *ours, *hf;
} block_names[] = {
	{ "attn_norm.w", "input_layernorm.weight" },
	{ "attn.q.w", "self_attn.q_proj.weight" },
	{ "attn.k.w", "self_attn.k_proj.weight" },
	{ "attn.v.w", "self_attn.v_proj.weight" },
	{ "attn.o.w", "self_attn.o_proj.weight" },
	{ "mlp_norm.w", "post_attention_layernorm.weight" },
	{ "mlp.gate.w", "mlp.gate_proj.weight" },
	{ "mlp.up.w", "mlp.up_proj.weight" },
	{ "mlp.down.w", "mlp.down_proj.weight" },
};

int mr_hf_llama_name(const char *ours, char *buf, size_t cap)
{
	int layer, at = 0;

	if (!strcmp(ours, "tok_emb"))
		return snprintf(buf, cap, "model.embed_tokens.weight"), 0;
	if (!strcmp(ours, "norm.w"))
		return snprintf(buf, cap, "model.norm.weight"), 0;
	if (!strcmp(ours, "output.w"))
		return snprintf(buf, cap, "lm_head.weight"), 0;
	if (sscanf(ours, "h.%d.%n", &layer, &at) != 1 || at == 0)
		return MR_ENOTFOUND;
	for (size_t k = 0; k < sizeof(block_names) / sizeof(block_names[0]); k++)
		if (!strcmp(ours + at, block_names[k].ours))
			return snprintf(buf, cap, "model.layers.%d.%s", layer, block_names[k].hf), 0;
	return MR_ENOTFOUND;
}

/* "[a, b]" of a shape into buf. */
/* One Hugging Face tensor: a contiguous run of one of ours. */
struct piece {
	char name[MR_ST_MAX_NAME + 1];
	size_t off, n;   /* floats into our tensor */
	int ndim;
	int64_t shape[MR_ST_MAX_DIMS];
};

/* Our tensor t as the Hugging Face tensors it is, into out (NULL: only
 * counted): itself, or Mixtral's experts one per expert and projection -
 * moe.gate_up.w (E,2F,C) is experts.e.w1 (gate, F,C) then w3 (up, F,C),
 * moe.down.w (E,C,F) is experts.e.w2 (C,F), moe.router.w (E,C) is
 * block_sparse_moe.gate. Returns the count, MR_ENOTFOUND for a tensor
 * with no Hugging Face name. */
static int pieces_of(const struct mr_gpt_tensor *t, struct piece *out)
{
	struct piece one = { .n = 0 }, *pc = out ? out : &one;
	int layer, at = 0, proj = 0, np, k;
	const char *rest = "";

	if (sscanf(t->name, "h.%d.%n", &layer, &at) == 1 && at > 0 &&
	    !strncmp(t->name + at, "moe.", 4)) {
		rest = t->name + at + 4;
		proj = !strcmp(rest, "gate_up.w") ? 2 : !strcmp(rest, "down.w") ? 1 : 0;
	}
	if (!proj) { /* a tensor of its own */
		if (!strcmp(rest, "router.w"))
			snprintf(pc->name, sizeof(pc->name),
				 "model.layers.%d.block_sparse_moe.gate.weight", layer);
		else if (mr_hf_llama_name(t->name, pc->name, sizeof(pc->name)) < 0)
			return MR_ENOTFOUND;
		pc->off = 0;
		pc->n = t->n;
		pc->ndim = t->ndim;
		for (k = 0; k < t->ndim; k++)
			pc->shape[k] = t->full[k];
		return 1;
	}
	np = (int)t->full[0] * proj;
	for (k = 0; out && k < np; k++) {
		pc = &out[k];
		pc->n = t->n / (size_t)np;
		pc->off = (size_t)k * pc->n;
		pc->ndim = 2;
		pc->shape[0] = t->full[1] / proj; /* gate_up: F of 2F; down: C */
		pc->shape[1] = t->full[2];
		snprintf(pc->name, sizeof(pc->name),
			 "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", layer, k / proj,
			 proj == 1 ? "w2" : k % 2 ? "w3" : "w1");
	}
	return np;
}

/* Every piece of every tensor of m, in table order (malloc'd; *owner:
 * the tensor of each). */
static int all_pieces(const struct mr_gpt *m, struct piece **out, int **owner, int *n,
		      struct mr_errbuf *eb)
{
	int total = 0, i, k;

	*out = NULL;
	*owner = NULL;
	for (i = 0; i < m->ntensors; i++) {
		if ((k = pieces_of(&m->tensors[i], NULL)) < 0)
			return mr_errf(eb, MR_EINVAL, "tensor '%s' has no Hugging Face name",
				       m->tensors[i].name);
		total += k;
	}
	*out = calloc((size_t)total, sizeof(**out));
	*owner = calloc((size_t)total, sizeof(**owner));
	if (!*out || !*owner) {
		free(*out);
		free(*owner);
		*out = NULL;
		*owner = NULL;
		return mr_errf(eb, MR_ENOMEM, "out of memory naming %d tensors", total);
	}
	for (i = 0, total = 0; i < m->ntensors; i++) {
		k = pieces_of(&m->tensors[i], *out + total);
		while (k-- > 0)
			(*owner)[total++] = i;
	}
	*n = total;
	return 0;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
	size_t at = (size_t)snprintf(buf, cap, "[");

	for (int k = 0; k < ndim && at < cap; k++)
		at += (size_t)snprintf(buf + at, cap - at, "%s%lld", k ? ", " : "",
				       (long long)shape[k]);
	if (at < cap)
		snprintf(buf + at, cap - at, "]");
}

/* ---- JSON files ---- */

/* dir/name parsed (an object, no duplicate keys, at most MAX_JSON bytes). */
static int load_json(const char *dir, const char *name, json_t **out, struct mr_errbuf *eb)
{
	char path[4200];
	json_error_t je;
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (stat(path, &st) != 0)
		return mr_errf(eb, errno == ENOENT ? MR_ENOTFOUND : MR_EIO, "unable to read '%s': %s",
			       path, strerror(errno));
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_JSON)
		return mr_errf(eb, MR_ELIMIT, "'%s' is not a regular file of at most %u bytes", path,
			       MAX_JSON);
	*out = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!*out)
		return mr_errf(eb, MR_ECORRUPT, "'%s': line %d: %s", path, je.line, je.text);
	if (!json_is_object(*out)) {
		json_decref(*out);
		return mr_errf(eb, MR_ECORRUPT, "'%s' is not a JSON object", path);
	}
	return 0;
}

/* doc written to dir/name atomically (temporary file, fsync, rename);
 * indented, reals with at most 15 digits (floats are stored shortest). */
static int save_json(const char *dir, const char *name, const json_t *doc, struct mr_errbuf *eb)
{
	char path[4200], tmp[4300], *text;
	int fd, rc = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", path, (long)getpid());
	if (!(text = json_dumps(doc, JSON_INDENT(2) | JSON_REAL_PRECISION(15))))
		return mr_errf(eb, MR_ENOMEM, "out of memory writing '%s'", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = mr_errf(eb, MR_EIO, "unable to create '%s': %s", tmp, strerror(errno));
	} else {
		if (mr_file_write_all(fd, text, strlen(text)) < 0 ||
		    mr_file_write_all(fd, "\n", 1) < 0 || fsync(fd) != 0)
			rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", tmp, strerror(errno));
		if (close(fd) != 0 && rc == 0)
			rc = mr_errf(eb, MR_EIO, "unable to write '%s': %s", tmp, strerror(errno));
		if (rc == 0 && rename(tmp, path) != 0)
			rc = mr_errf(eb, MR_EIO, "unable to create '%s': %s", path, strerror(errno));
		if (rc < 0)
			unlink(tmp);
	}
	free(text);
	return rc;
}

/* A float as the shortest decimal that reads back as the same float, as
 * a double (so 1e-5f is written 1e-05, not 9.99999974737875e-06). */
static double shortest(float f)
{
	char buf[32];

	for (int p = 1; p <= 9; p++) {
		snprintf(buf, sizeof(buf), "%.*g", p, (double)f);
		if (strtof(buf, NULL) == f)
			break;
	}
	return strtod(buf, NULL);
}

/* ---- config.json ---- */

/* A message from the JSON getters, prefixed with the file. */
static int cfg_err(struct mr_errbuf *eb, int rc, const char *path, const struct mr_errbuf *in)
{
	return mr_errf_field(eb, rc, in->field, "'%s': %s", path, in->msg);
}

static int need_int(const json_t *doc, const char *path, const char *key, int64_t lo, int64_t hi,
		    int required, int *out, struct mr_errbuf *eb)
{
	struct mr_errbuf in = { "", "" };
	int64_t v;
	int rc;

	if (required && !json_object_get(doc, key))
		return mr_errf_field(eb, MR_EINVAL, key, "'%s': key '%s' is missing", path, key);
	if ((rc = mr_json_get_int(doc, key, 0, lo, hi, &v, &in)) < 0)
		return cfg_err(eb, rc, path, &in);
	if (json_object_get(doc, key))
		*out = (int)v;
	return 0;
}

static int opt_float(const json_t *doc, const char *path, const char *key, double lo, double hi,
		     float *out, struct mr_errbuf *eb)
{
	struct mr_errbuf in = { "", "" };
	double v;
	int rc;

	if (!json_object_get(doc, key))
		return 0;
	if ((rc = mr_json_get_double(doc, key, 0, lo, hi, &v, &in)) < 0)
		return cfg_err(eb, rc, path, &in);
	*out = (float)v;
	return 0;
}

/* rope_scaling: null/absent, or Llama 3.1's ("rope_type" or "type" llama3). */
static int read_scaling(const json_t *doc, const char *path, struct mr_rope_scaling *s,
			struct mr_errbuf *eb)
{
	const json_t *rs = json_object_get(doc, "rope_scaling");
	const json_t *ty;
	int rc;

	memset(s, 0, sizeof(*s));
	if (!rs || json_is_null(rs))
		return 0;
	if (!json_is_object(rs))
		return mr_errf_field(eb, MR_EINVAL, "rope_scaling",
				     "'%s': 'rope_scaling' must be null or an object", path);
	ty = json_object_get(rs, "rope_type");
	if (!ty)
		ty = json_object_get(rs, "type");
	if (!json_is_string(ty) || strcmp(json_string_value(ty), "llama3"))
		return mr_errf_field(eb, MR_ENOTSUP, "rope_scaling",
				     "'%s': rope_scaling type '%.40s' is not supported (meshrun "
				     "reads null or Llama 3.1's \"llama3\")", path,
				     json_is_string(ty) ? json_string_value(ty) : "(none)");
	s->original_max_pos = 0;
	if ((rc = opt_float(rs, path, "factor", 1.0, 1e6, &s->factor, eb)) < 0 ||
	    (rc = opt_float(rs, path, "low_freq_factor", 1e-6, 1e6, &s->low_freq_factor, eb)) < 0 ||
	    (rc = opt_float(rs, path, "high_freq_factor", 1e-6, 1e6, &s->high_freq_factor, eb)) <
		    0 ||
	    (rc = need_int(rs, path, "original_max_position_embeddings", 1, 1 << 30, 1,
			   &s->original_max_pos, eb)) < 0)
		return rc;
	if (!json_object_get(rs, "factor") || !json_object_get(rs, "low_freq_factor") ||
	    !json_object_get(rs, "high_freq_factor"))
		return mr_errf_field(eb, MR_EINVAL, "rope_scaling",
				     "'%s': rope_scaling needs factor, low_freq_factor and "
				     "high_freq_factor", path);
	if (!(s->high_freq_factor > s->low_freq_factor))
		return mr_errf_field(eb, MR_EINVAL, "rope_scaling",
				     "'%s': rope_scaling's high_freq_factor must exceed "
				     "low_freq_factor", path);
	return 0;
}

static int read_config(const char *dir, int max_seq, struct mr_gpt_config *c,
		       struct mr_errbuf *eb)
{
	char path[4200];
	const json_t *v;
	json_t *doc = NULL;
	int rc, head_dim = 0, tie = 0, moe;

	snprintf(path, sizeof(path), "%s/" CONFIG, dir);
	if ((rc = load_json(dir, CONFIG, &doc, eb)) < 0)
		return rc;
	memset(c, 0, sizeof(*c));
	c->arch = MR_ARCH_LLAMA;
	v = json_object_get(doc, "model_type");
	moe = json_is_string(v) && !strcmp(json_string_value(v), "mixtral");
	if (!json_is_string(v) || (strcmp(json_string_value(v), "llama") && !moe)) {
		rc = mr_errf_field(eb, MR_ENOTSUP, "model_type",
				   "'%s': model_type is %s%.40s%s, meshrun reads \"llama\" and "
				   "\"mixtral\"", path,
				   json_is_string(v) ? "\"" : "", v ? json_is_string(v)
									 ? json_string_value(v)
									 : "not a string"
								    : "missing",
				   json_is_string(v) ? "\"" : "");
		goto out;
	}
	/* LlamaConfig's (MixtralConfig's) defaults for the optional keys */
	c->norm_eps = moe ? 1e-5f : 1e-6f;
	c->rope_theta = moe ? 1e6f : 10000.0f;
	if (moe) {
		/* experts in every layer, every token's gates renormalised over
		 * its top k, no token dropped (Mixtral's sparse MoE block) */
		c->n_kv_head = 8;
		c->moe_every = 1;
		c->moe_dropless = 1;
		c->moe_norm_topk = 1;
		c->capacity_factor = 1.0f;
		c->aux_coef = 0.001f;
		if ((rc = need_int(doc, path, "num_local_experts", 1, 1024, 1, &c->n_experts,
				   eb)) < 0 ||
		    (rc = need_int(doc, path, "num_experts_per_tok", 1, 2, 1, &c->top_k, eb)) < 0 ||
		    (rc = opt_float(doc, path, "router_aux_loss_coef", 0.0, 1000.0, &c->aux_coef,
				    eb)) < 0)
			goto out;
		v = json_object_get(doc, "sliding_window");
		if (v && !json_is_null(v)) {
			rc = mr_errf_field(eb, MR_ENOTSUP, "sliding_window",
					   "'%s': sliding_window must be null: meshrun's attention "
					   "sees every earlier position", path);
			goto out;
		}
	}
	if ((rc = need_int(doc, path, "hidden_size", 1, 65536, 1, &c->d_model, eb)) < 0 ||
	    (rc = need_int(doc, path, "num_hidden_layers", 1, 1024, 1, &c->n_layer, eb)) < 0 ||
	    (rc = need_int(doc, path, "num_attention_heads", 1, 65536, 1, &c->n_head, eb)) < 0 ||
	    (rc = need_int(doc, path, "num_key_value_heads", 1, 65536, 0, &c->n_kv_head, eb)) < 0 ||
	    (rc = need_int(doc, path, "intermediate_size", 1, 1 << 20, 1, &c->ffn_hidden, eb)) <
		    0 ||
	    (rc = need_int(doc, path, "vocab_size", 2, 1 << 20, 1, &c->vocab, eb)) < 0 ||
	    (rc = need_int(doc, path, "max_position_embeddings", 1, 1 << 20, 1, &c->max_seq, eb)) <
		    0 ||
	    (rc = need_int(doc, path, "head_dim", 1, 65536, 0, &head_dim, eb)) < 0 ||
	    (rc = opt_float(doc, path, "rms_norm_eps", 1e-30, 1.0, &c->norm_eps, eb)) < 0 ||
	    (rc = opt_float(doc, path, "rope_theta", 1.0, 1e12, &c->rope_theta, eb)) < 0 ||
	    (rc = read_scaling(doc, path, &c->rope_scaling, eb)) < 0)
		goto out;
	if ((v = json_object_get(doc, "tie_word_embeddings")) && !json_is_null(v)) {
		if (!json_is_boolean(v)) {
			rc = mr_errf_field(eb, MR_EINVAL, "tie_word_embeddings",
					   "'%s': 'tie_word_embeddings' must be true or false", path);
			goto out;
		}
		tie = json_is_true(v);
	}
	c->tie_embeddings = tie;
	if (max_seq > 0)
		c->max_seq = max_seq;
	if (head_dim && head_dim * c->n_head != c->d_model) {
		rc = mr_errf_field(eb, MR_ENOTSUP, "head_dim",
				   "'%s': head_dim %d is not hidden_size / num_attention_heads (%d / "
				   "%d): meshrun's heads split d_model", path, head_dim, c->d_model,
				   c->n_head);
		goto out;
	}
	v = json_object_get(doc, "hidden_act");
	if (v && (!json_is_string(v) || strcmp(json_string_value(v), "silu"))) {
		rc = mr_errf_field(eb, MR_ENOTSUP, "hidden_act",
				   "'%s': hidden_act must be \"silu\" (SwiGLU)", path);
		goto out;
	}
	if (json_is_true(json_object_get(doc, "attention_bias")) ||
	    json_is_true(json_object_get(doc, "mlp_bias"))) {
		rc = mr_errf_field(eb, MR_ENOTSUP, "attention_bias",
				   "'%s': attention_bias / mlp_bias: meshrun's llama has no biases",
				   path);
		goto out;
	}
	{
		struct mr_errbuf in = { "", "" };
		if ((rc = mr_gpt_config_check(c, &in)) < 0)
			rc = mr_errf_field(eb, rc, in.field, "'%s': %s", path, in.msg);
	}
out:
	json_decref(doc);
	return rc;
}

static int write_config(const struct mr_gpt_config *c, const char *dir, struct mr_errbuf *eb)
{
	const struct mr_rope_scaling *s = &c->rope_scaling;
	json_t *doc, *rs = json_null(), *gen;
	int rc;

	if (s->factor > 0)
		rs = json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
			       shortest(s->factor), "low_freq_factor", shortest(s->low_freq_factor),
			       "high_freq_factor", shortest(s->high_freq_factor),
			       "original_max_position_embeddings", s->original_max_pos);
	doc = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:o, s:b, "
			"s:s, s:b, s:b, s:f, s:s, s:b}",
			"architectures", "LlamaForCausalLM", "model_type", "llama", "hidden_size",
			c->d_model, "intermediate_size", mr_gpt_ffn(c), "num_hidden_layers",
			c->n_layer, "num_attention_heads", c->n_head, "num_key_value_heads",
			mr_gpt_kv_heads(c), "head_dim", c->d_model / c->n_head, "vocab_size",
			c->vocab, "max_position_embeddings", c->max_seq, "rms_norm_eps",
			shortest(mr_gpt_norm_eps(c)), "rope_theta", shortest(mr_gpt_rope_theta(c)),
			"rope_scaling", rs, "tie_word_embeddings", mr_gpt_tied(c), "hidden_act",
			"silu", "attention_bias", 0, "mlp_bias", 0, "initializer_range", 0.02,
			"torch_dtype", "float32", "use_cache", 1);
	if (doc && c->moe_every &&
	    json_object_update_new(
		    doc, json_pack("{s:[s], s:s, s:i, s:i, s:f, s:b, s:n, s:f}", "architectures",
				   "MixtralForCausalLM", "model_type", "mixtral",
				   "num_local_experts", c->n_experts, "num_experts_per_tok",
				   c->top_k, "router_aux_loss_coef", shortest(c->aux_coef),
				   "output_router_logits", 0, "sliding_window",
				   "router_jitter_noise", 0.0)) < 0) {
		json_decref(doc);
		doc = NULL;
	}
	gen = json_pack("{s:b}", "do_sample", 0);
	if (!doc || !gen)
		rc = mr_errf(eb, MR_ENOMEM, "out of memory writing '%s/" CONFIG "'", dir);
	else if ((rc = save_json(dir, CONFIG, doc, eb)) == 0)
		rc = save_json(dir, GENCFG, gen, eb);
	json_decref(doc);
	json_decref(gen);
	return rc;
}

/* ---- export ---- */

static int exists_in(const char *dir, const char *name)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return access(path, F_OK) == 0;
}

static void remove_in(const char *dir, const char *name)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	unlink(path);
}

static void shard_name(char *buf, size_t cap, int k, int n)
{
	if (n == 1)
		snprintf(buf, cap, SINGLE);
	else
		snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k + 1, n);
}

int mr_hf_llama_export(const struct mr_gpt *m, const char *dir, uint64_t shard_bytes,
		       int overwrite, int *nfiles, struct mr_errbuf *eb)
{
	static const char *const meta[] = { "format", "pt", NULL };
	char file[64], path[4200];
	struct mr_st_spec *specs = NULL;
	struct piece *pcs = NULL;
	int *shard = NULL, *owner = NULL, i, k, n = 0, np = 0, rc = 0;
	json_t *index = NULL, *map = NULL;
	uint64_t in_shard = 0, total = 0;

	if (m->cfg.arch != MR_ARCH_LLAMA)
		return mr_errf_field(eb, MR_ENOTSUP, "arch",
				     "'%s': a Hugging Face Llama export needs a llama model (a "
				     "gpt2 model exports with --safetensors)", dir);
	if (m->cfg.moe_every > 1 || (m->cfg.moe_every && !mr_gpt_moe_norm_topk(&m->cfg)))
		return mr_errf_field(eb, MR_ENOTSUP,
				     m->cfg.moe_every > 1 ? "moe_every" : "moe_norm_topk",
				     "'%s': a Hugging Face Mixtral has experts in every layer "
				     "(moe_every 1) and renormalised gates (moe_norm_topk)", dir);
	if (!shard_bytes)
		shard_bytes = MR_HF_SHARD_BYTES;
	if ((rc = all_pieces(m, &pcs, &owner, &np, eb)) < 0)
		goto out;
	specs = calloc((size_t)np, sizeof(*specs));
	shard = calloc((size_t)np, sizeof(*shard));
	if (!specs || !shard) {
		rc = mr_errf(eb, MR_ENOMEM, "out of memory exporting to '%s'", dir);
		goto out;
	}
	/* names, shapes (Linear's (out, in) is ours) and the shard of each */
	for (i = 0; i < np; i++) {
		uint64_t bytes = (uint64_t)pcs[i].n * sizeof(float);

		specs[i].name = pcs[i].name;
		specs[i].ndim = pcs[i].ndim;
		for (k = 0; k < pcs[i].ndim; k++)
			specs[i].shape[k] = pcs[i].shape[k];
		if (i > 0 && in_shard + bytes > shard_bytes) {
			n++;
			in_shard = 0;
		}
		shard[i] = n;
		in_shard += bytes;
		total += bytes;
	}
	n++;
	if (nfiles)
		*nfiles = n;
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		rc = mr_errf(eb, MR_EIO, "unable to create '%s': %s", dir, strerror(errno));
		goto out;
	}
	/* nothing is written over without overwrite: nor a weights file
	 * the loader would pick instead of these */
	for (k = -4; k < n && !overwrite; k++) {
		const char *nm = k == -4 ? CONFIG : k == -3 ? GENCFG : k == -2 ? SINGLE
			       : k == -1 ? INDEX : file;
		if (k >= 0)
			shard_name(file, sizeof(file), k, n);
		if (exists_in(dir, nm)) {
			rc = mr_errf(eb, MR_EEXISTS, "'%s/%s' exists", dir, nm);
			goto out;
		}
	}
	for (k = 0, i = 0; k < n && rc == 0; k++) {
		struct mr_st_writer w;
		int first = i;
		while (i < np && shard[i] == k)
			i++;
		shard_name(file, sizeof(file), k, n);
		snprintf(path, sizeof(path), "%s/%s", dir, file);
		if ((rc = mr_st_writer_open(&w, path, specs + first, i - first, meta, overwrite,
					    eb)) < 0)
			break;
		for (int j = first; j < i && rc == 0; j++)
			rc = mr_st_writer_put(&w, m->params + m->tensors[owner[j]].off + pcs[j].off,
					      pcs[j].n, eb);
		if (rc == 0)
			rc = mr_st_writer_commit(&w, eb);
		else
			mr_st_writer_abort(&w);
	}
	if (rc < 0)
		goto out;
	if (n > 1) {
		/* the loader prefers model.safetensors: a stale one must go */
		remove_in(dir, SINGLE);
		index = json_pack("{s:{s:I}, s:{}}", "metadata", "total_size", (json_int_t)total,
				  "weight_map");
		map = index ? json_object_get(index, "weight_map") : NULL;
		for (i = 0; map && i < np; i++) {
			shard_name(file, sizeof(file), shard[i], n);
			if (json_object_set_new(map, pcs[i].name, json_string(file)) < 0)
				map = NULL;
		}
		rc = map ? save_json(dir, INDEX, index, eb)
			 : mr_errf(eb, MR_ENOMEM, "out of memory writing '%s/" INDEX "'", dir);
	} else {
		remove_in(dir, INDEX);
	}
	if (rc == 0)
		rc = write_config(&m->cfg, dir, eb);
	if (rc == 0)
		rc = mr_file_sync_dir(dir, eb);
out:
	json_decref(index);
	free(specs);
	free(pcs);
	free(owner);
	free(shard);
	return rc;
}

/* ---- import ---- */

/* The weights of a directory: one file, or the shards an index names. */
struct weights {
	const char *dir;
	char index_path[4200];
	json_t *map;                /* weight_map (borrowed from index), or NULL */
	json_t *index;
	int n;
	struct mr_st_file *f;
	unsigned char **used;       /* [file][tensor]: taken */
};

static void weights_close(struct weights *w)
{
	for (int k = 0; k < w->n; k++) {
		mr_st_close(&w->f[k]);
		if (w->used)
			free(w->used[k]);
	}
	free(w->f);
	free(w->used);
	json_decref(w->index);
}

/* A shard name as a plain file name of dir: no path, no "..". */
static int plain_name(const char *s)
{
	return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 256;
}

/* Index of shard file name among the open ones (opened here if new). */
static int open_shard(struct weights *w, const char *name, struct mr_errbuf *eb)
{
	char path[4200];
	int k, rc;

	snprintf(path, sizeof(path), "%s/%s", w->dir, name);
	for (k = 0; k < w->n; k++)
		if (!strcmp(w->f[k].path, path))
			return k;
	if (w->n >= MAX_SHARDS)
		return mr_errf(eb, MR_ELIMIT, "'%s' names more than %d shards", w->index_path,
			       MAX_SHARDS);
	if (access(path, F_OK) != 0)
		return mr_errf(eb, MR_EINVAL, "'%s': its weight_map names shard '%s', which is "
				   "missing", w->index_path, name);
	if ((rc = mr_st_open(&w->f[w->n], path, eb)) < 0)
		return rc;
	if (!(w->used[w->n] = calloc((size_t)w->f[w->n].ntensors + 1, 1))) {
		mr_st_close(&w->f[w->n]);
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", path);
	}
	return w->n++;
}

static int weights_open(struct weights *w, const char *dir, struct mr_errbuf *eb)
{
	const char *key;
	json_t *v;
	size_t cap = 1;
	int rc;

	memset(w, 0, sizeof(*w));
	w->dir = dir;
	snprintf(w->index_path, sizeof(w->index_path), "%s/" INDEX, dir);
	if (!exists_in(dir, SINGLE)) {
		if (!exists_in(dir, INDEX))
			return mr_errf(eb, MR_ENOTFOUND, "'%s' has neither '" SINGLE "' nor '" INDEX
						       "'", dir);
		if ((rc = load_json(dir, INDEX, &w->index, eb)) < 0)
			return rc;
		w->map = json_object_get(w->index, "weight_map");
		if (!json_is_object(w->map) || json_object_size(w->map) == 0)
			return mr_errf_field(eb, MR_EINVAL, "weight_map",
					     "'%s': 'weight_map' is missing or not a non-empty "
					     "object", w->index_path);
		cap = json_object_size(w->map);
		if (cap > MAX_SHARDS)
			cap = MAX_SHARDS;
	}
	w->f = calloc(cap, sizeof(*w->f));
	w->used = calloc(cap, sizeof(*w->used));
	if (!w->f || !w->used)
		return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'", dir);
	if (!w->map)
		return (rc = open_shard(w, SINGLE, eb)) < 0 ? rc : 0;
	json_object_foreach(w->map, key, v) {
		if (!json_is_string(v) || !plain_name(json_string_value(v)))
			return mr_errf_field(eb, MR_EINVAL, "weight_map",
					     "'%s': weight_map['%.80s'] is not a file name of the "
					     "directory", w->index_path, key);
		if ((rc = open_shard(w, json_string_value(v), eb)) < 0)
			return rc;
	}
	return 0;
}

/* Where HF tensor name is: *k the file, *ti the tensor; MR_EINVAL naming
 * the file(s) when it is nowhere. */
static int weights_find(struct weights *w, const char *name, int *k, int *ti,
			struct mr_errbuf *eb)
{
	if (w->map) {
		json_t *v = json_object_get(w->map, name);
		if (!v)
			return mr_errf(eb, MR_EINVAL, "'%s': weight_map has no tensor '%s'",
				       w->index_path, name);
		*k = open_shard(w, json_string_value(v), eb);
		if (*k < 0)
			return *k;
	} else {
		*k = 0;
	}
	if ((*ti = mr_st_find(&w->f[*k], name)) < 0)
		return mr_errf(eb, MR_EINVAL, "'%s': no tensor '%s'%s", w->f[*k].path, name,
			       w->map ? " (the weight_map puts it there)" : "");
	return 0;
}

/* Parameters of a llama config, in double (no overflow). */
static double nparams_of(const struct mr_gpt_config *c)
{
	double C = c->d_model, hs = C / c->n_head, q = c->n_head * hs;
	double kv = mr_gpt_kv_heads(c) * hs, F = mr_gpt_ffn(c), V = c->vocab;

	double moe_layers = c->moe_every ? c->n_layer / c->moe_every : 0;

	return V * C * (mr_gpt_tied(c) ? 1 : 2) + C +
	       c->n_layer * (2 * C + 2 * q * C + 2 * kv * C) +
	       (c->n_layer - moe_layers) * 3 * F * C +
	       moe_layers * c->n_experts * (C + 3 * F * C);
}

/* Tensors no parameter of meshrun's: an old checkpoint's rotary buffers. */
static int ignorable(const char *nm)
{
	size_t n = strlen(nm), s = strlen(".self_attn.rotary_emb.inv_freq");

	return !strncmp(nm, "model.layers.", 13) && n > s &&
	       !strcmp(nm + n - s, ".self_attn.rotary_emb.inv_freq");
}

static int fill_params(struct mr_gpt *m, struct weights *w, struct mr_errbuf *eb)
{
	char want[160], got[160];
	struct piece *pcs;
	int *owner, i, k = 0, ti = 0, np, rc;

	if ((rc = all_pieces(m, &pcs, &owner, &np, eb)) < 0)
		return rc;
	for (i = 0; i < np && rc == 0; i++) {
		const struct piece *pc = &pcs[i];
		const struct mr_st_tensor *ft;
		int same, d;

		if ((rc = weights_find(w, pc->name, &k, &ti, eb)) < 0)
			break;
		ft = &w->f[k].t[ti];
		same = ft->ndim == pc->ndim;
		for (d = 0; same && d < pc->ndim; d++)
			same = ft->shape[d] == pc->shape[d];
		if (!same) {
			shape_str(got, sizeof(got), ft->ndim, ft->shape);
			shape_str(want, sizeof(want), pc->ndim, pc->shape);
			rc = mr_errf(eb, MR_EINVAL,
				     "'%s': tensor '%s' has shape %s, config.json's model needs %s",
				     w->f[k].path, pc->name, got, want);
			break;
		}
		w->used[k][ti] = 1;
		rc = mr_st_read_f32(&w->f[k], ti, m->params + m->tensors[owner[i]].off + pc->off,
				    eb);
	}
	free(pcs);
	free(owner);
	return rc;
}

/* Every other tensor in the files: a tied head equal to the embedding
 * and rotary buffers pass, anything else is refused. */
static int check_rest(const struct mr_gpt *m, struct weights *w, struct mr_errbuf *eb)
{
	const struct mr_gpt_tensor *emb = &m->tensors[0];
	int k, i, rc = 0;

	for (k = 0; k < w->n && rc == 0; k++)
		for (i = 0; i < w->f[k].ntensors && rc == 0; i++) {
			const struct mr_st_tensor *ft = &w->f[k].t[i];
			float *head;
			if (w->used[k][i] || ignorable(ft->name))
				continue;
			if (strcmp(ft->name, "lm_head.weight"))
				return mr_errf(eb, MR_EINVAL,
					       "'%s': unexpected tensor '%s' (not a parameter of a "
					       "Llama model; docs/CHECKPOINTS.md has the names)",
					       w->f[k].path, ft->name);
			if (ft->count != emb->n)
				return mr_errf(eb, MR_EINVAL,
					       "'%s': 'lm_head.weight' is not shaped like the "
					       "embedding, and config.json ties them", w->f[k].path);
			if (!(head = malloc(emb->n * sizeof(float))))
				return mr_errf(eb, MR_ENOMEM, "out of memory reading '%s'",
					       w->f[k].path);
			rc = mr_st_read_f32(&w->f[k], i, head, eb);
			if (rc == 0 && memcmp(head, m->params + emb->off, emb->n * sizeof(float)))
				rc = mr_errf(eb, MR_EINVAL,
					     "'%s': 'lm_head.weight' differs from the embedding, but "
					     "config.json says tie_word_embeddings", w->f[k].path);
			free(head);
		}
	return rc;
}

int mr_hf_llama_import(struct mr_gpt *m, const char *dir, int max_seq, struct mr_errbuf *eb)
{
	struct mr_gpt_config c;
	struct weights w;
	double room = 0;
	int rc, k;

	memset(m, 0, sizeof(*m));
	if ((rc = read_config(dir, max_seq, &c, eb)) < 0)
		return rc;
	if ((rc = weights_open(&w, dir, eb)) < 0)
		goto out;
	/* the config must fit the files before a model of it is allocated
	 * (2 bytes per parameter at least) */
	for (k = 0; k < w.n; k++)
		room += (double)(w.f[k].size - w.f[k].data_at) / 2.0;
	if (nparams_of(&c) > room) {
		rc = mr_errf(eb, MR_EINVAL,
			     "'%s/" CONFIG "': its model has %.0f parameters, more than the weights "
			     "files hold", dir, nparams_of(&c));
		goto out;
	}
	if ((rc = mr_gpt_create(m, &c, 1, 1, NULL, eb)) < 0) {
		memset(m, 0, sizeof(*m));
		goto out;
	}
	if ((rc = fill_params(m, &w, eb)) == 0)
		rc = check_rest(m, &w, eb);
	if (rc < 0) {
		mr_gpt_release(m);
		memset(m, 0, sizeof(*m));
	}
out:
	weights_close(&w);
	return rc;
}
