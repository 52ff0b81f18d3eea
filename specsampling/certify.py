r"""Certify schemes by exact computation: the engine behind ``specsampling certify``.

For every scheme, every built-in shape it supports and a suite of model pairs, :func:`certify`
computes the lossless error (:func:`~specsampling.exact.lossless_error`: the max deviation of one
round followed by target samples from the target joint) in float64 and, for rational schemes,
exactly with ``Fraction`` pairs, plus the block efficiency :math:`E[\tau + 1]`. A scheme is
**certified** iff

.. math:: \max |\text{error}_{\text{float64}}| \le 10^{-12}
          \quad\text{and}\quad \text{error}_{\text{Fraction}} = 0 \text{ on every exact case},

every shape it refuses raises :class:`~specsampling.UnsupportedShape` (from the exact engine and
from the sampler), no case raises, a tree verifier exact for grafted trees (law ``grafted``:
i.i.d. draws plus a guess from the context, :meth:`~specsampling.DraftTree.graft`) is lossless
on its i.i.d. shapes and chains of depth at most two with :func:`lookup_guess` grafted in, at
two contexts (the same bounds) and every other tree verifier refuses such a tree,
:math:`1 \le E[\tau + 1] \le \text{depth} + 1`, and its single-position closed form (if
any) equals exact enumeration. Keyed couplings (``gumbel``,
``poisson``, ``gls``, ``gls_strong``) must in addition pass their structural checks
(:mod:`specsampling.invariance`): with a fixed key the strong ones emit seeded target-only
decoding for a perfect, the pair's own and an unrelated drafter, with position-keyed and
context-keyed noise; active-set ``gls`` gives identical verdicts for identical draft tokens
under perturbed draft probabilities.

Vocabulary sizes are chosen per shape so that the enumeration stays small
(:data:`TREE_BUDGET`); the whole run takes about half a minute.

:func:`specsampling.certify_torch.certify_torch` (``specsampling certify --backend torch``)
checks the torch lowerings of :mod:`specsampling.gpu` against these certified references.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import UnsupportedShape
from .exact import enumerated_acceptance, expected_emitted, lossless_error, round_law
from .invariance import conditional_violations, strong_violations
from .noise import Noise
from .pairs import ModelPair, Random, Stationary
from .sampling import speculate
from .schemes import (
    SCHEMES,
    KeyedCoupling,
    Scheme,
    TreeVerifier,
    get_scheme,
    tables,
)
from .shapes import Shape
from .tree import DraftTree, DrawLaw, grafted_law

if TYPE_CHECKING:
    from .certify_torch import TorchReport

#: Largest float error a certified scheme may show (exact cases must be exactly 0).
TOLERANCE = 1e-12
#: Upper bound on ``vocab ** draws`` (and ``vocab ** (depth + 1)``) when picking a vocabulary.
TREE_BUDGET = 729
#: Seeds of the :class:`~specsampling.pairs.Random` pairs, float64 and exact.
FLOAT_SEEDS = (0, 1, 2)
EXACT_SEEDS = (0, 1)
#: Numbers of candidates for the single-position closed-form check.
CLOSED_FORM_DRAFTS = (1, 2, 3)
#: Seeds of the vocabulary-5 pairs of the keyed couplings' drafter-invariance checks.
STRUCTURAL_SEEDS = (0, 1)

#: Deepest shape the grafted cases use (the guess is two tokens long), and the contexts they
#: start from (:func:`lookup_guess` guesses ``[1, 2]`` and ``[0, 1]`` there).
GRAFT_DEPTH = 2
GRAFT_PREFIXES = ((), (2,))

#: ``progress(done, total, label)``, called after every unit of work.
Progress = Callable[[int, int, str], None]


def builtin_shapes() -> tuple[Shape, ...]:
    """The shapes every scheme is tried on (a scheme's own single-position law is added).

    >>> len(builtin_shapes())
    19
    """
    return (
        Shape.chain(1),
        Shape.chain(2),
        Shape.chain(3),
        Shape.star(2),
        Shape.star(3),
        Shape.star(4),
        Shape.star(2, replacement=False),
        Shape.star(3, replacement=False),
        Shape.star(4, replacement=False),
        Shape.paths(2, 2),
        Shape.branching((2, 2)),
        Shape.branching((2, 1), replacement=True),
        Shape.delayed(2, trunk=1, branch=1),
        Shape.top((2, 2)),
        Shape.greedy((2,)),
        Shape.greedy((3,)),
        Shape.greedy((2, 2)),
        Shape.hub(1),
        Shape.hub(2),
    )


def _dist(text: str) -> tuple[Fraction, ...]:
    return tuple(Fraction(x) for x in text.split())


_TINY, _HALF = Fraction(1, 10**12), Fraction(1, 2)
#: Stationary edge-case pairs ``(label, target, draft)``, all over a vocabulary of 3.
STATIONARY: tuple[tuple[str, tuple[Fraction, ...], tuple[Fraction, ...]], ...] = (
    ("p=(1/2,1/3,1/6) vs uniform", _dist("1/2 1/3 1/6"), _dist("1/3 1/3 1/3")),
    ("disjoint supports", _dist("1/2 1/2 0"), _dist("0 0 1")),
    ("draft == target", _dist("1/5 3/10 1/2"), _dist("1/5 3/10 1/2")),
    ("one-hot target", _dist("0 1 0"), _dist("1/2 1/4 1/4")),
    ("one-hot draft", _dist("1/3 1/3 1/3"), _dist("1 0 0")),
    ("masses near 1e-12", (1 - 2 * _TINY, _TINY, _TINY), (_TINY, _HALF, _HALF - _TINY)),
)


def lookup_guess(prefix: tuple[int, ...]) -> list[int]:
    """The guess certification grafts into every tree (a stand-in for prompt lookup): the two
    tokens after the context's last one (``0`` before any), modulo 3, the smallest vocabulary
    the cases use (``vocab_for`` gives 3 to 6), so the guess follows some drawn trees and leaves
    others.

    >>> lookup_guess(()), lookup_guess((4, 2))
    ([1, 2], [0, 1])
    """
    last = prefix[-1] if prefix else 0
    return [(last + 1) % 3, (last + 2) % 3]


def vocab_for(shape: Shape, budget: int = TREE_BUDGET) -> int:
    """Largest vocabulary in 2..6 whose tree enumeration (:meth:`Shape.count_trees`) and
    sequence enumeration (``vocab ** (depth + 1)``) both stay within ``budget``.

    >>> vocab_for(Shape.chain(1)), vocab_for(Shape.star(4)), vocab_for(Shape.branching((2, 2)))
    (6, 5, 3)
    """
    fitting = [
        v for v in range(2, 7) if max(shape.count_trees(v), v ** (shape.depth + 1)) <= budget
    ]
    return max(fitting, default=2)


def model_pairs(shape: Shape, exact: bool) -> list[tuple[str, ModelPair]]:
    """The suite for ``shape``: stationary edge cases, then seeded random pairs."""
    convert: Callable[[Fraction], Any] = (lambda x: x) if exact else float
    pairs: list[tuple[str, ModelPair]] = [
        (f"stationary: {label}", Stationary([convert(x) for x in t], [convert(x) for x in d]))
        for label, t, d in STATIONARY
    ]
    vocab = vocab_for(shape)
    for seed in EXACT_SEEDS if exact else FLOAT_SEEDS:
        pair = Random(vocab, seed, exact=exact)
        pairs.append((repr(pair), pair))
    return pairs


@dataclass(frozen=True)
class Violation:
    """One failed check: where, which kind and what was seen."""

    shape: str
    pair: str
    kind: str
    detail: str


@dataclass(frozen=True)
class SchemeReport:
    """Certification of one scheme.

    ``exact_ok`` is ``None`` for schemes that are not rational (no exact cases run);
    ``max_exact_error`` is the largest exact error as a fraction string.
    """

    name: str
    rational: bool
    reference: str
    supported: tuple[str, ...]
    refused: tuple[str, ...]
    cases: int
    exact_cases: int
    max_float_error: float
    max_exact_error: str | None
    exact_ok: bool | None
    emitted_min: float | None
    emitted_max: float | None
    closed_form_checks: int
    violations: tuple[Violation, ...] = field(default=())
    #: Keyed couplings: drafter-invariance runs (strong or conditional), see
    #: :mod:`specsampling.invariance`; 0 for the other schemes.
    structural_checks: int = 0
    #: Tree verifiers exact for law ``grafted``: lossless cases with :func:`lookup_guess`
    #: grafted in (float and exact); 0 for the other schemes.
    grafted_cases: int = 0

    @property
    def certified(self) -> bool:
        """No violation and at least one case checked."""
        return not self.violations and self.cases > 0


@dataclass(frozen=True)
class Report:
    """Certification of a set of schemes; ``certified`` iff every scheme is."""

    schemes: tuple[SchemeReport, ...]
    tolerance: float
    seconds: float
    version: str

    @property
    def certified(self) -> bool:
        return all(s.certified for s in self.schemes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (verdicts included)."""
        schemes = [{**asdict(s), "certified": s.certified} for s in self.schemes]
        return {
            "version": self.version,
            "tolerance": self.tolerance,
            "seconds": self.seconds,
            "certified": self.certified,
            "schemes": schemes,
        }


def exit_code(report: Report | TorchReport) -> int:
    """``0`` when every scheme is certified, ``1`` on any violation (the CLI's exit status)."""
    return 0 if report.certified else 1


def certify(
    schemes: Iterable[str | Scheme] | None = None, *, progress: Progress | None = None
) -> Report:
    """Certify schemes (registered names or scheme objects; default: all of ``SCHEMES``).

    Parameters
    ----------
    schemes : iterable of str or Scheme, optional
        What to certify; objects need not be registered, so a candidate (or a deliberately broken
        variant) can be checked before it is.
    progress : callable, optional
        ``progress(done, total, label)``, called after every case.

    Returns
    -------
    Report
        One :class:`SchemeReport` per scheme, in the order given.

    Examples
    --------
    >>> report = certify(["standard"])
    >>> report.certified, report.schemes[0].max_exact_error
    (True, '0')
    >>> report.schemes[0].supported
    ('chain(1)', 'chain(2)', 'chain(3)', 'star(1, replacement=True)')
    """
    start = time.perf_counter()
    resolved = [get_scheme(s) for s in (SCHEMES.values() if schemes is None else schemes)]
    plans = [_plan(scheme) for scheme in resolved]
    total = sum(plan.size for plan in plans)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    reports = tuple(_run(scheme, plan, tick) for scheme, plan in zip(resolved, plans, strict=True))
    from . import __version__

    return Report(reports, TOLERANCE, time.perf_counter() - start, __version__)


@dataclass(frozen=True)
class _Plan:
    supported: tuple[Shape, ...]
    refused: tuple[Shape, ...]
    cases: tuple[tuple[Shape, str, ModelPair, bool], ...]
    closed: tuple[tuple[int, str, ModelPair], ...]
    structural: tuple[tuple[Shape, str, ModelPair, int | None], ...] = ()
    grafted: tuple[tuple[Shape, str, ModelPair, bool], ...] = ()

    @property
    def size(self) -> int:
        parts = (self.cases, self.refused, self.closed, self.structural, self.grafted)
        return sum(len(part) for part in parts)


def _plan(scheme: Scheme) -> _Plan:
    shapes = list(builtin_shapes())
    for k in CLOSED_FORM_DRAFTS:
        own = scheme.single_shape(k)
        if own not in shapes:
            shapes.append(own)
    supported = tuple(s for s in shapes if scheme.supports(s))
    refused = tuple(s for s in shapes if s not in supported)
    exacts = (False, True) if scheme.rational else (False,)
    cases = tuple(
        (shape, label, pair, exact)
        for shape in supported
        for exact in exacts
        for label, pair in model_pairs(shape, exact)
    )
    closed = tuple(
        (k, label, pair)
        for k in CLOSED_FORM_DRAFTS
        if scheme.supports(scheme.single_shape(k))
        for exact in exacts
        for label, pair in model_pairs(scheme.single_shape(k), exact)
    )
    structural: tuple[tuple[Shape, str, ModelPair, int | None], ...] = ()
    if isinstance(scheme, KeyedCoupling):
        structural = tuple(
            (shape, repr(pair), pair, window)
            for shape in supported
            for pair in (Random(5, seed) for seed in STRUCTURAL_SEEDS)
            for window in (None, 2)
        )
    grafted: tuple[tuple[Shape, str, ModelPair, bool], ...] = ()
    if isinstance(scheme, TreeVerifier) and scheme.exact_for(DrawLaw.GRAFTED, False):
        grafted = tuple(
            (shape, label, pair, exact)
            for shape, label, pair, exact in cases
            if shape.depth <= GRAFT_DEPTH
            and grafted_law(shape.law, shape.is_chain) is DrawLaw.GRAFTED
        )
    return _Plan(supported, refused, cases, closed, structural, grafted)


def _run(scheme: Scheme, plan: _Plan, tick: Callable[[str], None]) -> SchemeReport:
    violations: list[Violation] = []
    float_errors: list[float] = [0.0]
    exact_errors: list[Any] = []
    emitted: list[float] = []
    for shape, label, pair, exact in plan.cases:
        try:
            error = lossless_error(scheme, pair, shape)
            efficiency = expected_emitted(scheme, pair, shape)
        except Exception as err:  # a crash is a finding, not a reason to stop
            violations.append(Violation(repr(shape), label, "exception", _describe(err)))
        else:
            if exact:
                exact_errors.append(error)
                if error != 0:
                    violations.append(Violation(repr(shape), label, "exact error", str(error)))
            else:
                float_errors.append(float(error))
                if not float(error) <= TOLERANCE:
                    detail = f"{float(error):.3g} > {TOLERANCE:g}"
                    violations.append(Violation(repr(shape), label, "float error", detail))
            emitted.append(float(efficiency))
            if not 1 - TOLERANCE <= float(efficiency) <= shape.depth + 1 + TOLERANCE:
                detail = f"E[tau+1] = {float(efficiency)} outside [1, {shape.depth + 1}]"
                violations.append(Violation(repr(shape), label, "block efficiency", detail))
        tick(f"{scheme.name} {shape!r}")
    for shape in plan.refused:
        violations.extend(_check_refusal(scheme, shape))
        tick(f"{scheme.name} refuses {shape!r}")
    checked = 0
    for k, label, pair in plan.closed:
        has_closed_form, violation = _check_closed_form(scheme, k, label, pair)
        checked += has_closed_form and violation is None
        if violation is not None:
            violations.append(violation)
        tick(f"{scheme.name} closed form k={k}")
    structural = 0
    for shape, label, pair, window in plan.structural:
        try:
            assert isinstance(scheme, KeyedCoupling)  # only keyed couplings plan these
            found = _check_invariance(scheme, pair, shape, window)
        except Exception as err:
            violations.append(Violation(repr(shape), label, "exception", _describe(err)))
        else:
            structural += 1
            violations.extend(Violation(repr(shape), label, "invariance", d) for d in found)
        tick(f"{scheme.name} invariance {shape!r}")
    for shape, label, pair, exact in plan.grafted:
        try:  # two contexts, two guesses ([1, 2] and [0, 1])
            errors = [
                lossless_error(scheme, pair, shape, prefix=start, graft=lookup_guess)
                for start in GRAFT_PREFIXES
            ]
            error = max(errors, key=abs)
        except Exception as err:
            violations.append(Violation(f"{shape!r} grafted", label, "exception", _describe(err)))
        else:
            if exact:
                exact_errors.append(error)
            else:
                float_errors.append(float(error))
            if (error != 0) if exact else not float(error) <= TOLERANCE:
                kind = "exact error" if exact else "float error"
                violations.append(Violation(f"{shape!r} grafted", label, kind, str(error)))
        tick(f"{scheme.name} {shape!r} grafted")
    if isinstance(scheme, TreeVerifier) and not scheme.exact_for(DrawLaw.GRAFTED, False):
        violations.extend(_check_grafted_refusal(scheme))
    max_exact = max(exact_errors, key=abs, default=None)
    return SchemeReport(
        name=scheme.name,
        rational=bool(scheme.rational),
        reference=str(getattr(scheme, "reference", "")),
        supported=tuple(repr(s) for s in plan.supported),
        refused=tuple(repr(s) for s in plan.refused),
        cases=len(plan.cases),
        exact_cases=len(exact_errors),
        max_float_error=max(float_errors),
        max_exact_error=None if max_exact is None else str(Fraction(max_exact)),
        exact_ok=all(e == 0 for e in exact_errors) if scheme.rational else None,
        emitted_min=min(emitted, default=None),
        emitted_max=max(emitted, default=None),
        closed_form_checks=checked,
        violations=tuple(violations),
        structural_checks=structural,
        grafted_cases=len(plan.grafted),
    )


def _check_grafted_refusal(scheme: TreeVerifier) -> list[Violation]:
    """``verify`` and ``verdict_law`` must refuse a grafted tree (law ``grafted``)."""
    label, pair = _refusal_pair()
    tree = DraftTree.chain([0], law="iid").graft(lookup_guess(()))
    target, draft = tables(pair, tree)
    noise = Noise.draw(np.random.default_rng(0), tree.num_nodes)
    calls: tuple[tuple[str, Callable[[], object]], ...] = (
        ("verify", lambda: scheme.verify(tree, target, draft, noise)),
        ("verdict_law", lambda: scheme.verdict_law(tree, target, draft)),
    )
    silent = "{name} silently verified a grafted tree it is not exact for"
    return _unrefused(calls, "grafted chain(1)", label, silent)


def _refusal_pair() -> tuple[str, ModelPair]:
    """The first stationary edge case, in float64: what the refusal checks call with."""
    label, target, draft = STATIONARY[0]
    return "stationary: " + label, Stationary([float(x) for x in target], [float(x) for x in draft])


def _unrefused(
    calls: Sequence[tuple[str, Callable[[], object]]], shape: str, label: str, silent: str
) -> list[Violation]:
    """A ``refusal`` violation for each call that does not raise ``UnsupportedShape``
    (``silent``: the detail when it returns, a format string of ``name``)."""
    found = []
    for name, call in calls:
        try:
            call()
        except UnsupportedShape:
            continue
        except Exception as err:
            detail = f"{name} raised {_describe(err)} instead of UnsupportedShape"
        else:
            detail = silent.format(name=name)
        found.append(Violation(shape, label, "refusal", detail))
    return found


def _check_invariance(
    scheme: KeyedCoupling, pair: ModelPair, shape: Shape, window: int | None
) -> list[str]:
    """Strong couplings must emit seeded target-only decoding for every drafter; conditional
    ones (active-set GLS) identical verdicts for identical draft tokens."""
    if scheme.strong_invariance:
        return strong_violations(scheme, pair, shape, window=window)
    problems, compared = conditional_violations(scheme, pair, shape, window=window)
    if compared == 0:
        problems.append("vacuous: no key drafted the same tree under the perturbed drafter")
    return problems


def _check_refusal(scheme: Scheme, shape: Shape) -> list[Violation]:
    """A refused shape must raise ``UnsupportedShape`` from the exact engine and the sampler."""
    label, pair = _refusal_pair()
    calls: Sequence[tuple[str, Callable[[], object]]] = (
        ("round_law", lambda: round_law(scheme, pair, shape)),
        ("speculate", lambda: speculate(scheme, pair, shape, np.random.default_rng(0))),
    )
    if isinstance(scheme, TreeVerifier):
        calls = (*calls, *_direct_calls(scheme, pair, shape))
    silent = "supports() is False but {name} silently accepted the shape"
    return _unrefused(calls, repr(shape), label, silent)


def _direct_calls(
    scheme: TreeVerifier, pair: ModelPair, shape: Shape
) -> tuple[tuple[str, Callable[[], object]], ...]:
    """``verify`` and ``verdict_law`` on a tree of the refused shape that the scheme is not exact
    for (a tree that degenerated to a sampled chain may be verified)."""
    for tree, _ in shape.enumerate(pair):
        if not scheme.exact_for(tree.law, tree.is_chain):
            target, draft = tables(pair, tree)
            noise = Noise.draw(np.random.default_rng(0), tree.num_nodes)
            return (
                ("verify", functools.partial(scheme.verify, tree, target, draft, noise)),
                ("verdict_law", functools.partial(scheme.verdict_law, tree, target, draft)),
            )
    return ()


def _check_closed_form(
    scheme: Scheme, k: int, label: str, pair: ModelPair
) -> tuple[bool, Violation | None]:
    """``(has a closed form, violation)``: a closed form must equal exact enumeration."""
    where = f"single position, k={k}"
    try:
        closed = scheme.closed_acceptance(pair.target(()), pair.draft(()), k)
        if closed is None:
            return False, None
        enumerated = enumerated_acceptance(scheme, pair, scheme.single_shape(k))
    except Exception as err:
        return True, Violation(where, label, "exception", _describe(err))
    if pair.target(()).dtype == object:
        if closed != enumerated:
            detail = f"{closed} != enumeration {enumerated}"
            return True, Violation(where, label, "closed form", detail)
    elif not abs(float(closed) - float(enumerated)) <= TOLERANCE:
        detail = f"{float(closed)!r} != enumeration {float(enumerated)!r}"
        return True, Violation(where, label, "closed form", detail)
    return True, None


def _describe(err: Exception) -> str:
    return f"{type(err).__name__}: {err}"
