"""Benchmark: torch chain verification on CPU from logits, vs Hugging Face and a read floor.

Run from the repository root::

    pip install -e ".[torch]" transformers   # transformers: the Hugging Face baseline
    python benchmarks/torch_chains.py            # writes benchmarks/results/torch_chains-<date>.md
    python benchmarks/torch_chains.py --no-write # print only
    python benchmarks/torch_chains.py --quick --output /tmp/chains.md   # seconds: smoke test

One chain round of a correlated model pair (``common.chain_logits``: target logits
``[B, γ + 1, V]`` = 3 x N(0, 1), draft logits ``[B, γ, V]`` = the same plus N(0, 1), draft
tokens sampled from the draft), float32 as a decoder hands them over. Measured side by side in
one run, the contenders taking turns within each repeat (``common.interleaved_median``: the
median of each over the repeats):

* **ours**, per chain scheme of ``specsampling.gpu.SCHEMES`` (iterated at run time):
  ``ssg.process(logits, temperature=T)`` on both tables, then ``ssg.verify_chain`` when the
  package has it, else ``ssg.verify`` on a tensor-built chain ``TreeBatch`` (the path used is in
  the table). Validation is off on both calls (``validate=False``: the decoding-loop hot path).
* **Hugging Face** ``transformers.generation.utils._speculative_sampling`` called once per
  sequence (it takes logits and does its own softmax), the way ``generate`` calls it.
* the **read floor**: one ``sum`` over each input logits table, i.e. one pass over the bytes
  any verifier must read;
* the **exp floor**: the faster of ``exp(logits).sum(-1)`` and ``torch.softmax`` of each table:
  the normalisers of every row (each logit through one ``exp``). On a CPU this pass, not the
  read, bounds any verifier that normalises every row of its logits (the Hugging Face loop and
  process + verify included): "HF loop / exp floor" is the largest speed-up over Hugging Face
  open to them. A verifier that forms only the rows its walk reads (``verify_chain_logits`` at
  one or two sequences) is not bound by it and can go below it.

Per scheme also: "verify / softmax" (verify only over ``torch.softmax`` of both tables; the goal
for the chain fast paths is <= 0.25x), the verify with ``validate=True`` (its checks: one host
synchronisation and a read of every real row), the verify in float64 (the tables upcast
beforehand: the path-wise exact mode), and the verify compiled with
``torch.compile(fullgraph=True)`` (chain fast paths only: ``standard``, ``specinfer``, ``rsd``,
``nss``, ``block``, ``traversal``; not under ``--quick``, whose point is seconds).

Then the latency a decoder pays per round at the Qwen vocabulary (V = 151,936, B = 1, γ = 8).
The ratios are the claim; absolute times depend on the CPU and its load (printed; a load above
half the CPU count measures contention).
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path

import torch
from common import (
    chain_logits,
    chain_schemes,
    interleaved_median,
    is_busy,
    machine_lines,
    parse_torch_args,
    report_result,
    sig,
    table,
    torch_parser,
)

import specsampling.gpu as ssg

#: The schemes with a chain fast path (gathered tests, O(1) rows per sequence).
FAST = ("standard", "specinfer", "rsd", "nss", "block", "traversal")

#: The top-p of the B <= 2 line that processes both tables with it (eager and from logits).
TOP_P = 0.9

RESULTS = Path(__file__).resolve().parent / "results"


def hugging_face():
    """``(function, note)``: HF's ``_speculative_sampling``, or ``None`` and why not."""
    try:
        import transformers
        from transformers.generation.utils import _speculative_sampling
    except ImportError as error:
        return None, f"Hugging Face baseline not run: {error} (pip install transformers)"
    return _speculative_sampling, f"transformers {transformers.__version__}"


