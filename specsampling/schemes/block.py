r"""Block verification on a chain (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh).

Algorithm. For the drafted chain :math:`x_1..x_\gamma \sim q` set :math:`w_0 = 1` and
:math:`w_i = \min(1, w_{i-1} p_i(x_i) / q_i(x_i))`, the capped cumulative likelihood ratio. The
block acceptance probabilities are :math:`h_\gamma = w_\gamma` and, for :math:`i < \gamma`,

.. math:: h_i = \frac{S_i}{S_i + 1 - w_i}, \qquad S_i = \sum_y (w_i\,p_{i+1}(y) - q_{i+1}(y))_+,

with :math:`h_i = 1` when the denominator is 0. Draw :math:`\eta_i \sim U[0, 1)` for **every**
:math:`i` and let :math:`\tau` be the **last** :math:`i` with :math:`\eta_i < h_i` (0 if none).
Emit :math:`x_1..x_\tau` and then a bonus :math:`y \sim p_{\gamma+1}` if :math:`\tau = \gamma`,
else :math:`y \sim \mathrm{norm}((w_\tau p_{\tau+1} - q_{\tau+1})_+)`, the *w-weighted* residual.

Theorem (Sun et al., Thm. 1-2). Lossless, and optimal in expected accepted tokens among verifiers
that see only the drafted block's conditionals; never worse than token-level verification.

Acceptance. :math:`E[\tau] = \sum_{i \le \gamma} E_{x_{1:i} \sim q}[w_i(x_{1:i})]`; on
:math:`p = (1/3, 2/3)`, :math:`q = (2/3, 1/3)`, :math:`\gamma = 2` this is 11/9 against 10/9 for
token-level verification.

Reference: Sun et al., "Block Verification Accelerates Speculative Decoding", arXiv 2403.10444.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._types import Prefix, Probs
from ..noise import Noise
from ..ops import categorical, positive_part, total
from ..pairs import ModelPair
from ..tree import DraftTree
from .base import NodeLaw, TreeScheme, Verdict, VerdictLaw
from .standard import check_chain_arguments, standard_acceptance


class Block(TreeScheme):
    """Block verification; exact on sampled chains.

    >>> import specsampling as ss
    >>> from fractions import Fraction as F
    >>> pair = ss.pairs.Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)])
    >>> ss.expected_emitted("block", pair, ss.Shape.chain(2)) - 1
    Fraction(11, 9)
    """

    name = "block"
    reference = "Sun et al. 2024, block verification (arXiv 2403.10444)"

    def closed_acceptance(self, target: Probs, draft: Probs, num_drafts: int) -> Any:
        """One candidate is a chain of one token: standard acceptance, :math:`\\sum \\min(p, q)`."""
        return standard_acceptance(target, draft) if num_drafts == 1 else None

    def verify(
        self, tree: DraftTree, target_probs: Probs, draft_probs: Probs, noise: Noise
    ) -> Verdict:
        self.check_round(tree, target_probs, draft_probs, noise)
        path = _chain_nodes(tree)
        weights, accept = self.block_probabilities(tree, path, target_probs, draft_probs)
        tau = self.choose_tau([noise.accept[node] for node in path], accept)
        node = path[tau]
        return Verdict(
            node,
            categorical(
                self.emit(path, tau, weights, target_probs, draft_probs), noise.sample[node]
            ),
        )

    def verdict_law(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> VerdictLaw:
        self.check_round(tree, target_probs, draft_probs)
        path = _chain_nodes(tree)
        weights, accept = self.block_probabilities(tree, path, target_probs, draft_probs)
        law: VerdictLaw = {}
        for tau, prob in enumerate(self.tau_law(accept)):
            if not prob > 0:
                continue
            emit = self.emit(path, tau, weights, target_probs, draft_probs)
            for token, mass in enumerate(emit):
                if mass > 0:
                    law[Verdict(path[tau], token)] = prob * mass
        return law

    def verdict_nodes(self, tree: DraftTree, target_probs: Probs, draft_probs: Probs) -> NodeLaw:
        """The law of :meth:`verdict_law` by node: :meth:`tau_law` on the chain's nodes."""
        self.check_round(tree, target_probs, draft_probs)
        path = _chain_nodes(tree)
        _, accept = self.block_probabilities(tree, path, target_probs, draft_probs)
        return {path[tau]: prob for tau, prob in enumerate(self.tau_law(accept)) if prob > 0}

    def choose_tau(self, etas: list[float], accept: list[Any]) -> int:
        """The **last** ``i >= 1`` with ``eta_i < h_i`` (0 if none): later successes override."""
        tau = 0
        for i in range(1, len(accept)):
            if etas[i] < accept[i]:
                tau = i
        return tau

    def tau_law(self, accept: list[Any]) -> list[Any]:
        """Exact law of :meth:`choose_tau`: ``P(tau = i) = h_i prod_{j > i} (1 - h_j)``."""
        law: list[Any] = [0] * len(accept)
        later_fail: Any = 1
        for i in range(len(accept) - 1, 0, -1):
            law[i] = later_fail * accept[i]
            later_fail = later_fail * (1 - accept[i])
        law[0] = later_fail
        return law

    def block_probabilities(
        self, tree: DraftTree, path: list[int], target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[Any], list[Any]]:
        """Cumulative weights ``w_0..w_gamma`` and block acceptances ``h_i`` (``h_0`` unused)."""
        weights: list[Any] = [1]
        for i in range(1, len(path)):
            parent, token = path[i - 1], tree.tokens[path[i]]
            scaled = weights[-1] * target_probs[parent][token]
            draft_x = draft_probs[parent][token]
            weights.append(1 if scaled >= draft_x else scaled / draft_x)
        gamma = len(path) - 1
        accept: list[Any] = [1] * (gamma + 1)
        for i in range(1, gamma):
            node = path[i]
            mass = total(positive_part(weights[i] * target_probs[node] - draft_probs[node]))
            denominator = mass + (1 - weights[i])
            accept[i] = mass / denominator if denominator > 0 else 1
        if gamma:
            accept[gamma] = weights[gamma]
        return weights, accept

    def emit(
        self,
        path: list[int],
        tau: int,
        weights: list[Any],
        target_probs: Probs,
        draft_probs: Probs,
    ) -> Probs:
        """Law of the token emitted after accepting ``x_1..x_tau``."""
        node = path[tau]
        if tau == len(path) - 1:
            bonus: Probs = target_probs[node]
            return bonus
        residual = positive_part(weights[tau] * target_probs[node] - draft_probs[node])
        mass = total(residual)
        if not mass > 0:
            fallback: Probs = target_probs[node]
            return fallback
        out: Probs = residual / mass
        return out


