"""Model-free draft proposers for speculative decoding: n-gram prompt lookup and suffix decoding.

Both read only the request's token list (prompt + output), which the scheduler holds, and index it lazily:
a request's tokens are indexed when it is next asked for a proposal, so a request that never drafts (the
batch is too large, its acceptance is too low) costs nothing, and every token is indexed once.

- `NgramProposer` (vLLM's "ngram", prompt lookup decoding): the longest n-gram (prompt_lookup_min <= n <=
  prompt_lookup_max) that ends the sequence and occurred before; the draft is the k tokens that followed
  its most recent earlier occurrence. One dict per request maps each n-gram to where it last ended.
- `SuffixProposer` (vLLM's "suffix", after SuffixDecoding, arXiv 2411.04975): a depth-limited suffix trie
  with occurrence counts over the request's own tokens, plus one bounded trie over the outputs of recently
  finished requests. The longest suffix of the sequence found in a trie (with a continuation) is followed
  along its most frequent children while the estimated probability of the whole draft (the product of
  count ratios) stays above min_token_prob; the draft is at most max_spec_factor x the matched length.
  The trie (local or global) whose draft has the larger expected accepted length (the sum of those
  probabilities) proposes.
"""

from __future__ import annotations

from collections import deque

from engine.config import SpeculativeConfig


def make_proposer(config: SpeculativeConfig) -> NgramProposer | SuffixProposer:
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    return SuffixProposer(config.suffix_decoding_max_tree_depth, config.suffix_decoding_max_cached_requests,
                          config.suffix_decoding_max_spec_factor, config.suffix_decoding_min_token_prob)


