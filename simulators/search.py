r"""Choosing the draft tree under a node budget: :func:`search_shape`, :func:`sweep`,
:func:`delayed_grid` and :func:`candidate_shapes`.

Three methods, all returning a :class:`SearchResult` (the best shape or policy with its
estimate, and every candidate evaluated):

* ``"verifier"``: verifier-aware. Every static shape the scheme is exact for with at most
  ``budget`` drafted nodes (:func:`candidate_shapes`: chains, stars, i.i.d. paths and delayed
  trees by default; branching with and without replacement and top trees on request) is scored
  by the scheme's **own**
  Rao-Blackwellised block efficiency (or the predicted tokens/s under a
  :class:`~specsampling.simulators.cost.CostModel`). Successive halving keeps the cost down:
  every candidate gets ``num_trees`` trees, the best third goes on with twice as many, and so on
  for ``rounds`` rounds; each round's candidates see the same root contexts (common random
  numbers), and the winner is estimated again on fresh trees (the selection's own figure is
  biased upwards);
* ``"ddtree"``: DDTree's best-first heap on the draft's probabilities
  (:class:`~specsampling.simulators.policies.HeapTree`), for schemes exact on deterministic trees
  (``nss``);
* ``"opt-tree"``: OPT-Tree's layer-wise greedy
  (:class:`~specsampling.simulators.policies.OptTree`) over its layer width.

The proxies of the last two maximise the *draft's* expected accepted length; the verifier-aware
search maximises what the verifier will actually accept, which is what DDTE's comparison
(Thomas et al., arXiv 2602.16994) says matters.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specsampling.shapes import Shape
from specsampling.validation import check_flag, check_names, check_positive_int

from .estimators import estimate, resolve
from .policies import HeapTree, OptTree
from .sources import as_generator
from .stats import Estimate

METHODS = ("verifier", "ddtree", "opt-tree")
OBJECTIVES = ("block-efficiency", "tokens-per-second")
#: Shape families :func:`candidate_shapes` knows.
FAMILIES = ("chain", "star", "paths", "delayed", "branching", "top")
#: What :func:`search_shape` searches by default (the others are opt-in: many candidates).
DEFAULT_FAMILIES = ("chain", "star", "paths", "delayed")
#: Layers of the ``"opt-tree"`` method's trees when ``max_depth`` is not given.
OPT_TREE_DEPTH = 10


@dataclass(frozen=True)
class SearchResult:
    """The best shape (or tree policy) found, with its estimate and every candidate.

    ``value`` is the objective of the best: its block efficiency, or its predicted tokens/s,
    from ``estimate``, a fresh run on new trees after the selection (the selection's own figure
    for the winner is biased upwards). ``candidates`` lists ``(shape, estimate, value)`` for
    every candidate evaluated, from the last round it took part in: the last round's first (the
    winner at the head), each round best first.
    """

    shape: Any
    estimate: Estimate
    objective: str
    value: float
    candidates: tuple[tuple[Any, Estimate, float], ...]

    def table(self, limit: int = 10) -> str:
        """The best ``limit`` candidates, one per line."""
        speed = self.objective == "tokens-per-second"
        head = f"{'shape':<32} {'E[tau+1]':>9} {'+-95%':>7} {'trees':>6}"
        lines = [head + (f" {'tokens/s':>10}" if speed else "")]
        for shape, est, value in self.candidates[:limit]:
            line = f"{shape!r:<32} {est.mean:>9.4f} {1.96 * est.stderr:>7.4f} {est.num_trees:>6}"
            lines.append(line + (f" {value:>10.4g}" if speed else ""))
        return "\n".join(lines)


def _widths(budget: int, max_depth: int) -> Iterable[tuple[int, ...]]:
    """Width tuples whose trees have at most ``budget`` drafted nodes."""

    def grow(prefix: tuple[int, ...], nodes: int, layer: int) -> Iterable[tuple[int, ...]]:
        if prefix:
            yield prefix
        if len(prefix) == max_depth:
            return
        for width in range(1, budget + 1):
            added = layer * width
            if nodes + added > budget:
                break
            yield from grow((*prefix, width), nodes + added, layer * width)

    return grow((), 0, 1)


def candidate_shapes(
    scheme: Any,
    budget: int,
    families: Sequence[str] | None = None,
    max_depth: int | None = None,
) -> list[Shape]:
    """Every shape of ``families`` the scheme is exact for, with 1..``budget`` drafted nodes.

    Examples
    --------
    >>> [repr(s) for s in candidate_shapes("traversal", 3, families=("chain", "paths"))]
    ['chain(1)', 'chain(2)', 'chain(3)']
    >>> for shape in candidate_shapes("traversal", 4, families=("paths", "delayed")):
    ...     print(shape)
    paths(2, 2)
    delayed(2, trunk=1, branch=1)
    delayed(2, trunk=2, branch=1)
    delayed(3, trunk=1, branch=1)
    """
    obj = resolve(scheme)
    budget = check_positive_int(budget, "budget")
    depth = budget if max_depth is None else check_positive_int(max_depth, "max_depth")
    names = FAMILIES if families is None else check_names(families, "families")
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        raise ValueError(f"families: unknown {unknown}; expected some of {FAMILIES}")
    shapes: list[Shape] = []
    if "chain" in names:
        shapes += [Shape.chain(n) for n in range(1, min(budget, depth) + 1)]
    if "star" in names:
        for k in range(2, budget + 1):
            shapes += [Shape.star(k), Shape.star(k, replacement=False)]
    if "paths" in names:
        shapes += [
            Shape.paths(k, n)
            for k in range(2, budget + 1)
            for n in range(2, min(depth, budget // k) + 1)
        ]
    if "delayed" in names:
        shapes += [
            Shape.delayed(k, trunk=t, branch=b)
            for k in range(2, budget + 1)
            for t in range(1, depth)
            for b in range(1, depth - t + 1)
            if t + k * b <= budget
        ]
    if "branching" in names:
        for widths in _widths(budget, depth):
            if len(widths) > 1 and max(widths) > 1:  # a star or a chain otherwise
                shapes += [Shape.branching(widths), Shape.branching(widths, replacement=True)]
    if "top" in names:
        shapes += [Shape.top(widths) for widths in _widths(budget, depth)]
    unique = list(dict.fromkeys(shapes))
    return [s for s in unique if obj.supports(s)]


def delayed_grid(
    num_drafts: Iterable[int] = range(1, 5),
    trunk: Iterable[int] = range(0, 9),
    branch: Iterable[int] = range(0, 9),
) -> list[Shape]:
    """DDTE's (K, L1, L2) grid of delayed trees as shapes, duplicates merged.

    ``K = 1`` or ``L2 = 0`` is the chain of ``L1 + L2`` tokens, ``L1 = 0`` is ``paths(K, L2)``,
    the empty tree is left out.

    >>> delayed_grid((1, 2), (0, 1), (1,))
    [chain(1), chain(2), paths(2, 1), delayed(2, trunk=1, branch=1)]
    """
    out: list[Shape] = []
    for k, t, b in itertools.product(num_drafts, trunk, branch):
        if k == 1 or b == 0:
            if t + b * (k == 1) > 0:
                out.append(Shape.chain(t + b * (k == 1)))
        elif t == 0:
            out.append(Shape.paths(k, b))
        else:
            out.append(Shape.delayed(k, trunk=t, branch=b))
    if not out:
        raise ValueError(
            "delayed_grid: no shape in the grid (every combination drafts nothing: some trunk "
            "or branch length must be >= 1, with num_drafts >= 1)"
        )
    return list(dict.fromkeys(out))


def sweep(
    scheme: Any,
    source: Any,
    shapes: Iterable[Any],
    num_trees: int = 256,
    generator: Any = None,
    *,
    method: str = "rao-blackwell",
    seed_per_shape: bool = True,
    progress: bool | None = None,
) -> list[tuple[Any, Estimate]]:
    """Estimate ``scheme`` on every shape of ``shapes`` (each on the same root contexts).

    Parameters
    ----------
    scheme : str or TreeVerifier
    source : ModelPair or RecordedTrees
    shapes : iterable of Shape or tree policy
        At least one; a list, a tuple or any iterable (``delayed_grid``'s list, say).
    num_trees : int, default 256
        Drafted trees per shape, at least 2.
    generator : None, int or numpy.random.Generator
    method : {"rao-blackwell", "plain"}
    seed_per_shape : bool, default True
        Every shape drafts after the same root contexts (one seed for all); ``False``: the
        shapes draw their roots one after the other from ``generator``.
    progress : bool, optional

    Returns
    -------
    list of (shape, Estimate)
        In the order of ``shapes``.

    Raises
    ------
    TypeError
        If ``shapes`` is not an iterable of shapes (``None``, a single shape, a string).
    ValueError
        If ``shapes`` is empty or ``seed_per_shape`` not a bool; the other arguments are
        checked as :func:`~specsampling.simulators.estimate` checks them.
    """
    todo = _shape_list(shapes)
    if not todo:
        raise ValueError("shapes: expected at least one shape, got none")
    seed_per_shape = bool(check_flag(seed_per_shape, "seed_per_shape"))
    rng = as_generator(generator)
    seed = int(rng.integers(2**63))
    out = []
    for shape in todo:
        gen = seed if seed_per_shape else rng
        out.append(
            (shape, estimate(scheme, source, shape, num_trees, method, gen, progress=progress))
        )
    return out


def _shape_list(shapes: Any) -> list[Any]:
    """``shapes`` as a list, or a ``TypeError`` naming the argument."""
    expected = "shapes: expected a sequence of shapes or tree policies, got"
    if isinstance(shapes, Shape) or hasattr(shapes, "draft_trees"):
        raise TypeError(f"{expected} one ({shapes!r}); pass [{shapes!r}]")
    if shapes is None or isinstance(shapes, (str, bytes)):
        raise TypeError(f"{expected} {shapes!r}")
    try:
        return list(shapes)
    except TypeError:
        raise TypeError(f"{expected} {type(shapes).__name__}") from None


def search_shape(
    scheme: Any,
    source: Any,
    budget: int = 16,
    method: str = "verifier",
    *,
    objective: str = "block-efficiency",
    cost: Any = None,
    batch_size: int = 1,
    num_trees: int = 256,
    rounds: int = 3,
    families: Sequence[str] | None = None,
    max_depth: int | None = None,
    generator: Any = None,
    progress: bool | None = None,
) -> SearchResult:
    """The best draft tree for ``scheme`` with at most ``budget`` drafted nodes.

    Parameters
    ----------
    scheme : str or TreeVerifier
    source : ModelPair
        A :class:`~specsampling.simulators.pairs.Synthetic` pair or any model pair.
    budget : int, default 16
        Drafted nodes per round at most (the root excluded).
    method : {"verifier", "ddtree", "opt-tree"}
        See the module doc.
    objective : {"block-efficiency", "tokens-per-second"}
        What to maximise; tokens/s needs ``cost`` (static shapes only).
    cost : CostModel, optional
        Forward costs for the tokens/s objective (``CostModel.measure`` on your models, or
        ``CostModel.relative(...)``).
    batch_size : int, default 1
        Rows decoded together, for the cost model.
    num_trees : int, default 256
        Trees per candidate in the first round (doubling each round).
    rounds : int, default 3
        Successive-halving rounds (``1``: every candidate once).
    families : sequence of str, optional
        Shape families to search (default :data:`DEFAULT_FAMILIES`: chains, stars, i.i.d.
        paths and delayed trees; add ``"branching"`` and ``"top"`` for those, whose count grows
        fast: hundreds of width tuples at budget 16).
    max_depth : int, optional
        Deepest shape considered, at least 1 (default: ``budget``; for ``"opt-tree"``, its
        :data:`OPT_TREE_DEPTH` layers).
    generator : None, int or numpy.random.Generator
    progress : bool, optional
        One line per candidate on standard error (default: when it is a terminal).

    Examples
    --------
    >>> import specsampling as ss
    >>> from specsampling import simulators as sim
    >>> pair = sim.pairs.Synthetic(vocab_size=1000, seed=0)
    >>> best = sim.search_shape("traversal", pair, budget=4, families=("chain", "paths"),
    ...                         num_trees=64, rounds=2, generator=0)
    >>> best.shape, best.estimate.mean > 2
    (chain(4), True)
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: expected one of {OBJECTIVES}, got {objective!r}")
    if objective == "tokens-per-second" and cost is None:
        raise ValueError("cost: the tokens-per-second objective needs a CostModel")
    if objective != "tokens-per-second" and cost is not None:
        raise ValueError(
            f"cost: only the tokens-per-second objective uses a cost model; pass "
            f"objective='tokens-per-second' or drop cost (objective is {objective!r})"
        )
    if cost is not None and not hasattr(cost, "tokens_per_second"):
        raise TypeError(
            f"cost: expected a specsampling.simulators.CostModel, got {type(cost).__name__}"
        )
    batch_size = check_positive_int(batch_size, "batch_size")
    progress = check_flag(progress, "progress", optional=True)
    budget = check_positive_int(budget, "budget")
    rounds = check_positive_int(rounds, "rounds")
    check_positive_int(num_trees, "num_trees", minimum=2)
    if hasattr(source, "batches"):
        raise ValueError(
            f"source: recorded trees hold one drafted shape ({source.shape!r}); search_shape "
            "drafts new shapes and needs a model pair (estimate or compare replay recorded trees)"
        )
    if method == "verifier":
        wanted = DEFAULT_FAMILIES if families is None else families
        candidates: list[Any] = candidate_shapes(scheme, budget, wanted, max_depth)
        if not candidates:
            raise ValueError(
                f"scheme {resolve(scheme).name!r}: no shape of {families} fits budget {budget}"
            )
    else:
        if objective == "tokens-per-second":
            raise ValueError(
                f"objective: {method!r} builds dynamic trees; the cost model prices shapes"
            )
        if method == "ddtree":
            candidates = [HeapTree(budget, max_depth)]
        else:
            widths = sorted({1, 2, 3, 4, 6, 8, budget} & set(range(1, budget + 1)))
            depth = OPT_TREE_DEPTH if max_depth is None else max_depth
            candidates = [OptTree(budget, width=w, max_depth=depth) for w in widths]
        resolve(scheme, candidates[0])  # refuse a scheme not exact for deterministic trees
    rng = as_generator(generator)

    def value(shape: Any, est: Estimate) -> float:
        if objective == "block-efficiency":
            return est.mean
        return float(cost.tokens_per_second(max(1.0, est.mean), shape, batch_size))

    trees = int(num_trees)
    evaluated: list[tuple[Any, Estimate, float]] = []  # later rounds first, then by value
    for round_index in range(rounds):
        seed = int(rng.integers(2**63))
        scored = []
        for shape in candidates:
            est = estimate(scheme, source, shape, trees, generator=seed, progress=progress)
            scored.append((shape, est, value(shape, est)))
        scored.sort(key=lambda item: -item[2])
        evaluated = scored + [e for e in evaluated if e[0] not in candidates]
        if round_index + 1 == rounds or len(scored) == 1:
            break
        candidates = [s for s, _, _ in scored[: max(1, math.ceil(len(scored) / 3))]]
        trees *= 2
    # The winner's figures from the selection are biased upwards (the maximum of noisy
    # estimates): it is estimated again on fresh trees, and that is what is reported.
    best_shape = scored[0][0]
    if len(scored) > 1:
        fresh = int(rng.integers(2**63))
        best_est = estimate(scheme, source, best_shape, trees, generator=fresh, progress=progress)
    else:
        best_est = scored[0][1]
    best_value = value(best_shape, best_est)
    return SearchResult(best_shape, best_est, objective, best_value, tuple(evaluated))


__all__ = [
    "DEFAULT_FAMILIES",
    "FAMILIES",
    "METHODS",
    "OBJECTIVES",
    "OPT_TREE_DEPTH",
    "SearchResult",
    "candidate_shapes",
    "delayed_grid",
    "search_shape",
    "sweep",
]
