"""One prepared run for a CUDA machine: the CUDA tests, then the torch benchmarks, in one call.

Run from the repository root (see ``benchmarks/gpu/README.md``)::

    python benchmarks/gpu/run.py OUT_DIR                    # on the GPU machine, < 10 minutes
    python benchmarks/gpu/run.py OUT_DIR --device cpu --quick --skip-tests   # smoke test here

Steps, each written to ``OUT_DIR`` as soon as it is done (``results.md``, ``results.json``,
``pytest-cuda.txt``), so a run cut short still leaves what it measured:

1. The environment: Python, torch, CUDA device, which optional packages import.
2. The CUDA tests: ``python -m pytest -q -m cuda tests/`` (the ``cuda``-marked tests run on the
   GPU), with a timeout.
3. Chains, for every chain scheme of ``specsampling.gpu.SCHEMES`` (iterated at run time;
   ``ssg.verify_chain`` when present) at B in {1, 32, 64}, γ = 8, V in {32k, 128k}: verify time
   from float32 probabilities, process + verify from float32 logits, against the copy floor (a
   device-to-device copy of both probability tables, measured in the same run); Hugging Face's
   ``_speculative_sampling`` looped per sequence and FlashInfer's ``chain_speculative_sampling``
   on the same tensors when they import. One call per scheme and size runs under
   ``torch.cuda.set_sync_debug_mode("error")`` (validation off): "no sync" means no host
   synchronisation inside process + verify.
4. Trees: ``Shape.paths(4, 8)`` and ``Shape.branching((2, 3, 4))`` (32 drafted nodes) for every
   tree lowering supporting them, same B and V, against the copy floor of both tables.

GPU times are ``torch.cuda.Event`` timings of back-to-back calls after a warm-up (the median of
several trials); on CPU, ``time.perf_counter``. A deadline (``--deadline-s``) skips what would
not fit, and says so in the results.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # common.py


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
    """ "no sync" if ``fn()`` runs under ``set_sync_debug_mode("error")``, else the error."""
    if not device.startswith("cuda"):
        return "n/a (CPU)"
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as error:
        return "SYNC: " + str(error).splitlines()[0][:120]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return "no sync"


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
        self.chains: list[dict[str, Any]] = []
        self.trees: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def remaining(self) -> float:
        return self.args.deadline_s - (time.perf_counter() - self.began)

    # ------------------------------------------------------------------ output
    def save(self) -> None:
        data = {
            "env": self.env,
            "tests": self.tests,
            "chains": self.chains,
            "trees": self.trees,
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
                ms(r.get("hf_s")),
                ms(r.get("flashinfer_s")),
                ms(r.get("adapter_s")),
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
            "HF loop (ms)",
            "FlashInfer (ms)",
            "our FlashInfer adapter (ms)",
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
        notes = "\n".join(f"- {n}" for n in data["notes"]) or "- none"
        quick = " **(`--quick`: a smoke test, not a result)**" if self.args.quick else ""
        return f"""# Torch backend on {self.env.get("device name", "?")}{quick}

Generated by `python benchmarks/gpu/run.py`; see `benchmarks/gpu/README.md`.

{env_lines}
- elapsed: {data["elapsed_s"]} s

## CUDA tests

{test_text}

## Chains (γ = {self.args.gamma}, float32)

"verify" takes probabilities (validation off); "process + verify" starts from logits
(`ssg.process` of both tables first). "copy floor" is a device-to-device copy of both
probability tables (`[B, γ + 1, V]` and `[B, γ, V]`), timed in the same run; "floor / verify"
is the share of that floor reached (goal for chains: >= 60%). "HF loop": Hugging Face
`_speculative_sampling` once per sequence, from logits. "host sync": one process + verify call
under `torch.cuda.set_sync_debug_mode("error")`.

{table(chain_header, chain_rows) if chain_rows else "not run"}

## Trees (32 drafted nodes, float32)

Tree structures drafted by the reference (`common.SyntheticPair`, vocabulary
{self.args.structure_vocab:,}: token ids only), tables random softmaxes on the device; the walk
is branch-free, so its cost does not depend on what is accepted.

