r"""Monte-Carlo block efficiency with error bars: :func:`estimate` and paired :func:`compare`.

The block efficiency of a scheme on a shape is :math:`E[\tau + 1]`, the expected number of
tokens one round emits. Rounds are drafted from a tree source (:mod:`.sources`: a model pair, a
:class:`~specsampling.simulators.pairs.Synthetic` pair at real vocabulary sizes, or recorded
real-model trees) and each drafted tree :math:`T` contributes one value:

* ``method="plain"``: one verification of :math:`T` with fresh uniforms, on the batched torch
  lowering (:func:`specsampling.gpu.verify`): the emitted count :math:`\tau + 1`;
* ``method="rao-blackwell"``: the exact conditional expectation
  :math:`E[\tau + 1 \mid T] = \sum_v P(\text{verdict node} = v \mid T)\,(\mathrm{depth}(v) + 1)`
  from the reference scheme's node law (``verdict_nodes``, the marginal of its exact
  ``verdict_law``). By the tower rule its mean is the same :math:`E[\tau + 1]`, and by the law of
  total variance its variance is smaller by :math:`E[\mathrm{Var}(\tau + 1 \mid T)]`: it removes
  the verification noise, keeping only the drafting noise (DDTE's estimator: Thomas et al.,
  arXiv 2602.16994). The estimate reports the measured ratio of the two variances on the same
  trees.

Every :class:`Estimate` carries its mean, standard error, number of trees and a 95% normal
confidence interval (the normal approximation: reliable from a few hundred trees, possibly far
too narrow at tens; see :func:`estimate`). :func:`compare` runs several schemes on the
**same** drafted trees (and, for ``plain``, the same uniforms): common random numbers, so each
difference gets its own, much tighter, interval from the per-tree differences.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

import specsampling as ss
from specsampling.errors import UnsupportedShape
from specsampling.gpu import get_lowering
from specsampling.gpu import verify as gpu_verify
from specsampling.gpu.noise import Noise as BatchNoise
from specsampling.schemes.base import KeyedCoupling, TreeVerifier
from specsampling.shapes import Shape, check_shape
from specsampling.validation import check_flag, check_names

from .sources import Drafted, as_generator, draft_batches
from .stats import Comparison, Estimate

METHODS = ("rao-blackwell", "plain")
#: Trees drawn from a model pair when ``num_trees`` is not given.
DEFAULT_TREES = 1024


def resolve(scheme: Any, shape: Shape | None = None) -> TreeVerifier:
    """The reference :class:`~specsampling.schemes.base.TreeVerifier` named by ``scheme``,
    checked for ``shape``; keyed couplings are refused (their rounds run from a key)."""
    obj = ss.SCHEMES.get(scheme) if isinstance(scheme, str) else scheme
    if obj is None:
        raise ValueError(f"scheme: unknown scheme {scheme!r}; known: {sorted(ss.SCHEMES)}")
    if isinstance(obj, KeyedCoupling) or not isinstance(obj, TreeVerifier):
        raise UnsupportedShape(
            f"scheme {getattr(obj, 'name', obj)!r}: the estimators verify drafted trees; a keyed "
            "coupling drafts and verifies from one keyed field (use ss.expected_emitted, or "
            "specsampling.simulators.estimate_emitted, for it)"
        )
    if isinstance(shape, Shape):
        obj.check(shape)
    elif shape is not None and not obj.exact_for(shape.law, False):  # a tree policy
        raise UnsupportedShape(
            f"scheme {obj.name!r} is not exact for the trees of {shape!r} (law "
            f"{shape.law.value!r}, chosen deterministically); it is exact for "
            f"{obj.support_text()} (nss verifies any tree)"
        )
    return obj


def conditional_emitted(scheme: Any, tree: ss.DraftTree, target: Any, draft: Any) -> Any:
    """``E[tau + 1 | tree]``: the exact expected emitted tokens given the drafted tree.

    Parameters
    ----------
    scheme : str or TreeVerifier
    tree : DraftTree
    target, draft : array [num_nodes, V]
        The distributions after every node (float64 or Fractions).

    Examples
    --------
    >>> import numpy as np, specsampling as ss
    >>> pair = ss.pairs.Stationary([1/3, 2/3], [2/3, 1/3])
    >>> shape = ss.Shape.chain(2)
    >>> total = sum(w * conditional_emitted("standard", t, *ss.schemes.tables(pair, t))
    ...             for t, w in shape.enumerate(pair, ()))
    >>> bool(abs(total - 19 / 9) < 1e-12)
    True
    """
    law = node_law(resolve(scheme), tree, target, draft)
    return sum(prob * (tree.depth(node) + 1) for node, prob in law.items())


def node_law(scheme: TreeVerifier, tree: ss.DraftTree, target: Any, draft: Any) -> dict[int, Any]:
    """The law of the verdict's node given ``tree``: the scheme's ``verdict_nodes``, or for a
    verifier without one, the marginal of its ``verdict_law``."""
    laws = getattr(scheme, "verdict_nodes", None)
    if laws is not None:
        law: dict[int, Any] = laws(tree, target, draft)
        return law
    law = {}
    for verdict, prob in scheme.verdict_law(tree, target, draft).items():
        law[verdict.node] = law.get(verdict.node, 0) + prob
    return law


def _lowering(scheme: TreeVerifier) -> Any:
    """The torch lowering of this very scheme object, or ``None`` (a user's verifier, or a
    scheme built with other parameters than the registered one)."""
    try:
        return get_lowering(scheme)
    except (TypeError, KeyError):
        return None


def _values(
    schemes: Sequence[TreeVerifier],
    batch: Drafted,
    method: str,
    generator: torch.Generator,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per scheme and tree ``[S, B]``: the method's values (and plain values for the ratio,
    when every scheme has a lowering)."""
    lowerings = [_lowering(s) for s in schemes]
    plain = None
    if all(low is not None for low in lowerings):
        noise = BatchNoise.draw(batch.trees, generator)
        plain = np.stack(
            [
                gpu_verify(low, batch.trees, batch.target, batch.draft, noise, validate=False)
                .num_emitted.cpu()
                .numpy()
                .astype(np.float64)
                for low in lowerings
            ]
        )
    if method == "plain":
        if plain is None:
            missing = [s.name for s, low in zip(schemes, lowerings, strict=True) if low is None]
            raise ValueError(
                f"method: 'plain' verifies on the torch lowering, and {missing} has none (a "
                "scheme object other than the registered one); use method='rao-blackwell'"
            )
        return plain, None
    trees = batch.trees.to_trees()
    sizes = batch.trees.num_nodes.tolist()
    target = batch.target.cpu().numpy()
    draft = batch.draft.cpu().numpy()
    exact = np.array(
        [
            [
                float(conditional_emitted(s, tree, target[b, :n], draft[b, :n]))
                for b, (tree, n) in enumerate(zip(trees, sizes, strict=True))
            ]
            for s in schemes
        ]
    )
    return exact, plain