def compiled_verifier(name: str):
    """``verify_chain`` of ``name`` (validation off, explicit noise) under
    ``torch.compile(fullgraph=True)``, or the error text when it does not compile."""

    def verify(draft_tokens, target_probs, draft_probs, accept, sample):
        noise = ssg.Noise(accept, sample)
        out = ssg.verify_chain(name, draft_tokens, target_probs, draft_probs, noise, validate=False)
        return out.tokens

    # one compiled graph per scheme and size: above dynamo's default limit of 8 recompilations
    # of this one function, after which it would silently run eagerly
    for option in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, option):
            setattr(torch._dynamo.config, option, max(getattr(torch._dynamo.config, option), 64))
    return torch.compile(verify, fullgraph=True)


def measure(
    batch_size: int,
    gamma: int,
    vocab_size: int,
    temperature: float,
    repeats: int,
    seed: int,
    compile_fast: bool = True,
) -> tuple[list[list[str]], dict[str, float], list[list[str]]]:
    """One configuration: rows of the scheme table, the reference timings, skipped schemes."""
    target_logits, draft_logits, draft_tokens = chain_logits(batch_size, gamma, vocab_size, seed)
    speculative_sampling, _ = hugging_face()
    usable, skipped = chain_schemes(ssg, gamma)

    def processed():
        target = ssg.process(target_logits, temperature=temperature, validate=False)
        draft = ssg.process(draft_logits, temperature=temperature, validate=False)
        return target, draft  # [B, γ + 1, V], [B, γ, V]

    target_probs, draft_probs = processed()
    # One buffer per table reused every call, as a serving loop would: no fresh table to fault in.
    buffers = (torch.empty_like(target_probs), torch.empty_like(draft_probs))

    def processed_into():
        target = ssg.process(target_logits, temperature=temperature, validate=False, out=buffers[0])
        draft = ssg.process(draft_logits, temperature=temperature, validate=False, out=buffers[1])
        return target, draft

    fns = {
        "floor": lambda: (target_logits.sum(), draft_logits.sum()),
        "exp": lambda: (target_logits.exp().sum(-1), draft_logits.exp().sum(-1)),
        "softmax": lambda: (target_logits.softmax(-1), draft_logits.softmax(-1)),
        "softmax_out": lambda: (
            torch._softmax(target_logits, -1, False, out=buffers[0]),
            torch._softmax(draft_logits, -1, False, out=buffers[1]),
        ),
        "process": processed,
        "process_out": processed_into,
    }
    hf_emitted = None
    top_p_emitted = float("nan")
    if speculative_sampling is not None:

        def hf_loop():
            counts = []
            for row in range(batch_size):  # HF verifies one sequence per call
                draft_row = draft_logits[row : row + 1]  # [1, γ, V]
                target_row = target_logits[row : row + 1]  # [1, γ + 1, V]
                if temperature != 1.0:  # what HF's temperature warper does first
                    draft_row, target_row = draft_row / temperature, target_row / temperature
                _, matches = speculative_sampling(
                    draft_tokens[row : row + 1], draft_row, gamma, target_row
                )
                counts.append(int(matches) + 1)
            return counts

        fns["hf"] = hf_loop
        torch.manual_seed(seed)
        hf_emitted = sum(hf_loop()) / batch_size
    from_logits = getattr(ssg, "verify_chain_logits", None)
    if from_logits is not None and batch_size <= 2:
        # a round that accepts every draft (the draft's logits are the target's): the most rows
        # verify_chain_logits can be made to process, against process + verify on the same round
        all_target = target_logits.clone()
        all_draft = all_target[:, :gamma].clone()
        all_generator = torch.Generator().manual_seed(seed)

        def all_eager():
            target = ssg.process(all_target, temperature=temperature, validate=False)
            draft = ssg.process(all_draft, temperature=temperature, validate=False)
            return ssg.verify_chain(
                "standard", draft_tokens, target, draft, generator=all_generator, validate=False
            )

        def all_logits():
            return from_logits(
                "standard",
                draft_tokens,
                all_target,
                all_draft,
                temperature=temperature,
                generator=all_generator,
                validate=False,
            )

        fns["accepted:full"] = all_eager
        fns["accepted:logits"] = all_logits
        if "top_p" in inspect.signature(from_logits).parameters:
            # top-p 0.9 on both tables, the tokens drawn from the draft's top-p distribution
            top_p_draft = ssg.process(
                draft_logits, temperature=temperature, top_p=TOP_P, validate=False
            ).reshape(-1, vocab_size)
            top_p_tokens = torch.multinomial(
                top_p_draft, 1, generator=torch.Generator().manual_seed(seed)
            ).view(batch_size, gamma)
            top_p_generator = torch.Generator().manual_seed(seed)

            def top_p_eager():
                target = ssg.process(
                    target_logits, temperature=temperature, top_p=TOP_P, validate=False
                )
                draft = ssg.process(
                    draft_logits, temperature=temperature, top_p=TOP_P, validate=False
                )
                return ssg.verify_chain(
                    "standard",
                    top_p_tokens,
                    target,
                    draft,
                    generator=top_p_generator,
                    validate=False,
                )

            def top_p_logits():
                return from_logits(
                    "standard",
                    top_p_tokens,
                    target_logits,
                    draft_logits,
                    temperature=temperature,
                    top_p=TOP_P,
                    generator=top_p_generator,
                    validate=False,
                )

            fns["top_p:full"] = top_p_eager
            fns["top_p:logits"] = top_p_logits
            top_p_emitted = float(top_p_eager().num_emitted.double().mean())
    noise = ssg.chain.chain_noise(batch_size, gamma, torch.Generator().manual_seed(seed))
    target64, draft64 = target_probs.double(), draft_probs.double()
    compile_notes = {}
    emitted = {}
    for name, path, run in usable:
        generator = torch.Generator().manual_seed(seed)

        def full(run=run, generator=generator):
            target, draft = processed()
            return run(draft_tokens, target, draft, generator)

        def verify_only(run=run, generator=generator):
            return run(draft_tokens, target_probs, draft_probs, generator)

        def reused(run=run, generator=generator):
            target, draft = processed_into()
            return run(draft_tokens, target, draft, generator)

        fns[f"full:{name}"] = full
        fns[f"reused:{name}"] = reused
        fns[f"verify:{name}"] = verify_only
        emitted[name] = float(full().num_emitted.double().mean())
        if path != "verify_chain":
            continue
        if from_logits is not None:

            def logits(name=name, generator=generator):
                return from_logits(
                    name,
                    draft_tokens,
                    target_logits,
                    draft_logits,
                    temperature=temperature,
                    generator=generator,
                    validate=False,
                )

            fns[f"logits:{name}"] = logits

        def validated(name=name):
            return ssg.verify_chain(name, draft_tokens, target_probs, draft_probs, noise)

        fns[f"validate:{name}"] = validated
        if name not in FAST:
            continue

        def exact(name=name):
            return ssg.verify_chain(name, draft_tokens, target64, draft64, noise, validate=False)

        fns[f"f64:{name}"] = exact
        if compile_fast:
            compiled = compiled_verifier(name)
            args = (draft_tokens, target_probs, draft_probs, noise.accept, noise.sample)
            try:
                compiled(*args)
            except Exception as error:  # recorded in the report, never hidden
                compile_notes[name] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                continue
            fns[f"compiled:{name}"] = lambda compiled=compiled, args=args: compiled(*args)
    best = interleaved_median(fns, repeats)  # seconds, median
    best["exp"] = min(best["exp"], best["softmax"])  # the fastest full pass through exp
    rows = []

    def ms(key: str) -> str:
        return sig(best[key] * 1e3) if key in best else "n/a"

    for name, path, _ in usable:
        spent = best[f"full:{name}"]
        verify = best[f"verify:{name}"]
        rows.append(
            [
                f"`{name}`",
                path,
                sig(spent * 1e3),
                sig(verify * 1e3),
                sig(best["hf"] / spent, 2) + "x" if "hf" in best else "n/a",
                sig(spent / best["floor"], 2) + "x",
                sig(spent / best["exp"], 2) + "x",
                f"{emitted[name]:.2f}",
                sig(verify / best["softmax"], 2) + "x",
                ms(f"validate:{name}"),
                ms(f"f64:{name}"),
                compile_notes.get(name, ms(f"compiled:{name}")),
                ms(f"reused:{name}"),
                sig(best["hf"] / best[f"reused:{name}"], 2) + "x" if "hf" in best else "n/a",
                sig(best[f"reused:{name}"] / best["softmax_out"], 2) + "x",
                ms(f"logits:{name}"),
                sig(best[f"logits:{name}"] / best["exp"], 2) + "x"
                if f"logits:{name}" in best
                else "n/a",
            ]
        )
    refs = dict(best)
    refs["hf_emitted"] = hf_emitted if hf_emitted is not None else float("nan")
    refs["top_p_emitted"] = top_p_emitted
    return rows, refs, skipped


