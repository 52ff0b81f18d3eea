r"""Adaptive draft lengths: how long the next round's chain is.

A :class:`DraftLength` policy picks each round's chain length **before the round draws**, from
what earlier rounds did (how many drafted tokens were accepted, how long the forwards took);
:class:`~specsampling.gpu.hf.SpeculativeDecoder` drafts ``Shape.chain(length)`` that round.

* :class:`HeuristicLength` -- transformers' ``num_assistant_tokens_schedule="heuristic"``
  (``transformers/generation/candidate_generator.py``, ``update_candidate_strategy``): start at
  ``initial`` tokens, ``+2`` after a round whose drafted tokens were all accepted, ``-1``
  (never below 1) otherwise;
* :class:`CostModelLength` -- the length that maximises predicted tokens per second, from a
  :class:`specsampling.simulators.CostModel` of the draft and target forwards (fitted online
  from the round timings, or given) and the running acceptance rate.

Why the law is kept. Given everything emitted so far, the length a policy picks is fixed
before the round's drafting noise and the verifier's uniforms are drawn: it is a function of
the past (earlier tokens, earlier rounds' outcomes and timings), never of this round's noise.
Every chain scheme is exact for each fixed length, so it is exact conditionally on the past,
hence exact. (The same holds for early stopping inside a round,
:class:`~specsampling.gpu.hf.model_draft.ModelDraft` ``confidence=``, by a finer argument: see
its docstring.)

In a batch every row drafts the same length (the policy sees all rows: ``+2`` only when every
row accepted all its drafts); lengths are capped at ``max_length`` and at the tokens the rows
can still emit.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from specsampling.validation import check_positive_int


class DraftLength(ABC):
    """A policy for the next round's chain length (see the module doc)."""

    max_length: int

    def start(self, initial: int) -> None:  # noqa: B027 (no-op default)
        """A ``generate`` call begins; ``initial`` is the decoder shape's chain length."""

    @abstractmethod
    def length(self, batch_size: int) -> int:
        """The next round's chain length, in ``[1, max_length]``."""

    @abstractmethod
    def update(
        self,
        drafted: list[int],
        accepted: list[int],
        seconds: dict[str, float],
        draft_forwards: int,
        batch_size: int,
    ) -> None:
        """A round ended: per row, ``drafted`` tokens of which ``accepted`` were accepted;
        ``seconds`` of its phases (``draft``, ``target``, ``verify``) and its draft forwards."""


def _check_length(value: Any, name: str) -> int:
    return check_positive_int(value, name)


def check_confidence(confidence: Any) -> float | None:
    """``confidence`` (``None``, or a probability in ``(0, 1]``) as a float."""
    if confidence is None:
        return None
    if isinstance(confidence, (bool, np.bool_)) or not isinstance(
        confidence, (int, float, np.integer, np.floating)
    ):
        raise ValueError(f"confidence: expected a number in (0, 1], got {confidence!r}")
    if not 0 < confidence <= 1:  # NaN fails too
        raise ValueError(f"confidence: expected a number in (0, 1], got {confidence!r}")
    return float(confidence)


def check_adaptive(verification: Any, option: str) -> None:
    """Refuse ``option`` (an adaptive length, early stopping) where it is not built: keyed
    couplings (their walk drafts on the decoder shape's plan) and shapes other than chains."""
    from specsampling.errors import UnsupportedShape

    from .verification import TreeVerification

    if not isinstance(verification, TreeVerification):
        raise UnsupportedShape(
            f"{option}: adaptive draft lengths run with tree verifiers; {verification.name!r} is a "
            "keyed coupling, which drafts on the decoder shape's fixed plan"
        )
    if not verification.shape.is_chain:
        raise UnsupportedShape(
            f"{option}: adaptive draft lengths draft chains; got {verification.shape!r} "
            "(use Shape.chain(k))"
        )


class HeuristicLength(DraftLength):
    """transformers' heuristic schedule: ``+2`` after a round whose drafts were all accepted,
    else ``-1`` (at least 1); starts at ``initial`` (``None``: the decoder shape's length) and
    stays at most ``max_length``. As ``num_assistant_tokens_schedule="heuristic_transient"``
    it starts afresh at every ``generate`` call.

    >>> policy = HeuristicLength(initial=4, max_length=5)
    >>> policy.start(3)
    >>> policy.length(1)
    4
    >>> policy.update([4], [4], {}, 4, 1); policy.length(1)
    5
    >>> policy.update([5], [2], {}, 5, 1); policy.length(1)
    4
    """

    def __init__(self, initial: int | None = None, max_length: int = 64) -> None:
        self.initial = None if initial is None else _check_length(initial, "initial")
        self.max_length = _check_length(max_length, "max_length")
        if self.initial is not None and self.initial > self.max_length:
            raise ValueError(
                f"initial: expected at most max_length = {self.max_length}, got {initial}"
            )
        self.current = self.initial or 1

    def start(self, initial: int) -> None:
        self.current = min(self.initial or initial, self.max_length)

    def length(self, batch_size: int) -> int:
        return self.current

    def update(self, drafted, accepted, seconds, draft_forwards, batch_size) -> None:
        if all(a == d for a, d in zip(accepted, drafted, strict=True)):
            self.current = min(self.current + 2, self.max_length)
        else:
            self.current = max(1, self.current - 1)

    def __repr__(self) -> str:
        return f"HeuristicLength(initial={self.initial}, max_length={self.max_length})"