class _Progress:
    """``label: i / n trees`` on standard error, at most once a second (``enabled`` only)."""

    def __init__(self, label: str, total: int, enabled: bool | None) -> None:
        self.label, self.total, self.count = label, total, 0
        self.enabled = sys.stderr.isatty() if enabled is None else bool(enabled)
        self.start = self.last = time.monotonic()

    def add(self, count: int) -> None:
        self.count += count
        now = time.monotonic()
        if self.enabled and (now - self.last >= 1 or self.count >= self.total):
            self.last = now
            width = 30
            done = int(width * self.count / self.total)
            bar = "#" * done + "." * (width - done)
            print(
                f"\r{self.label} [{bar}] {self.count}/{self.total} trees, {now - self.start:.0f} s",
                end="\n" if self.count >= self.total else "",
                file=sys.stderr,
                flush=True,
            )


class _Rounds(NamedTuple):
    """A checked request for rounds, the front :func:`estimate`, :func:`compare` and
    :func:`~specsampling.simulators.depth.depth_profile` share: the resolved schemes, the shape
    (or tree policy) the trees are drafted with, and the batches of drafted trees (lazy, with
    the progress bar) with the generator of their verification noise."""

    schemes: list[TreeVerifier]
    shape: Any
    batches: Iterator[Drafted]
    generator: torch.Generator


