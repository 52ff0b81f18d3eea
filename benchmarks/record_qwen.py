"""Record drafted trees of the Qwen2.5-Coder pair on HumanEval prompts, for the simulators.

Run from the repository root (the models are fetched once into the cache)::

    python benchmarks/record_qwen.py --prompts 8 --max-new-tokens 64
    specsampling simulate --recorded ~/.cache/specsampling/recorded/qwen-coder-paths-2-3-t1.npz

Target Qwen2.5-Coder-1.5B-Instruct, draft Qwen2.5-Coder-0.5B-Instruct (``--dtype``, bfloat16 by
default), the first ``--prompts`` HumanEval prompts (as ``benchmarks/decode.py``), decoded with
``--scheme`` on ``--shape``; every round's tree and both models' processed distributions are
stored (:func:`specsampling.simulators.record`, top ``--keep`` tokens per node plus tails). The
file goes into the models' cache (``$SPECSAMPLING_CACHE/recorded``), not into the repository.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from decode import human_eval_prompts

from specsampling import simulators as sim
from specsampling.compare import parse_shape
from specsampling.gpu import hf


def main() -> None:
    made = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    made.add_argument("--prompts", type=int, default=8)
    made.add_argument("--max-new-tokens", type=int, default=64)
    made.add_argument("--shape", default="paths(2, 3)")
    made.add_argument("--scheme", default="traversal")
    made.add_argument("--temperature", type=float, default=1.0)
    made.add_argument("--keep", type=int, default=256)
    made.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    made.add_argument("--threads", type=int, default=2)
    made.add_argument("--output", default=None)
    args = made.parse_args()
    torch.set_num_threads(args.threads)
    shape = parse_shape(args.shape)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = hf.load_model("qwen2.5-coder-1.5b", dtype=dtype)
    draft, _ = hf.load_model("qwen2.5-coder-0.5b", dtype=dtype)
    tag = repr(shape).replace("(", "-").replace(")", "").replace(", ", "-").replace("=", "")
    default = hf.cache_dir() / "recorded" / f"qwen-coder-{tag}-t{args.temperature:g}.npz"
    path = Path(args.output) if args.output else default
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    trees = sim.record(
        target,
        draft,
        human_eval_prompts(args.prompts),
        path,
        shape=shape,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        scheme=args.scheme,
        keep=args.keep,
        tokenizer=tokenizer,
        progress=True,
    )
    trees.meta["models"] = {"target": "qwen2.5-coder-1.5b", "draft": "qwen2.5-coder-0.5b"}
    trees.meta["dtype"] = args.dtype
    trees.save(path)
    print(trees.summary())
    print(f"wrote {path} in {time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
