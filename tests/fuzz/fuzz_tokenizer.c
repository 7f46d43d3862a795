/*
 * fuzz_tokenizer.c - libFuzzer harness for the byte-level BPE tokenizer
 * (data/mr_tokenizer.h), under ASan/UBSan.
 *
 * The first byte says what the rest is:
 *   bit 0 clear: a text for one of two small built-in tokenizers (bit 1:
 *     GPT-2's ByteLevel regex, or Llama 3's Sequence of Split + ByteLevel;
 *     the 256 byte symbols, a few merges in both forms, an added token).
 *     encode must succeed exactly when the text is valid UTF-8, every id
 *     must be below the vocabulary size, and decode(encode(x)) == x.
 *   bit 0 set: a tokenizer.json. Loading it succeeds, or fails with a
 *     message naming the file; a loaded one encodes and round-trips a
 *     fixed sample.
 *
 * Seeds: tests/fuzz/corpus/tokenizer/ (texts with specials, contractions,
 * CJK, emoji, invalid UTF-8; small tokenizer.json files good and bad).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/mr_tokenizer.h"

static char dir[] = "/tmp/mr-fuzz-tok-XXXXXX";
static struct mr_tokenizer *builtin[2];

static const char LLAMA3[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
	"[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* GPT-2's byte -> code point table, written out for the harness */
static unsigned byte_cp(unsigned b)
{
	unsigned n = 0;

	if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
		return b;
	for (unsigned k = 0; k < b; k++)
		n += !((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE);
	return 256 + n;
}

static void put_cp(char *s, unsigned cp)
{
	if (cp < 0x80) {
		s[0] = (char)cp;
		s[1] = '\0';
	} else {
		s[0] = (char)(0xC0 | cp >> 6);
		s[1] = (char)(0x80 | (cp & 0x3F));
		s[2] = '\0';
	}
}

static struct mr_tokenizer *make_builtin(int llama)
{
	static const char *const merges[][2] = { { "\xc4\xa0", "t" }, { "h", "e" },
						 { "\xc4\xa0t", "he" }, { "i", "n" },
						 { "in", "g" }, { "e", "r" } };
	json_t *root = json_object(), *model = json_object(), *vocab = json_object();
	json_t *m = json_array(), *added = json_array(), *pre;
	struct mr_tokenizer *t = NULL;
	struct mr_errbuf eb = { "", "" };
	char s[8], path[128];
	int id = 256;

	for (unsigned b = 0; b < 256; b++) {
		put_cp(s, byte_cp(b));
		json_object_set_new(vocab, s, json_integer(b));
	}
	for (size_t i = 0; i < sizeof(merges) / sizeof(merges[0]); i++) {
		char both[16];

		snprintf(both, sizeof(both), "%s%s", merges[i][0], merges[i][1]);
		json_object_set_new(vocab, both, json_integer(id++));
		if (i % 2)
			json_array_append_new(m, json_pack("[ss]", merges[i][0], merges[i][1]));
		else
			json_array_append_new(m, json_pack("s+++", merges[i][0], " ", merges[i][1], ""));
	}
	json_array_append_new(added, json_pack("{s:i,s:s,s:b}", "id", 70000, "content",
					       "<|endoftext|>", "special", 1));
	if (llama)
		pre = json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s,s:b}]}", "type", "Sequence",
				"pretokenizers", "type", "Split", "pattern", "Regex", LLAMA3,
				"behavior", "Isolated", "type", "ByteLevel", "use_regex", 0);
	else
		pre = json_pack("{s:s,s:b}", "type", "ByteLevel", "use_regex", 1);
	json_object_set_new(model, "type", json_string("BPE"));
	json_object_set_new(model, "vocab", vocab);
	json_object_set_new(model, "merges", m);
	json_object_set_new(model, "ignore_merges", json_boolean(llama));
	json_object_set_new(root, "model", model);
	json_object_set_new(root, "added_tokens", added);
	json_object_set_new(root, "pre_tokenizer", pre);
	snprintf(path, sizeof(path), "%s/builtin%d.json", dir, llama);
	if (json_dump_file(root, path, 0) != 0 || mr_tokenizer_load(&t, path, &eb) < 0) {
		fprintf(stderr, "fuzz_tokenizer: built-in tokenizer: %s\n", eb.msg);
		abort();
	}
	json_decref(root);
	return t;
}

static int valid_utf8(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		unsigned c = s[i], more, lo = 0x80, hi = 0xBF;

		if (c < 0x80) {
			i++;
			continue;
		}
		more = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2
		       : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
		if (!more || n - i <= more)
			return 0;
		lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
		hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
		if (s[i + 1] < lo || s[i + 1] > hi)
			return 0;
		for (unsigned k = 2; k <= more; k++)
			if ((s[i + k] & 0xC0) != 0x80)
				return 0;
		i += more + 1;
	}
	return 1;
}

static void round_trip(const struct mr_tokenizer *t, const char *text, size_t len)
{
	struct mr_errbuf eb = { "", "" };
	uint32_t *ids;
	size_t n, back;
	char *s;
	int rc = mr_tokenizer_encode(t, text, len, &ids, &n, &eb);

	if ((rc == 0) != valid_utf8((const uint8_t *)text, len)) {
		fprintf(stderr, "fuzz_tokenizer: encode rc %d for a text that is%s UTF-8: %s\n", rc,
			rc == 0 ? " not" : "", eb.msg);
		abort();
	}
	if (rc < 0)
		return;
	for (size_t i = 0; i < n; i++)
		if (ids[i] >= (uint32_t)mr_tokenizer_vocab_size(t))
			abort();
	if (mr_tokenizer_decode(t, ids, n, &s, &back, &eb) < 0 || back != len ||
	    memcmp(s, text, len) != 0) {
		fprintf(stderr, "fuzz_tokenizer: decode(encode(x)) != x (%s)\n", eb.msg);
		abort();
	}
	free(ids);
	free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char sample[] = "Hello world<|endoftext|> it's 12345 caf\xc3\xa9 \xe6\x97\xa5 ";
	struct mr_tokenizer *t;
	struct mr_errbuf eb = { "", "" };
	char path[128];
	FILE *f;

	if (!builtin[0]) {
		if (!mkdtemp(dir))
			abort();
		builtin[0] = make_builtin(0);
		builtin[1] = make_builtin(1);
	}
	if (size < 1)
		return 0;
	if (!(data[0] & 1)) {
		round_trip(builtin[(data[0] >> 1) & 1], (const char *)data + 1, size - 1);
		return 0;
	}
	snprintf(path, sizeof(path), "%s/input.json", dir);
	if (!(f = fopen(path, "wb")))
		abort();
	if (size > 1 && fwrite(data + 1, 1, size - 1, f) != size - 1)
		abort();
	fclose(f);
	if (mr_tokenizer_load(&t, path, &eb) < 0) {
		if (!strstr(eb.msg, path)) {
			fprintf(stderr, "fuzz_tokenizer: refusal without the file: %s\n", eb.msg);
			abort();
		}
		return 0;
	}
	/* a loaded tokenizer may lack byte symbols: encode may refuse, never crash */
	{
		uint32_t *ids;
		size_t n, back;
		char *s;

		if (mr_tokenizer_encode(t, sample, sizeof(sample) - 1, &ids, &n, &eb) == 0) {
			if (mr_tokenizer_decode(t, ids, n, &s, &back, &eb) == 0)
				free(s);
			free(ids);
		}
	}
	mr_tokenizer_free(t);
	return 0;
}
