r"""Drafted trees recorded from real models, replayed without them: :func:`record` and
:class:`RecordedTrees`.

:func:`record` decodes prompts with :class:`specsampling.gpu.hf.SpeculativeDecoder` and keeps,
for every round and row, the drafted tree and both models' **processed** distributions at every
node (the decoder's round traces, processed exactly as the decoder processes them: temperature,
top-k, top-p, target and draft alike). :meth:`RecordedTrees.load` reads them back, and every
estimator takes the result as a tree source: ``sim.estimate(scheme, trees)`` replays the
recorded rounds for any scheme exact for the recorded draw law, no model needed.

**Storage** (``keep``): ``None`` stores every distribution in full (float32, ``V`` values per
node and model: about 1.2 MB per node at ``V = 151,936``). An integer ``K`` (default 256) stores,
per node, the ``K`` tokens of largest ``max(p, q)`` plus the node's drafted children, their
target and draft probabilities (float64), and each model's remaining *tail mass*. Replay then
spreads each tail uniformly over the tokens not kept. The replayed pair equals the recorded one
on the kept tokens and moves only the tail mass; spreading both tails alike can only raise
:math:`\sum \min(p, q)` on the tail, so replayed acceptance errs high, by at most the tail
mass. :meth:`RecordedTrees.summary` reports the mean and largest tail mass, so a reader can
judge how much was moved.

**File format** (``.npz``, version :data:`VERSION`): arrays ``parents``, ``tokens`` (``[T, N]``,
``-1`` padded), ``num_nodes`` ``[T]``, ``expanded`` ``[T, N]`` (nodes whose draft distribution
was computed; the draft row of any other node is never read and replays as the target row),
``candidates`` ``[T, N, C]`` (each node's children in drafting order, repeated i.i.d. draws
repeated, ``-1`` padded: SpecTr and the others that count draws need them), ``ids`` ``[T, N,
K]`` (``-1`` padded; absent for full storage), ``target``, ``draft`` (``[T, N,
K]`` or ``[T, N, V]``), ``target_tail``, ``draft_tail`` ``[T, N]``, and ``meta``: a JSON string
with ``format`` (``"specsampling.recorded-trees"``), ``version``, ``vocab_size``, ``shape`` (as
written in Python, :func:`specsampling.compare.parse_shape`), ``law``, ``keep``, ``scheme`` (the
verifier the recording decoded with, which decides the contexts of later rounds), ``models``,
``temperature``, ``top_k``, ``top_p``, ``prompts`` (token counts and, when text was given, the
text), ``max_new_tokens``, ``seed``, ``date``, ``specsampling`` (version). Version 2 files end
with a seal, the zip comment ``specsampling-sha256:<hex>``: the sha256 of every byte before it.
:meth:`RecordedTrees.save` writes a temporary file and renames it into place, and
:meth:`RecordedTrees.load` refuses, with one ``ValueError`` naming the file, any file whose seal,
layout (each array's dtype and shape against the others and the metadata) or ranges are wrong.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import specsampling as ss
from specsampling.compare import parse_shape
from specsampling.errors import UnsupportedShape
from specsampling.gpu.processing import process
from specsampling.gpu.tree import PAD, TreeBatch
from specsampling.shapes import Shape, check_shape
from specsampling.tree import DrawLaw

from .sources import BATCH_ELEMENTS, Drafted

FORMAT = "specsampling.recorded-trees"
#: Version 2 seals the file with its sha256 (the zip comment); version 1 files still load.
VERSION = 2
#: The arrays of a file, besides ``meta`` (``ids`` only for top-K storage).
_ARRAYS = (
    "parents",
    "tokens",
    "num_nodes",
    "expanded",
    "target",
    "draft",
    "target_tail",
    "draft_tail",
    "candidates",
    "ids",
)
#: The seal: the zip comment ``_SEAL`` + the sha256 (hex) of every byte before the comment.
_SEAL = b"specsampling-sha256:"
_SEAL_SIZE = len(_SEAL) + 64


class _Damaged(ValueError):
    """What is wrong with a file (:meth:`RecordedTrees.load` names the file)."""


def _sealed(archive: bytes) -> bytes:
    """``archive`` (a zip without a comment) with the seal as its comment: the comment length
    field (the last 2 bytes) set, then ``_SEAL`` and the hex sha256 of all bytes before it."""
    body = archive[:-2] + _SEAL_SIZE.to_bytes(2, "little")
    return body + _SEAL + hashlib.sha256(body).hexdigest().encode("ascii")


def _check_seal(raw: bytes) -> None:
    body, seal = raw[:-_SEAL_SIZE], raw[-_SEAL_SIZE:]
    if not seal.startswith(_SEAL) or body[-2:] != _SEAL_SIZE.to_bytes(2, "little"):
        raise _Damaged("its sha256 seal is missing (truncated or rewritten)")
    if hashlib.sha256(body).hexdigest().encode("ascii") != seal[len(_SEAL) :]:
        raise _Damaged("its sha256 does not match its seal (the bytes changed)")


def _check_layout(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Every array's dtype and shape against the others and ``meta``, and their ranges."""
    missing = [name for name in _ARRAYS[:-1] if name not in arrays]
    if missing:
        raise _Damaged(f"arrays {missing} are missing")
    vocab = meta.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 2:
        raise _Damaged(f"meta vocab_size {vocab!r} is not an integer >= 2")
    parents = arrays["parents"]
    if parents.ndim != 2 or parents.dtype.kind not in "iu":
        raise _Damaged(f"parents: expected [T, N] integers, got {parents.dtype} {parents.shape}")
    trees, nodes = parents.shape
    width = vocab if "ids" not in arrays else arrays["ids"].shape[-1]
    expected = {
        "tokens": ((trees, nodes), "iu"),
        "num_nodes": ((trees,), "iu"),
        "expanded": ((trees, nodes), "b"),
        "target": ((trees, nodes, width), "f"),
        "draft": ((trees, nodes, width), "f"),
        "target_tail": ((trees, nodes), "f"),
        "draft_tail": ((trees, nodes), "f"),
        "ids": ((trees, nodes, width), "iu"),
    }
    for name, (shape, kinds) in expected.items():
        if name not in arrays:
            continue
        array = arrays[name]
        if array.shape != shape or array.dtype.kind not in kinds:
            raise _Damaged(
                f"{name}: expected shape {shape} of kind {kinds!r} (from parents {parents.shape}"
                f" and vocab_size {vocab}), got {array.dtype} {array.shape}"
            )
    candidates = arrays["candidates"]
    if candidates.ndim != 3 or candidates.shape[:2] != (trees, nodes):
        raise _Damaged(f"candidates: expected [{trees}, {nodes}, C], got {candidates.shape}")
    if width > vocab:
        raise _Damaged(f"{width} stored tokens per node exceed vocab_size {vocab}")
    counts = arrays["num_nodes"]
    if np.any(counts < 1) or np.any(counts > nodes):
        raise _Damaged(f"num_nodes: expected counts in [1, {nodes}]")
    for name, high in (("parents", nodes), ("candidates", nodes), ("tokens", vocab)):
        if np.any(arrays[name] < -1) or np.any(arrays[name] >= high):
            raise _Damaged(f"{name}: entries outside [-1, {high})")
    if "ids" in arrays and (np.any(arrays["ids"] < -1) or np.any(arrays["ids"] >= vocab)):
        raise _Damaged(f"ids: entries outside [-1, {vocab})")
    for name in ("target", "draft", "target_tail", "draft_tail"):
        values = arrays[name]
        if not np.all(np.isfinite(values)) or np.any(values < 0) or np.any(values > 1 + 1e-6):
            raise _Damaged(f"{name}: probabilities outside [0, 1] (or NaN)")
    try:
        parse_shape(str(meta.get("shape")))
        DrawLaw.of(meta.get("law"))
    except (ValueError, TypeError, KeyError, SyntaxError) as err:
        raise _Damaged(f"meta shape/law unreadable: {err}") from None


