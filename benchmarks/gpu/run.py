"""One prepared run for a CUDA machine: exactness on the device, then the torch benchmarks.

Run from the repository root (see ``benchmarks/gpu/README.md``)::

    python benchmarks/gpu/run.py OUT_DIR                    # on the GPU machine, < 8 minutes
    python benchmarks/gpu/run.py OUT_DIR --device cpu --quick --skip-tests   # smoke test here

Steps, each written to ``OUT_DIR`` as soon as it is done (``results.md``, ``results.json``,
``pytest-cuda.txt``, ``decode/``), so a run cut short still leaves what it measured:

1. The environment: Python, torch, CUDA device, which optional packages import.
2. Path-wise equality on the device, every scheme, float64: ``certify_torch(device=...)``
   (the lowering's verdict equals the reference's on mixed batches of every shape the scheme
   supports, every enumerated tree checked against the reference's exact verdict law, the
   refused shapes refused), one scheme at a time.
3. The float32 agreement rate: fuzzed chain rounds verified in float64 and, from the same
   float32-rounded tables and the same uniforms, in float32 (``standard``, ``nss``, ``block``,
   ``traversal``); the rows whose tokens differ, counted.
4. Chains, for every chain scheme of ``specsampling.gpu.SCHEMES`` (iterated at run time) at B in
   {1, 64, 256}, γ = 8, V in {32,000, 151,936}: verify from float32 probabilities, process +
   verify and ``verify_chain_logits`` from float32 logits, against the copy floor (a
   device-to-device copy of both probability tables, measured in the same run); Hugging Face's
   ``_speculative_sampling`` looped per sequence, FlashInfer's ``chain_speculative_sampling``
   and vLLM's ``rejection_sample`` on the same tensors when they import, and our adapters in
   their layouts. One call per scheme and size runs under
   ``torch.cuda.set_sync_debug_mode("error")`` (validation off): "no sync" means no host
   synchronisation inside process + verify.
5. Trees: ``Shape.paths(4, 8)`` and ``Shape.branching((2, 3, 4))`` (32 drafted nodes) for every
   tree lowering supporting them, same B and V, against the copy floor of both tables.
6. Decoding tokens/s on the Qwen2.5 pairs' configurations (random weights):
   ``benchmarks/gpu/decode.py`` with what is left of the budget.
7. The CUDA tests, with what is left: ``python -m pytest -q -m cuda tests/``.

GPU times are ``torch.cuda.Event`` timings of back-to-back calls after a warm-up (the median of
several trials); on CPU, ``time.perf_counter``. A deadline (``--deadline-s``) skips what would
not fit, and says so in the results.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # common.py

#: Seconds kept for the CUDA tests when they run (the last step).
MIN_TEST_S = 60.0
#: The float32 agreement step's schemes (every chain engine) and rows per batch.
AGREEMENT_SCHEMES = ("standard", "nss", "block", "traversal")
AGREEMENT_CHUNK = 100_000
AGREEMENT_VOCAB, AGREEMENT_GAMMA = 200, 4
#: A tree lowering whose single call would take longer than this at the next size (its last
#: call scaled by B V) is not timed there: the host-planned rules (``ot_optimal``, ``khisti``,
#: ``resispec``'s default) plan each reached node on the host, which no device speeds up.
TREE_CALL_CAP_S = 2.0
#: A tree call slower than this is timed once (no warm-up, no trials, no sync check).
TREE_SLOW_CALL_S = 0.25


def fuzzed_rounds(torch: Any, rows: int, seed: int, device: str) -> tuple[Any, ...]:
    """``(tokens, target, draft, accept, sample)``: ``rows`` chain rounds of a correlated pair
    on ``device`` (``tests/test_gpu_chain_float32.py``'s construction), the float64 tables
    exactly the float32-rounded ones, so both precisions see the same numbers."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (rows, AGREEMENT_GAMMA + 1, AGREEMENT_VOCAB)
    logits = 3 * torch.randn(shape, generator=g, device=device, dtype=torch.float64)
    noise = torch.randn(shape[0], AGREEMENT_GAMMA, AGREEMENT_VOCAB, generator=g, device=device)
    draft = (logits[:, :AGREEMENT_GAMMA] + noise.double()).softmax(-1)
    flat = draft.reshape(-1, AGREEMENT_VOCAB)
    tokens = torch.multinomial(flat, 1, generator=g).reshape(rows, AGREEMENT_GAMMA)
    accept = torch.rand(rows, AGREEMENT_GAMMA + 1, generator=g, device=device, dtype=torch.float64)
    sample = torch.rand(rows, AGREEMENT_GAMMA + 1, generator=g, device=device, dtype=torch.float64)
    target = logits.softmax(-1).float().double()
    return tokens, target, draft.float().double(), accept, sample


def overlay() -> Path:
    """A temporary import root where ``specsampling`` has its mapped subpackages (``gpu``,
    ``simulators``) in place, made of symbolic links to this checkout, for a machine where the
    package is not installed (pyproject maps ``specsampling.gpu`` to ``gpu/``)."""
    top = Path(tempfile.mkdtemp(prefix="specsampling-overlay-"))
    package = top / "specsampling"
    package.mkdir()
    for entry in (ROOT / "specsampling").iterdir():
        (package / entry.name).symlink_to(entry)
    (package / "gpu").symlink_to(ROOT / "gpu")
    (package / "simulators").symlink_to(ROOT / "simulators")
    (top / "proofs_tests").symlink_to(ROOT / "proofs_tests")
    return top


def import_package(force_overlay: bool) -> tuple[Any, Path | None]:
    """``(specsampling.gpu, overlay root or None)``: the installed package, else the overlay."""
    if not force_overlay:
        try:
            return importlib.import_module("specsampling.gpu"), None
        except ImportError:
            for name in [m for m in sys.modules if m.split(".")[0] == "specsampling"]:
                del sys.modules[name]
    top = overlay()
    sys.path.insert(0, str(top))
    return importlib.import_module("specsampling.gpu"), top


# --------------------------------------------------------------------------- timing
class Timer:
    """Seconds per call of a callable: CUDA events on a GPU, ``perf_counter`` on CPU."""

    def __init__(self, torch: Any, device: str, quick: bool) -> None:
        self.torch, self.cuda, self.quick = torch, device.startswith("cuda"), quick
        self.trials = 2 if quick else 5
        self.target_s = 0.04  # wall time per trial

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn: Any) -> float:
        fn()  # warm-up (allocator and kernel caches, lazy initialisation)
        iters = 1
        if not self.quick:
            fn()
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            once = max(time.perf_counter() - start, 1e-6)
            iters = int(min(50, max(1, self.target_s / once)))
        results = []
        for _ in range(self.trials):
            if self.cuda:
                begin = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(iters):
                    fn()
                end.record()
                end.synchronize()
                results.append(begin.elapsed_time(end) / 1e3 / iters)
            else:
                start = time.perf_counter()
                for _ in range(iters):
                    fn()
                results.append((time.perf_counter() - start) / iters)
        return statistics.median(results)