class _NgramIndex:
    __slots__ = ("last_end", "indexed", "match_end")

    def __init__(self) -> None:
        self.last_end: dict[tuple[int, ...], int] = {}     # n-gram -> index of its last token, last seen
        self.indexed = 0                                  # tokens entered so far
        self.match_end = -1                               # where the current suffix last ended before


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._states: dict[int, _NgramIndex] = {}

    def propose(self, req: int, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` draft tokens to follow `tokens` (the request's whole sequence)."""
        state = self._states.get(req)
        if state is None:
            state = self._states[req] = _NgramIndex()
        end = len(tokens)
        if state.indexed < end:
            self._index(state, tokens, end)
        start = state.match_end + 1
        return tokens[start:start + limit] if start else []

    def _index(self, state: _NgramIndex, tokens: list[int], end: int) -> None:
        last_end = state.last_end
        low, high = self.min_n, self.max_n
        for j in range(state.indexed, end - 1):           # earlier tokens: record only
            for n in range(low, min(high, j + 1) + 1):
                last_end[tuple(tokens[j - n + 1:j + 1])] = j
        j = end - 1                                       # the last token: look up, then record
        state.match_end = -1
        for n in range(min(high, end), low - 1, -1):      # longest n-gram first
            key = tuple(tokens[j - n + 1:end])
            previous = last_end.get(key)
            if previous is not None and state.match_end < 0:
                state.match_end = previous
            last_end[key] = j
        state.indexed = end

    def finish(self, req: int, tokens: list[int], num_prompt_tokens: int) -> None:
        self._states.pop(req, None)


class _Node:
    """A trie node: how often its string occurred, and its children by next token. A node with one child
    keeps it inline (most nodes of a deep trie lie on unbranched paths); more go into a dict."""

    __slots__ = ("count", "token", "child", "children")

    def __init__(self) -> None:
        self.count = 0
        self.token = -1
        self.child: _Node | None = None
        self.children: dict[int, _Node] | None = None

    def get(self, token: int) -> _Node | None:
        if self.token == token:
            return self.child
        return None if self.children is None else self.children.get(token)

    def add(self, token: int) -> _Node:
        node = self.get(token)
        if node is None:
            node = _Node()
            if self.child is None and self.children is None:
                self.token, self.child = token, node
            else:
                if self.children is None:
                    self.children = {self.token: self.child}
                    self.token, self.child = -1, None
                self.children[token] = node
        node.count += 1
        return node

    def remove(self, token: int) -> None:
        if self.token == token:
            self.token, self.child = -1, None
        elif self.children is not None:
            del self.children[token]

    def most_frequent(self) -> tuple[int, _Node] | None:
        if self.child is not None:
            return self.token, self.child
        if not self.children:
            return None
        token = max(self.children, key=lambda t: self.children[t].count)
        return token, self.children[token]

    @property
    def has_children(self) -> bool:
        return self.child is not None or bool(self.children)


class SuffixTrie:
    """Every substring of up to `depth` tokens of what was appended, with its occurrence count."""

    __slots__ = ("depth", "root", "active")

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = _Node()
        self.active: list[_Node] = []       # active[i]: the node of the last i + 1 tokens appended

    def append(self, tokens: list[int]) -> None:
        depth, root, active = self.depth, self.root, self.active
        for token in tokens:
            extended = [root.add(token)]
            extended.extend(node.add(token) for node in active[:depth - 1])
            active = extended
        self.active = active

    def insert(self, tokens: list[int]) -> None:
        """Add one separate sequence (its suffixes do not continue what was appended before)."""
        self.active = []
        self.append(tokens)
        self.active = []

    def remove(self, tokens: list[int]) -> None:
        """Undo insert(tokens): lower the counts of its substrings, dropping nodes that reach zero."""
        depth = self.depth
        for start in range(len(tokens)):
            node = self.root
            for token in tokens[start:start + depth]:
                child = node.get(token)
                child.count -= 1
                if child.count == 0:
                    node.remove(token)
                    break
                node = child

    def longest_match(self, tokens: list[int]) -> tuple[_Node, int]:
        """The node of the longest suffix of `tokens` (shorter than the depth) that has a continuation
        here, and its length; (root, 0) when none has."""
        for length in range(min(self.depth - 1, len(tokens)), 0, -1):
            node = self.root
            for token in tokens[len(tokens) - length:]:
                node = node.get(token)
                if node is None:
                    break
            if node is not None and node.has_children:
                return node, length
        return self.root, 0


def follow(node: _Node, seen: int, limit: int, min_prob: float) -> tuple[list[int], float]:
    """The most frequent continuation from `node` (of whose `seen` occurrences some continue) while the
    product of count ratios stays >= min_prob: (tokens, sum of those probabilities)."""
    draft: list[int] = []
    prob, score = 1.0, 0.0
    while len(draft) < limit and seen > 0:
        best = node.most_frequent()
        if best is None:
            break
        token, child = best
        prob *= min(child.count / seen, 1.0)
        if prob < min_prob:
            break
        draft.append(token)
        score += prob
        node, seen = child, child.count
    return draft, score


class _LocalTrie:
    __slots__ = ("trie", "indexed")

    def __init__(self, depth: int) -> None:
        self.trie = SuffixTrie(depth)
        self.indexed = 0


class SuffixProposer:
    def __init__(self, depth: int, max_cached_requests: int, max_spec_factor: float, min_token_prob: float) -> None:
        self.depth = depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.max_cached_requests = max_cached_requests
        self.cache = SuffixTrie(depth)                    # outputs of recently finished requests
        self._cached: deque[list[int]] = deque()
        self._local: dict[int, _LocalTrie] = {}

    def propose(self, req: int, tokens: list[int], limit: int) -> list[int]:
        local = self._local.get(req)
        if local is None:
            local = self._local[req] = _LocalTrie(self.depth)
        if local.indexed < len(tokens):
            local.trie.append(tokens[local.indexed:])
            local.indexed = len(tokens)
        best: list[int] = []
        best_score = 0.0
        # The local match: of the sequence's own suffixes with a continuation (the current occurrence, at
        # the end, has none yet, so count - 1 occurrences may continue), the one whose draft scores best
        # (its expected accepted tokens), deepest first. Not simply the deepest: a match and its draft
        # share the trie's depth, so a match of depth - 1 tokens (any copied stretch soon has one) could
        # draft one token only.
        active = local.trie.active
        for length in range(min(len(active), self.depth - 1), 0, -1):
            node = active[length - 1]
            if not node.has_children:
                continue
            cap = self._cap(limit, length)
            draft, score = follow(node, node.count - 1, cap, self.min_token_prob)
            if score > best_score:
                best, best_score = draft, score
                if score >= cap:            # every token certain and as many as allowed: none scores more
                    return best
        if self._cached:
            node, length = self.cache.longest_match(tokens[-max(1, self.depth - limit):])   # room to draft
            if length:
                draft, score = follow(node, node.count, self._cap(limit, length), self.min_token_prob)
                if score > best_score:
                    best = draft
        return best

    def _cap(self, limit: int, match_length: int) -> int:
        return min(limit, int(self.max_spec_factor * match_length))

    def finish(self, req: int, tokens: list[int], num_prompt_tokens: int) -> None:
        """Forget the request; its output joins the cache of recent outputs (the oldest leaves past the
        bound)."""
        self._local.pop(req, None)
        output = tokens[num_prompt_tokens:]
        if not self.max_cached_requests or not output:
            return
        self.cache.insert(output)
        self._cached.append(output)
        if len(self._cached) > self.max_cached_requests:
            self.cache.remove(self._cached.popleft())
