"""Text to token ids and back: one id per character, or byte-level BPE trained from scratch.

    tok = CharTokenizer(text)                     # the vocabulary is the set of characters seen
    tok = BPETokenizer.train(text, vocab_size=512)  # 256 bytes + 256 learned merges
    assert tok.decode(tok.encode(s)) == s
"""

import re
from collections import Counter


class CharTokenizer:
    """The course's answer to exercise 04.1 (`char_tokenizer`): read it once your check passes.

    Each distinct character of the training text is one token, numbered in sorted order."""

    def __init__(self, text):
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, s):
        unknown = set(s) - self.stoi.keys()
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {sorted(unknown)[:10]}")
        return [self.stoi[c] for c in s]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


# ---- byte-level BPE -----------------------------------------------------------------------

# Chunks that merges never cross, like GPT-2's: words with their leading space, numbers,
# runs of punctuation, whitespace. Every character matches one branch, so chunks rebuild the text.
SPLIT = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def pair_counts(ids, counts=None, weight=1):
    """The course's answer to exercise 04.2 (`bpe_merge_step`): read it once your check passes.

    How often each adjacent pair (a, b) occurs in ids, in order of first appearance."""
    counts = Counter() if counts is None else counts
    for pair in zip(ids, ids[1:]):
        counts[pair] += weight
    return counts


def merge(ids, pair, new_id):
    """The course's answer to exercise 04.2 (`bpe_merge_step`): read it once your check passes.

    Replace every non-overlapping occurrence of `pair`, left to right, with `new_id`."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


class BPETokenizer:
    """Byte-level byte-pair encoding: ids 0..255 are bytes, each later id is a merge of two ids.

    Any string encodes (its UTF-8 bytes always do), and decoding concatenates bytes, so
    decode(encode(s)) == s for every s, non-ASCII included.
    """

    def __init__(self, merges):
        self.merges = dict(merges)   # (a, b) -> new id, in the order they were learned
        self.vocab = {i: bytes([i]) for i in range(256)}
        for (a, b), new_id in self.merges.items():
            self.vocab[new_id] = self.vocab[a] + self.vocab[b]
        self.vocab_size = len(self.vocab)
        self._cache = {}

    @classmethod
    def train(cls, text, vocab_size, verbose=False):
        """Learn vocab_size - 256 merges: each time, merge the most frequent adjacent pair.

        Pairs are counted inside chunks (see SPLIT), each distinct chunk once, weighted by how
        often it occurs. Ties go to the pair counted first.
        """
        assert vocab_size >= 256
        words = Counter(SPLIT.findall(text))
        chunks = [list(w.encode("utf-8")) for w in words]
        freqs = list(words.values())
        merges = {}
        for new_id in range(256, vocab_size):
            counts = Counter()
            for ids, f in zip(chunks, freqs):
                pair_counts(ids, counts, f)
            if not counts:
                break                                    # every chunk is a single token already
            pair = max(counts, key=counts.get)
            merges[pair] = new_id
            chunks = [merge(ids, pair, new_id) if len(ids) > 1 else ids for ids in chunks]
            if verbose:
                print(f"merge {new_id - 255}: {pair} -> {new_id}, seen {counts[pair]} times")
        return cls(merges)

    def _encode_chunk(self, chunk):
        if chunk not in self._cache:
            ids = list(chunk.encode("utf-8"))
            while len(ids) > 1:
                # apply the earliest learned merge that is possible, as training did
                pair = min(zip(ids, ids[1:]), key=lambda p: self.merges.get(p, float("inf")))
                if pair not in self.merges:
                    break
                ids = merge(ids, pair, self.merges[pair])
            self._cache[chunk] = ids
        return self._cache[chunk]

    def encode(self, s):
        return [i for chunk in SPLIT.findall(s) for i in self._encode_chunk(chunk)]

    def decode(self, ids):
        return b"".join(self.vocab[i] for i in ids).decode("utf-8", errors="replace")

    def token_str(self, i):
        """A token as readable text (bytes that are not whole UTF-8 characters shown escaped)."""
        b = self.vocab[i]
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return str(b)[2:-1]