def sync_check(torch: Any, device: str, fn: Any) -> str:
    """ "no sync" if ``fn()`` runs under ``set_sync_debug_mode("error")``, "SYNC: ..." where
    it synchronises, "error: ..." where it fails otherwise (out of memory, a refusal): never
    raises, so one failing call costs its row only."""
    if not device.startswith("cuda"):
        return "n/a (CPU)"
    try:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    except Exception as error:
        first = (str(error).splitlines() or [""])[0][:120]
        if isinstance(error, RuntimeError) and "synchroniz" in str(error):
            return "SYNC: " + first
        return f"error: {type(error).__name__}: {first}"
    return "no sync"


def free_memory(torch: Any) -> None:
    """Return the caching allocator's free blocks to the device between steps (the decoding
    step's models need the memory the tables of the tree step held)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- peers
def hugging_face() -> tuple[Any, str]:
    try:
        import transformers
        from transformers.generation.utils import _speculative_sampling
    except ImportError as error:
        return None, f"Hugging Face not available ({error})"
    return _speculative_sampling, f"transformers {transformers.__version__}"


def flashinfer_chain(torch: Any) -> tuple[Any, str]:
    """A caller ``fi(draft_probs, draft_tokens_int32, target_probs)`` of FlashInfer's
    ``chain_speculative_sampling`` (uniforms drawn per call for versions that take them)."""
    try:
        import flashinfer
        from flashinfer.sampling import chain_speculative_sampling
    except Exception as error:  # ImportError, or a broken build
        return None, f"FlashInfer not available ({type(error).__name__}: {error})"
    params = inspect.signature(chain_speculative_sampling).parameters
    if "uniform_samples" in params:

        def call(draft_probs, draft_tokens, target_probs):
            batch, gamma = draft_tokens.shape
            uniform = torch.rand(batch, gamma + 1, device=draft_probs.device)
            return chain_speculative_sampling(draft_probs, draft_tokens, uniform, target_probs)

    else:

        def call(draft_probs, draft_tokens, target_probs):
            return chain_speculative_sampling(draft_probs, draft_tokens, target_probs)

    return call, f"flashinfer {getattr(flashinfer, '__version__', '?')}"


def vllm_layout(
    torch: Any, draft: Any, target: Any, target_logits: Any, draft_tokens: Any
) -> tuple[Any, ...]:
    """vLLM V1's flattened inputs for ``B`` chains of ``γ`` drafts: ``(draft_token_ids [B γ],
    num_draft_tokens, max_spec_len, cu_num_draft_tokens [B], draft_probs [B γ, V], target
    [B γ, V], bonus_token_ids [B, 1])``, the target rows as logits (vLLM's ``rejection_sample``
    takes the target's processed logits and forms their softmax itself), the bonus tokens drawn
    here from the target's last row (vLLM's caller draws them before the rejection sampler)."""
    batch, gamma = draft_tokens.shape
    vocab = target.shape[-1]
    device = target.device
    bonus = torch.multinomial(target[:, gamma], 1).int()  # [B, 1]
    cumulative = (torch.arange(1, batch + 1, device=device) * gamma).int()  # [B]
    flat_logits = target_logits[:, :gamma].reshape(-1, vocab).contiguous()  # [B γ, V]
    flat_draft = draft.reshape(-1, vocab)  # [B γ, V]
    tokens = draft_tokens.reshape(-1).int()  # [B γ]
    return tokens, [gamma] * batch, gamma, cumulative, flat_draft, flat_logits, bonus


def vllm_rejection(torch: Any) -> tuple[Any, str]:
    """A caller ``f(*vllm_layout(...))`` of vLLM's own ``rejection_sample`` (every request
    sampled at temperature 1, no per-request generators), or ``None`` and why not."""
    try:
        import vllm
        from vllm.v1.sample.rejection_sampler import rejection_sample
    except Exception as error:  # ImportError, or a build without this module
        return None, f"vLLM not available ({type(error).__name__}: {error})"
    version = getattr(vllm, "__version__", "?")
    try:
        make = sampling_metadata(torch)
    except Exception as error:  # its metadata class changed shape
        return None, f"vLLM {version}: no sampling metadata ({type(error).__name__}: {error})"

    def call(tokens, counts, width, cumulative, draft_probs, target_logits, bonus):
        metadata = make(len(counts), target_logits.device)
        return rejection_sample(
            tokens, counts, width, cumulative, draft_probs, target_logits, bonus, metadata
        )

    return call, f"vllm {version}"


def sampling_metadata(torch: Any) -> Any:
    """``make(batch, device)``: vLLM's ``SamplingMetadata`` for ``batch`` requests sampled at
    temperature 1 with nothing else set, built from the fields its dataclass declares."""
    import dataclasses

    from vllm.v1.sample.metadata import SamplingMetadata

    def make(batch: int, device: Any) -> Any:
        values = {
            "temperature": torch.ones(batch, device=device),
            "all_greedy": False,
            "all_random": True,
            "generators": {},
            "no_penalties": True,
            "output_token_ids": [[] for _ in range(batch)],
            "allowed_token_ids_mask": None,
            "bad_words_token_ids": {},
            "logitsprocs": None,
        }
        fields = {f.name: f for f in dataclasses.fields(SamplingMetadata)}
        kwargs = {
            name: values.get(name) for name in fields if name in values or _required(fields[name])
        }
        return SamplingMetadata(**kwargs)

    return make


def _required(field: Any) -> bool:
    import dataclasses

    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def our_vllm_adapter() -> Any:
    try:
        module = importlib.import_module("specsampling.gpu.vllm")
    except ImportError:
        return None
    return getattr(module, "rejection_sample", None)


def our_flashinfer_adapter() -> Any:
    try:
        module = importlib.import_module("specsampling.gpu.flashinfer")
    except ImportError:
        return None
    return getattr(module, "chain_speculative_sampling", None)


# --------------------------------------------------------------------------- the run
class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.began = time.perf_counter()
        self.env: dict[str, Any] = {}
        self.tests: dict[str, Any] = {}
        self.pathwise: list[dict[str, Any]] = []
        self.agreement: list[dict[str, Any]] = []
        self.chains: list[dict[str, Any]] = []
        self.trees: list[dict[str, Any]] = []
        self.decode = ""
        self.notes: list[str] = []
        self.tree_calls: dict[str, tuple[float, int]] = {}  # name: (seconds, B V) of a call

    def remaining(self) -> float:
        return self.args.deadline_s - (time.perf_counter() - self.began)

    def reserved(self) -> float:
        """Seconds the benchmark steps leave for the later ones (decoding, the tests)."""
        later = 0.0 if self.args.skip_decode else self.args.decode_s
        return later + (0.0 if self.args.skip_tests else MIN_TEST_S) + 15.0

    # ------------------------------------------------------------------ output
    def save(self) -> None:
        data = {
            "env": self.env,
            "tests": self.tests,
            "pathwise": self.pathwise,
            "agreement": self.agreement,
            "chains": self.chains,
            "trees": self.trees,
            "decode": self.decode,
            "notes": self.notes,
            "elapsed_s": round(time.perf_counter() - self.began, 1),
        }
        (self.out / "results.json").write_text(json.dumps(data, indent=1, default=str))
        (self.out / "results.md").write_text(self.markdown(data))

    def markdown(self, data: dict[str, Any]) -> str:
        from common import sig, table

        def ms(value: Any) -> str:
            return "-" if value is None else sig(value * 1e3)

        def ratio(num: Any, den: Any) -> str:
            return "-" if num is None or den is None else sig(num / den, 2) + "x"

        env_lines = "\n".join(f"- {k}: {v}" for k, v in self.env.items())
        tests = self.tests
        test_text = (
            f"`{tests['command']}`: {tests.get('summary', 'not run')} "
            f"(exit {tests.get('returncode', '-')}, {tests.get('seconds', '-')} s; full log in "
            "`pytest-cuda.txt`)"
            if "command" in tests
            else tests.get("summary", "not run")
        )
        chain_rows = [
            [
                f"`{r['scheme']}`",
                r["path"],
                str(r["B"]),
                f"{r['V']:,}",
                ms(r.get("verify_s")),
                ms(r.get("process_verify_s")),
                ms(r.get("floor_s")),
                ratio(r.get("verify_s"), r.get("floor_s")),
                "-" if r.get("verify_s") is None else f"{100 * r['floor_s'] / r['verify_s']:.0f}%",
                ms(r.get("logits_s")),
                ms(r.get("hf_s")),
                ms(r.get("flashinfer_s")),
                ms(r.get("adapter_s")),
                ms(r.get("vllm_s")),
                ms(r.get("vllm_adapter_s")),
                r.get("sync", "-"),
            ]
            for r in data["chains"]
        ]
        chain_header = [
            "scheme",
            "path",
            "B",
            "V",
            "verify (ms)",
            "process + verify (ms)",
            "copy floor (ms)",
            "verify / floor",
            "floor / verify",
            "`verify_chain_logits` (ms)",
            "HF loop (ms)",
            "FlashInfer (ms)",
            "our FlashInfer adapter (ms)",
            "vLLM `rejection_sample` (ms)",
            "our vLLM adapter (ms)",
            "host sync",
        ]
        tree_rows = [
            [
                f"`{r['scheme']}`",
                f"`{r['shape']}`",
                str(r["B"]),
                f"{r['V']:,}",
                ms(r.get("verify_s")),
                ms(r.get("floor_s")),
                ratio(r.get("verify_s"), r.get("floor_s")),
                r.get("sync", "-"),
            ]
            for r in data["trees"]
        ]
        tree_header = [
            "scheme",
            "shape",
            "B",
            "V",
            "verify (ms)",
            "copy floor (ms)",
            "verify / floor",
            "host sync",
        ]
        pathwise_rows = [
            [
                f"`{r['scheme']}`",
                r.get("lowering", "-"),
                str(r.get("supported", "-")),
                str(r.get("refused", "-")),
                f"{r.get('cases', 0):,}",
                str(r.get("violations", "-")),
                "yes" if r.get("certified") else "**no**",
                f"{r.get('seconds', 0):.1f}",
                r.get("detail", ""),
            ]
            for r in data["pathwise"]
        ]
        pathwise_header = [
            "scheme",
            "lowering",
            "shapes",
            "refused shapes",
            "rows and streams compared",
            "violations",
            "certified",
            "s",
            "detail",
        ]
        agreement_rows = [
            [
                f"`{r['scheme']}`",
                f"{r['rows']:,}",
                str(r["differ"]),
                "-" if not r["rows"] else f"{r['differ'] / r['rows']:.1e}",
            ]
            for r in data["agreement"]
        ]
        agreement_header = ["scheme", "rows", "rows whose tokens differ", "rate"]
        notes = "\n".join(f"- {n}" for n in data["notes"]) or "- none"
        quick = " **(`--quick`: a smoke test, not a result)**" if self.args.quick else ""
        return f"""# Torch backend on {self.env.get("device name", "?")}{quick}

