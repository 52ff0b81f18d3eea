r"""Draft means :math:`m^d_n` for the reverse chain, and the registry that names them.

A draft proposes each reverse step with the target's :math:`\sigma_n` and its own mean; it is
chosen by object, and :func:`get_draft` maps the names ``"frozen"``, ``"gaussian"`` and
``"exact"`` in :data:`DRAFTS` to objects at the edge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

# Absolute imports: pytest (importlib mode) also loads these files as simulators.diffusion.*
from specsampling.simulators.diffusion.process import Array, VPDiffusion


class Draft(Protocol):
    """A draft mean :math:`m^d_n`; ``anchors`` is the last target increment of each row."""

    name: str
    uses_anchor: bool

    def means(self, process: VPDiffusion, states: Array, steps: Array, anchors: Array) -> Array:
        """Draft means at ``states`` (n, dim) for steps (n,)."""
        ...


class FrozenDraft:
    r"""The frozen drift :math:`m^d(y) = y + (m^t(\tilde Y) - \tilde Y)` (training free)."""

    name = "frozen"
    uses_anchor = True

    def means(self, process: VPDiffusion, states: Array, steps: Array, anchors: Array) -> Array:
        return np.asarray(states + anchors)


class GaussianDraft:
    """The exact drift of the moment-matched single Gaussian (no target information)."""

    name = "gaussian"
    uses_anchor = False

    def means(self, process: VPDiffusion, states: Array, steps: Array, anchors: Array) -> Array:
        return process.gaussian_mean(states, steps)


class ExactDraft:
    """The target drift itself, uncounted: an oracle for tests (every draft is accepted)."""

    name = "exact"
    uses_anchor = False

    def means(self, process: VPDiffusion, states: Array, steps: Array, anchors: Array) -> Array:
        return process.target_mean(states, steps)


DRAFTS: Mapping[str, Draft] = {d.name: d for d in (FrozenDraft(), GaussianDraft(), ExactDraft())}


def get_draft(draft: Any) -> Draft:
    """A draft by name (``"frozen"``, ``"gaussian"``, ``"exact"``) or the object itself."""
    if isinstance(draft, str):
        if draft not in DRAFTS:
            raise ValueError(f"draft: unknown draft {draft!r}; choose from {sorted(DRAFTS)}")
        return DRAFTS[draft]
    if not callable(getattr(draft, "means", None)) or not hasattr(draft, "uses_anchor"):
        raise TypeError(f"draft: expected a draft name or object, got {draft!r}")
    return draft  # type: ignore[no-any-return]


__all__ = ["DRAFTS", "Draft", "ExactDraft", "FrozenDraft", "GaussianDraft", "get_draft"]
