"""Which tokens each penalised request has seen, kept incrementally so a step touches only those tokens.

Repetition, presence and frequency penalties change the logits of the tokens a request has seen (prompt
and/or output), which are few next to the vocabulary. vLLM rebuilds [rows, V] bin counts every step;
here each row keeps the list of its distinct tokens, and a dense int32 table [rows, V] answers "how often
did row r output token t" in O(1). The table comes from np.zeros (calloc), so only the pages that hold
seen tokens are ever backed by memory. Table value: 2 * output count + (1 if the token is in the prompt).
"""

from __future__ import annotations

import numpy as np


class TokenOccurrences:
    def __init__(self, max_rows: int, vocab_size: int) -> None:
        self.max_rows = max_rows
        self.vocab_size = vocab_size
        self._table: np.ndarray | None = None              # allocated on the first tracked row
        self._seen = np.zeros((max_rows, 0), dtype=np.int32)  # distinct tokens, in order of first sight
        self._num_seen = np.zeros(max_rows, dtype=np.int64)

    @property
    def table(self) -> np.ndarray:
        if self._table is None:
            self._table = np.zeros((self.max_rows, self.vocab_size), dtype=np.int32)
        return self._table

    def add(self, row: int, prompt_token_ids: np.ndarray, output_token_ids: np.ndarray) -> None:
        """Start tracking `row` (which must be empty) with its prompt and the tokens it already produced."""
        table = self.table
        prompt_ids = np.unique(prompt_token_ids)
        output_ids, counts = np.unique(output_token_ids, return_counts=True)
        table[row, prompt_ids] = 1
        table[row, output_ids] += 2 * counts.astype(np.int32)
        distinct = np.union1d(prompt_ids, output_ids)
        self._reserve(len(distinct))
        self._seen[row, : len(distinct)] = distinct
        self._num_seen[row] = len(distinct)

    def clear(self, row: int) -> None:
        n = self._num_seen[row]
        if n:
            self.table[row, self._seen[row, :n]] = 0
            self._num_seen[row] = 0

    def move(self, src: int, dst: int) -> None:
        """Move row src's state to the empty row dst."""
        n = self._num_seen[src]
        tokens = self._seen[src, :n]
        table = self.table
        table[dst, tokens] = table[src, tokens]
        self._seen[dst, :n] = tokens
        self._num_seen[dst] = n
        self.clear(src)

    def append(self, rows: np.ndarray, token_ids: np.ndarray) -> None:
        """Count one new output token per row (rows are distinct and tracked)."""
        table = self.table
        previous = table[rows, token_ids]
        table[rows, token_ids] = previous + 2
        first_sight = previous == 0
        if first_sight.any():
            new_rows = rows[first_sight]
            slots = self._num_seen[new_rows]
            self._reserve(int(slots.max()) + 1)
            self._seen[new_rows, slots] = token_ids[first_sight]
            self._num_seen[new_rows] = slots + 1

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every (row, seen token) pair of the given rows, flattened: (index into rows, token, output count)."""
        counts = self._num_seen[rows]
        owner = np.repeat(np.arange(len(rows)), counts)
        starts = np.cumsum(counts) - counts
        columns = np.arange(len(owner)) - np.repeat(starts, counts)
        owner_rows = rows[owner]
        tokens = self._seen[owner_rows, columns]
        return owner, tokens, self.table[owner_rows, tokens] >> 1

    def _reserve(self, width: int) -> None:
        if width > self._seen.shape[1]:
            grown = np.zeros((self.max_rows, max(width, 2 * self._seen.shape[1], 64)), dtype=np.int32)
            grown[:, : self._seen.shape[1]] = self._seen
            self._seen = grown