Generated by `python benchmarks/gpu/run.py`; see `benchmarks/gpu/README.md`.

{env_lines}
- elapsed: {data["elapsed_s"]} s

## Goals

{self.goals(data["chains"])}

## Path-wise on the device (float64)

`specsampling.certify_torch([scheme], device=...)` one scheme at a time: mixed batches of every
supported shape against the reference, verdict for verdict, every enumerated tree's verdicts
against the reference's exact verdict law, refused shapes refused (keyed couplings: their
streams against the reference's).

{table(pathwise_header, pathwise_rows) if pathwise_rows else "not run"}

## Float32 agreement

Fuzzed chain rounds (γ = 4, V = 200, target logits 3 N(0, 1), draft logits those plus
N(0, 1), drafts sampled from the draft) verified in float64 and, from the same float32-rounded
tables and the same uniforms, in float32; a row differs only where a uniform lies within
float32 rounding of a boundary (`tests/test_gpu_chain_float32.py` checks that on the CPU).

{table(agreement_header, agreement_rows) if agreement_rows else "not run"}

## Chains (γ = {self.args.gamma}, float32)

"verify" takes probabilities (validation off); "process + verify" starts from logits
(`ssg.process` of both tables first), `verify_chain_logits` too (the same tokens, processing
the rows its walk reads). "copy floor" is a device-to-device copy of both probability tables
(`[B, γ + 1, V]` and `[B, γ, V]`), timed in the same run; "floor / verify" is the share of that
floor reached (goal for chains: >= 60%). "HF loop": Hugging Face `_speculative_sampling` once
per sequence, from logits. vLLM's `rejection_sample` takes vLLM's flattened layout: the draft's
`[B γ, V]` probabilities and the target's `[B γ, V]` logits, whose softmax it forms (the bonus
tokens drawn beforehand); "our vLLM adapter" is `ssg.process` of those logits and
`specsampling.gpu.vllm.rejection_sample`, the same work. "host sync": one process + verify
call under `torch.cuda.set_sync_debug_mode("error")`.

