"""Where a request goes among data-parallel engines: by load, and by the prefix each engine holds.

Load is vLLM's DP balancer score, `waiting * 4 + running`, from the freshest counts the frontend has (see
`DPEngineClient.loads`). The prefix side is what vLLM's internal balancer lacks: the router hashes the first
`PREFIX_BLOCKS` full KV blocks of the prompt exactly as the scheduler's KV cache manager does
(`engine.block_hash`) and remembers which engine it sent each hash to, in an LRU bounded by the engines'
KV capacity. A request goes to the engine holding its longest remembered prefix unless that engine is
much busier than the least-loaded one (SGLang's cache_aware rule: both an absolute and a relative gap),
in which case load wins and the prefix moves with it. Requests with no remembered prefix go to the
least-loaded engine, ties broken towards the engine that has been sent the fewest requests.

The memory is approximate (built from routing history, not from the engines' caches), as in SGLang's and
vllm-router's cache_aware policies; eviction inside an engine is not seen. Policies: prefix (default),
load, round_robin (the benchmarks' baseline).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.block_hash import prefix_block_hashes

PREFIX_BLOCKS = 16          # hashed per request: longest-prefix matching up to 16 blocks (256 tokens at 16)
BUSIER_ABS = 16             # the prefix's engine is "much busier" when its score exceeds the least
BUSIER_REL = 1.5            # loaded engine's by more than BUSIER_ABS and by more than BUSIER_REL times


def load_score(waiting: int, running: int) -> int:
    """vLLM's DP load-balancing score (DPLBAsyncMPClient)."""
    return waiting * 4 + running


class Router:
    """Picks a data-parallel rank per request; `choose` is on the request path (microseconds)."""

    def __init__(self, num_engines: int, block_size: int, policy: str = "prefix",
                 capacity_blocks: int = 1 << 20, prefix_blocks: int = PREFIX_BLOCKS) -> None:
        if num_engines < 1:
            raise ValueError(f"a router needs at least one engine, got {num_engines}")
        if policy not in ("prefix", "load", "round_robin"):
            raise ValueError(f"unknown routing policy {policy!r}")
        self.num_engines = num_engines
        self.block_size = block_size
        self.policy = policy
        self.prefix_blocks = prefix_blocks
        self.capacity_blocks = max(capacity_blocks, 1)
        self.owner: OrderedDict[bytes, int] = OrderedDict()     # block hash -> engine, LRU order
        self.routed = [0] * num_engines                         # requests sent to each engine
        self._next = 0

    def choose(self, prompt_token_ids: Sequence[int], cache_salt: str | None,
               scores: Sequence[int]) -> int:
        """The rank for a request, given each engine's load score (see load_score)."""
        if self.policy == "round_robin":
            rank = self._next
            self._next = (rank + 1) % self.num_engines
        else:
            routed = self.routed
            rank = min(range(self.num_engines), key=lambda e: (scores[e], routed[e]))
            if self.policy == "prefix":
                hashes = prefix_block_hashes(prompt_token_ids, self.block_size, cache_salt, self.prefix_blocks)
                if hashes:
                    owner = self._longest_owner(hashes)
                    if owner is not None and not self._much_busier(scores[owner], scores[rank]):
                        rank = owner
                    self._remember(hashes, rank)
        self.routed[rank] += 1
        return rank

    def pinned(self, rank: int, prompt_token_ids: Sequence[int], cache_salt: str | None) -> int:
        """A request pinned to `rank` (X-data-parallel-rank): its prefix now lives there too."""
        if not 0 <= rank < self.num_engines:
            raise ValueError(f"data-parallel rank {rank} does not exist: ranks are 0..{self.num_engines - 1}")
        if self.policy == "prefix":
            hashes = prefix_block_hashes(prompt_token_ids, self.block_size, cache_salt, self.prefix_blocks)
            self._remember(hashes, rank)
        self.routed[rank] += 1
        return rank

    def _longest_owner(self, hashes: list[bytes]) -> int | None:
        owner = self.owner
        for block_hash in reversed(hashes):
            rank = owner.get(block_hash)
            if rank is not None:
                return rank
        return None

    @staticmethod
    def _much_busier(score: int, best: int) -> bool:
        return score - best > BUSIER_ABS and score > BUSIER_REL * best

    def _remember(self, hashes: list[bytes], rank: int) -> None:
        owner = self.owner
        for block_hash in hashes:
            owner[block_hash] = rank
            owner.move_to_end(block_hash)
        while len(owner) > self.capacity_blocks:
            owner.popitem(last=False)
