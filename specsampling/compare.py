"""Compare every registered scheme against the optimum (``specsampling compare``).

Single position: each scheme's exact acceptance :math:`P(Y \\in \\text{drafts})` under its own
draft law, next to the LP optimum for that draft law and the gap. Trees: each scheme's exact
expected emitted tokens :math:`E[\\tau + 1]` for a model pair and a shape.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from .errors import InvalidDistribution, UnsupportedShape
from .exact import acceptance, expected_emitted
from .optimal import lp_acceptance, optimal_acceptance
from .pairs import ModelPair, check_model_pair
from .schemes import SCHEMES, get_scheme
from .shapes import Shape
from .validation import MASS_TOLERANCE, check_pair, check_positive_int

#: Largest vocabulary for which the LP over a scheme's own draft-tuple law is solved.
MAX_LP_VOCAB = 8


@dataclass(frozen=True)
class Row:
    """One scheme at one position; ``None`` where a value does not apply (see ``note``)."""

    scheme: str
    draft_law: str
    acceptance: float | None
    optimum: float | None
    gap: float | None
    note: str = ""


@dataclass(frozen=True)
class Comparison:
    """Single-position comparison for ``num_drafts`` drafts."""

    vocab_size: int
    num_drafts: int
    optimum_iid: float
    optimum_without: float
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class TreeRow:
    """One scheme's exact block efficiency on a tree shape, or why it is not defined there."""

    scheme: str
    expected_emitted: float | None
    note: str = ""


def compare(
    target: Any,
    draft: Any,
    num_drafts: int,
    schemes: Any = None,
    *,
    tolerance: float = MASS_TOLERANCE,
) -> Comparison:
    r"""Every scheme's single-position acceptance against the optimum for its draft law.

    The optimum is :func:`~specsampling.optimal.optimal_acceptance` for i.i.d. and
    without-replacement drafting; for schemes with their own draft law (greedy, hub) it is the
    LP over that law's tuples, solved for vocabularies up to ``MAX_LP_VOCAB``. ``schemes`` is a
    list of names or scheme objects (default: every registered scheme); ``tolerance`` is the
    float mass tolerance of :func:`~specsampling.validation.check_distribution`. A scheme whose
    computation fails at this size (a refusal, an overflow, too deep a recursion) gets a row
    with ``None`` values and the reason in ``note``.

    >>> cmp = compare([1/2, 1/3, 1/6], [1/3, 1/3, 1/3], 2)
    >>> row = next(r for r in cmp.rows if r.scheme == "specinfer")
    >>> round(row.acceptance, 6), row.optimum, round(row.gap, 6)
    (0.888889, 1.0, 0.111111)
    """
    target, draft = check_pair(target, draft, tolerance=tolerance)
    k = check_positive_int(num_drafts, "num_drafts")
    names = _scheme_list(schemes)
    optima = {
        "iid": float(optimal_acceptance(target, draft, k, replacement=True)),
        "without": float(optimal_acceptance(target, draft, k, replacement=False)),
    }
    rows = []
    for name in names:
        scheme = get_scheme(name)
        try:
            shape = scheme.single_shape(k)
        except (ValueError, UnsupportedShape) as err:
            rows.append(Row(scheme.name, "-", None, None, None, str(err)))
            continue
        law = "iid" if shape.is_chain else shape.law
        if not scheme.supports(shape):
            note = f"not defined for num_drafts={k}"
            rows.append(Row(scheme.name, "-", None, None, None, note))
            continue
        try:
            value = float(acceptance(scheme, target, draft, k))
        except (ValueError, ArithmeticError, RecursionError) as err:
            rows.append(Row(scheme.name, law, None, optima.get(law), None, _failure(err, k)))
            continue
        optimum = optima.get(law)
        if optimum is None and target.shape[0] <= MAX_LP_VOCAB:
            optimum = float(lp_acceptance(target, draft, k, shape=shape))
        gap = None if optimum is None else optimum - value
        rows.append(Row(scheme.name, law, value, optimum, gap))
    return Comparison(int(target.shape[0]), k, optima["iid"], optima["without"], tuple(rows))


