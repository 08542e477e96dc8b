"""The prefix cache's block hash: one definition for the scheduler and the frontend's data-parallel router.

The scheduler's KV cache manager names each full block of a request's tokens by a chained sha256 over
(parent block's hash, the block's int32 token ids, extra keys), the first block's extra keys holding the
cache_salt. The frontend's router (`engine.client.router`) hashes the first blocks of a prompt the same way
to send requests that share a prefix to the engine that holds it; so the scheme lives here, in a root
contract both sides may import, and the two can never drift apart.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

# The parent of every request's first block. Fixed, so hashes are stable across processes and restarts.
ROOT_BLOCK_HASH = hashlib.sha256(b"ringserve prefix cache v1").digest()
NO_EXTRA_KEYS = b""


def hash_block_tokens(parent_hash: bytes, token_bytes: bytes, extra_keys: bytes = NO_EXTRA_KEYS) -> bytes:
    """sha256 over the parent's 32-byte digest, the block's int32 token ids and the extra keys.

    The first two parts have fixed sizes, so the concatenation is unambiguous.
    """
    return hashlib.sha256(parent_hash + token_bytes + extra_keys).digest()


def salt_extra_keys(cache_salt: str | None) -> bytes:
    return NO_EXTRA_KEYS if cache_salt is None else b"salt\x00" + cache_salt.encode()


def prefix_block_hashes(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None,
                        max_blocks: int | None = None) -> list[bytes]:
    """The chained hashes of the first full blocks of token_ids (all of them unless max_blocks), exactly
    as the scheduler's KV cache manager computes them for a request."""
    num_blocks = len(token_ids) // block_size
    if max_blocks is not None:
        num_blocks = min(num_blocks, max_blocks)
    if num_blocks <= 0:
        return []
    data = array("i", token_ids[:num_blocks * block_size]).tobytes()
    width = 4 * block_size
    parent = hash_block_tokens(ROOT_BLOCK_HASH, data[:width], salt_extra_keys(cache_salt))
    hashes = [parent]
    for i in range(1, num_blocks):
        parent = hash_block_tokens(parent, data[i * width: (i + 1) * width])
        hashes.append(parent)
    return hashes


def external_block_hash(block_hash: bytes) -> int:
    """A block hash as KV-cache events carry it: vLLM's default 64-bit integer form (the digest's last
    eight bytes, big-endian), which routers consuming vLLM's events expect."""
    return int.from_bytes(block_hash[-8:], "big")
