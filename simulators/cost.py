r"""A speed cost model: block efficiency into predicted tokens per second.

A speculative round of a :class:`~specsampling.Shape` on ``B`` rows, as
:class:`specsampling.gpu.hf.SpeculativeDecoder` runs it, is

1. **draft**: one draft forward per depth level, ``D = shape.depth`` of them. Level 1 feeds each
   row's pending token (:math:`n_1 = 1`); level :math:`d \ge 2` feeds the frontier of depth
   ``d - 1`` nodes, :math:`n_d` = the number of draw steps at depth ``d - 1``
   (:func:`level_tokens`);
2. **score**: one target forward over the root and every drafted node,
   :math:`N = 1 + |\text{steps}|` tokens;
3. **verify**: the verifier's own time, :math:`v` per node and row.

A forward over ``n`` tokens per row costs ``fixed + per_token * B * n`` seconds, so

.. math::

    T_\text{round} = \sum_{d=1}^{D} \bigl(c_\text{draft} + k_\text{draft} B n_d\bigr)
        + c_\text{target} + k_\text{target} B N + v B N,
    \qquad
    \text{tokens/s} = \frac{B \, E[\tau + 1]}{T_\text{round}}.

Plain decoding is the same round on the root alone (no draft levels, :math:`N = 1`): ``B``
tokens per :math:`c_\text{target} + (k_\text{target} + v) B` seconds; the speedup is the ratio.
With ``per_token = 0`` and a chain of ``k`` tokens this is the classic
:math:`E[\tau + 1] / (c k + 1)` of Leviathan et al. (2023), ``c`` the draft's cost relative to
the target's.

Simplifications: the cost of a forward does not grow with the cache (attention over a longer
context is ignored); the draft's catch-up of the tokens accepted last round is folded into the
first level (it feeds them with the pending token); the node count is the shape's worst case
(duplicate i.i.d. draws merge into fewer nodes, but the decoder pads to it); draft, target and
verifier never overlap; rows that stop early are not modelled. :meth:`CostModel.measure` fits
the four forward costs on the user's own models.
"""

from __future__ import annotations

import math
import numbers
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from specsampling.shapes import Shape, check_shape
from specsampling.validation import check_positive_int


def level_tokens(shape: Shape) -> tuple[int, ...]:
    """Tokens per row fed to each of the draft forwards of one round of ``shape``.

    Entry ``d - 1`` is level ``d``: ``1`` (the pending token) for the first, the number of
    draw steps at depth ``d - 1`` for the others; one entry per depth level.

    Examples
    --------
    >>> from specsampling import Shape
    >>> level_tokens(Shape.chain(3)), level_tokens(Shape.paths(2, 3))
    ((1, 1, 1), (1, 2, 2))
    >>> level_tokens(Shape.branching((2, 3, 1)))
    (1, 2, 6)
    """
    shape = check_shape(shape)
    depths: list[int] = []
    for parent, _ in shape.steps:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return (1, *(depths.count(depth) for depth in range(1, max(depths))))


