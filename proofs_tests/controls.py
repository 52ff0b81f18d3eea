"""Controls: variants that look buggy but are exact, so the oracle must NOT flag them.

Reported as bugs (ml-explore/mlx-swift-lm#459, z-lab/dflash#77) but exact: under accept-iff-equal
(NSS) noise shared between drafting and verification is harmless, unlike under the ratio rule
(vllm-project/vllm#54282, mutant ``mutant-shared-uniform``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

import specsampling as ss
from proofs_tests.mutants import CHAIN2, A, Case, cdf_interval, chain_by_inverse_cdf
from specsampling.noise import Noise
from specsampling.pairs import ModelPair
from specsampling.schemes import tables
from specsampling.schemes.nss import NSS

F = Fraction
Probs = Any


class NSSSharedUniform(NSS):
    """NOT a bug (cf. vllm-project/vllm#54282): NSS whose target draw at a node reuses the uniform
    that drafted the node's child. The emitted token is still the target's inverse-CDF sample
    of a fresh uniform, so the stream is exact; the oracle must not flag it."""

    name = "control-nss-shared-uniform"

    def supports(self, shape: ss.Shape) -> bool:
        return shape.is_chain

    def sample(
        self, pair: ModelPair, shape: ss.Shape, rng: np.random.Generator, prefix: Any
    ) -> tuple[ss.DraftTree, ss.Verdict]:
        self.check(shape)
        uniforms = rng.random(shape.depth)
        tree = chain_by_inverse_cdf(pair, shape.depth, uniforms, tuple(prefix))
        sample = np.concatenate([uniforms, rng.random(1)])
        noise = Noise.checked(rng.random(tree.num_nodes), sample, tree.num_nodes)
        return tree, self.verify(tree, *tables(pair, tree, tuple(prefix)), noise)

    def node_law(
        self, tree: ss.DraftTree, node: int, target_probs: Probs, draft_probs: Probs
    ) -> tuple[list[tuple[int, Any]], Probs]:
        (child,) = tree.candidates[node]
        drafted = tree.tokens[child]
        low, high = cdf_interval(draft_probs[node], drafted)
        target = target_probs[node]
        stop = target * 0
        for token in range(len(target)):
            t_low, t_high = cdf_interval(target, token)
            overlap = min(high, t_high) - max(low, t_low)
            stop[token] = max(overlap, 0 * overlap) / draft_probs[node][drafted]
        descend = stop[drafted]
        stop[drafted] = 0 * descend
        return [(child, descend)], stop


#: Variants that look buggy but are exact: the oracle must pass them.
CONTROLS: dict[str, tuple[Any, Case]] = {
    "nss-shared-uniform": (
        NSSSharedUniform(),
        Case((A, ((F(1, 6), F(2, 3), F(1, 6)), (F(1, 2), F(1, 4), F(1, 4)))), CHAIN2, "nss", 2),
    ),
}