{table(tree_header, tree_rows) if tree_rows else "not run"}

## Notes

{notes}
"""

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
        timeout = max(10.0, min(self.args.test_timeout, self.remaining() - 60))
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
        adapter = our_flashinfer_adapter()
        self.notes += [f"chains: {hf_note}", f"chains: {fi_note}"]
        self.fi_first = True
        for vocab in args.vocabs:
            for batch in args.batches:
                if self.remaining() < 30:
                    self.notes.append(f"chains: B={batch}, V={vocab} skipped (deadline)")
                    continue
                self.chain_config(torch, ssg, timer, usable, (hf, fi, adapter), batch, vocab)

    def chain_config(self, torch, ssg, timer, usable, peers, batch, vocab) -> None:
        """Every usable chain scheme and the peers at one size."""
        from common import chain_logits

        args, device = self.args, self.args.device
        hf, fi, adapter = peers
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
            shared["adapter_s"] = self.guarded(
                f"adapter {label}", timer, lambda: adapter(draft, draft_tokens, target)
            )
        for name, path, run in usable:
            record = {"scheme": name, "path": path, "B": batch, "V": vocab, **shared}

            def verify(run=run):
                return run(draft_tokens, target, draft)

            def full(run=run):
                t = ssg.process(target_logits, validate=False)  # [B, γ + 1, V]
                d = ssg.process(draft_logits, validate=False)  # [B, γ, V]
                return run(draft_tokens, t, d)

            record["verify_s"] = self.guarded(f"{name} {label}", timer, verify)
            record["process_verify_s"] = self.guarded(f"{name} full {label}", timer, full)
            record["sync"] = sync_check(torch, device, full)
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
                    if self.remaining() < 20:
                        self.notes.append(
                            f"trees: {shape!r} B={batch} V={vocab} skipped (deadline)"
                        )
                        continue
                    self.tree_config(torch, ssg, timer, pair, shape, names, batch, vocab)

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

            self.trees.append(
                {
                    "scheme": name,
                    "shape": repr(shape),
                    "B": batch,
                    "V": vocab,
                    "floor_s": floor,
                    "verify_s": self.guarded(f"tree {name} B={batch} V={vocab}", timer, verify),
                    "sync": sync_check(torch, device, verify),
                }
            )
            self.save()

    def guarded(self, label: str, timer: Any, fn: Any) -> float | None:
        """``timer(fn)``, or ``None`` with a note when it raises."""
        try:
            return timer(fn)
        except Exception as error:
            self.notes.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0]}")
            return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory for results.md, results.json, pytest-cuda.txt")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument("--skip-tests", action="store_true", help="benchmarks only")
    parser.add_argument("--gamma", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 64])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32_000, 128_000])
    parser.add_argument("--structure-vocab", type=int, default=2_000)
    parser.add_argument("--test-paths", nargs="+", default=["tests/"], help="relative to root")
    parser.add_argument("--test-timeout", type=float, default=240.0)
    parser.add_argument("--deadline-s", type=float, default=540.0, help="whole-run budget")
    parser.add_argument("--force-overlay", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.batches, args.vocabs, args.gamma, args.structure_vocab = [1, 4], [1_000], 4, 200
    run = Run(args)
    try:
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise SystemExit("no CUDA device: pass --device cpu for a smoke test")
        ssg, top = import_package(args.force_overlay)
        import specsampling as ss

        torch.manual_seed(0)
        run.environment(torch, ssg, top)
        if args.skip_tests:
            run.tests = {"summary": "skipped (--skip-tests)"}
        else:
            run.run_tests(top)
        run.chain_benchmarks(torch, ssg)
        run.tree_benchmarks(torch, ssg, ss)
    except Exception:
        run.notes.append("run aborted: " + traceback.format_exc().replace("\n", " | "))
        run.save()
        raise
    run.save()
    print((run.out / "results.md").read_text())


if __name__ == "__main__":
    main()