def _rounds(
    schemes: Sequence[Any],
    source: Any,
    shape: Any,
    num_trees: int | None,
    method: str,
    generator: Any,
    prefix: Sequence[int] | None,
    batch_size: int | None,
    progress: bool | None,
) -> _Rounds:
    """Check the arguments of :func:`estimate` (``schemes`` one or more of its ``scheme``) and
    plan the rounds: the one place they are checked."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    progress = check_flag(progress, "progress", optional=True)
    if num_trees is None:
        num_trees = len(source) if hasattr(source, "batches") else DEFAULT_TREES
    if isinstance(num_trees, bool) or not isinstance(num_trees, (int, np.integer)):
        raise TypeError(f"num_trees: expected an integer >= 2, got {num_trees!r}")
    if num_trees < 2:
        raise ValueError(f"num_trees: expected an integer >= 2, got {num_trees}")
    rng = as_generator(generator)
    if hasattr(source, "batches"):  # recorded trees carry their own shape
        shape = source.check_shape(shape)
        objs = [resolve(s, shape) for s in schemes]
        for obj in objs:
            source.check_scheme(obj)
        batches = source.batches(int(num_trees), batch_size)
    else:
        if shape is None:
            raise TypeError("shape: a model pair needs a Shape to draft (e.g. ss.Shape.chain(4))")
        if not hasattr(shape, "draft_trees"):
            shape = check_shape(shape)
        objs = [resolve(s, shape) for s in schemes]
        batches = draft_batches(
            source, shape, int(num_trees), rng, prefix=prefix, batch_size=batch_size
        )
    torch_generator = torch.Generator().manual_seed(int(rng.integers(2**63)))
    label = ", ".join(o.name for o in objs)
    bar = _Progress(f"{label} on {shape!r}", int(num_trees), progress)
    return _Rounds(objs, shape, _counted(batches, bar), torch_generator)


def _counted(batches: Iterable[Drafted], bar: _Progress) -> Iterator[Drafted]:
    """``batches``, the progress bar advanced after each."""
    for batch in batches:
        yield batch
        bar.add(batch.trees.batch_size)


def _run(planned: _Rounds, method: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Per scheme and tree ``[S, T]``: the method's values, and the plain values (when every
    scheme has a lowering) for the variance ratio."""
    parts, plains = [], []
    for batch in planned.batches:
        got, plain = _values(planned.schemes, batch, method, planned.generator)
        parts.append(got)
        if plain is not None:
            plains.append(plain)
    table = np.concatenate(parts, axis=1) if parts else np.zeros((len(planned.schemes), 0))
    return table, (np.concatenate(plains, axis=1) if plains else None)


def _ratio(plain: np.ndarray, values: np.ndarray) -> float:
    var_plain, var = float(plain.var(ddof=1)), float(values.var(ddof=1))
    if var > 0:
        return var_plain / var
    return math.inf if var_plain > 0 else 1.0