{table(chain_header, chain_rows) if chain_rows else "not run"}

## Trees (32 drafted nodes, float32)

Tree structures drafted by the reference (`common.SyntheticPair`, vocabulary
{self.args.structure_vocab:,}: token ids only), tables random softmaxes on the device; the walk
is branch-free, so its cost does not depend on what is accepted.

{table(tree_header, tree_rows) if tree_rows else "not run"}

## Decoding (random weights in the Qwen2.5 configurations)

{data["decode"] or "not run"}

## CUDA tests

{test_text}

## Notes

{notes}
"""

    def goals(self, chains: list[dict[str, Any]]) -> str:
        """The chain goals at the largest batch run for each vocabulary: `standard`'s share of
        the copy floor (>= 60%) and FlashInfer's time over ours (>= 1)."""
        lines = []
        for vocab in sorted({r["V"] for r in chains}):
            rows = [r for r in chains if r["V"] == vocab and r["scheme"] == "standard"]
            if not rows:
                continue
            row = max(rows, key=lambda r: r["B"])
            verify, floor = row.get("verify_s"), row.get("floor_s")
            share = "-" if not verify else f"{100 * floor / verify:.0f}%"
            flash = row.get("flashinfer_s")
            versus = (
                "FlashInfer not run"
                if not flash or not verify
                else (f"FlashInfer / ours {flash / verify:.2f}x (goal >= 1)")
            )
            lines.append(
                f"- B = {row['B']}, V = {vocab:,}: `standard` verify reaches {share} of the copy "
                f"floor's speed (goal >= 60%); {versus}"
            )
        return "\n".join(lines) or "- no chain rows"

    # ------------------------------------------------------------------ steps
    def environment(self, torch: Any, ssg: Any, top: Path | None) -> None:
        env = self.env
        env["date"] = datetime.date.today().isoformat()
        env["python"] = platform.python_version()
        env["platform"] = platform.platform()
        env["torch"] = torch.__version__
        env["device"] = self.args.device
        if self.args.device.startswith("cuda"):
            env["device name"] = torch.cuda.get_device_name()
            env["cuda"] = torch.version.cuda
        else:
            env["device name"] = f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
        env["specsampling import"] = "installed" if top is None else f"overlay {top}"
        env["specsampling path"] = sys.modules["specsampling"].__file__
        env["registered lowerings"] = ", ".join(sorted(ssg.SCHEMES))
        env["verify_chain"] = "yes" if hasattr(ssg, "verify_chain") else "no (tree path)"
        for name in ("numpy", "scipy", "pytest", "hypothesis", "transformers", "flashinfer"):
            try:
                module = importlib.import_module(name)
                env[name] = getattr(module, "__version__", "?")
            except Exception as error:
                env[name] = f"not available ({type(error).__name__})"
        with contextlib.suppress(OSError):  # no load average on some platforms
            env["load average"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        self.save()

    def pathwise_step(self) -> None:
        """Step 2: ``certify_torch`` on the device, one scheme at a time, within its budget."""
        from specsampling import SCHEMES
        from specsampling.certify_torch import certify_torch

        names = self.args.pathwise_schemes or sorted(SCHEMES)
        start = time.perf_counter()
        for position, name in enumerate(names):
            spent = time.perf_counter() - start
            if spent > self.args.pathwise_s or self.remaining() < self.reserved() + 60:
                self.notes.append(f"path-wise: skipped (budget): {', '.join(names[position:])}")
                break
            begun = time.perf_counter()
            record: dict[str, Any] = {"scheme": name}
            try:
                report = certify_torch([name], device=self.args.device).schemes[0]
            except Exception as error:  # recorded, never hidden
                record.update(certified=False, detail=f"{type(error).__name__}: {error}"[:200])
            else:
                record.update(
                    lowering=report.lowering,
                    supported=len(report.supported),
                    refused=len(report.refused),
                    cases=report.cases,
                    violations=len(report.violations),
                    certified=report.certified,
                    detail=(str(report.violations[0])[:200] if report.violations else report.note),
                )
            record["seconds"] = time.perf_counter() - begun
            self.pathwise.append(record)
            self.save()

    def agreement_step(self, torch: Any, ssg: Any) -> None:
        """Step 3: float32 against float64 verdicts on the same fuzzed rounds and uniforms."""
        for name in AGREEMENT_SCHEMES:
            label = f"float32 agreement: `{name}`"
            self.attempt(label, partial(self.agreement_scheme, torch, ssg, name))
            free_memory(torch)

    def agreement_scheme(self, torch: Any, ssg: Any, name: str) -> None:
        """One scheme's share of :meth:`agreement_step`."""
        total, chunk = self.args.agreement_rows, min(self.args.agreement_rows, AGREEMENT_CHUNK)
        record = {"scheme": name, "rows": 0, "differ": 0}
        for seed in range(max(1, total // chunk)):
            if self.remaining() < self.reserved() + 60:
                self.notes.append(f"float32 agreement: `{name}` cut at {record['rows']} rows")
                break
            rounds = fuzzed_rounds(torch, chunk, 1000 * len(name) + seed, self.args.device)
            tokens, target, draft, accept, sample = rounds
            noise = ssg.Noise(accept, sample)
            exact = ssg.verify_chain(name, tokens, target, draft, noise, validate=False)
            fast = ssg.verify_chain(
                name, tokens, target.float(), draft.float(), noise, validate=False
            )
            record["differ"] += int((exact.tokens != fast.tokens).any(-1).sum())
            record["rows"] += chunk
        self.agreement.append(record)
        self.save()

    def decoding(self, top: Path | None) -> None:
        """Step 6: ``benchmarks/gpu/decode.py`` with its share of what is left."""
        budget = min(self.args.decode_s, self.remaining() - MIN_TEST_S * (not self.args.skip_tests))
        if budget < 45:
            self.notes.append(f"decoding: skipped (budget: {budget:.0f} s left for it)")
            return
        out = self.out / "decode"
        command = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "decode.py"), str(out)]
        command += ["--device", self.args.device, "--deadline-s", f"{budget - 15:.0f}"]
        if self.args.quick:
            command += ["--tiny", "--new-tokens", "10", "--prompt-tokens", "8"]
        env = dict(os.environ)
        if top is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(top), env.get("PYTHONPATH")]))
        try:
            done = subprocess.run(
                command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=budget
            )
            if done.returncode:
                self.notes.append(f"decoding: exit {done.returncode}: {done.stderr[-300:]!r}")
        except subprocess.TimeoutExpired:
            self.notes.append(f"decoding: timed out after {budget:.0f} s")
        result = out / "decode.md"
        if result.exists():
            body = result.read_text()
            self.decode = body.split("\n", 1)[1].strip() if body.startswith("# ") else body
        self.save()

    def run_tests(self, top: Path | None) -> None:
        command = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
        # one process, without the project's xdist options (the GPU image may lack pytest-xdist)
        command += ["-o", "addopts=--import-mode=importlib"]
        env = dict(os.environ)
        if top is None:
            cwd, command = ROOT, [*command, *self.args.test_paths]
        else:  # the overlay first on sys.path (python -m puts the cwd there)
            cwd = top
            command += ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]
            command += [str(ROOT / path) for path in self.args.test_paths]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(top), env.get("PYTHONPATH")]))
        timeout = max(10.0, min(self.args.test_timeout, self.remaining() - 10))
        start = time.perf_counter()
        self.tests = {"command": " ".join(command[1:]), "timeout_s": timeout}
        try:
            done = subprocess.run(
                command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
            )
            log, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as error:
            out = error.stdout or b""
            log = (out.decode() if isinstance(out, bytes) else out) + "\nTIMED OUT"
            code = "timeout"
        (self.out / "pytest-cuda.txt").write_text(log)
        lines = [line for line in log.strip().splitlines() if line.strip()]
        self.tests.update(
            returncode=code,
            seconds=round(time.perf_counter() - start, 1),
            summary=lines[-1] if lines else "no output",
        )
        self.save()

    def chain_benchmarks(self, torch: Any, ssg: Any) -> None:
        from common import chain_schemes

        args, device = self.args, self.args.device
        timer = Timer(torch, device, args.quick)
        usable, skipped = chain_schemes(ssg, args.gamma)
        for name, why in skipped:
            self.notes.append(f"chains: `{name}` not timed: {why}")
        hf, hf_note = hugging_face()
        fi, fi_note = flashinfer_chain(torch)
        vl, vl_note = vllm_rejection(torch)
        adapters = our_flashinfer_adapter(), our_vllm_adapter()
        self.notes += [f"chains: {hf_note}", f"chains: {fi_note}", f"chains: {vl_note}"]
        self.fi_first = True
        for vocab in args.vocabs:
            for batch in args.batches:
                if self.remaining() < self.reserved() + 30:
                    self.notes.append(f"chains: B={batch}, V={vocab} skipped (deadline)")
                    continue
                peers = hf, fi, vl, *adapters
                config = (torch, ssg, timer, usable, peers, batch, vocab)
                self.attempt(f"chains: B={batch}, V={vocab}", partial(self.chain_config, *config))
                free_memory(torch)

    def chain_config(self, torch, ssg, timer, usable, peers, batch, vocab) -> None:
        """Every usable chain scheme and the peers at one size."""
        from common import chain_logits

        args, device = self.args, self.args.device
        hf, fi, vl, adapter, vllm_adapter = peers
        label = f"B={batch} V={vocab}"
        target_logits, draft_logits, draft_tokens = chain_logits(
            batch, args.gamma, vocab, seed=0, device=device
        )  # [B, γ + 1, V], [B, γ, V], [B, γ]
        target = ssg.process(target_logits, validate=False)  # [B, γ + 1, V]
        draft = ssg.process(draft_logits, validate=False)  # [B, γ, V]
        copies = torch.empty_like(target), torch.empty_like(draft)
        floor = timer(lambda: (copies[0].copy_(target), copies[1].copy_(draft)))
        shared: dict[str, Any] = {"floor_s": floor}
        if hf is not None:

            def hf_loop():
                for row in range(batch):  # one sequence per call, as HF's generate
                    hf(
                        draft_tokens[row : row + 1],
                        draft_logits[row : row + 1],
                        args.gamma,
                        target_logits[row : row + 1],
                    )

            shared["hf_s"] = self.guarded(f"HF {label}", timer, hf_loop)
        tokens32 = draft_tokens.int()  # [B, γ]
        if fi is not None:
            if self.fi_first:
                start = time.perf_counter()
                self.guarded(
                    "FlashInfer first call", lambda f: f(), lambda: fi(draft, tokens32, target)
                )
                timer.sync()
                self.notes.append(
                    "FlashInfer first call (JIT build included): "
                    f"{time.perf_counter() - start:.1f} s"
                )
                self.fi_first = False
            shared["flashinfer_s"] = self.guarded(
                f"FlashInfer {label}", timer, lambda: fi(draft, tokens32, target)
            )
        if adapter is not None:
            shared["adapter_s"] = self.guarded(  # unchecked, as FlashInfer's kernel
                f"adapter {label}",
                timer,
                lambda: adapter(draft, draft_tokens, target, validate=False),
            )
        if vl is not None or vllm_adapter is not None:
            layout = vllm_layout(torch, draft, target, target_logits, draft_tokens)
            if vl is not None:
                shared["vllm_s"] = self.guarded(f"vLLM {label}", timer, lambda: vl(*layout))
            if vllm_adapter is not None:

                def ours_vllm():  # the same work: the target rows' softmax, then the verdicts
                    target_rows = ssg.process(layout[5], validate=False)  # [B γ, V]
                    return vllm_adapter(*layout[:5], target_rows, layout[6], validate=False)

                shared["vllm_adapter_s"] = self.guarded(f"vLLM adapter {label}", timer, ours_vllm)
        from_logits = getattr(ssg, "verify_chain_logits", None)
        for name, path, run in usable:
            record = {"scheme": name, "path": path, "B": batch, "V": vocab, **shared}

            def verify(run=run):
                return run(draft_tokens, target, draft)

            def full(run=run):
                t = ssg.process(target_logits, validate=False)  # [B, γ + 1, V]
                d = ssg.process(draft_logits, validate=False)  # [B, γ, V]
                return run(draft_tokens, t, d)

            def logits(name=name):
                return from_logits(name, draft_tokens, target_logits, draft_logits, validate=False)

            record["verify_s"] = self.guarded(f"{name} {label}", timer, verify)
            record["process_verify_s"] = self.guarded(f"{name} full {label}", timer, full)
            if from_logits is not None:
                record["logits_s"] = self.guarded(f"{name} logits {label}", timer, logits)
            failed = record["process_verify_s"] is None
            record["sync"] = "-" if failed else sync_check(torch, device, full)
            self.chains.append(record)
            self.save()

    def tree_benchmarks(self, torch: Any, ssg: Any, ss: Any) -> None:
        from common import SyntheticPair

        from specsampling.gpu.schemes import TreeLowering

        args, device = self.args, self.args.device
        timer = Timer(torch, device, args.quick)
        shapes = (ss.Shape.paths(4, 8), ss.Shape.branching((2, 3, 4)))
        pair = SyntheticPair(args.structure_vocab, seed=0)
        for shape in shapes:
            names = [
                n
                for n in sorted(ssg.SCHEMES)
                if isinstance(ssg.get_lowering(n), TreeLowering) and ss.SCHEMES[n].supports(shape)
            ]
            for vocab in args.vocabs:
                for batch in args.batches:
                    if self.remaining() < self.reserved() + 20:
                        self.notes.append(
                            f"trees: {shape!r} B={batch} V={vocab} skipped (deadline)"
                        )
                        continue
                    config = (torch, ssg, timer, pair, shape, names, batch, vocab)
                    label = f"trees: {shape!r} B={batch} V={vocab}"
                    self.attempt(label, partial(self.tree_config, *config))
                    free_memory(torch)

    def tree_config(self, torch, ssg, timer, pair, shape, names, batch, vocab) -> None:
        """Every tree lowering supporting ``shape`` at one size."""
        import numpy as np

        device = self.args.device
        rng = np.random.default_rng(batch)
        trees = [shape.draft(pair, rng) for _ in range(batch)]
        tree_batch = ssg.TreeBatch.from_trees(trees, device=device)
        size = (batch, tree_batch.parents.shape[1], vocab)
        gen = torch.Generator(device=device).manual_seed(1)
        target = torch.randn(size, generator=gen, device=device).mul_(3).softmax(-1)  # [B, N, V]
        draft = torch.randn(size, generator=gen, device=device).mul_(3).softmax(-1)  # [B, N, V]
        copies = torch.empty_like(target), torch.empty_like(draft)
        floor = timer(lambda: (copies[0].copy_(target), copies[1].copy_(draft)))
        for name in names:

            def verify(name=name):
                return ssg.verify(name, tree_batch, target, draft, None, validate=False)

            label = f"tree {name} {shape!r} B={batch} V={vocab}"
            if name in self.tree_calls:  # a slow rule: skip sizes its last call says won't fit
                seconds, elements = self.tree_calls[name]
                predicted = seconds * batch * vocab / elements
                if predicted > TREE_CALL_CAP_S:
                    self.notes.append(f"{label}: not timed (about {predicted:.0f} s a call)")
                    continue
            record = {"scheme": name, "shape": repr(shape), "B": batch, "V": vocab}
            record["floor_s"] = floor
            timer.sync()
            start = time.perf_counter()
            failed = self.guarded(label, lambda f: (f(), timer.sync(), 1)[-1], verify) is None
            seconds = time.perf_counter() - start
            if failed:
                record.update(verify_s=None, sync="-")
            elif seconds < TREE_SLOW_CALL_S:  # fast: warm-up, trials, the sync check
                record["verify_s"] = self.guarded(label, timer, verify)
                record["sync"] = sync_check(torch, device, verify)
            else:  # slow: that one call
                record.update(verify_s=seconds, sync="timed once")
                self.tree_calls[name] = (seconds, batch * vocab)
            self.trees.append(record)
            self.save()

    def attempt(self, label: str, fn: Any) -> None:
        """``fn()``; where it raises, a note and the run goes on (a size or a step that fails
        on the device costs itself only, never the steps after it)."""
        try:
            fn()
        except Exception as error:
            first = (str(error).splitlines() or [""])[0][:200]
            self.notes.append(f"{label}: aborted: {type(error).__name__}: {first}")
            self.save()

    def guarded(self, label: str, timer: Any, fn: Any) -> float | None:
        """``timer(fn)``, or ``None`` with a note when it raises."""
        try:
            return timer(fn)
        except Exception as error:
            self.notes.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0]}")
            return None