class CostModelLength(DraftLength):
    r"""The chain length of the highest predicted speed.

    With a per-token acceptance rate :math:`\alpha` (i.i.d. model, Leviathan et al. 2023) a
    chain of ``k`` emits :math:`E_k = (1 - \alpha^{k+1}) / (1 - \alpha)` tokens a round, and
    a round costs :meth:`CostModel.round_seconds
    <specsampling.simulators.CostModel.round_seconds>` of ``Shape.chain(k)``; the policy picks
    :math:`\arg\max_{1 \le k \le \text{max\_length}} B E_k / T_k`.

    ``alpha`` is the running estimate ``(accepted + prior_accepted) / (trials + prior_trials)``
    (a trial: each drafted token the verifier reached: the accepted ones and the first
    rejection); ``costs`` a fixed :class:`~specsampling.simulators.CostModel`, or ``None``:
    fitted online from the measured rounds (a draft forward's mean time; the target forward's
    time as a least-squares line in the tokens it scores; the verifier's time per node), the
    decoder shape's length used until ``warmup`` rounds are measured. The first round of a call
    is not measured: both models' first forward also runs the prompt.

    >>> from specsampling.simulators import CostModel
    >>> policy = CostModelLength(max_length=8, costs=CostModel.relative(draft_ratio=0.1))
    >>> policy.start(4)
    >>> policy.alpha, policy.length(1)  # prior acceptance 0.8: E_k / (1 + 0.1 k)
    (0.8, 6)
    >>> for _ in range(20):
    ...     policy.update([4], [0], {}, 4, 1)
    >>> policy.length(1)  # nothing is accepted: the shortest chain
    1
    """

    def __init__(
        self,
        max_length: int = 16,
        costs: Any = None,
        prior_alpha: float = 0.8,
        prior_weight: float = 4.0,
        warmup: int = 3,
    ) -> None:
        self.max_length = _check_length(max_length, "max_length")
        if costs is not None and not hasattr(costs, "round_seconds"):
            raise ValueError(
                f"costs: expected a specsampling.simulators.CostModel, got {type(costs).__name__}"
            )
        self.costs = costs
        real = (int, float, np.integer, np.floating)
        if isinstance(prior_alpha, (bool, np.bool_)) or not (
            isinstance(prior_alpha, real) and 0 <= prior_alpha < 1
        ):
            raise ValueError(f"prior_alpha: expected a number in [0, 1), got {prior_alpha!r}")
        if isinstance(prior_weight, (bool, np.bool_)) or not (
            isinstance(prior_weight, real) and 0 < prior_weight < math.inf
        ):
            raise ValueError(f"prior_weight: expected a finite number > 0, got {prior_weight!r}")
        self.prior_alpha, self.prior_weight = float(prior_alpha), float(prior_weight)
        self.warmup = check_positive_int(warmup, "warmup", 0)
        self.start(1)

    def start(self, initial: int) -> None:
        self.initial = min(initial, self.max_length)
        self.successes, self.trials = 0.0, 0.0
        self.rounds = 0
        self.draft_seconds = self.draft_count = 0.0
        self.verify_seconds = self.verify_nodes = 0.0
        self.fit = [0.0] * 5  # target time y against tokens n: count, Σn, Σn², Σy, Σny

    @property
    def alpha(self) -> float:
        """The running per-token acceptance estimate."""
        prior = self.prior_weight
        return (self.successes + prior * self.prior_alpha) / (self.trials + prior)

    def update(self, drafted, accepted, seconds, draft_forwards, batch_size) -> None:
        for d, a in zip(drafted, accepted, strict=True):
            self.successes += a
            self.trials += a + (1 if a < d else 0)
        self.rounds += 1
        if self.rounds == 1:  # both models' first forward also ran the prompt: not fitted
            return
        if draft_forwards:
            self.draft_seconds += seconds.get("draft", 0.0)
            self.draft_count += draft_forwards
        tokens = batch_size * (1 + max(drafted, default=0))
        self.verify_seconds += seconds.get("verify", 0.0)
        self.verify_nodes += tokens
        y = seconds.get("target", 0.0)
        for i, value in enumerate((1.0, tokens, tokens * tokens, y, tokens * y)):
            self.fit[i] += value

    def fitted(self) -> Any:
        """The :class:`~specsampling.simulators.CostModel` of the rounds so far (or ``costs``)."""
        if self.costs is not None:
            return self.costs
        from specsampling.simulators import CostModel  # the one cost model, imported on use

        count, sum_n, sum_nn, sum_y, sum_ny = self.fit
        spread = count * sum_nn - sum_n * sum_n
        slope = (count * sum_ny - sum_n * sum_y) / spread if spread > 1e-9 else 0.0
        slope = max(slope, 0.0)
        fixed = max((sum_y - slope * sum_n) / count, 0.0)
        if fixed + slope == 0:
            fixed = 1e-6
        draft = self.draft_seconds / self.draft_count if self.draft_count else 0.0
        verify = self.verify_seconds / self.verify_nodes if self.verify_nodes else 0.0
        return CostModel(fixed, slope, draft, 0.0, verify)

    def length(self, batch_size: int) -> int:
        if self.costs is None and self.fit[0] < max(self.warmup, 1):  # rounds fitted
            return self.initial
        from specsampling.shapes import Shape

        costs = self.fitted()
        alpha = self.alpha
        best, best_speed = 1, -math.inf
        for k in range(1, self.max_length + 1):
            emitted = (1 - alpha ** (k + 1)) / (1 - alpha)
            speed = emitted / costs.round_seconds(Shape.chain(k), batch_size)
            if speed > best_speed * (1 + 1e-12):
                best, best_speed = k, speed
        return best

    def __repr__(self) -> str:
        costs = "fitted online" if self.costs is None else repr(self.costs)
        return f"CostModelLength(max_length={self.max_length}, costs={costs})"


__all__ = [
    "CostModelLength",
    "DraftLength",
    "HeuristicLength",
    "check_adaptive",
    "check_confidence",
]