@dataclass
class RecordedTrees:
    """Recorded drafted trees with both models' processed distributions at every node.

    Build with :func:`record` or :meth:`load`; pass to :func:`~specsampling.simulators.estimate`
    and :func:`~specsampling.simulators.compare` as the source (the shape is the recorded one).

    Examples
    --------
    >>> import numpy as np, specsampling as ss
    >>> from specsampling import simulators as sim
    >>> pair = ss.pairs.Random(vocab_size=6, seed=0)
    >>> trees = sim.RecordedTrees.from_pair(pair, ss.Shape.paths(2, 2), 50, generator=0)
    >>> len(trees), trees.shape
    (50, paths(2, 2))
    >>> est = sim.estimate("traversal", trees, num_trees=50)
    >>> exact = float(ss.expected_emitted("traversal", pair, ss.Shape.paths(2, 2)))
    >>> abs(est.mean - exact) < 5 * est.stderr
    True
    """

    parents: np.ndarray  # [T, N] int64, -1 padded
    tokens: np.ndarray  # [T, N] int64, -1 padded
    num_nodes: np.ndarray  # [T]
    expanded: np.ndarray  # [T, N] bool
    target: np.ndarray  # [T, N, K] or [T, N, V]
    draft: np.ndarray  # same
    target_tail: np.ndarray  # [T, N]
    draft_tail: np.ndarray  # [T, N]
    ids: np.ndarray | None  # [T, N, K] int64, -1 padded; None: full storage
    candidates: np.ndarray  # [T, N, C] int64, -1 padded: children in drafting order, repeats kept
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.vocab_size = int(self.meta["vocab_size"])
        self.shape = parse_shape(self.meta["shape"])
        self.law = DrawLaw.of(self.meta["law"])

    def __len__(self) -> int:
        return int(self.parents.shape[0])

    def __repr__(self) -> str:
        models = self.meta.get("models") or {}
        named = (
            f", target={models.get('target')!r}, draft={models.get('draft')!r}" if models else ""
        )
        return f"RecordedTrees({len(self)} trees, {self.shape!r}, V={self.vocab_size}{named})"

    # -- files ------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the ``.npz`` file (see the module doc); returns its path."""
        out = Path(path)
        arrays: dict[str, Any] = {
            "parents": self.parents,
            "tokens": self.tokens,
            "num_nodes": self.num_nodes,
            "expanded": self.expanded,
            "target": self.target,
            "draft": self.draft,
            "target_tail": self.target_tail,
            "draft_tail": self.draft_tail,
            "candidates": self.candidates,
            "meta": np.array(json.dumps(self.meta)),
        }
        if self.ids is not None:
            arrays["ids"] = self.ids
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)
        temporary = out.with_name(out.name + ".part")
        temporary.write_bytes(_sealed(buffer.getvalue()))
        os.replace(temporary, out)  # an interrupted save never leaves a half file at ``out``
        return out

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RecordedTrees:
        """Read a file written by :meth:`save`. A damaged, truncated or foreign file is refused
        with one ``ValueError`` naming it and what is wrong: the format and version are checked,
        then the file's sha256 seal (every byte, version 2), then every array's dtype and shape
        against the others and the metadata, and the ranges of ids and probabilities."""
        where = Path(path)
        try:
            raw = where.read_bytes()
            with np.load(io.BytesIO(raw), allow_pickle=False) as data:
                if "meta" not in data.files:
                    raise _Damaged("not a recorded-trees file (no 'meta')")
                meta = json.loads(str(data["meta"]))
                if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                    found = meta.get("format") if isinstance(meta, dict) else meta
                    raise _Damaged(f"not a recorded-trees file ({found!r})")
                version = meta.get("version")
                if version not in (1, VERSION):
                    raise ValueError(
                        f"path: {where} has format version {version!r}; this specsampling "
                        f"reads versions 1 and {VERSION}"
                    )
                if version >= 2:
                    _check_seal(raw)
                arrays = {name: data[name] for name in _ARRAYS if name in data.files}
        except _Damaged as err:
            raise ValueError(f"path: {where} is refused: {err}") from None
        except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile, zlib.error) as err:
            if isinstance(err, FileNotFoundError) or str(err).startswith("path: "):
                raise
            raise ValueError(
                f"path: {where} is refused: damaged or not a recorded-trees file "
                f"({type(err).__name__}: {err})"
            ) from None
        try:
            _check_layout(arrays, meta)
            return cls(
                arrays["parents"],
                arrays["tokens"],
                arrays["num_nodes"],
                arrays["expanded"],
                arrays["target"],
                arrays["draft"],
                arrays["target_tail"],
                arrays["draft_tail"],
                arrays.get("ids"),
                arrays["candidates"],
                meta,
            )
        except (_Damaged, KeyError, ValueError, TypeError) as err:
            raise ValueError(f"path: {where} is refused: {err}") from None

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def from_tables(
        cls,
        trees: Sequence[ss.DraftTree],
        targets: Sequence[Any],
        drafts: Sequence[Any],
        expanded: Sequence[Any] | None,
        *,
        shape: Shape,
        keep: int | None = 256,
        meta: dict[str, Any] | None = None,
    ) -> RecordedTrees:
        """Pack trees and their dense tables (``[num_nodes, V]`` each) into the stored form."""
        shape = check_shape(shape)
        if not trees:
            raise ValueError("trees: nothing to record")
        for i, tree in enumerate(trees):  # replay rebuilds every tree with the shape's law
            if tree.law is not shape.law or tree.guesses:
                raise ValueError(
                    f"trees[{i}]: drawn by law {tree.law.value!r}"
                    + (" with a grafted guess" if tree.guesses else "")
                    + f", but a recording of {shape!r} replays every tree by its law "
                    f"{shape.law.value!r} (record trees drafted by the shape's own law)"
                )
        count = len(trees)
        width = max(t.num_nodes for t in trees)
        vocab = int(np.asarray(targets[0]).shape[1])
        parents = np.full((count, width), PAD, dtype=np.int64)
        tokens = np.full((count, width), PAD, dtype=np.int64)
        sizes = np.array([t.num_nodes for t in trees], dtype=np.int64)
        grown = np.zeros((count, width), dtype=bool)
        most = max((len(c) for t in trees for c in t.candidates), default=0)
        candidates = np.full((count, width, max(1, most)), PAD, dtype=np.int64)
        for i, tree in enumerate(trees):
            for n, cands in enumerate(tree.candidates):
                candidates[i, n, : len(cands)] = cands
            parents[i, 1 : tree.num_nodes] = tree.parents[1:]
            tokens[i, 1 : tree.num_nodes] = tree.tokens[1:]
            if expanded is None:
                grown[i, : tree.num_nodes] = [
                    bool(tree.candidates[n]) for n in range(tree.num_nodes)
                ]
            else:
                grown[i, : tree.num_nodes] = np.asarray(expanded[i], dtype=bool)[: tree.num_nodes]
        if keep is None:
            target = np.zeros((count, width, vocab), dtype=np.float32)
            draft = np.zeros_like(target)
            for i, tree in enumerate(trees):
                target[i, : tree.num_nodes] = np.asarray(targets[i], dtype=np.float64)
                draft[i, : tree.num_nodes] = np.asarray(drafts[i], dtype=np.float64)
            # float32 storage: the tails carry what rounding moved, so rows replay summing to 1.
            target_tail = np.zeros((count, width))
            draft_tail = np.zeros((count, width))
            ids = None
        else:
            if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
                raise ValueError(f"keep: expected None (full) or an integer >= 1, got {keep!r}")
            slots = min(vocab, keep + shape_width(shape))
            ids = np.full((count, width, slots), PAD, dtype=np.int64)
            target = np.zeros((count, width, slots))
            draft = np.zeros_like(target)
            target_tail = np.zeros((count, width))
            draft_tail = np.zeros((count, width))
            for i, tree in enumerate(trees):
                p_all = np.asarray(targets[i], dtype=np.float64)
                q_all = np.asarray(drafts[i], dtype=np.float64)
                for n in range(tree.num_nodes):
                    p, q = p_all[n], q_all[n]
                    chosen = _support(p, q, [tree.tokens[c] for c in tree.candidates[n]], keep)
                    ids[i, n, : len(chosen)] = chosen
                    target[i, n, : len(chosen)] = p[chosen]
                    draft[i, n, : len(chosen)] = q[chosen]
                    target_tail[i, n] = max(0.0, 1.0 - float(p[chosen].sum()))
                    draft_tail[i, n] = max(0.0, 1.0 - float(q[chosen].sum()))
        info = {
            "format": FORMAT,
            "version": VERSION,
            "vocab_size": vocab,
            "shape": repr(shape),
            "law": shape.law.value,
            "keep": keep,
            "date": datetime.date.today().isoformat(),
            "specsampling": ss.__version__,
        }
        info.update(meta or {})
        return cls(
            parents,
            tokens,
            sizes,
            grown,
            target,
            draft,
            target_tail,
            draft_tail,
            ids,
            candidates,
            info,
        )

    @classmethod
    def from_pair(
        cls,
        pair: Any,
        shape: Shape,
        num_trees: int,
        generator: Any = None,
        *,
        keep: int | None = None,
        prefix: Sequence[int] | None = None,
    ) -> RecordedTrees:
        """Record ``num_trees`` trees drafted from a model pair (for tests and for freezing a
        synthetic workload); ``keep`` as in :func:`record` (default: full)."""
        from .sources import as_generator, draft_batches

        rng = as_generator(generator)
        trees, targets, drafts = [], [], []
        for batch in draft_batches(pair, shape, num_trees, rng, prefix=prefix):
            sizes = batch.trees.num_nodes.tolist()
            for b, tree in enumerate(batch.trees.to_trees()):
                trees.append(tree)
                targets.append(batch.target[b, : sizes[b]].cpu().numpy())
                drafts.append(batch.draft[b, : sizes[b]].cpu().numpy())
        meta = {"models": {"pair": repr(pair)}}
        return cls.from_tables(trees, targets, drafts, None, shape=shape, keep=keep, meta=meta)

    # -- replay -------------------------------------------------------------------------------
    def check_shape(self, shape: Shape | None) -> Shape:
        """The recorded shape; a given ``shape`` must equal it."""
        if shape is not None and check_shape(shape) != self.shape:
            raise ValueError(f"shape: these trees were recorded with {self.shape!r}, not {shape!r}")
        return self.shape

    def check_scheme(self, scheme: Any) -> None:
        """Refuse a scheme that is not exact for the recorded draw law (``UnsupportedShape``)."""
        try:
            scheme.check(self.shape)
        except UnsupportedShape as error:
            raise UnsupportedShape(f"recorded trees of {self.shape!r}: {error}") from None

    def tables(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense float64 target and draft tables ``[num_nodes, V]`` of tree ``index``."""
        n = int(self.num_nodes[index])
        target = self._dense(self.target[index, :n], self.target_tail[index, :n], index, n)
        draft = self._dense(self.draft[index, :n], self.draft_tail[index, :n], index, n)
        unexpanded = ~self.expanded[index, :n]
        draft[unexpanded] = target[unexpanded]  # never read; a valid row
        return target, draft

    def _dense(self, values: np.ndarray, tails: np.ndarray, index: int, n: int) -> np.ndarray:
        vocab = self.vocab_size
        if self.ids is None:
            out = np.asarray(values, dtype=np.float64).copy()
            out /= out.sum(axis=1, keepdims=True)  # undo float32 rounding of the row mass
            return out
        out = np.zeros((n, vocab))
        for node in range(n):
            ids = self.ids[index, node]
            ids = ids[ids >= 0]
            rest = vocab - len(ids)
            if rest and tails[node] > 0:
                out[node] = tails[node] / rest
            out[node, ids] = values[node, : len(ids)]
            out[node] /= out[node].sum()
        return out

    def tree(self, index: int) -> ss.DraftTree:
        """The drafted tree ``index`` (candidates in drafting order, repeated draws kept), with
        the recorded law."""
        n = int(self.num_nodes[index])
        cands = [tuple(int(c) for c in row if c >= 0) for row in self.candidates[index, :n]]
        return ss.DraftTree(
            tuple(int(x) for x in self.parents[index, :n]),
            tuple(int(x) for x in self.tokens[index, :n]),
            tuple(cands),
            self.law,
        )

    def batches(
        self, num_trees: int | None = None, batch_size: int | None = None
    ) -> Iterator[Drafted]:
        """The first ``num_trees`` recorded trees (all by default), in order, as batches."""
        total = len(self) if num_trees is None else int(num_trees)
        if total > len(self):
            raise ValueError(f"num_trees: the file holds {len(self)} trees, asked for {total}")
        width = int(self.parents.shape[1])
        size = batch_size or max(1, BATCH_ELEMENTS // (width * self.vocab_size))
        for start in range(0, total, size):
            rows = range(start, min(total, start + size))
            trees = [self.tree(i) for i in rows]
            pairs = [self.tables(i) for i in rows]
            batch = TreeBatch.from_trees(trees)
            target = torch.zeros(
                len(trees), batch.parents.shape[1], self.vocab_size, dtype=torch.float64
            )
            draft = torch.zeros_like(target)
            for b, (t, d) in enumerate(pairs):
                target[b, : t.shape[0]] = torch.from_numpy(t)
                draft[b, : d.shape[0]] = torch.from_numpy(d)
            yield Drafted(batch, target, draft, tuple(() for _ in rows))

    def summary(self) -> str:
        """Trees, nodes, storage and the tail mass replay spreads."""
        real = np.arange(self.parents.shape[1])[None, :] < self.num_nodes[:, None]
        tails = np.concatenate([self.target_tail[real], self.draft_tail[real & self.expanded]])
        models = self.meta.get("models") or {}
        lines = [
            f"{len(self)} trees of {self.shape!r} (law {self.law.value}), V = {self.vocab_size}, "
            f"{float(self.num_nodes.mean()):.2f} nodes per tree on average",
            "storage: "
            + (
                "full distributions (float32)"
                if self.ids is None
                else f"top {self.meta['keep']} "
                "tokens per node plus drafted children, tails spread uniformly"
            )
            + f"; tail mass mean {float(tails.mean()) if tails.size else 0.0:.2e}, "
            f"max {float(tails.max()) if tails.size else 0.0:.2e}",
        ]
        if models:
            lines.append("models: " + ", ".join(f"{k} {v}" for k, v in models.items()))
        for key in ("scheme", "temperature", "top_k", "top_p", "max_new_tokens", "date"):
            if key in self.meta:
                lines.append(f"{key}: {self.meta[key]}")
        return "\n".join(lines)


def shape_width(shape: Shape) -> int:
    """The most candidates one node of ``shape`` can hold (bound on forced-in child slots)."""
    counts: dict[int, int] = {}
    for parent, _ in shape.steps:
        counts[parent] = counts.get(parent, 0) + 1
    return max(counts.values(), default=0)


def _support(p: np.ndarray, q: np.ndarray, children: Sequence[int], keep: int) -> np.ndarray:
    """The ``keep`` tokens of largest ``max(p, q)`` (ties to the lower id) plus ``children``."""
    score = np.maximum(p, q)
    if keep >= len(score):
        top = np.arange(len(score))
    else:
        top = np.argpartition(-score, keep - 1)[:keep]
    chosen = np.union1d(top[score[top] > 0], np.asarray(list(children), dtype=np.int64))
    return chosen.astype(np.int64)


def record(
    target: Any,
    draft: Any,
    prompts: Sequence[Any],
    path: str | os.PathLike[str],
    *,
    shape: Shape,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    scheme: str | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    keep: int | None = 256,
    seed: int = 0,
    tokenizer: Any = None,
    dtype: Any = None,
    progress: bool | None = None,
) -> RecordedTrees:
    """Decode ``prompts`` speculatively and record every round's tree and distributions.

    Parameters
    ----------
    target, draft : causal LM or name
        Model objects (any Hugging Face causal LM the decoder takes), or names of
        :data:`specsampling.gpu.hf.MODELS` (loaded with ``dtype``, float32 by default).
    prompts : sequence of str or of token-id sequences
        Text needs ``tokenizer`` (taken from ``target`` when it is a name).
    path : path
        Where to write the ``.npz`` file (see the module doc).
    shape : Shape
        How every round drafts.
    temperature, top_k, top_p : processing of both models, as the decoder's.
    max_new_tokens : int
        Tokens decoded per prompt; every round on the way is recorded.
    scheme : str, optional
        The verifier that decides each round's accepted tokens (and so later contexts): the
        default is ``traversal`` for multi-candidate shapes, ``standard`` for chains.
    keep : int or None, default 256
        Tokens kept per node (plus the drafted children), or ``None`` for full distributions.
    seed : int
        The decoder's seed, per prompt ``seed + i``.

    Returns
    -------
    RecordedTrees
        What was written.
    """
    from specsampling.gpu import hf

    shape = check_shape(shape)
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep: expected None (full) or an integer >= 1, got {keep!r}")
    ss.validation.check_output_file(path, "path")  # before any model is loaded
    names = {}
    if isinstance(target, str):
        names["target"] = target
        target, loaded = hf.load_model(
            target, dtype=dtype or torch.float32, progress=bool(progress)
        )
        tokenizer = tokenizer or loaded
    if isinstance(draft, str):
        names["draft"] = draft
        draft, _ = hf.load_model(draft, dtype=dtype or torch.float32, progress=bool(progress))
    for role, model in (("target", target), ("draft", draft)):
        config = getattr(model, "config", None)
        names.setdefault(role, getattr(config, "_name_or_path", "") or type(model).__name__)
    if scheme is None:
        if shape.is_chain:
            scheme = "standard"
        elif shape.law in (DrawLaw.IID, DrawLaw.WITHOUT):
            scheme = "traversal"
        else:
            scheme = "nss"  # deterministic and own-law trees
    drafter = hf.drafters.as_drafter(draft)
    if getattr(drafter, "law", None) is not None or isinstance(drafter, hf.MixedDraft):
        raise ValueError(
            f"draft: {type(drafter).__name__} proposes trees by another law than the shape's "
            "(point-mass lookups, grafted branches), which a recording cannot replay; record a "
            "draft model (a causal LM, LayerSkipDraft or ModelDraft)"
        )
    decoder = hf.SpeculativeDecoder(target, drafter, scheme, shape)
    trees: list[ss.DraftTree] = []
    targets: list[np.ndarray] = []
    drafts: list[np.ndarray] = []
    grown: list[np.ndarray] = []
    prompt_info = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError("tokenizer: text prompts need a tokenizer (or pass token ids)")
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            prompt_info.append({"text": prompt, "tokens": int(ids.shape[1])})
        else:
            ids = torch.as_tensor([list(prompt)], dtype=torch.long)
            prompt_info.append({"tokens": int(ids.shape[1])})
        decoder.traces = []
        decoder.generate(
            ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed + index,
        )
        for trace in decoder.traces:
            # Processed as the decoder processed them (its dtype), then widened to float64.
            tp = process(trace.target_logits, temperature, top_k, top_p).double()
            vocab = tp.shape[-1]
            dp = tp.clone()
            if trace.draft_logits is not None:
                raw = trace.draft_logits[..., :vocab]
                mask = ~torch.isnan(raw).any(-1)
                if bool(mask.any()):
                    dp[mask] = process(raw[mask], temperature, top_k, top_p).double()
            else:
                mask = torch.zeros(tp.shape[:2], dtype=torch.bool)
            sizes = trace.tree.num_nodes.tolist()
            for b, tree in enumerate(trace.tree.to_trees()):
                if tree.num_nodes < 2:
                    continue  # a root alone (no draft): nothing to verify
                n = sizes[b]
                trees.append(tree)
                targets.append(tp[b, :n].cpu().numpy())
                drafts.append(dp[b, :n].cpu().numpy())
                grown.append(mask[b, :n].cpu().numpy())
        decoder.traces = None
        if progress:
            print(f"recorded prompt {index + 1}/{len(prompts)}: {len(trees)} trees", flush=True)
    meta = {
        "models": names,
        "scheme": scheme,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "prompts": prompt_info,
    }
    out = RecordedTrees.from_tables(
        trees, targets, drafts, grown, shape=shape, keep=keep, meta=meta
    )
    out.save(path)
    return out


__all__ = ["FORMAT", "VERSION", "RecordedTrees", "record"]
