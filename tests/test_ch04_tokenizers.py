"""The char and byte-level BPE tokenizers: round trips for any string, and merges as specified."""

from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.gpt.tokenizers import SPLIT, BPETokenizer, CharTokenizer, merge, pair_counts

CORPUS = ("The quick brown fox's 3 jumps over the lazy dog, twice; then it jumped again: 1234!\n"
          "    def f(x_1):\n        return x_1 ** 2  # naïve café, déjà vu\n") * 3
BPE = BPETokenizer.train(CORPUS, 256 + 40)


@settings(max_examples=30, deadline=None)
@given(st.text())
def test_bpe_round_trips_any_string(s):
    assert BPE.decode(BPE.encode(s)) == s


@settings(max_examples=30, deadline=None)
@given(st.text())
def test_split_chunks_rebuild_the_text(s):
    assert "".join(SPLIT.findall(s)) == s


@settings(max_examples=20, deadline=None)
@given(st.text(alphabet=sorted(set(CORPUS))))
def test_char_round_trips(s):
    tok = CharTokenizer(CORPUS)
    assert tok.decode(tok.encode(s)) == s


def test_bpe_compresses_and_merges_are_ordered():
    ids = BPE.encode(CORPUS)
    assert len(ids) < 0.7 * len(CORPUS.encode())
    assert list(BPE.merges.values()) == list(range(256, 296))
    for (a, b), new in BPE.merges.items():
        assert a < new and b < new and BPE.vocab[new] == BPE.vocab[a] + BPE.vocab[b]
    assert BPE.token_str(256) == BPE.vocab[256].decode()


def test_first_merge_is_the_most_frequent_pair():
    words = SPLIT.findall(CORPUS)
    counts = pair_counts([])
    for w in words:
        pair_counts(list(w.encode()), counts)
    assert next(iter(BPE.merges)) == max(counts, key=counts.get)


def test_merge_is_left_to_right_and_non_overlapping():
    assert merge([5, 5, 5, 7, 5, 5], (5, 5), 300) == [300, 5, 7, 300]
    assert merge([1, 2], (2, 1), 9) == [1, 2]
    assert pair_counts([5, 5, 5]) == {(5, 5): 2}


def test_char_tokenizer_refuses_unknown_characters():
    import pytest
    with pytest.raises(ValueError, match="not in the vocabulary"):
        CharTokenizer("abc").encode("abz")