@dataclass(frozen=True)
class CostModel:
    """Seconds per forward: ``fixed + per_token * (batch_size * tokens in the forward)``.

    Attributes
    ----------
    target_fixed, target_per_token : float
        The target's cost of a forward and of each row-token in it (seconds).
    draft_fixed, draft_per_token : float
        The same for the draft (``0`` for drafters that cost nothing, e.g. n-grams).
        All costs are finite and ``>= 0``; the target's are not both ``0``.
    verify_per_node : float
        The verifier's own time per tree node and row (also plain decoding's sampling).

    Examples
    --------
    >>> from specsampling import Shape
    >>> costs = CostModel(0.020, 0.0005, 0.002, 0.0001)
    >>> print(costs)
    CostModel(target 20 ms + 0.5 ms/token, draft 2 ms + 0.1 ms/token, verify 0 ms/node)
    >>> round(costs.round_seconds(Shape.chain(4)) * 1000, 3)  # 4 x 2.1 ms + 22.5 ms
    30.9
    >>> round(costs.speedup(3.2, Shape.chain(4)), 3)  # 3.2 tokens per 30.9 ms, 1 per 20.5 ms
    2.123
    """

    target_fixed: float
    target_per_token: float
    draft_fixed: float
    draft_per_token: float
    verify_per_node: float = 0.0

    def __post_init__(self) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, _check_cost(getattr(self, field.name), field.name))
        if self.target_fixed + self.target_per_token == 0:
            raise ValueError(
                "target_fixed, target_per_token: a target forward must cost something (both are 0)"
            )

    def __str__(self) -> str:
        ms = {field.name: f"{getattr(self, field.name) * 1e3:.4g}" for field in fields(self)}
        return (
            f"CostModel(target {ms['target_fixed']} ms + {ms['target_per_token']} ms/token, "
            f"draft {ms['draft_fixed']} ms + {ms['draft_per_token']} ms/token, "
            f"verify {ms['verify_per_node']} ms/node)"
        )

    __repr__ = __str__

    # ------------------------------------------------------------------ the round
    def round_seconds(self, shape: Shape, batch_size: int = 1) -> float:
        """Predicted seconds of one speculative round of ``shape`` on ``batch_size`` rows.

        Examples
        --------
        >>> from specsampling import Shape
        >>> costs = CostModel.relative(draft_ratio=0.1)
        >>> round(costs.round_seconds(Shape.paths(2, 3)), 9)  # 3 draft levels, 1 target
        1.3
        """
        shape = check_shape(shape)
        rows = check_positive_int(batch_size, "batch_size")
        draft = sum(self.draft_fixed + self.draft_per_token * rows * n for n in level_tokens(shape))
        nodes = rows * (1 + len(shape.steps))
        target = self.target_fixed + self.target_per_token * nodes
        return draft + target + self.verify_per_node * nodes

    def tokens_per_second(
        self, block_efficiency: float, shape: Shape, batch_size: int = 1
    ) -> float:
        """Predicted tokens per second: ``batch_size * block_efficiency / round_seconds``.

        Parameters
        ----------
        block_efficiency : float
            ``E[tau + 1]``, the expected tokens per round and row, in ``[1, shape.depth + 1]``
            (e.g. ``float(estimate.mean)`` of :func:`specsampling.simulators.estimate`).
        shape : Shape
            The round's drafting plan.
        batch_size : int
            Rows decoded together.

        Examples
        --------
        >>> from specsampling import Shape
        >>> costs = CostModel(0.010, 0.0, 0.001, 0.0)
        >>> round(costs.tokens_per_second(2.5, Shape.chain(2), batch_size=4), 6)  # 10 / 12 ms
        833.333333
        """
        shape = check_shape(shape)
        efficiency = _check_block_efficiency(block_efficiency, shape)
        rows = check_positive_int(batch_size, "batch_size")
        return rows * efficiency / self.round_seconds(shape, rows)

    def plain_tokens_per_second(self, batch_size: int = 1) -> float:
        """Tokens per second of plain decoding: the target alone, one token per forward.

        >>> round(CostModel(0.010, 0.001, 0.0, 0.0).plain_tokens_per_second(batch_size=10), 6)
        500.0
        """
        rows = check_positive_int(batch_size, "batch_size")
        seconds = self.target_fixed + (self.target_per_token + self.verify_per_node) * rows
        return rows / seconds

    def speedup(self, block_efficiency: float, shape: Shape, batch_size: int = 1) -> float:
        """:meth:`tokens_per_second` over :meth:`plain_tokens_per_second`.

        >>> from specsampling import Shape
        >>> round(CostModel.relative(0.05).speedup(3.0, Shape.chain(4)), 6)  # 3 / 1.2
        2.5
        """
        fast = self.tokens_per_second(block_efficiency, shape, batch_size)
        return fast / self.plain_tokens_per_second(batch_size)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def relative(cls, draft_ratio: float = 0.1, per_token: float = 0.0) -> CostModel:
        """Costs in units of one target forward's fixed cost, for what-if questions.

        Parameters
        ----------
        draft_ratio : float
            A draft forward's cost relative to the target's (both terms).
        per_token : float
            The target's cost of each row-token of a forward relative to its fixed cost
            (``0``: forwards cost the same whatever their width, the small-batch regime).

        Returns
        -------
        CostModel
            ``target_fixed = 1``, ``target_per_token = per_token``, the draft's costs scaled by
            ``draft_ratio``, no verifier time; its "seconds" are target forwards.

        Examples
        --------
        >>> CostModel.relative(0.25, per_token=0.01).as_dict()
        {'target_fixed': 1.0, 'target_per_token': 0.01, 'draft_fixed': 0.25, 'draft_per_token': 0.0025, 'verify_per_node': 0.0}
        """  # noqa: E501
        ratio = _check_cost(draft_ratio, "draft_ratio")
        slope = _check_cost(per_token, "per_token")
        return cls(1.0, slope, ratio, ratio * slope)

    def as_dict(self) -> dict[str, float]:
        """The five costs in seconds, by field name (for JSON)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        """The model :meth:`as_dict` wrote; ``verify_per_node`` may be absent.

        >>> costs = CostModel(0.02, 0.001, 0.002, 0.0001, 1e-5)
        >>> CostModel.from_dict(costs.as_dict()) == costs
        True
        >>> CostModel.from_dict({"target_fixed": 1.0})
        Traceback (most recent call last):
        ...
        ValueError: data: missing cost(s) ['draft_fixed', 'draft_per_token', 'target_per_token']
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"data: expected a mapping of costs, got {type(data).__name__}")
        names = {field.name for field in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"data: unknown cost(s) {unknown}; expected {sorted(names)}")
        missing = sorted(names - set(data) - {"verify_per_node"})
        if missing:
            raise ValueError(f"data: missing cost(s) {missing}")
        return cls(**data)

    @classmethod
    def measure(
        cls,
        target: Any,
        draft: Any = None,
        *,
        context: int = 128,
        tokens: Sequence[int] = (1, 2, 4, 8, 16),
        batch_size: int = 1,
        repeats: int = 3,
        progress: bool = False,
    ) -> CostModel:
        """Fit the forward costs of Hugging Face causal LMs by timing them on this machine.

        Each model is prefilled once with ``context`` random token ids (``torch.Generator``
        seeded 0) into a ``DynamicCache``; then for each ``n`` in ``tokens`` it runs a forward
        of ``[batch_size, n]`` new tokens after the cache (a causal 4D mask and
        ``position_ids``, as the decoder feeds them), one warm-up and ``repeats`` timed runs,
        the cache cropped back to ``context`` after each. The medians are fitted by least
        squares, ``time = fixed + per_token * batch_size * n``, both kept non-negative.

        Parameters
        ----------
        target, draft : causal LM
            The models (``draft=None``: the draft costs nothing). Each runs on its own device,
            under ``torch.no_grad()``; CUDA is synchronised around every timed forward.
        context : int
            Cached tokens before each timed forward.
        tokens : sequence of int
            New tokens per row of the timed forwards (at least two distinct values to fit a
            per-token cost; with one, ``per_token`` is 0).
        batch_size : int
            Rows ``B``.
        repeats : int
            Timed forwards per width (their median is kept).
        progress : bool
            Print each median on stderr.

        Returns
        -------
        CostModel
            Seconds; ``verify_per_node = 0`` (add the verifier with ``dataclasses.replace``).

        Examples
        --------
        >>> from proofs_tests.hf_models import tiny_causal_lm
        >>> target = tiny_causal_lm("llama", 0, layers=2)
        >>> costs = CostModel.measure(target, None, context=8, tokens=(1, 4), repeats=1)
        >>> costs.target_fixed + costs.target_per_token > 0, costs.draft_fixed
        (True, 0.0)
        """
        context = check_positive_int(context, "context")
        rows = check_positive_int(batch_size, "batch_size")
        repeats = check_positive_int(repeats, "repeats")
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence) or not tokens:
            raise ValueError(f"tokens: expected a non-empty sequence of integers, got {tokens!r}")
        widths = [check_positive_int(n, f"tokens[{i}]") for i, n in enumerate(tokens)]
        timed = {}
        for name, model in (("target", target), ("draft", draft)):
            if model is None:
                timed[name] = (0.0, 0.0)
                continue
            medians = _time_forwards(model, name, context, widths, rows, repeats, progress)
            timed[name] = _fit([rows * n for n in widths], medians)
        return cls(*timed["target"], *timed["draft"])


