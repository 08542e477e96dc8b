"""The scheduler process (the engine core). It never imports torch.

`main.py` is the process: attach the frontend's rings, start the executors through
`engine.executor.group`, hand the frontend the KV capacity, then loop. `engine_core.py` is one step:
schedule, execute, update. `scheduler.py` decides what runs each step under the token budget (continuous
batching, chunked prefill, preemption); `request_queue.py` holds the waiting queues (fcfs, priority);
`kv_cache_manager.py` maps requests to KV blocks with prefix caching over `block_pool.py`; `request.py`
is a request's state.
"""
