/*
 * tokenizer_int.h - the loaded tokenizer, shared by tokenizer.c (reading
 * tokenizer.json) and tokenizer_bpe.c (encode, decode). Not a public API.
 */
#ifndef MR_TOKENIZER_INT_H
#define MR_TOKENIZER_INT_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/mr_tokenizer.h"
#include "mr_dict.h"

#define MR__TK_MAX_STEPS 8

/* how a Split step keeps what its pattern matched (the tokenizers
 * library's SplitDelimiterBehavior) */
enum mr__tk_behavior {
	MR__TK_ISOLATED,    /* a piece of its own */
	MR__TK_REMOVED,     /* dropped */
	MR__TK_MERGED_PREV, /* appended to the piece before it */
	MR__TK_MERGED_NEXT, /* prepended to the piece after it */
};

/* one pre-tokenizer step: a regex split, or ByteLevel (re NULL unless
 * use_regex) */
struct mr__tk_step {
	pcre2_code *re;
	enum mr__tk_behavior behavior;
	int byte_level;
	int prefix_space; /* ByteLevel add_prefix_space */
};

/* merge table slot: the pair (a, b) -> rank and the merged id; rank
 * UINT32_MAX marks an empty slot */
struct mr__tk_merge {
	uint32_t a, b, rank, id;
};

struct mr__tk_added {
	char *s;
	size_t len;
	uint32_t id;
};

struct mr_tokenizer {
	char path[256];
	int nid;                   /* 1 + the largest id */
	char **bytes;              /* (nid) each id's decoded bytes, NULL for a hole */
	uint32_t *blen;            /* (nid) their lengths */
	struct mr_dict vocab;      /* byte-level string -> id + 1 (the model's vocab) */
	int32_t byte_id[256];      /* id of each byte's one-symbol token, -1 none */
	struct mr__tk_merge *merge; /* open addressing, power-of-two mcap */
	size_t mcap;
	struct mr__tk_added *added; /* longest first */
	size_t nadded;
	unsigned char added_first[256]; /* 1: an added token starts with this byte */
	struct mr__tk_step step[MR__TK_MAX_STEPS];
	int nstep;
	int ignore_merges;
};

/* GPT-2's byte <-> unicode table: the code point standing for byte b;
 * the byte a code point stands for, -1 for none. */
uint32_t mr__tk_byte_cp(unsigned b);
int mr__tk_cp_byte(uint32_t cp);
/* Appends the UTF-8 of cp to out (room for 4); returns the bytes written. */
size_t mr__tk_utf8_put(uint32_t cp, char *out);
/* The merge slot of (a, b), NULL when no merge joins them. */
const struct mr__tk_merge *mr__tk_merge_find(const struct mr_tokenizer *t, uint32_t a,
					     uint32_t b);

#endif
