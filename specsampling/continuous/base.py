r"""Contract of the continuous (Gaussian-kernel) schemes: result types, noise, the protocol.

A *node* is one denoising step from a verified parent: the target kernel
:math:`P = N(m_t, \sigma^2 I)` and the draft kernel :math:`Q = N(m_d, \sigma^2 I)` (same
:math:`\sigma`), and ``K`` children drafted i.i.d. from :math:`Q` in drafting order. A node scheme
returns either one of the children (accepted) or a state of its own, so that the output is an
exact draw from :math:`P`. A *chain* scheme verifies a drafted chain of ``L`` such steps at once.

The reference implementations consume noise arrays (:class:`NodeNoise`, for a node or a chain;
:data:`ChainNoise` is the same tuple); the public samplers draw them from a
:class:`numpy.random.Generator`.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .frame import Frame

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.intp]


class Verified(NamedTuple):
    """Outcome of verifying a batch of nodes.

    Attributes
    ----------
    states : ndarray, shape (B, dim)
        The committed state of each row, an exact draw from the target kernel; the accepted child
        itself (bitwise) when ``index >= 0``. Same float dtype as the inputs.
    index : ndarray of int, shape (B,)
        Accepted child (drafting order), or ``-1`` when the state came from the residual or the
        reflection.
    """

    states: npt.NDArray[np.floating]
    index: Index  # type: ignore[assignment]  # the contract's name; shadows tuple.index


class BlockVerified(NamedTuple):
    """Outcome of verifying a batch of drafted chains.

    Attributes
    ----------
    num_committed : ndarray of int, shape (B,)
        :math:`\\tau^*`: the drafted states ``children[:, :num_committed]`` are committed.
    states : ndarray, shape (B, dim)
        The one extra state committed after them; a round commits ``num_committed + 1`` states.
    """

    num_committed: Index
    states: npt.NDArray[np.floating]


class NodeNoise(NamedTuple):
    """All randomness of one node or one chain verification, as data.

    A node with ``K`` children and a chain with ``L`` levels use the same three arrays: one
    accept uniform per child (node) or per level (chain), one residual uniform and one Gaussian
    vector per row.

    Attributes
    ----------
    accept : ndarray, shape (B, K) or (B, L)
        Uniforms in [0, 1): one per child (accept tests) or per level, :math:`u_i`
        (reflection) or :math:`\\eta_i` (block).
    residual : ndarray, shape (B,)
        Uniforms in [0, 1) for the inverse-CDF residual draw.
    gaussian : ndarray, shape (B, dim)
        Standard normals: the fresh orthogonal noise of the residual (block), or the target
        sample after a fully accepted chain.
    """

    accept: Array
    residual: Array
    gaussian: Array

    @classmethod
    def draw(cls, rng: np.random.Generator, batch: int, num_drafts: int, dim: int) -> NodeNoise:
        """Draw the noise of ``batch`` rows with ``num_drafts`` children (or chain levels).

        >>> noise = NodeNoise.draw(np.random.default_rng(0), 5, 3, 2)
        >>> noise.accept.shape, noise.residual.shape, noise.gaussian.shape
        ((5, 3), (5,), (5, 2))
        >>> ChainNoise is NodeNoise
        True
        """
        return cls(
            rng.random((batch, num_drafts)), rng.random(batch), rng.standard_normal((batch, dim))
        )


#: The noise of a chain verification: the same tuple as :class:`NodeNoise`, with ``accept`` of
#: shape ``(B, L)`` (one uniform per level). Kept as a name because ``specsampling.continuous``
#: exports it.
ChainNoise = NodeNoise


class NodeOutcome(NamedTuple):
    """What a node scheme decides, in frame coordinates (float64).

    ``child >= 0`` selects that child; otherwise the state is ``frame.reconstruct(s, zperp)``.
    """

    child: Index
    s: Array
    zperp: Array


class ChainLevels(NamedTuple):
    """A drafted chain in frame coordinates.

    Attributes
    ----------
    frames : Frame
        Batch shape ``(B, L)``: level ``i`` (0-based) is the step leaving parent ``i``.
    s : ndarray, shape (B, L)
        :math:`\\hat s_i`, the drafted child of level ``i`` projected in its parent's frame.
    zperp : ndarray, shape (B, L, dim)
        Its orthogonal part.
    final_mean : ndarray, shape (B, dim)
        Target mean at the last drafted state (for the step after a fully accepted chain).
    final_std : ndarray, shape (B,)
        :math:`\\sigma` of that step.
    """

    frames: Frame
    s: Array
    zperp: Array
    final_mean: Array
    final_std: Array


class ChainOutcome(NamedTuple):
    """``num_committed`` drafted levels accepted, then ``state`` (float64, shape (B, dim))."""

    num_committed: Index
    state: Array


@runtime_checkable
class ContinuousScheme(Protocol):
    """What every registered continuous scheme provides."""

    name: str
    #: arXiv id and title.
    reference: str
    #: Largest number of children per node the scheme is exact for (``None``: any).
    max_drafts: int | None

    def acceptance(self, delta: Array, num_drafts: int) -> Array:
        """Exact per-node acceptance, vectorised over ``delta`` (float64, any shape)."""
        ...

    def verify_node(self, frame: Frame, s: Array, zperp: Array, noise: NodeNoise) -> NodeOutcome:
        """Verify ``(B, K)`` projected children ``s``/``zperp`` against ``frame`` (batch (B,))."""
        ...


@runtime_checkable
class ChainScheme(ContinuousScheme, Protocol):
    """A scheme that also verifies a drafted chain of kernels in one round."""

    def verify_chain(self, levels: ChainLevels, noise: NodeNoise) -> ChainOutcome:
        """Verify a batch of drafted chains with explicit noise."""
        ...