HEADER = [
    "scheme",
    "path",
    "process + verify (ms)",
    "verify only (ms)",
    "HF loop / ours",
    "ours / read floor",
    "ours / exp floor",
    "tokens emitted per row",
    "verify / softmax",
    "verify, validate=True (ms)",
    "verify, float64 (ms)",
    "verify, compiled (ms)",
    "process(out=) + verify (ms)",
    "HF loop / ours, out=",
    "ours, out= / softmax into a reused buffer",
    "from logits: `verify_chain_logits` (ms)",
    "`verify_chain_logits` / exp floor",
]


def reference_lines(refs: dict[str, float], batch_size: int) -> str:
    lines = [
        f"- read floor (one `sum` over each logits table): {sig(refs['floor'] * 1e3)} ms",
        "- exp floor (the faster of `exp(logits).sum(-1)` and `torch.softmax` of each table): "
        f"{sig(refs['exp'] * 1e3)} ms",
        f"- `torch.softmax` of both tables, for scale: {sig(refs['softmax'] * 1e3)} ms",
        f"- `ssg.process` of both tables alone: {sig(refs['process'] * 1e3)} ms",
        "- softmax of both tables into reused buffers (`torch._softmax(..., out=)`, the floor "
        f"with no fresh memory): {sig(refs['softmax_out'] * 1e3)} ms; `ssg.process(..., out=)` "
        f"of both: {sig(refs['process_out'] * 1e3)} ms",
    ]
    if "hf" in refs:
        lines.append(
            f"- Hugging Face `_speculative_sampling`, {batch_size} calls (one per sequence): "
            f"{sig(refs['hf'] * 1e3)} ms; tokens emitted per row {refs['hf_emitted']:.2f}"
        )
        lines.append(
            "- HF loop / exp floor (the largest speed-up over HF open to a verifier that "
            "normalises every row, as process + verify does; `verify_chain_logits` forms fewer "
            f"rows at B <= 2): {sig(refs['hf'] / refs['exp'], 2)}x"
        )
    if "accepted:full" in refs:
        eager, lazy = refs["accepted:full"], refs["accepted:logits"]
        lines.append(
            "- `standard` on a round that accepts every draft (the draft's logits are the "
            "target's, so `verify_chain_logits` processes every row): process + verify "
            f"{sig(eager * 1e3)} ms ({sig(eager / refs['exp'], 2)}x the exp floor), "
            f"`verify_chain_logits` {sig(lazy * 1e3)} ms ({sig(lazy / refs['exp'], 2)}x)"
        )
    if "top_p:full" in refs:
        eager, lazy = refs["top_p:full"], refs["top_p:logits"]
        lines.append(
            f"- `standard` with top-p {TOP_P} on both tables (the tokens drawn from the draft's "
            f"top-p distribution; {refs['top_p_emitted']:.2f} tokens emitted per row): "
            f"`ssg.process(..., top_p={TOP_P})` + verify {sig(eager * 1e3)} ms "
            f"({sig(eager / refs['exp'], 2)}x the exp floor), `verify_chain_logits(..., "
            f"top_p={TOP_P})` {sig(lazy * 1e3)} ms ({sig(lazy / refs['exp'], 2)}x)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = torch_parser(__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--latency-vocab", type=int, default=151_936)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    args = parse_torch_args(parser)
    if not args.temperature > 0:
        parser.error("--temperature must be > 0 (HF verifies sampled rounds only)")
    if args.quick:
        args.batch, args.gamma, args.vocab, args.latency_vocab = 4, 4, 2_000, 5_000
        args.repeats = 2
    began = time.perf_counter()
    load_before = os.getloadavg()
    _, hf_note = hugging_face()

    rows, refs, skipped = measure(
        args.batch,
        args.gamma,
        args.vocab,
        args.temperature,
        args.repeats,
        args.seed,
        compile_fast=not args.quick,
    )
    lat_rows, lat_refs, _ = measure(
        1,
        args.gamma,
        args.latency_vocab,
        args.temperature,
        args.repeats * 3,
        args.seed + 1,
        compile_fast=not args.quick,
    )
    load_after = os.getloadavg()
    busy = is_busy(load_before)  # the after value includes this benchmark's own threads
    skipped_text = (
        "\n\nNot timed (from `ssg.SCHEMES`, probed on a tiny round):\n\n"
        + table(["scheme", "why"], [[f"`{n}`", why] for n, why in skipped])
        if skipped
        else ""
    )
    quick = " **(`--quick` sizes: a smoke test, not a result)**" if args.quick else ""
    text = f"""# Torch chain verification on CPU, from logits{quick}

Generated by `python benchmarks/torch_chains.py`; see `benchmarks/README.md`.

{machine_lines(load_before, load_after)}
- baseline: {hf_note}
- run time of the whole benchmark: {time.perf_counter() - began:.1f} s

Float32 logits of a correlated pair (`common.chain_logits`, seed {args.seed}); temperature
{args.temperature}. "process + verify" is `ssg.process` of both logits tables then the chain
verify (validation off); "HF loop / ours" divides Hugging Face's per-sequence loop (logits in,
its own softmax) by that; "ours / read floor" divides it by one `sum` over each logits table,
"ours / exp floor" by one `exp` pass over each (the normalisers: no verifier that normalises
every row can go below it; one that forms only the rows it reads, `verify_chain_logits` below,
can). The three columns after those process into one reused buffer per
table (`ssg.process(..., out=)`, what a serving loop that keeps its buffers does): no fresh
`[B, γ + 1, V]` table, whose page faults are most of a softmax's time on some machines. The
last two verify from the logits with `ssg.verify_chain_logits` (the same tokens): at B <= 2 on
the CPU, for the schemes whose chains take the standard rule, `greedy` and `nss`, it processes
only the rows the walk reads (chunks of lanes 0-1, 2-5, 6-13, so its time depends on how many
drafts are accepted: see the all-accepted line under the latency table); for `block`,
`traversal` (whose weights read every lane) and at larger batches it is process + verify.
Median of {args.repeats} interleaved repeats after a warm-up (latency: {args.repeats * 3}).
Goals: verify / softmax <= 0.25x, process + verify <= 1.5x the exp floor and HF loop / ours
>= 1.2x (B = 64), process + verify <= 2x the exp floor (B = 1, V = 151,936). The read-floor
ratio is shown for scale, not as a goal: the exp floor alone is several times the read floor
on a CPU.

## Throughput: B = {args.batch}, γ = {args.gamma}, V = {args.vocab:,}

{table(HEADER, rows)}

{reference_lines(refs, args.batch)}{skipped_text}

## Latency per round: B = 1, γ = {args.gamma}, V = {args.latency_vocab:,}

{table(HEADER, lat_rows)}

{reference_lines(lat_refs, 1)}
"""
    today = time.strftime("%Y-%m-%d")
    report_result(
        text,
        args.output,
        RESULTS / f"torch_chains-{today}.md",
        no_write=args.no_write,
        quick=args.quick,
        busy=busy,
    )


if __name__ == "__main__":
    main()
