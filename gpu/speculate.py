r"""Batched sampled rounds on a model pair: ``speculate(scheme, pair, shape, num_rounds)``.

The torch counterpart of :func:`specsampling.speculate` repeated: every round, each of the
``batch_size`` rows drafts a tree of ``shape`` after its own context with the tensor drafter
(:mod:`specsampling.gpu.drafting`), the tables of that tree are read from the pair
(:func:`specsampling.schemes.tables` per row), the lowering verifies the whole batch
(:func:`specsampling.gpu.verify`), and each row appends its emitted tokens.

Noise per round, all fresh float64 uniforms from ``generator``: drafting noise ``[B, S]`` (one
per draw step) and, drawn separately, the verifier's ``accept`` / ``sample`` ``[B, 1 + S]``.
Drafting never reads the verifier's noise (the shared-stream bug of vllm-project/vllm#54282), so the
tree is independent of the verifier's uniforms given the context, which is exactly what each
verifier's losslessness theorem assumes: for a scheme exact for the shape's law,

.. math:: P(x_{n+1}, \dots, x_{n+k} \mid x_{\le n}) = \prod_i p(x_{n+i} \mid x_{< n+i}),

whatever the draft. Keyed couplings draw tree and verdict from one keyed field instead; they are
refused here (their rounds run from a key: ``specsampling.gpu.generate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specsampling.pairs import ModelPair, check_model_pair
from specsampling.schemes import tables
from specsampling.shapes import Shape, check_shape
from specsampling.validation import check_positive_int, check_prefix

from . import drafting
from .api import tables_batch, verify
from .noise import Noise, check_generator
from .schemes import tree_lowering


@dataclass(frozen=True)
class Speculation:
    """What :func:`speculate` returns.

    Attributes
    ----------
    tokens : tuple of tuple of int, length B
        Each row's tokens emitted after its prefix, all rounds concatenated.
    emitted : tuple of tuple of int, length B
        Tokens each round emitted, per row (``num_rounds`` entries, each at least 1).
    num_rounds : int
        Rounds run.
    """

    tokens: tuple[tuple[int, ...], ...]
    emitted: tuple[tuple[int, ...], ...]
    num_rounds: int

    @property
    def block_efficiency(self) -> float:
        """Mean tokens emitted per round over rows and rounds."""
        total = sum(len(row) for row in self.tokens)
        return total / (len(self.tokens) * self.num_rounds)


class RoundNoise(NamedTuple):
    """One round's noise: ``drafting [B, S]`` and the verifier's :class:`Noise` ``[B, 1 + S]``
    (``1 + S`` bounds the nodes of any tree; verify reads the first ``N`` columns)."""

    drafting: torch.Tensor  # [B, S] float64
    verify: Noise  # [B, 1 + S] float64 each


class Speculator:
    """Sampled rounds of one lowered tree scheme on one pair and shape (:func:`speculate`).

    The pieces are methods so that tests can break one (a mutant subclass): :meth:`noise`
    draws a round's noise, :meth:`round` drafts, builds tables and verifies.
    """

    def __init__(self, scheme: object, pair: ModelPair, shape: Shape) -> None:
        self.lowering = tree_lowering(scheme)
        self.pair = check_model_pair(pair)
        self.shape = check_shape(shape)
        self.lowering.reference_scheme.check(self.shape)

    def noise(
        self, batch_size: int, generator: torch.Generator | None, device: torch.device
    ) -> RoundNoise:
        """Fresh independent uniforms: the drafting noise first, then the verifier's."""
        steps = len(self.shape.steps)

        def uniforms(width: int) -> torch.Tensor:
            return torch.rand(
                (batch_size, width), dtype=torch.float64, generator=generator, device=device
            )

        drafting_noise = uniforms(steps)  # [B, S]
        accept, sample = uniforms(1 + steps), uniforms(1 + steps)  # [B, 1 + S] each
        return RoundNoise(drafting_noise, Noise(accept, sample))

    def round(
        self, prefixes: Sequence[tuple[int, ...]], noise: RoundNoise, device: torch.device
    ) -> list[tuple[int, ...]]:
        """One round for every row: the tokens each row emits after ``prefixes[b]``."""
        batch = drafting.draft(self.shape, self.pair, noise.drafting, prefixes, device=device)
        trees = batch.to_trees()
        rows = [
            tables(self.pair, tree, prefix) for tree, prefix in zip(trees, prefixes, strict=True)
        ]
        target_probs, draft_probs = tables_batch(
            [r[0] for r in rows], [r[1] for r in rows], device=device
        )  # [B, N, V] each
        width = batch.parents.shape[1]
        verify_noise = Noise(noise.verify.accept[:, :width], noise.verify.sample[:, :width])
        out = verify(self.lowering, batch, target_probs, draft_probs, verify_noise)
        emitted = out.tokens.tolist()
        counts = out.num_emitted.tolist()
        return [tuple(row[:count]) for row, count in zip(emitted, counts, strict=True)]

    def run(
        self,
        num_rounds: int,
        generator: torch.Generator | None = None,
        prefix: Sequence[int] = (),
        batch_size: int = 1,
    ) -> Speculation:
        """``num_rounds`` rounds for ``batch_size`` rows starting after ``prefix``."""
        num_rounds = check_positive_int(num_rounds, "num_rounds")
        batch_size = check_positive_int(batch_size, "batch_size")
        generator = check_generator(generator)
        device = torch.device("cpu") if generator is None else generator.device
        start = check_prefix(prefix, self.pair.vocab_size)
        tokens: list[tuple[int, ...]] = [()] * batch_size
        emitted: list[list[int]] = [[] for _ in range(batch_size)]
        for _ in range(num_rounds):
            noise = self.noise(batch_size, generator, device)
            step = self.round([start + row for row in tokens], noise, device)
            for b, row in enumerate(step):
                tokens[b] = tokens[b] + row
                emitted[b].append(len(row))
        return Speculation(tuple(tokens), tuple(tuple(e) for e in emitted), num_rounds)


