r"""Certify the torch lowerings against their certified references: ``specsampling certify
--backend torch``.

:func:`certify_torch` checks every lowering of :mod:`specsampling.gpu` against the numpy
reference that :func:`specsampling.certify.certify` certifies: path-wise equality on mixed
batches of drafted trees (for the lowerings exact for grafted trees, rows with
:func:`~specsampling.certify.lookup_guess` grafted in among them), the same on every enumerated
tree of every shape, refusals (grafted trees included), and keyed streams for the keyed
couplings; a scheme without a lowering is a failing ``not lowered`` row.
It imports torch only when called.
"""

from __future__ import annotations

import importlib
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .certify import (
    CLOSED_FORM_DRAFTS,
    FLOAT_SEEDS,
    STATIONARY,
    STRUCTURAL_SEEDS,
    TOLERANCE,
    Progress,
    Violation,
    _describe,
    builtin_shapes,
    lookup_guess,
    vocab_for,
)
from .errors import UnsupportedShape
from .noise import LARGEST_BELOW_ONE, Noise
from .pairs import ModelPair, Random, Stationary
from .sampling import generate as sampling_generate
from .schemes import SCHEMES, Scheme, TreeVerifier, Verdict, get_scheme, tables
from .shapes import Shape
from .tree import DraftTree, DrawLaw, grafted_law

#: Pairs of the torch path-wise batches: vocabularies of the seeded random pairs.
TORCH_VOCABS = (4, 6)
#: Trees drafted per shape and pair in a path-wise batch (each with every noise of
#: :func:`_torch_noises`).
TORCH_DRAFTS = 2
#: Budget of :func:`vocab_for` for the law check's random pairs (every tree is enumerated).
TORCH_LAW_BUDGET = 64
#: ``(accept, sample)`` constant uniforms of the law check's noise grid, plus one seeded draw:
#: the boundary uniforms crossed (an accept test at ``u = 0`` meets a zero target mass, an
#: inverse CDF at the largest float below 1 the clip to the last positive token).
TORCH_LAW_GRID = ((0.0, LARGEST_BELOW_ONE), (LARGEST_BELOW_ONE, 0.0))
#: Keys and stream length of the keyed couplings' token comparison.
TORCH_KEYS = (0, 1, 2, 3)
TORCH_STREAM_LENGTH = 8

_Round = tuple[Shape, DraftTree, Any, Any, Noise]


@dataclass(frozen=True)
class TorchSchemeReport:
    """Certification of one scheme's torch lowering (``specsampling certify --backend torch``).

    ``lowering`` is ``"tree"`` (a :class:`~specsampling.gpu.schemes.TreeLowering`), ``"keyed"``
    (checked through ``specsampling.gpu.generate``) or ``"not lowered"`` (never certified).
    ``pathwise_rows`` counts the rows of the mixed path-wise batches, ``law_trees`` the
    enumerated trees of the law check and ``law_rows`` their rows (trees x noise grid),
    ``keyed_streams`` the compared keyed streams, ``grafted_rows`` the path-wise rows whose
    tree has a guess grafted in (counted in ``pathwise_rows`` too).
    """

    name: str
    lowering: str
    supported: tuple[str, ...]
    refused: tuple[str, ...]
    pathwise_rows: int = 0
    law_trees: int = 0
    law_rows: int = 0
    keyed_streams: int = 0
    violations: tuple[Violation, ...] = field(default=())
    #: Why a scheme is not lowered (empty otherwise).
    note: str = ""
    grafted_rows: int = 0

    @property
    def cases(self) -> int:
        """Rows and streams compared with the reference."""
        return self.pathwise_rows + self.law_rows + self.keyed_streams

    @property
    def certified(self) -> bool:
        """Lowered, no violation and at least one case checked."""
        return self.lowering != "not lowered" and not self.violations and self.cases > 0