def arguments() -> argparse.ArgumentParser:
    """The command line (defaults: the full GPU run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory for results.md, results.json, pytest-cuda.txt")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--skip-tests", action="store_true", help="no CUDA test step")
    parser.add_argument("--skip-decode", action="store_true", help="no decoding step")
    parser.add_argument("--gamma", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32_000, 151_936])
    parser.add_argument("--structure-vocab", type=int, default=2_000)
    parser.add_argument("--pathwise-schemes", nargs="+", help="default: every scheme")
    parser.add_argument("--pathwise-s", type=float, default=90.0, help="path-wise step budget")
    parser.add_argument("--agreement-rows", type=int, default=1_000_000, help="per scheme")
    parser.add_argument("--decode-s", type=float, default=120.0, help="decoding step budget")
    parser.add_argument("--test-paths", nargs="+", default=["tests/"], help="relative to root")
    parser.add_argument("--test-timeout", type=float, default=240.0)
    parser.add_argument("--deadline-s", type=float, default=480.0, help="whole-run budget")
    parser.add_argument("--force-overlay", action="store_true", help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.quick:
        args.batches, args.vocabs, args.gamma, args.structure_vocab = [1, 4], [1_000], 4, 200
        args.pathwise_schemes = args.pathwise_schemes or ["standard", "block", "gumbel"]
        args.agreement_rows = min(args.agreement_rows, 2_000)
    run = Run(args)
    try:
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("no CUDA device: pass --device cpu for a smoke test")
        ssg, top = import_package(args.force_overlay)
        import specsampling as ss

        torch.manual_seed(0)
        run.environment(torch, ssg, top)
        run.attempt("path-wise step", run.pathwise_step)
        run.attempt("float32 agreement step", lambda: run.agreement_step(torch, ssg))
        run.attempt("chain step", lambda: run.chain_benchmarks(torch, ssg))
        run.attempt("tree step", lambda: run.tree_benchmarks(torch, ssg, ss))
        free_memory(torch)
        if args.skip_decode:
            run.decode = "skipped (--skip-decode)"
        else:
            run.attempt("decoding step", lambda: run.decoding(top))
        if args.skip_tests:
            run.tests = {"summary": "skipped (--skip-tests)"}
        else:
            run.attempt("test step", lambda: run.run_tests(top))
    except Exception:
        run.notes.append("run aborted: " + traceback.format_exc().replace("\n", " | "))
        run.save()
        raise
    run.save()
    print((run.out / "results.md").read_text())


if __name__ == "__main__":
    main()