def estimate(
    scheme: Any,
    source: Any,
    shape: Shape | None = None,
    num_trees: int | None = None,
    method: str = "rao-blackwell",
    generator: Any = None,
    *,
    prefix: Sequence[int] | None = None,
    batch_size: int | None = None,
    progress: bool | None = None,
) -> Estimate:
    """Estimate the block efficiency ``E[tau + 1]`` of ``scheme`` from ``num_trees`` rounds.

    Parameters
    ----------
    scheme : str or TreeVerifier
        A registered tree verifier (keyed couplings are refused).
    source : ModelPair or RecordedTrees
        Where the rounds come from (see :mod:`specsampling.simulators.sources`).
    shape : Shape
        How each round drafts; recorded trees carry their own (``None`` or equal).
    num_trees : int, optional
        Drafted trees (rounds), at least 2; default 1024 from a pair, every tree of a recording.
    method : {"rao-blackwell", "plain"}
        Exact conditional expectation per tree, or one sampled verification per tree.
    generator : None, int or numpy.random.Generator
        Randomness of roots, drafting and verification (``None``: fresh entropy).
    prefix : tuple of int, optional
        Draft every tree after this context (default: the pair's own root contexts, else ``()``).
    batch_size : int, optional
        Trees per batch (default: a table of at most 8M values).
    progress : bool, optional
        A progress bar on standard error (default: when it is a terminal).

    Returns
    -------
    Estimate
        Mean, standard error and the 95% interval ``ci``, ``mean +- 1.96 stderr``.

    Notes
    -----
    The interval is the normal approximation, reliable from a few hundred trees. At tens of
    trees, and when every tree gives the same count (standard error 0, a zero-width interval),
    it can be far too narrow: with ``method="plain"`` on 20 trees where most rounds emit the
    same number of tokens, a nominal 95% interval can miss the true value in about two runs of
    five. Use more trees, or the Rao-Blackwellised method (the default), which removes the
    verification noise behind those equal counts.

    Examples
    --------
    >>> import specsampling as ss
    >>> from specsampling import simulators as sim
    >>> pair = ss.pairs.Stationary([1/3, 2/3], [2/3, 1/3])
    >>> est = sim.estimate("standard", pair, ss.Shape.chain(2), 2000, generator=0)
    >>> est.ci[0] < 19 / 9 < est.ci[1], est.variance_ratio > 1
    (True, True)
    """
    out = compare(
        [scheme], source, shape, num_trees, method, generator,
        prefix=prefix, batch_size=batch_size, progress=progress,
    )  # fmt: skip
    (only,) = out.estimates.values()
    return only


def compare(
    schemes: Sequence[Any],
    source: Any,
    shape: Shape | None = None,
    num_trees: int | None = None,
    method: str = "rao-blackwell",
    generator: Any = None,
    *,
    prefix: Sequence[int] | None = None,
    batch_size: int | None = None,
    progress: bool | None = None,
) -> Comparison:
    """Estimate several schemes on the same drafted trees, with paired differences.

    Parameters are those of :func:`estimate`; ``schemes`` lists at least one scheme, each
    exact for ``shape``.

    Examples
    --------
    >>> import specsampling as ss
    >>> from specsampling import simulators as sim
    >>> pair = ss.pairs.Random(vocab_size=4, seed=1)
    >>> out = sim.compare(["traversal", "specinfer"], pair, ss.Shape.paths(2, 2), 400,
    ...                   generator=0, prefix=())
    >>> d = out.differences[("traversal", "specinfer")]
    >>> d.stderr < out["traversal"].stderr  # pairing removes the shared drafting noise
    True
    """
    names = list(check_names(schemes, "schemes"))  # one name is one scheme, never its letters
    labels = [resolve(s).name for s in names]
    if len(set(labels)) != len(labels):
        raise ValueError(f"schemes: each scheme once, got {labels}")
    planned = _rounds(
        names, source, shape, num_trees, method, generator, prefix, batch_size, progress
    )
    values, plain = _run(planned, method)
    estimates = {
        label: Estimate.of(
            values[i], method, None if plain is None else _ratio(plain[i], values[i])
        )
        for i, label in enumerate(labels)
    }
    differences = {
        (a, b): Estimate.of(values[i] - values[j], "difference")
        for i, a in enumerate(labels)
        for j, b in enumerate(labels)
        if i < j
    }
    return Comparison(estimates, differences, method, int(values.shape[1]), planned.shape)


__all__ = [
    "METHODS",
    "Comparison",
    "Estimate",
    "compare",
    "conditional_emitted",
    "estimate",
    "node_law",
]
