"""One prepared run for a CUDA machine: the HF decoder on the real Qwen2.5 configurations.

Run from the repository root (see ``benchmarks/gpu/README.md``)::

    python benchmarks/gpu/decode.py OUT_DIR                      # on the GPU machine, < 8 min
    python benchmarks/gpu/decode.py OUT_DIR --device cpu --tiny  # smoke test here (seconds)

**The weights are random.** No real model fits the GPU machine's 64 MiB payload, so every model
is built from the published Qwen2.5 configuration (hidden size, layers, heads, KV heads, MLP
size, vocabulary) with random bfloat16 weights. Speeds are those of the real architectures;
acceptance is not, so block efficiency comes from drafts of **known** acceptance:

* ``self``: the target drafts for itself (acceptance 1: a chain of ``k`` tokens emits exactly
  ``k + 1`` per round, every tree its depth + 1): the decoder's best case, and a check;
* ``small``: the random 0.5B model drafts (acceptance near 0 against an unrelated random
  target: about one token per round): the worst case.

Pairs 1.5B/0.5B and 7B/0.5B (the 7B's vocabulary is set to the 0.5B's 151,936 so the two share
it; the real 7B pads to 152,064), B in {1, 8, 32}, ``standard`` chains of 4 and ``traversal``
on ``paths(2, 3)``, 64 new tokens from a 128-token random prompt per row, T = 1. Reported:
tokens/s, plain decoding's tokens/s in the same run (the target alone), block efficiency, and
the split of the rounds' draft, target and verify time (each phase waited for on the device at
its end; bookkeeping between phases is outside the split); the goal is verify under 5% of it.
Each result is appended to ``OUT_DIR/decode.md`` and ``decode.json`` as it is measured, so a run
cut short keeps what it did; ``--deadline-s`` skips what would not fit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: The published Qwen2.5 configurations (config.json of each model), vocabulary shared.
QWEN = {
    "0.5B": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "tie_word_embeddings": True,
    },
    "1.5B": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "tie_word_embeddings": True,
    },
    "7B": {
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "tie_word_embeddings": False,
    },
}
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "tie_word_embeddings": True,
}
VOCAB = 151936


def build(size: str, device: Any, dtype: Any, tiny: bool) -> Any:
    """A random-weight Qwen2 causal LM of the named configuration, its weights made in
    ``dtype`` (the rotary frequencies stay float32, as in a loaded checkpoint)."""
    import torch
    import transformers

    params = TINY if tiny else QWEN[size]
    config = transformers.Qwen2Config(
        vocab_size=512 if tiny else VOCAB,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        attn_implementation="sdpa",
        **params,
    )
    torch.manual_seed({"0.5B": 1, "1.5B": 2, "7B": 3}[size])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in `dtype`, as from_pretrained(dtype=...) builds:
    try:  # no float32 copy first (the 7B's would hold about 30 GB beside its bfloat16 one)
        with torch.device(device):
            model = transformers.Qwen2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = None
    return model


def main() -> None:
    made = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    made.add_argument("out", type=Path)
    made.add_argument("--device", default="cuda")
    made.add_argument("--tiny", action="store_true", help="tiny configs: a smoke test")
    made.add_argument("--deadline-s", type=float, default=480.0)
    made.add_argument("--new-tokens", type=int, default=64)
    made.add_argument("--prompt-tokens", type=int, default=128)
    args = made.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    import specsampling as ss
    from specsampling.gpu import hf

    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    md, js = args.out / "decode.md", args.out / "decode.json"
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    sizes = "tiny smoke test" if args.tiny else "real sizes"
    md.write_text(
        f"# HF decoder on random-weight Qwen2.5 configurations ({sizes})\n\n"
        f"- date {datetime.date.today()}, device {name}, torch {torch.__version__}, dtype {dtype}\n"
        "- **weights are random** (real configurations, no real weights fit the payload)\n\n"
        "| pair | draft | B | scheme | shape | tokens/s | plain tokens/s | ratio | tokens/round "
        "| draft / target / verify |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows: list[dict[str, Any]] = []
    small = build("0.5B", device, dtype, args.tiny)
    vocab = small.config.vocab_size
    for size in ("1.5B", "7B"):
        if time.perf_counter() - began > args.deadline_s:
            break
        target = build(size, device, dtype, args.tiny)
        for batch in (1, 8, 32):
            gen = torch.Generator().manual_seed(batch)
            prompt = torch.randint(vocab, (batch, args.prompt_tokens), generator=gen).to(device)

            def timed(fn: Any, *given: Any, **named: Any) -> tuple[Any, float]:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                value = fn(*given, **named)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                return value, time.perf_counter() - start

            plain_dec = hf.SpeculativeDecoder(target, None, "standard", ss.Shape.chain(1))
            plain_dec.generate(prompt, max_new_tokens=4, seed=0)  # warm-up
            plain, wall = timed(plain_dec.generate, prompt, args.new_tokens, seed=0)
            plain_rate = sum(plain.num_generated) / wall
            for label, draft in (("self", target), ("small", small)):
                for scheme, shape in (
                    ("standard", ss.Shape.chain(4)),
                    ("traversal", ss.Shape.paths(2, 3)),
                ):
                    if time.perf_counter() - began > args.deadline_s:
                        md.write_text(md.read_text() + "\n(deadline reached: the rest skipped)\n")
                        js.write_text(json.dumps(rows, indent=2))
                        return
                    dec = hf.SpeculativeDecoder(target, draft, scheme, shape)
                    dec.generate(prompt, max_new_tokens=4, seed=0)  # warm-up
                    out, wall = timed(dec.generate, prompt, args.new_tokens, seed=1)
                    st = out.stats
                    rate = sum(out.num_generated) / wall
                    busy = st.draft_time + st.target_time + st.verify_time
                    row = {
                        "pair": f"{size}/0.5B",
                        "draft": label,
                        "batch": batch,
                        "scheme": scheme,
                        "shape": repr(shape),
                        "tokens_per_second": rate,
                        "plain_tokens_per_second": plain_rate,
                        "block_efficiency": st.block_efficiency,
                        "draft_share": st.draft_time / busy,
                        "target_share": st.target_time / busy,
                        "verify_share": st.verify_time / busy,
                        "random_weights": True,
                    }
                    rows.append(row)
                    js.write_text(json.dumps(rows, indent=2))
                    md.write_text(
                        md.read_text()
                        + f"| {row['pair']} | {label} | {batch} | {scheme} | {shape!r} | "
                        f"{rate:.1f} | {plain_rate:.1f} | {rate / plain_rate:.2f}x | "
                        f"{st.block_efficiency:.2f} | {100 * row['draft_share']:.0f}% / "
                        f"{100 * row['target_share']:.0f}% / {100 * row['verify_share']:.1f}% |\n"
                    )
        del target
        if device.type == "cuda":
            torch.cuda.empty_cache()
    md.write_text(md.read_text() + f"\nrun time {time.perf_counter() - began:.0f} s\n")


if __name__ == "__main__":
    main()
