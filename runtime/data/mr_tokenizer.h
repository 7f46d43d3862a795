/*
 * mr_tokenizer.h - byte-level BPE tokenizers read from a Hugging Face
 * tokenizer.json (the GPT-2 and Llama 3 kind).
 *
 * What is read (the format of the `tokenizers` library's tokenizer.json):
 *   model         type "BPE"; vocab (token string -> id); merges, each
 *                 either "a b" or ["a", "b"], rank = position in the list;
 *                 ignore_merges (Llama 3: a word found whole in the vocab
 *                 is one token). dropout, byte_fallback, a subword prefix
 *                 or an end-of-word suffix are refused.
 *   added_tokens  matched literally in the raw text, longest first, before
 *                 anything else; a match is its id, never split.
 *   normalizer    null only.
 *   pre_tokenizer ByteLevel (add_prefix_space; use_regex: the GPT-2 split
 *                 below), Split (a Regex or String pattern; behaviour
 *                 Isolated, Removed, MergedWithPrevious, MergedWithNext;
 *                 invert false), or a Sequence of them (Llama 3: Split with
 *                 its pattern, then ByteLevel with use_regex false).
 *                 Regexes are PCRE2 with UTF and Unicode properties (\p{L},
 *                 (?!\S), (?i:...) as the files write them).
 *   decoder       ByteLevel or null: an id's bytes are its vocab string
 *                 mapped back through GPT-2's byte <-> unicode table (bytes
 *                 '!'..'~', 0xA1..0xAC, 0xAE..0xFF are their own code
 *                 point, the other 68 bytes U+0100 onward in byte order);
 *                 an added token decodes to its content.
 * post_processor (a BOS that Llama 3 adds) is not applied: encode gives
 * the ids of the text alone, as `add_special_tokens=False` does.
 *
 * Encoding: the text must be valid UTF-8; it is cut at added tokens, each
 * other part pre-tokenized into words, each word's bytes mapped to their
 * byte-level symbols and merged by BPE (the adjacent pair of lowest merge
 * rank first, leftmost among equals; ranks found by hash), with a per-call
 * cache of words already seen. decode(encode(x)) == x for any x.
 *
 * Ownership: mr_tokenizer_load allocates *out, mr_tokenizer_free releases
 * it (NULL is a no-op). encode/decode allocate *ids / *text with malloc;
 * the caller frees them. A loaded tokenizer is read-only: encode and
 * decode may run on it from several threads at once.
 * Non-goals: WordPiece/Unigram models, normalizers, sentencepiece-style
 * (Metaspace) tokenizers, the added-token options lstrip/rstrip/
 * single_word, offsets.
 */
#ifndef MR_TOKENIZER_H
#define MR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "mr_err.h"

/* The GPT-2 pre-tokenizer regex (ByteLevel with use_regex true), as
 * GPT-2's encoder.py and the tokenizers library's ByteLevel write it. */
#define MR_TOKENIZER_GPT2_REGEX \
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* Bounds: a tokenizer.json of at most 512 MiB, at most 2^24 tokens, an
 * encode input of at most 2 GiB. */
#define MR_TOKENIZER_MAX_FILE ((size_t)512 << 20)
#define MR_TOKENIZER_MAX_VOCAB (1 << 24)
#define MR_TOKENIZER_MAX_TEXT ((size_t)2 << 30)

struct mr_tokenizer;

/* Reads path. MR_ENOTFOUND when it does not exist, MR_EPARSE (not JSON),
 * MR_ENOTSUP (not a byte-level BPE this module reads), MR_ECORRUPT (an
 * inconsistent file: a merge naming an unknown token, a duplicate id, a
 * regex that does not compile), MR_ELIMIT, MR_ENOMEM; the message names
 * the file and the reason. */
int mr_tokenizer_load(struct mr_tokenizer **out, const char *path, struct mr_errbuf *eb);
/* The ids of text[0..len) into *ids (malloc'd, *n of them; NULL when 0).
 * MR_EINVAL when text is not valid UTF-8 (the message gives the offset),
 * MR_ELIMIT past MR_TOKENIZER_MAX_TEXT. */
int mr_tokenizer_encode(const struct mr_tokenizer *t, const char *text, size_t len,
			uint32_t **ids, size_t *n, struct mr_errbuf *eb);
/* The bytes of ids[0..n) into *text (malloc'd, NUL-terminated, *len bytes
 * before the NUL). The raw bytes, not repaired: ids that end inside a
 * multi-byte character (as a generator's stream may, one id at a time)
 * give its first bytes, and the next ids the rest. MR_ERANGE names an id
 * that is not in the vocabulary. */
int mr_tokenizer_decode(const struct mr_tokenizer *t, const uint32_t *ids, size_t n,
			char **text, size_t *len, struct mr_errbuf *eb);
/* 1 + the largest id (vocab or added token): the least vocab_size of a
 * model that reads the tokenizer's ids. */
int mr_tokenizer_vocab_size(const struct mr_tokenizer *t);
/* The id of the added token whose content is exactly name, -1 if none
 * (e.g. "<|endoftext|>"). */
int mr_tokenizer_added_id(const struct mr_tokenizer *t, const char *name);
void mr_tokenizer_free(struct mr_tokenizer *t);

#endif
