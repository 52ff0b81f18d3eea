r"""Gumbel and Poisson list couplings: drafter-invariant speculative decoding on keyed noise.

Algorithm. Every position ``t`` has keyed exponentials ``E_{t,z}`` (one row,
:class:`~specsampling.keyed.KeyedNoise`). The drafter's candidates at a node are its first
arrivals, the tokens with the smallest ``E_{t,z} / q(z)``: one per node for ``gumbel`` (Daliri,
Musco, Suresh), the ``L`` first for ``poisson`` (a Gumbel-top-L list, an exact sample of size
``L`` from ``q`` without replacement). The target's token is ``Y_t = argmin_z E_{t,z} / p(z)``;
the round descends while ``Y_t`` is a drafted child and always emits ``Y_t``: there is no
residual step, and deeper drafts are discarded on a miss.

Theorem. The emitted stream is seeded target-only decoding, token for token, whatever the
drafter (strong drafter invariance), hence exactly distributed as the target. Proof idea: the
race winner ``argmin E / p`` is an exact draw from ``p``; noise is keyed by absolute position
(or context hash), never by round or draft step, so the drafter never changes which
exponentials the target reads.

Acceptance at one position, ``r_i = (q_i p_j / q_j - p_i)_+``:

.. math::

    P_{L=1} = \sum_j 1 \Big/ \sum_i \max(p_i / p_j,\ q_i / q_j), \qquad
    P_L = \sum_j p_j \int_0^\infty e^{-x}
        P[\mathrm{PoissonBinomial}(1 - e^{-x r}) \le L - 1]\, dx.

References: Daliri, Musco, Suresh, arXiv 2408.07978 (Gumbel coupling, drafter invariance);
the Poisson list is derived in this project from the Poisson functional representation
(``docs/schemes/poisson.md``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._types import Prefix, Probs
from ..keyed import KeyedNoise
from ..keyed.laws import gumbel_acceptance, gumbel_hits, keyed_select, poisson_hits
from ..ops import support
from ..pairs import ModelPair
from ..shapes import Shape
from ..tree import DraftTree, DrawLaw
from .base import Verdict
from .coupled import KeyedScheme, Transition, race_pick


class Poisson(KeyedScheme):
    """Poisson list coupling: each node's candidates are the drafter's first arrivals.

    Exact (and strongly drafter-invariant) on sampled chains and on trees whose siblings are
    drawn without replacement (``star(L, replacement=False)``, ``branching(widths)``): the i-th
    child of a node is its i-th arrival.

    >>> import specsampling as ss
    >>> round(ss.acceptance("poisson", [0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 2), 6)
    0.88873
    """

    name = "poisson"
    reference = "derived in this project; Daliri, Musco, Suresh, arXiv 2408.07978"

    def supports(self, shape: Shape) -> bool:
        return shape.is_chain or (shape.law is DrawLaw.WITHOUT and shape.level_widths is not None)

    def support_text(self) -> str:
        return "sampled chains and level-uniform trees without replacement (star, branching)"

    def single_shape(self, num_drafts: int) -> Shape:
        return Shape.star(num_drafts, replacement=False)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return float(self.hits(target, draft, num_drafts).sum())

    def hits(self, target: Probs, draft: Probs, list_size: int) -> Any:
        """``P(Y = j, j in the list)`` per token."""
        return poisson_hits(target, draft, list_size)

    def rows(self, shape: Shape) -> int:
        return 1

    def initial_state(self, shape: Shape) -> Any:
        return shape.level_widths

    def transitions(
        self, target: Probs, draft: Probs, shape: Shape, depth: int, state: Any
    ) -> Iterable[Transition]:
        hits = self.hits(target, draft, state[depth])
        for token in support(target):
            yield int(token), hits[token], state
            yield int(token), target[token] - hits[token], None

    def sample_keyed(
        self, pair: ModelPair, shape: Shape, noise: KeyedNoise, prefix: Prefix = ()
    ) -> tuple[DraftTree, Verdict]:
        self.check(shape)
        prefix = tuple(prefix)
        vocab = pair.vocab_size
        tree = shape.draft_with(pair, race_pick(noise, prefix, vocab, lambda step: 0), prefix)
        node = 0
        while True:
            context = prefix + tree.prefix(node)
            token = keyed_select(pair.target(context), noise.exponentials(context, 1, vocab))
            child = tree.child_with_token(node, token)
            if child is None:
                return tree, Verdict(node, token)
            node = child


class Gumbel(Poisson):
    """Single-draft Gumbel coupling (Daliri et al.): the Poisson list of size one, on chains.

    Its per-token hit probability ``c_j`` is rational, so the exact engine runs in ``Fraction``.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> ss.acceptance("gumbel", [F(1, 2), F(3, 10), F(1, 5)], [F(1, 5), F(3, 10), F(1, 2)], 1)
    Fraction(41, 65)
    """

    name = "gumbel"
    rational = True
    reference = "Daliri, Musco, Suresh, arXiv 2408.07978"

    def supports(self, shape: Shape) -> bool:
        return shape.is_chain

    def support_text(self) -> str:
        return "sampled chains"

    def single_shape(self, num_drafts: int) -> Shape:
        return Shape.star(num_drafts, replacement=True)

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        return gumbel_acceptance(target, draft) if num_drafts == 1 else None

    def hits(self, target: Probs, draft: Probs, list_size: int) -> Any:
        return gumbel_hits(target, draft)


GUMBEL = Gumbel()
POISSON = Poisson()