def _chain_nodes(tree: DraftTree) -> list[int]:
    path = [0]
    while tree.candidates[path[-1]]:
        (child,) = tree.candidates[path[-1]]
        path.append(child)
    return path


def block_expected_accepted(pair: ModelPair, length: int, prefix: Prefix = ()) -> Any:
    r"""Block verification on a chain: exact :math:`E[\tau] = \sum_{i \le \gamma} E_q[w_i]`.

    :math:`w_i = \min(1, w_{i-1} p_i(x_i) / q_i(x_i))` is the capped cumulative likelihood
    ratio (Sun et al. 2024). Enumerates drafted prefixes (``vocab ** (length - 1)`` at most).
    The arguments are checked as in
    :func:`~specsampling.schemes.standard.chain_expected_accepted`.

    >>> from fractions import Fraction as F
    >>> from specsampling.pairs import Stationary
    >>> block_expected_accepted(Stationary([F(1, 3), F(2, 3)], [F(2, 3), F(1, 3)]), 2)
    Fraction(11, 9)
    """
    pair, length, prefix = check_chain_arguments(pair, length, prefix)
    return _block_sum(pair, length, prefix, 1)


def _block_sum(pair: ModelPair, length: int, prefix: Prefix, weight: Any) -> Any:
    if length == 0:
        return 0
    target, draft = pair.target(prefix), pair.draft(prefix)
    drafted = np.flatnonzero(np.asarray(draft > 0, dtype=bool))
    scaled = weight * target[drafted]
    weights = np.where(scaled >= draft[drafted], 1, 0 * scaled)
    below = scaled < draft[drafted]
    weights[below] = scaled[below] / draft[drafted][below]
    result: Any = total(draft[drafted] * weights)
    if length > 1:
        for token, w in zip(drafted, weights, strict=True):
            deeper = _block_sum(pair, length - 1, (*prefix, int(token)), w)
            result = result + draft[token] * deeper
    return result


SCHEME = Block()