@dataclass(frozen=True)
class TorchReport:
    """Certification of the torch lowerings; ``certified`` iff every scheme is."""

    schemes: tuple[TorchSchemeReport, ...]
    seconds: float
    version: str
    torch_version: str
    device: str

    @property
    def certified(self) -> bool:
        return all(s.certified for s in self.schemes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (verdicts included)."""
        schemes = [{**asdict(s), "cases": s.cases, "certified": s.certified} for s in self.schemes]
        return {
            "backend": "torch",
            "version": self.version,
            "torch_version": self.torch_version,
            "device": self.device,
            "seconds": self.seconds,
            "certified": self.certified,
            "schemes": schemes,
        }


def load_gpu() -> Any:
    """``specsampling.gpu``, imported on demand (the core never imports torch).

    Raises ``ImportError`` saying how to install torch when it is missing.

    >>> load_gpu().__name__
    'specsampling.gpu'
    """
    try:
        return importlib.import_module("specsampling.gpu")
    except ImportError as err:
        hint = "" if "pip install" in str(err) else ': pip install "specsampling[torch]"'
        raise ImportError(f"the torch backend needs specsampling.gpu ({err}){hint}") from err


def certify_torch(
    schemes: Iterable[Any] | None = None,
    *,
    progress: Progress | None = None,
    device: str = "cpu",
) -> TorchReport:
    r"""Certify the torch lowerings against their references (``certify --backend torch``).

    For every scheme (default: all of :data:`~specsampling.SCHEMES`, lowered or not) and every
    built-in shape its reference supports, in float64 on ``device``:

    * **path-wise**: for each pair of :func:`_torch_pairs`, one batch mixing
      :data:`TORCH_DRAFTS` drafted trees of every supported shape, each with random noise,
      the boundary uniforms ``0`` and ``LARGEST_BELOW_ONE`` (all lanes, and accept/sample
      crossed) and the accept tests' own boundaries (:func:`_ratio_noises`), shuffled: every
      row's lowered verdict and emitted tokens must equal the reference's.
    * **law**: the exact law belongs to the reference (certified by :func:`certify`); the
      lowering has it iff it makes the reference's decision for every tree and noise. This
      check extends the path-wise equality from sampled trees to *every* tree the shape can
      draft (:meth:`Shape.enumerate` over the stationary edge cases and small random pairs;
      the tree weights must sum to 1), each with the crossed boundary grid
      :data:`TORCH_LAW_GRID` and a seeded draw, and requires every lowered verdict to have
      positive probability under the reference's exact ``verdict_law`` of its tree. It is
      deterministic, with no statistics and no tolerance, but it probes the noise at points:
      it is not a proof of equality between them (the chi-square of sampled lowered rounds
      against ``round_law`` is in ``tests/test_gpu_fuzz.py``).
    * **refusals**: a tree of a refused shape whose law the reference is not exact for must be
      refused by the lowering with :class:`~specsampling.UnsupportedShape`, alone and after a
      tree of a supported shape in the same batch.

    Keyed couplings lowered as keyed objects are checked by comparing the streams of
    ``specsampling.gpu.generate`` (one batch of the keys :data:`TORCH_KEYS`) with
    :func:`specsampling.generate` for every supported shape, on a seeded random pair and one
    stationary edge case (taken by turns over the shapes). A scheme without a lowering is
    reported as ``"not lowered"`` and is not certified.

    Parameters
    ----------
    schemes : iterable of str, Scheme or lowering, optional
        Registered names, reference scheme objects, or lowering objects (checked against the
        reference of their ``name``; need not be registered).
    progress : callable, optional
        ``progress(done, total, label)``, called after every unit of work.
    device : str, default "cpu"
        The torch device the lowerings run on.

    Examples
    --------
    >>> report = certify_torch(["standard"])
    >>> report.certified, report.schemes[0].lowering, report.schemes[0].law_trees > 0
    (True, 'tree', True)
    """
    start = time.perf_counter()
    ssg = load_gpu()
    items = list(SCHEMES) if schemes is None else list(schemes)
    resolved = [_resolve_lowering(ssg, item) for item in items]
    plans = [
        (name, lowering, _plan_torch(reference, lowering, ssg))
        for name, reference, lowering in resolved
    ]
    total = sum(len(shapes) + len(refused) for _, _, (shapes, refused) in plans)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    reports = tuple(
        _run_torch(ssg, name, reference, lowering, shapes, refused, device, tick)
        for (name, reference, lowering), (_, _, (shapes, refused)) in zip(
            resolved, plans, strict=True
        )
    )
    from . import __version__

    torch_version = str(importlib.import_module("torch").__version__)
    return TorchReport(reports, time.perf_counter() - start, __version__, torch_version, device)


def _resolve_lowering(ssg: Any, item: Any) -> tuple[str, Scheme, Any]:
    """``(name, reference scheme, lowering or None)`` for a name, scheme or lowering."""
    if isinstance(item, ssg.schemes.Lowering):
        return item.name, get_scheme(item.name), item
    reference = get_scheme(item)
    lowering = ssg.SCHEMES[reference.name] if reference.name in ssg.SCHEMES else None
    return reference.name, reference, lowering


def _torch_shapes(reference: Scheme) -> tuple[tuple[Shape, ...], tuple[Shape, ...]]:
    """``(supported, refused)`` among the built-in shapes and the scheme's own laws."""
    shapes = list(builtin_shapes())
    for k in CLOSED_FORM_DRAFTS:
        own = reference.single_shape(k)
        if own not in shapes:
            shapes.append(own)
    supported = tuple(s for s in shapes if reference.supports(s))
    return supported, tuple(s for s in shapes if s not in supported)


def _plan_torch(
    reference: Scheme, lowering: Any, ssg: Any
) -> tuple[tuple[Shape, ...], tuple[Shape, ...]]:
    supported, refused = _torch_shapes(reference)
    tree_lowered = lowering is not None and isinstance(lowering, ssg.schemes.TreeLowering)
    return supported, refused if tree_lowered else ()


def _run_torch(
    ssg: Any,
    name: str,
    reference: Scheme,
    lowering: Any,
    shapes: tuple[Shape, ...],
    refused: tuple[Shape, ...],
    device: str,
    tick: Callable[[str], None],
) -> TorchSchemeReport:
    supported = tuple(repr(s) for s in shapes)
    all_refused = tuple(repr(s) for s in _torch_shapes(reference)[1])
    if lowering is None:
        for shape in shapes:
            tick(f"{name} not lowered {shape!r}")
        note = "no lowering in specsampling.gpu.SCHEMES"
        return TorchSchemeReport(name, "not lowered", supported, all_refused, note=note)
    if not isinstance(lowering, ssg.schemes.TreeLowering):
        return _run_keyed(ssg, name, reference, lowering, shapes, all_refused, tick)
    assert isinstance(reference, TreeVerifier)  # a tree lowering lowers a tree verifier
    violations: list[Violation] = []
    pathwise = _pathwise_rows(reference, shapes)
    for label, rounds in pathwise:
        violations += _compare_rows(ssg, lowering, reference, rounds, label, "path-wise", device)
    law_trees = law_rows = 0
    for shape in shapes:
        for label, pair in _law_pairs(shape):
            trees, rounds, found = _law_rounds(pair, shape, label)
            violations += found
            law_trees += trees
            law_rows += len(rounds)
            violations += _compare_rows(
                ssg, lowering, reference, rounds, label, "law", device, support=True
            )
        tick(f"{name} {shape!r}")
    companion = _companion(shapes)
    for shape in refused:
        violations += _check_torch_refusal(ssg, lowering, reference, shape, device, companion)
        tick(f"{name} refuses {shape!r}")
    if not reference.exact_for(DrawLaw.GRAFTED, False):
        violations += _check_torch_grafted_refusal(ssg, lowering, device, companion)
    rows = [row for _, rounds in pathwise for row in rounds]
    return TorchSchemeReport(
        name,
        "tree",
        supported,
        all_refused,
        pathwise_rows=len(rows),
        law_trees=law_trees,
        law_rows=law_rows,
        violations=tuple(violations),
        grafted_rows=sum(row[1].law is DrawLaw.GRAFTED for row in rows),
    )


def _torch_pairs() -> list[tuple[str, ModelPair]]:
    """The path-wise pairs: the stationary edge cases and seeded random pairs (any shape)."""
    pairs: list[tuple[str, ModelPair]] = [
        (f"stationary: {label}", Stationary([float(x) for x in t], [float(x) for x in d]))
        for label, t, d in STATIONARY
    ]
    for vocab in TORCH_VOCABS:
        for seed in FLOAT_SEEDS:
            pair = Random(vocab, seed)
            pairs.append((repr(pair), pair))
    return pairs


def _law_pairs(shape: Shape) -> list[tuple[str, ModelPair]]:
    """The law check's pairs: the stationary edge cases and random pairs small enough to
    enumerate every tree of ``shape`` (:data:`TORCH_LAW_BUDGET`)."""
    pairs = _torch_pairs()[: len(STATIONARY)]
    vocab = vocab_for(shape, TORCH_LAW_BUDGET)
    for seed in FLOAT_SEEDS:
        pair = Random(vocab, seed)
        pairs.append((repr(pair), pair))
    return pairs


def _torch_noises(
    rng: np.random.Generator, tree: DraftTree, target: Any, draft: Any
) -> list[Noise]:
    """A random draw, both boundary uniforms on every lane, the two crossed, and the accept
    tests' own boundaries (:func:`_ratio_noises`)."""
    num_nodes = tree.num_nodes
    grid = [(0.0, 0.0), (LARGEST_BELOW_ONE, LARGEST_BELOW_ONE), *TORCH_LAW_GRID]
    full = [Noise(np.full(num_nodes, a), np.full(num_nodes, s)) for a, s in grid]
    return [Noise.draw(rng, num_nodes), *full, *_ratio_noises(rng, tree, target, draft)]


def _ratio_noises(
    rng: np.random.Generator, tree: DraftTree, target: Any, draft: Any
) -> list[Noise]:
    r"""Noise on the accept tests' boundaries: each node's accept uniform at ``fl(p(x) / q(x))``
    of its token under its parent's tables, and one float below it (``LARGEST_BELOW_ONE`` where
    the ratio is at least 1, 0 where ``q(x) = 0``), sample uniforms random. A test written
    another way than the reference's ``u q(x) < p(x)`` (``u < p(x) / q(x)``, say) decides some
    of these differently: a random uniform almost never lands there."""
    parents, tokens = tree.parents, tree.tokens
    ratios = np.zeros(tree.num_nodes)
    for node in range(1, tree.num_nodes):
        p = float(target[parents[node]][tokens[node]])
        q = float(draft[parents[node]][tokens[node]]) if draft is not None else 1.0
        ratios[node] = p / q if q > 0 else 0.0
    at = np.where(ratios >= 1, LARGEST_BELOW_ONE, ratios)
    below = np.where(at > 0, np.nextafter(at, 0.0), 0.0)
    return [Noise(accept, rng.random(tree.num_nodes)) for accept in (at, below)]


def _pathwise_rows(reference: Scheme, shapes: tuple[Shape, ...]) -> list[tuple[str, list[_Round]]]:
    """One shuffled batch per pair mixing drafted trees of every shape with every noise; for a
    reference exact for grafted trees, each i.i.d. tree also with :func:`lookup_guess` grafted
    in from the root and from below its first drawn token."""
    grafts = isinstance(reference, TreeVerifier) and reference.exact_for(DrawLaw.GRAFTED, False)
    batches = []
    for index, (label, pair) in enumerate(_torch_pairs()):
        rng = np.random.default_rng(index)
        rounds: list[_Round] = []
        for shape in shapes:
            for _ in range(TORCH_DRAFTS):
                drawn = shape.draft(pair, rng)
                trees = [drawn]
                if grafts and grafted_law(shape.law, shape.is_chain) is DrawLaw.GRAFTED:
                    first = list(drawn.tokens[1:2])
                    trees += [drawn.graft(lookup_guess(())), drawn.graft([*first, 0, 1])]
                for tree in dict.fromkeys(trees):  # a guess that adds nothing: once
                    target, draft = tables(pair, tree)
                    noises = _torch_noises(rng, tree, target, draft)
                    rounds += [(shape, tree, target, draft, n) for n in noises]
        order = rng.permutation(len(rounds))
        batches.append((label, [rounds[i] for i in order]))
    return batches


def _law_rounds(
    pair: ModelPair, shape: Shape, label: str
) -> tuple[int, list[_Round], list[Violation]]:
    """Every tree ``shape`` drafts over ``pair`` with the noise grid (and the weight check)."""
    rng = np.random.default_rng(0)
    rounds: list[_Round] = []
    total, trees = 0.0, 0
    for tree, weight in shape.enumerate(pair):
        total += float(weight)
        if not weight > 0:
            continue
        trees += 1
        target, draft = tables(pair, tree)
        grid = [
            Noise(np.full(tree.num_nodes, a), np.full(tree.num_nodes, s)) for a, s in TORCH_LAW_GRID
        ]
        grid.append(Noise.draw(rng, tree.num_nodes))
        rounds += [(shape, tree, target, draft, noise) for noise in grid]
    found = []
    if not abs(total - 1) <= TOLERANCE:
        found.append(Violation(repr(shape), label, "enumeration", f"tree weights sum to {total}"))
    return trees, rounds, found


def _compare_rows(
    ssg: Any,
    lowering: Any,
    reference: TreeVerifier,
    rounds: list[_Round],
    label: str,
    kind: str,
    device: str,
    *,
    support: bool = False,
) -> list[Violation]:
    """Run the rows as one batch; one violation per shape with mismatching rows (the count and
    the first example), and, with ``support``, per verdict of zero exact probability."""
    if not rounds:
        return []
    try:
        verified = _run_rows(ssg, lowering, rounds, device)
    except Exception as err:  # a crash is a finding, not a reason to stop
        return [Violation("mixed batch", label, "exception", _describe(err))]
    nodes, next_tokens, emitted, counts = verified
    bad: dict[str, list[str]] = {}
    laws: dict[int, Any] = {}
    for row, (shape, tree, target, draft, noise) in enumerate(rounds):
        expected = tuple(reference.verify(tree, target, draft, noise))
        got = (nodes[row], next_tokens[row])
        path = (*tree.prefix(expected[0]), expected[1])
        tokens = emitted[row]
        problem = ""
        if got != expected or tuple(tokens[: counts[row]]) != path:
            problem = f"lowering {got} emits {tokens[: counts[row]]}, reference {expected}"
        elif set(tokens[counts[row] :]) - {-1}:
            problem = f"padding of the emitted tokens is not -1: {tokens}"
        elif support:
            law = laws.get(id(tree))
            if law is None:
                law = laws[id(tree)] = reference.verdict_law(tree, target, draft)
            if not law.get(Verdict(*expected), 0) > 0:
                problem = f"verdict {expected} has probability 0 under the exact verdict_law"
        if problem:
            where = f"tree {tree.tokens}, noise {_noise_text(noise)}: {problem}"
            bad.setdefault(repr(shape), []).append(where)
    return [
        Violation(shape, label, kind, f"{len(rows)} rows differ; first: {rows[0]}")
        for shape, rows in bad.items()
    ]


def _run_rows(
    ssg: Any, lowering: Any, rounds: list[_Round], device: str
) -> tuple[list[int], list[int], list[list[int]], list[int]]:
    batch = ssg.TreeBatch.from_trees([r[1] for r in rounds], device=device)
    target, draft = ssg.tables_batch([r[2] for r in rounds], [r[3] for r in rounds], device=device)
    noise = ssg.Noise.from_reference([r[4] for r in rounds], device=device)
    out = ssg.verify(lowering, batch, target, draft, noise)
    return out.node.tolist(), out.token.tolist(), out.tokens.tolist(), out.num_emitted.tolist()


def _noise_text(noise: Noise) -> str:
    def lane(values: Any) -> str:
        return "[" + ", ".join(f"{float(v):.17g}" for v in values) + "]"

    return f"accept={lane(noise.accept)} sample={lane(noise.sample)}"


def _companion(shapes: tuple[Shape, ...]) -> list[_Round]:
    """A round of a supported shape (none if there is none) that the refusal checks put first
    in their batch: a tree the lowering must refuse is refused wherever it sits in a batch, not
    only as the first row."""
    if not shapes:
        return []
    pair = _torch_pairs()[0][1]
    tree = shapes[0].draft(pair, np.random.default_rng(0))
    target, draft = tables(pair, tree)
    return [(shapes[0], tree, target, draft, Noise.constant(0.5, tree.num_nodes))]


def _check_torch_refusal(
    ssg: Any,
    lowering: Any,
    reference: TreeVerifier,
    shape: Shape,
    device: str,
    companion: list[_Round],
) -> list[Violation]:
    """A tree of a refused shape that the reference is not exact for must raise
    ``UnsupportedShape`` from the lowering too, alone and after a supported tree."""
    pair = _torch_pairs()[0][1]
    for tree, _ in shape.enumerate(pair):
        if reference.exact_for(tree.law, tree.is_chain):
            continue
        silent = f"the lowering silently verified a tree of law {tree.law.value!r}"
        return _unrefused_by(
            ssg, lowering, device, pair, shape, tree, repr(shape), silent, companion
        )
    return []


def _check_torch_grafted_refusal(
    ssg: Any, lowering: Any, device: str, companion: list[_Round]
) -> list[Violation]:
    """A lowering whose reference is not exact for grafted trees must refuse one."""
    pair = _torch_pairs()[0][1]
    tree = DraftTree.chain([0], law="iid").graft(lookup_guess(()))
    silent = "the lowering silently verified a grafted tree"
    return _unrefused_by(
        ssg, lowering, device, pair, Shape.chain(1), tree, "grafted chain(1)", silent, companion
    )


def _unrefused_by(
    ssg: Any,
    lowering: Any,
    device: str,
    pair: ModelPair,
    shape: Shape,
    tree: DraftTree,
    where: str,
    silent: str,
    companion: Sequence[_Round] = (),
) -> list[Violation]:
    """A ``refusal`` violation (at ``where``, on the first stationary pair ``pair``) unless
    the lowering raises ``UnsupportedShape`` on ``tree``, alone and after the ``companion``
    rows; ``silent``: the detail if it runs."""
    target, draft = tables(pair, tree)
    row: _Round = (shape, tree, target, draft, Noise.constant(0.5, tree.num_nodes))
    batches = [[row], [*companion, row]] if companion else [[row]]
    for rows in batches:
        try:
            _run_rows(ssg, lowering, rows, device)
        except UnsupportedShape:
            continue
        except Exception as err:
            detail = f"the lowering raised {_describe(err)} instead of UnsupportedShape"
        else:
            detail = silent
        if len(rows) > 1:
            detail += " (as the second row of a batch; alone it was refused)"
        return [Violation(where, "stationary: " + STATIONARY[0][0], "refusal", detail)]
    return []


def _run_keyed(
    ssg: Any,
    name: str,
    reference: Scheme,
    lowering: Any,
    shapes: tuple[Shape, ...],
    refused: tuple[str, ...],
    tick: Callable[[str], None],
) -> TorchSchemeReport:
    """Keyed couplings: ``specsampling.gpu.generate`` must emit the reference's keyed stream."""
    supported = tuple(repr(s) for s in shapes)
    generate = getattr(ssg, "generate", None)
    if generate is None:
        for shape in shapes:
            tick(f"{name} not lowered {shape!r}")
        note = "a keyed lowering is registered, but specsampling.gpu.generate does not exist"
        return TorchSchemeReport(name, "not lowered", supported, refused, note=note)
    violations: list[Violation] = []
    streams = 0
    stationary = _torch_pairs()[: len(STATIONARY)]
    random_pair: ModelPair = Random(5, STRUCTURAL_SEEDS[0])
    for index, shape in enumerate(shapes):
        # a seeded random pair and, by turns over the shapes, one stationary edge case
        pairs = [(repr(random_pair), random_pair), stationary[index % len(stationary)]]
        for label, pair in pairs:
            rng = np.random.default_rng(0)  # unused with a key: drafting is keyed too
            try:
                expected = [
                    sampling_generate(reference, pair, shape, TORCH_STREAM_LENGTH, rng, key=k)
                    for k in TORCH_KEYS
                ]
                out = generate(
                    lowering,
                    pair,
                    shape,
                    TORCH_STREAM_LENGTH,
                    key=list(TORCH_KEYS),
                    batch_size=len(TORCH_KEYS),
                )
                got = _streams(out)
            except Exception as err:
                violations.append(Violation(repr(shape), label, "exception", _describe(err)))
                continue
            streams += len(TORCH_KEYS)
            for key, want, row in itertools.zip_longest(TORCH_KEYS, expected, got):
                if row != (None if want is None else want.tokens):
                    detail = f"key {key}: lowering emits {row}, reference {want}"
                    violations.append(Violation(repr(shape), label, "keyed stream", detail))
        tick(f"{name} {shape!r}")
    return TorchSchemeReport(
        name, "keyed", supported, refused, keyed_streams=streams, violations=tuple(violations)
    )


def _streams(result: Any) -> list[tuple[int, ...]]:
    """The token rows of a ``generate`` result: an object with ``tokens [B, L]``, a tensor or a
    sequence of rows."""
    rows = getattr(result, "tokens", result)
    return [
        tuple(int(v) for v in row) for row in (rows.tolist() if hasattr(rows, "tolist") else rows)
    ]