def compare_tree(pair: ModelPair, shape: Shape, schemes: Any = None) -> tuple[TreeRow, ...]:
    """Exact :math:`E[\\tau + 1]` of every scheme that supports ``shape`` (others say why not).

    >>> from fractions import Fraction as F
    >>> import specsampling as ss
    >>> pair = ss.pairs.Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    >>> {r.scheme: round(r.expected_emitted, 4) for r in compare_tree(pair, ss.Shape.chain(2))
    ...  if r.expected_emitted is not None}["block"]
    2.2222
    """
    check_model_pair(pair)
    if not isinstance(shape, Shape):
        hint = f"; parse text with parse_shape({shape!r})" if isinstance(shape, str) else ""
        raise TypeError(
            f"shape: expected a specsampling.Shape such as Shape.chain(2), "
            f"got {type(shape).__name__}{hint}"
        )
    rows = []
    for name in _scheme_list(schemes):
        scheme = get_scheme(name)
        if not scheme.supports(shape):
            rows.append(TreeRow(scheme.name, None, f"not exact for {shape!r}"))
            continue
        try:
            value = float(expected_emitted(scheme, pair, shape))
        except InvalidDistribution:
            raise  # the pair's rows are bad: every scheme would say so
        except (ValueError, ArithmeticError, RecursionError) as err:
            rows.append(TreeRow(scheme.name, None, _failure(err)))
            continue
        rows.append(TreeRow(scheme.name, value))
    return tuple(rows)


def _scheme_list(schemes: Any) -> list[Any]:
    """The schemes to compare: every registered one, or the given names and objects."""
    if schemes is None:
        return list(SCHEMES)
    if isinstance(schemes, str) or not hasattr(schemes, "__iter__"):
        raise TypeError(
            f"schemes: expected a list of scheme names or objects, got {schemes!r}"
            + (f"; write [{schemes!r}]" if isinstance(schemes, str) else "")
        )
    return list(schemes)


def _failure(err: BaseException, num_drafts: int | None = None) -> str:
    """A row's note for a computation that failed."""
    if isinstance(err, ValueError):
        return str(err)
    where = "" if num_drafts is None else f" at num_drafts={num_drafts}"
    return f"failed{where}: {type(err).__name__}: {err}"


_SHAPE = re.compile(r"^\s*(chain|star|paths|branching|delayed|top|greedy|hub)\s*\((.*)\)\s*$")


def parse_shape(text: str) -> Shape:
    """Parse a shape written as in Python, e.g. ``"paths(2, 3)"``, ``"star(4, replacement=False)"``.

    >>> parse_shape("delayed(2, trunk=1, branch=2)")
    delayed(2, trunk=1, branch=2)
    """
    if not isinstance(text, str):
        raise TypeError(f"shape: expected text such as 'chain(3)', got {type(text).__name__}")
    match = _SHAPE.match(text)
    if match is None:
        raise ValueError(
            f"shape: cannot parse {text!r}; expected e.g. 'chain(3)', 'paths(2, 2)', "
            "'star(4, replacement=False)', 'branching((2, 2))', 'delayed(2, trunk=1, branch=1)', "
            "'top((3, 2))', 'greedy((3,))' or 'hub()'"
        )
    kind, inner = match.groups()
    try:
        call = ast.parse(f"f({inner})", mode="eval").body
        assert isinstance(call, ast.Call)
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}
    except (SyntaxError, ValueError):
        raise ValueError(
            f"shape: the arguments of {text!r} must be numbers, tuples or True/False"
        ) from None
    try:
        shape: Shape = getattr(Shape, kind)(*args, **kwargs)
    except TypeError:
        raise ValueError(
            f"shape: wrong arguments in {text!r}; see help(specsampling.Shape.{kind})"
        ) from None
    return shape
