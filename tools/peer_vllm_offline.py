"""Runs the offline workload in vLLM, for tools/compare_vllm.py. Executed by the PEER's interpreter (the
vLLM virtual environment): it imports vllm and the standard library only, never ringserve.

    VLLM_PYTHON tools/peer_vllm_offline.py WORKLOAD_JSON MODEL_DIR ENGINE_ARGS_JSON
prints one line "PEER-RESULT " + JSON: {"engine": "vllm", "seconds": ..., "output_tokens": ..., "output_tokens_per_s": ...}
"""

import json
import sys
import time


def main() -> None:
    from vllm import LLM, SamplingParams

    with open(sys.argv[1]) as f:
        workload = json.load(f)
    engine_args = json.loads(sys.argv[3])
    llm = LLM(sys.argv[2], **engine_args)
    params = [SamplingParams(temperature=workload["temperature"], top_k=workload["top_k"] or -1,
                             top_p=workload["top_p"], ignore_eos=True, max_tokens=n)
              for n in workload["output_lens"]]
    llm.generate([{"prompt_token_ids": workload["prompts"][0][:16]}], SamplingParams(max_tokens=4),
                 use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in workload["prompts"]], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    print("PEER-RESULT " + json.dumps({"engine": "vllm", "seconds": elapsed, "output_tokens": generated,
                      "output_tokens_per_s": generated / elapsed}), flush=True)


if __name__ == "__main__":
    main()
