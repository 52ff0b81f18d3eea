"""Noise as data for a batch: the uniforms of :class:`specsampling.Noise`, one row per tree.

``accept[b, n]`` is the uniform of the accept test of the candidate held by node ``n`` of row
``b``; ``sample[b, n]`` the uniform of the inverse-CDF draw made at node ``n``. Both are float64
on every device (float32 uniforms bottom out at 2^-24: vllm-project/vllm#43150). Lanes of padding
nodes hold ``PAD_UNIFORM`` (NaN): the walk never reads them, and a read would poison the verdict
visibly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

import specsampling as ss
from specsampling.errors import InvalidDistribution

from .tree import TreeBatch

#: The value of the padding lanes: never read by a verifier.
PAD_UNIFORM = float("nan")


class Noise(NamedTuple):
    """Uniforms in ``[0, 1)`` for one round of a batch: ``accept``, ``sample`` float64 ``[B, N]``.

    >>> import numpy as np
    >>> import specsampling as ss
    >>> noise = Noise.from_reference([ss.Noise.constant(0.5, 2), ss.Noise.constant(0.0, 3)])
    >>> noise.accept.shape, noise.sample[0].tolist()
    (torch.Size([2, 3]), [0.5, 0.5, nan])
    """

    accept: torch.Tensor  # [B, N] float64
    sample: torch.Tensor  # [B, N] float64

    @classmethod
    def from_reference(
        cls, noises: Sequence[ss.Noise], device: torch.device | str | None = None
    ) -> Noise:
        """Stack reference noises (each validated), padding short rows with ``PAD_UNIFORM``."""
        if isinstance(noises, (ss.Noise, str, bytes)) or not isinstance(noises, Iterable):
            got = "one ss.Noise" if isinstance(noises, ss.Noise) else type(noises).__name__
            raise TypeError(
                f"noises: expected a sequence of ss.Noise (one per tree), got {got}"
                + ("; pass [noise]" if isinstance(noises, ss.Noise) else "")
            )
        noises = list(noises)
        if not noises:
            raise InvalidDistribution("noise: expected at least one ss.Noise")
        checked = []
        for row, n in enumerate(noises):
            try:
                checked.append(ss.Noise.checked(n.accept, n.sample, len(n.accept)))
            except (InvalidDistribution, TypeError, AttributeError) as error:
                raise InvalidDistribution(f"noises[{row}]: {error}") from None
        width = max(len(n.accept) for n in checked)
        arrays = []
        for part in ("accept", "sample"):
            table = np.full((len(checked), width), PAD_UNIFORM)  # [B, N]
            for row, n in enumerate(checked):
                values = getattr(n, part)
                table[row, : len(values)] = values
            arrays.append(torch.tensor(table, dtype=torch.float64, device=device))
        return cls(arrays[0], arrays[1])

    @classmethod
    def draw(cls, batch: TreeBatch, generator: torch.Generator | int | None = None) -> Noise:
        """Fresh independent float64 uniforms for every lane of ``batch`` (on its device)."""
        if not isinstance(batch, TreeBatch):
            raise TypeError(
                f"batch: expected a TreeBatch (TreeBatch.from_trees(trees)), got "
                f"{type(batch).__name__}"
            )
        generator = check_generator(generator)
        shape = tuple(batch.parents.shape)  # (B, N)
        device = batch.device if generator is None else generator.device
        accept = torch.rand(shape, dtype=torch.float64, generator=generator, device=device)
        sample = torch.rand(shape, dtype=torch.float64, generator=generator, device=device)
        return cls(accept.to(batch.device), sample.to(batch.device))

    def check(self, batch: TreeBatch) -> None:
        """Raise :class:`~specsampling.InvalidDistribution` (naming ``noise.accept`` or
        ``noise.sample``) unless both are float tensors ``[B, N]`` with every real lane in
        ``[0, 1)``. One host synchronisation."""
        self.check_lanes(batch.real_nodes())

    def check_lanes(self, real: torch.Tensor) -> None:
        """:meth:`check` against a mask of real lanes ``real [B, N]`` (bool)."""
        self.check_shapes(tuple(real.shape))
        inside = [
            ((v >= 0) & (v < 1)) | ~real  # [B, N]
            for v in (self.accept.to(real.device), self.sample.to(real.device))
        ]
        if bool((inside[0] & inside[1]).all()):
            return
        for name, ok in zip(("accept", "sample"), inside, strict=True):
            bad = (~ok).any(-1)  # [B]
            if bool(bad.any()):
                row = int(bad.nonzero()[0, 0])
                raise InvalidDistribution(f"noise.{name}[{row}]: uniforms must lie in [0, 1)")

    def check_shapes(self, shape: tuple[int, ...]) -> None:
        """Raise :class:`~specsampling.InvalidDistribution` unless ``accept`` and ``sample``
        are float tensors of ``shape`` (host metadata only, no synchronisation)."""
        for name, values in (("accept", self.accept), ("sample", self.sample)):
            if not isinstance(values, torch.Tensor) or not values.is_floating_point():
                raise InvalidDistribution(
                    f"noise.{name}: expected a float tensor of shape {shape}, got "
                    f"{type(values).__name__}"
                )
            if tuple(values.shape) != shape:
                raise InvalidDistribution(
                    f"noise.{name}: expected shape {shape}, got {tuple(values.shape)}"
                )


def check_generator(generator: Any, name: str = "generator") -> torch.Generator | None:
    """``generator`` as a :class:`torch.Generator`: ``None`` and generators as they are, an int
    seeds a fresh CPU generator (as numpy's ``default_rng(seed)``); anything else is refused
    naming ``name``. The one check of every ``generator=`` in :mod:`specsampling.gpu`.

    >>> check_generator(3).initial_seed()
    3
    >>> check_generator("3")
    Traceback (most recent call last):
    ...
    TypeError: generator: expected a torch.Generator, an int seed or None, got str '3'
    """
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        if generator < 0:
            raise ValueError(f"{name}: a seed is an integer >= 0, got {generator}")
        return torch.Generator().manual_seed(int(generator))
    raise TypeError(
        f"{name}: expected a torch.Generator, an int seed or None, got "
        f"{type(generator).__name__} {generator!r}"
    )
