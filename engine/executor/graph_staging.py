"""Pinned host staging of the CUDA-graph inputs: one gather per input into pinned memory, one contiguous
non-blocking copy per input to the graph's static buffers (review F9, F10).

Block tables: each request's row of the persistent table is gathered straight into the pinned mirror,
whose rows have the persistent table's full width, so the copy to the device is one contiguous DMA. (The
old path gathered a [R, w] copy, copied it into the mirror, then copied a [:size, :w] slice, which is not
contiguous: ATen staged it through a pageable temporary, a blocking copy and a device-to-device kernel.)
Full rows cost size x max_blocks x 4 bytes per step, asynchronously: 256 KB at 256 sequences of 4k tokens.

Reuse: the pinned arrays are rewritten every step while the previous step's copies may still be reading
them (nothing else orders the two once a step has no host sync), so fill() waits for the event recorded
after the previous copies were issued; that wait is normally already over.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.executor.input_batch import StepInputs

# name -> (dtype, value of padding entries past the live rows)
INPUTS = {
    "input_ids": (torch.int64, 0),
    "positions": (torch.int64, 0),
    "slot_mapping": (torch.int64, -1),      # the KV write skips slot -1
    "seq_lens": (torch.int32, 1),           # padding rows attend one position of the null block
}


class GraphInputStaging:
    def __init__(self, max_size: int, max_blocks: int, *, pin: bool,
                 make_event: Callable[[], object] | None = None) -> None:
        def buffer(shape, dtype) -> torch.Tensor:
            tensor = torch.zeros(shape, dtype=dtype)
            return tensor.pin_memory() if pin else tensor

        self.host = {name: buffer((max_size,), dtype) for name, (dtype, _) in INPUTS.items()}
        self.host["block_tables"] = buffer((max_size, max_blocks), torch.int32)
        self._np = {name: t.numpy() for name, t in self.host.items()}
        self._make_event = make_event
        self._copied = None          # event recorded after the last copies were enqueued

    def fill(self, inputs: StepInputs, size: int) -> None:
        """Write a step's inputs for `size` padded rows into the host buffers."""
        if self._copied is not None:
            self._copied.synchronize()
        n = inputs.num_tokens
        seq_lens, rows = inputs.token_rows()          # a verify step: one decode row per query token
        host = self._np
        for name, (_, pad) in INPUTS.items():
            host[name][:n] = seq_lens if name == "seq_lens" else getattr(inputs, name)
            host[name][n:size] = pad
        tables = host["block_tables"]
        if inputs.block_table.shape[1] != tables.shape[1]:
            raise ValueError(f"block table width {inputs.block_table.shape[1]} != staging width {tables.shape[1]}")
        np.take(inputs.block_table, rows, axis=0, out=tables[:n])
        tables[n:size, 0] = 0                # the null block; later columns are never read (seq_len 1)

    def copy_to(self, device_buffers: dict[str, torch.Tensor], size: int) -> None:
        """Enqueue one contiguous non-blocking copy per input, then record the reuse event."""
        for name, host in self.host.items():
            device_buffers[name][:size].copy_(host[:size], non_blocking=True)
        if self._make_event is not None:
            self._copied = self._make_event()
            self._copied.record()
