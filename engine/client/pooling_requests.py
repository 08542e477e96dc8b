"""EngineClient's pooling face: embedding requests (a pooling model's one vector per prompt).

Mixed into EngineClient, over its state: `encode()` (asyncio, one PoolingRequestOutput, vLLM's
AsyncLLM.encode) and `add_pooling_request()` (blocking; the vector arrives in the finishing RequestDelta's
`pooled`, read with poll()). A request reaches the engine with its PoolingParams resolved against the model
(engine/client/pooling.py); the engine returns the raw pooled vector and the output processor finishes it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from engine.client.output_processor import RequestCollector
from engine.client.pooling import pooling_output, resolve_pooling_params
from engine.messages import AddRequest, pack
from engine.outputs import PoolingRequestOutput
from engine.sampling_params import PoolingParams, SamplingParams

POOLING_PLACEHOLDER = SamplingParams(max_tokens=1).resolved()   # AddRequest.params of a pooling request


class PoolingRequests:
    def _make_pooling_add(self, request_id: str, prompt_token_ids, params: PoolingParams | None, priority: int,
                          arrival_time: float | None) -> AddRequest:
        self.check_task(pooling=True)
        prompt = self._prompt_array(request_id, prompt_token_ids)
        if len(prompt) > self.max_model_len:
            raise ValueError(f"the input has {len(prompt)} tokens, more than this model's maximum input length, "
                             f"max_model_len ({self.max_model_len}); pass truncate_prompt_tokens (-1: that "
                             "maximum) to truncate it")
        blocks_needed = -(-len(prompt) // self.block_size)
        if not self.config.is_encoder and blocks_needed > self.num_blocks - 1:
            raise ValueError(f"the input needs {blocks_needed} KV blocks but the cache holds {self.num_blocks - 1}")
        return AddRequest(
            req=next(self._handles), prompt_token_ids=pack(prompt), params=POOLING_PLACEHOLDER, eos_token_ids=[],
            arrival_time=time.monotonic() if arrival_time is None else arrival_time, priority=priority,
            pooling=resolve_pooling_params(params, self.config),
        )

    async def encode(self, request_id: str, prompt_token_ids, pooling_params: PoolingParams | None = None, *,
                     priority: int = 0, arrival_time: float | None = None,
                     data_parallel_rank: int | None = None) -> AsyncIterator[PoolingRequestOutput]:
        """A pooling model's vector for one prompt, as one PoolingRequestOutput once the engine has it
        (vLLM's AsyncLLM.encode). UnsupportedTaskError on a generative model, ValueError for a bad input."""
        self._start_async_request(data_parallel_rank)
        msg = self._make_pooling_add(request_id, prompt_token_ids, pooling_params, priority, arrival_time)
        collector = RequestCollector()
        self._register(msg, request_id, collector)
        finished = False
        try:
            while not finished:
                delta = await collector.get()
                finished = delta.finished
        finally:
            if not finished:
                self._abort_handle(msg.req)
        yield pooling_output(request_id, prompt_token_ids, delta)

    def add_pooling_request(self, request_id: str, prompt_token_ids, pooling_params: PoolingParams | None = None,
                            *, priority: int = 0) -> None:
        """Queue a pooling request; its vector arrives as RequestDelta.pooled in its finishing delta."""
        self._check_alive()
        msg = self._make_pooling_add(request_id, prompt_token_ids, pooling_params, priority, None)
        self._register(msg, request_id, None)
