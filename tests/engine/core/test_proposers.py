"""The draft proposers: prompt lookup (ngram) and suffix decoding."""

from __future__ import annotations

from engine.core.proposers import NgramProposer, SuffixProposer, SuffixTrie


def test_ngram_takes_the_longest_match_and_its_most_recent_occurrence():
    proposer = NgramProposer(1, 3)
    tokens = [1, 2, 3, 9, 1, 2, 4, 7, 2, 3]
    # "2 3" last occurred at index 1-2, followed by 9 1 2 4; the unigram "3" alone would say the same here
    assert proposer.propose(0, tokens, 4) == [9, 1, 2, 4]
    tokens += [9, 1, 2]        # indexed lazily: "9 1 2" occurred at 3-5, followed by 4 7 2
    assert proposer.propose(0, tokens, 3) == [4, 7, 2]
    tokens += [5]              # nothing ends in 5 before: no draft
    assert proposer.propose(0, tokens, 3) == []
    assert NgramProposer(2, 2).propose(1, [4, 1, 2, 8, 1, 2], 2) == [8, 1]
    assert NgramProposer(3, 3).propose(2, [4, 1, 2, 8, 1, 2], 2) == []        # no earlier 3-gram "8 1 2"


def test_ngram_forgets_finished_requests():
    proposer = NgramProposer(1, 2)
    proposer.propose(5, [1, 2, 1], 2)
    proposer.finish(5, [1, 2, 1], 1)
    assert proposer._states == {}


def test_suffix_trie_counts_substrings_and_removes_them():
    trie = SuffixTrie(depth=3)
    trie.insert([1, 2, 1, 2])
    node = trie.root.get(1).get(2)
    assert node.count == 2 and node.get(1).count == 1
    trie.insert([1, 2, 3])
    assert trie.root.get(1).get(2).count == 3
    trie.remove([1, 2, 1, 2])
    assert trie.root.get(1).get(2).count == 1 and trie.root.get(1).get(2).get(1) is None
    trie.remove([1, 2, 3])
    assert not trie.root.has_children


def test_suffix_follows_the_most_frequent_continuation_while_probable():
    tokens = [5, 6, 7, 8, 0, 5, 6, 7, 8, 0, 5, 6, 9, 0, 5, 6]
    # the longest earlier match is "0 5 6" (3 tokens), continued once by 7 8 0 5 6 and once by 9: each
    # branch has probability 1/2, and the trie's depth (8) ends the draft after 5 tokens: 2.5 tokens expected.
    # "5 6" is continued by 7 8 0 5 twice of three times: 4 x 2/3 = 2.67 expected (at most 2 x 2 tokens)
    proposer = SuffixProposer(depth=8, max_cached_requests=4, max_spec_factor=2.0, min_token_prob=0.3)
    assert proposer.propose(0, tokens, 6) == [7, 8, 0, 5]
    assert SuffixProposer(8, 4, 1.0, 0.3).propose(0, tokens, 6) == [7, 8, 0]       # 3 x 1/2 > 2 x 2/3
    assert SuffixProposer(8, 4, 2.0, 0.7).propose(0, tokens, 6) == []              # 1/2, 2/3 < 0.7
    assert SuffixProposer(8, 4, 0.5, 0.3).propose(0, tokens, 6) == [7]             # at most 0.5 x 3
    # "5 6 7" has been followed by 8 every time: certain, so the whole limit
    assert SuffixProposer(8, 4, 2.0, 0.9).propose(0, tokens[:8], 3) == [8, 0, 5]


def test_suffix_cache_of_finished_outputs_is_bounded():
    proposer = SuffixProposer(depth=6, max_cached_requests=2, max_spec_factor=4.0, min_token_prob=0.1)
    proposer.finish(1, [100, 101, 1, 2, 3, 4], 2)           # output [1, 2, 3, 4] joins the cache
    assert proposer.propose(2, [50, 1, 2], 4) == [3, 4]
    proposer.finish(3, [100, 7, 8], 1)
    proposer.finish(4, [100, 9, 9], 1)                       # the third output pushes the first out
    assert proposer.propose(5, [50, 1, 2], 4) == []
    assert proposer.propose(6, [50, 7], 4) == [8]


def test_suffix_drafts_in_full_inside_a_long_copied_stretch():
    """A match and its draft share the trie's depth: inside a copied stretch the deepest match (depth - 1
    tokens) leaves room for one token, so the proposer takes the deepest that leaves room for the limit."""
    text = list(range(100, 140))
    tokens = text + text[:30]                              # copying: 30 tokens in, the rest to come
    proposer = SuffixProposer(depth=24, max_cached_requests=0, max_spec_factor=1.0, min_token_prob=0.1)
    assert proposer.propose(0, tokens, 4) == text[30:34]
    proposer.finish(0, tokens, 0)
    cached = SuffixProposer(depth=24, max_cached_requests=4, max_spec_factor=1.0, min_token_prob=0.1)
    cached.finish(1, text, 0)                              # the same text, now in the cache of outputs
    assert cached.propose(2, text[:30], 4) == text[30:34]