def speculate(
    scheme: object,
    pair: ModelPair,
    shape: Shape,
    num_rounds: int,
    generator: torch.Generator | None = None,
    prefix: Sequence[int] = (),
    batch_size: int = 1,
) -> Speculation:
    """Run ``num_rounds`` batched sampled rounds of a lowered tree scheme on ``pair``.

    Parameters
    ----------
    scheme : str or lowering object
        A tree scheme in :data:`specsampling.gpu.SCHEMES`; keyed couplings are refused.
    pair : ModelPair
        The target and draft models (numpy; called once per node and row). An exact
        (``Fraction``) pair is read in float64, each probability rounded once, as every table
        of this backend is.
    shape : Shape
        How each round drafts; the scheme must be exact for its law.
    num_rounds : int
        Rounds per row.
    generator : torch.Generator, optional
        Source of all noise (its device is where the batch runs); ``None``: torch's default.
    prefix : tuple of int
        The context every row starts after.
    batch_size : int
        Independent rows ``B``.

    Returns
    -------
    Speculation
        Per row the emitted tokens and the count of each round.

    Examples
    --------
    >>> import torch
    >>> import specsampling as ss
    >>> import specsampling.gpu as ssg
    >>> pair = ss.pairs.Random(vocab_size=5, seed=0)
    >>> out = ssg.speculate("specinfer", pair, ss.Shape.paths(2, 3), num_rounds=4,
    ...                     generator=torch.Generator().manual_seed(0), batch_size=3)
    >>> len(out.tokens), [len(row) for row in out.emitted], 1 <= out.block_efficiency <= 4
    (3, [4, 4, 4], True)
    >>> ssg.speculate("standard", pair, ss.Shape.star(2), 1)
    Traceback (most recent call last):
    ...
    specsampling.errors.UnsupportedShape: scheme 'standard' is not exact for drafts of shape \
star(2, replacement=True) (draft law 'iid'); it is exact for sampled chains
    """
    return Speculator(scheme, pair, shape).run(num_rounds, generator, prefix, batch_size)


__all__ = ["RoundNoise", "Speculation", "Speculator", "speculate"]
