"""The executor processes, and the scheduler's handle on them: both ends of the broadcast and result rings.

`group.py` runs inside the scheduler: the `Executor` protocol, `ExecutorGroup` (spawns the ranks, the
startup handshake, one step = one broadcast write and rank 0's reply) and `LocalExecutor` (in-process).
`main.py` is an executor process (`python -m engine.executor.main`): attach, load, report KV capacity,
serve steps. `model_runner.py` turns a SchedulerOutput into one forward pass over the persistent batch
(`input_batch.py`) and samples; `cuda_graphs.py` captures and replays decode steps; `fake_runner.py` is
the torch-free zero-cost model for engine and frontend benchmarks.
"""