# ----------------------------------------------------------------------------- helpers
def _check_cost(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a real number of seconds, got {value!r}")
    cost = float(value)
    if not math.isfinite(cost) or cost < 0:
        raise ValueError(f"{name}: expected a finite cost >= 0, got {value!r}")
    return cost


def _check_block_efficiency(value: Any, shape: Shape) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"block_efficiency: expected a real number, got {value!r}")
    efficiency = float(value)
    most = shape.depth + 1
    if not 1 <= efficiency <= most * (1 + 1e-12):
        raise ValueError(
            f"block_efficiency: expected E[tau + 1] in [1, {most}] (a round of {shape!r} "
            f"emits 1 to {most} tokens), got {value!r}"
        )
    return efficiency


def _fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(fixed, per_token)`` of ``y = fixed + per_token * x`` with both ``>= 0``.

    The two-parameter non-negative optimum: the unconstrained fit when it is feasible, else
    the better of the two boundary fits (through the origin, or flat).

    >>> _fit([1, 2, 4], [3.0, 4.0, 6.0])
    (2.0, 1.0)
    >>> _fit([1, 2], [2.0, 1.0])  # a falling line: flat at the mean
    (1.5, 0.0)
    """
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    candidates = []
    if spread > 0:
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
        candidates.append((mean_y - slope * mean_x, slope))
        candidates.append(
            (0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs))
        )
    candidates.append((mean_y, 0.0))
    feasible = [(a, b) for a, b in candidates if a >= 0 and b >= 0] or [(0.0, 0.0)]

    def residual(line: tuple[float, float]) -> float:
        return sum((line[0] + line[1] * x - y) ** 2 for x, y in zip(xs, ys, strict=True))

    return min(feasible, key=residual)


def _time_forwards(
    model: Any,
    name: str,
    context: int,
    widths: Sequence[int],
    rows: int,
    repeats: int,
    progress: bool,
) -> list[float]:
    """Median seconds of a ``[rows, n]`` cached forward of ``model`` for each ``n``."""
    import torch
    from transformers.cache_utils import DynamicCache

    from specsampling.gpu.hf.attention import check_causal_lm, forward_kwarg

    check_causal_lm(model, name)  # eager or sdpa attention: the 4D masks the decoder feeds
    kwarg = forward_kwarg(model)
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype
    vocab = _input_vocab(model)
    generator = torch.Generator().manual_seed(0)

    def forward(ids: torch.Tensor, cache: Any, start: int) -> None:
        n = ids.shape[1]
        allowed = torch.ones((n, start + n), dtype=torch.bool).tril(start)  # [n, start + n]
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
        positions = torch.arange(start, start + n).expand(rows, n)  # [B, n]
        model(
            input_ids=ids.to(device),
            attention_mask=mask.expand(rows, 1, n, start + n).to(device),  # [B, 1, n, start + n]
            position_ids=positions.to(device),
            use_cache=True,
            **{kwarg: cache},
        )

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    medians = []
    with torch.no_grad():
        cache = DynamicCache()
        forward(torch.randint(vocab, (rows, context), generator=generator), cache, 0)
        for n in widths:
            ids = torch.randint(vocab, (rows, n), generator=generator)  # [B, n]
            times = []
            for attempt in range(repeats + 1):  # the first is the warm-up
                sync()
                started = time.perf_counter()
                forward(ids, cache, context)
                sync()
                elapsed = time.perf_counter() - started
                extra = cache.get_seq_length() - context
                if extra > 0:  # a negative crop removes tokens in every transformers version
                    cache.crop(-extra)
                if attempt > 0:
                    times.append(elapsed)
            medians.append(statistics.median(times))
            if progress:
                print(
                    f"measure: {name} [{rows}, {n}] after {context}: {medians[-1] * 1e3:.3f} ms",
                    file=sys.stderr,
                )
    return medians


def _input_vocab(model: Any) -> int:
    """Token ids below this are valid inputs of ``model``."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "num_embeddings"):
        return int(embeddings.num_embeddings)
    return int(model.config.get_text_config(decoder=True).vocab_size)


__all__ = ["CostModel", "level_tokens"]
