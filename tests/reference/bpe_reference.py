#!/usr/bin/env python3
"""bpe_reference.py - a reference byte-level BPE encoder for test_tokenizer.

Reads a Hugging Face tokenizer.json and encodes a UTF-8 text file the way
the tokenizers library does for a byte-level BPE (the GPT-2 and Llama 3
kind), written plainly and separately from runtime/data/tokenizer*.c so the
two can disagree: the regexes run on the `regex` module (Debian's
python3-regex), BPE is GPT-2's encoder.py loop (merge every occurrence of
the lowest-rank pair, repeat).

  bpe_reference.py TOKENIZER.json TEXT_FILE   prints the ids, one a line

Covers: added tokens (matched literally, longest first), ByteLevel
(add_prefix_space, use_regex with GPT-2's pattern), Split (Isolated,
Removed, MergedWithPrevious, MergedWithNext), Sequence, merges as "a b" or
["a", "b"], model.ignore_merges. Anything else is an error.
"""
import json
import sys

import regex

GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                r"""|\s+(?!\S)|\s+""")


def byte_table():
    """GPT-2's bytes_to_unicode: printable latin-1 bytes are themselves,
    the rest U+0100 onward in byte order."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1))
            + list(range(0xAE, 0xFF + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTES = byte_table()


def split_step(pieces, pattern, behavior):
    out = []
    for p in pieces:
        cut = 0
        for m in regex.finditer(pattern, p):
            s, e = m.span()
            if s == e:
                continue
            if behavior == "Isolated":
                out += [p[cut:s]] if s > cut else []
                out.append(p[s:e])
                cut = e
            elif behavior == "Removed":
                out += [p[cut:s]] if s > cut else []
                cut = e
            elif behavior == "MergedWithPrevious":
                out.append(p[cut:e])
                cut = e
            elif behavior == "MergedWithNext":
                out += [p[cut:s]] if s > cut else []
                cut = s
            else:
                raise SystemExit("unsupported behavior " + behavior)
        if len(p) > cut:
            out.append(p[cut:])
    return out


def flatten(pre):
    if pre["type"] == "Sequence":
        return [s for p in pre["pretokenizers"] for s in flatten(p)]
    return [pre]


class Reference:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
        model = tok["model"]
        assert model["type"] == "BPE"
        self.vocab = model["vocab"]
        self.ignore_merges = bool(model.get("ignore_merges"))
        self.ranks = {}
        for i, m in enumerate(model["merges"]):
            a, b = m.split(" ") if isinstance(m, str) else m
            self.ranks.setdefault((a, b), i)
        self.added = sorted(((a["content"], a["id"]) for a in tok.get("added_tokens") or []),
                            key=lambda x: -len(x[0]))
        self.steps = flatten(tok["pre_tokenizer"])

    def pre_tokenize(self, text):
        pieces = [text]
        for st in self.steps:
            if st["type"] == "ByteLevel":
                if st.get("add_prefix_space"):
                    pieces = [p if p.startswith(" ") else " " + p for p in pieces]
                if st.get("use_regex", True):
                    pieces = split_step(pieces, GPT2_PATTERN, "Isolated")
            elif st["type"] == "Split":
                pat = st["pattern"]
                rx = pat["Regex"] if "Regex" in pat else regex.escape(pat["String"])
                pieces = split_step(pieces, rx, st.get("behavior", "Isolated"))
            else:
                raise SystemExit("unsupported pre-tokenizer " + st["type"])
        return pieces

    def bpe(self, piece):
        word = [BYTES[b] for b in piece.encode("utf-8")]
        if self.ignore_merges and "".join(word) in self.vocab:
            return [self.vocab["".join(word)]]
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return [self.vocab[w] for w in word]

    def encode(self, text):
        ids, seg, at = [], 0, 0
        while at < len(text):
            hit = next((a for a in self.added if text.startswith(a[0], at)), None)
            if not hit:
                at += 1
                continue
            for p in self.pre_tokenize(text[seg:at]) if at > seg else []:
                ids += self.bpe(p)
            ids.append(hit[1])
            at += len(hit[0])
            seg = at
        for p in self.pre_tokenize(text[seg:]) if len(text) > seg else []:
            ids += self.bpe(p)
        return ids


def main():
    ref = Reference(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8", newline="") as f:
        text = f.read()
    for i in ref.encode(text):
        print(i)


if __name__ == "__main__":
    main()
