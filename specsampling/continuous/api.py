r"""Public entry points: acceptance, single-node sampling, node and chain verification.

:func:`verify_with_noise` and :func:`verify_chain_with_noise` take the noise as data
(:class:`~specsampling.continuous.base.NodeNoise`); :func:`sample`, :func:`verify`,
:func:`verify_block` and :func:`verify_chain` draw it from a :class:`numpy.random.Generator` and
call them.

Shapes: ``B`` rows (independent nodes or chains, each with its own :math:`\sigma`), ``K``
children per node, ``L`` levels per chain, ``dim`` state dimensions. Means and children may be
any float dtype; :math:`\delta`, :math:`\tau` and the masses are float64, and the returned states
have the dtype of the children (of the means for :func:`sample`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from ..validation import check_positive_int
from ._checks import (
    check_array,
    check_delta,
    check_num_drafts,
    check_rng,
    check_shape,
    check_std,
    state_dtype,
)
from .base import Array, BlockVerified, ChainLevels, ChainScheme, NodeNoise, Verified
from .block import SCHEME as BLOCK
from .frame import Frame
from .reflection import SCHEME as REFLECTION
from .registry import ContinuousSchemeLike, get_scheme


@overload
def acceptance(scheme: ContinuousSchemeLike, delta: float, num_drafts: int = 1) -> float: ...
@overload
def acceptance(
    scheme: ContinuousSchemeLike, delta: npt.NDArray[Any] | Sequence[Any], num_drafts: int = 1
) -> Array: ...
def acceptance(scheme: ContinuousSchemeLike, delta: Any, num_drafts: int = 1) -> float | Array:
    r"""Exact probability that a node outputs one of its drafts.

    .. math::

        \alpha_{\text{reflection}} = \alpha_{\text{block}} = 2\Phi(-\delta/2), \qquad
        \alpha_{\text{dgrs}}(K) = 1 - G_{K+1}.

    Parameters
    ----------
    scheme : str or ContinuousScheme
        ``"reflection"``, ``"dgrs"``, ``"block"`` or a scheme object.
    delta : float or array_like
        Mismatch :math:`\delta = \|m_t - m_d\|/\sigma \ge 0`.
    num_drafts : int, default 1
        ``K`` children per node; reflection and block take exactly one.

    Returns
    -------
    float or ndarray
        A float for a scalar ``delta``, else an array of ``delta``'s shape. Degenerate
        :math:`\delta \le 10^{-10}` gives 1 (those nodes accept unconditionally).

    Examples
    --------
    >>> round(acceptance("reflection", 2.824), 4)
    0.1579
    >>> acceptance("dgrs", [0.25, 0.5], num_drafts=8).round(4)
    array([0.9807, 0.9521])
    """
    resolved = get_scheme(scheme)
    k = check_num_drafts(resolved, num_drafts)
    arr = check_delta(delta)
    out = np.asarray(resolved.acceptance(arr.reshape(-1), k), dtype=np.float64).reshape(arr.shape)
    return float(out) if arr.ndim == 0 else out


def sample(
    scheme: ContinuousSchemeLike,
    target_mean: Any,
    draft_mean: Any,
    std: Any,
    num_drafts: int,
    rng: np.random.Generator,
    size: int,
) -> Verified:
    r"""Draft and verify ``size`` independent nodes: each output is a draw from the target.

    Each row drafts ``num_drafts`` children i.i.d. from :math:`N(m_d, \sigma^2 I)` (in drafting
    order) and verifies them against :math:`N(m_t, \sigma^2 I)`.

    Parameters
    ----------
    scheme : str or ContinuousScheme
    target_mean, draft_mean : array_like, shape (dim,) or (size, dim)
        :math:`m_t` and :math:`m_d`, shared by every row or per row.
    std : float or array_like, shape (size,)
        :math:`\sigma > 0`.
    num_drafts : int
        ``K >= 1`` (1 for reflection and block).
    rng : numpy.random.Generator
    size : int
        Number of independent nodes.

    Returns
    -------
    Verified
        ``states`` of shape ``(size, dim)`` (the means' float dtype) and ``index`` of shape
        ``(size,)``: the accepted child, or -1.

    Examples
    --------
    >>> import numpy as np
    >>> out = sample("dgrs", [1.0, 0.0], [0.0, 0.0], 1.0, 4, np.random.default_rng(0), 50_000)
    >>> out.states.shape, round(float(np.mean(out.index >= 0)), 2)
    ((50000, 2), 0.8)
    """
    resolved = get_scheme(scheme)
    k = check_num_drafts(resolved, num_drafts)
    n = check_positive_int(size, "size")
    rng = check_rng(rng)
    target = _means(target_mean, "target_mean", n)
    draft = _means(draft_mean, "draft_mean", n, target.shape[1])
    sigma = check_std(std, (n,))
    dtype = state_dtype(target, draft)
    noise = rng.standard_normal((n, k, target.shape[1]))
    children = (draft[:, None, :] + sigma[:, None, None] * noise).astype(dtype)
    return verify_with_noise(
        resolved, target, draft, sigma, children, NodeNoise.draw(rng, n, k, target.shape[1])
    )


def verify(
    scheme: ContinuousSchemeLike,
    target_mean: Any,
    draft_mean: Any,
    std: Any,
    children: Any,
    rng: np.random.Generator,
) -> Verified:
    r"""Verify a batch of drafted nodes: one exact target draw per row.

    Row ``b`` has target kernel :math:`N(m_t^{(b)}, \sigma_b^2 I)`, draft kernel
    :math:`N(m_d^{(b)}, \sigma_b^2 I)` and ``K`` children drafted i.i.d. from the draft kernel.

    Parameters
    ----------
    scheme : str or ContinuousScheme
        ``"dgrs"`` takes any ``K >= 1``; ``"reflection"`` and ``"block"`` take ``K = 1``.
    target_mean, draft_mean : array_like, shape (B, dim)
        Per-row means (a ``(dim,)`` vector is shared by every row).
    std : float or array_like, shape (B,)
        :math:`\sigma_b > 0`.
    children : array_like, shape (B, K, dim)
        The drafted children, in drafting order.
    rng : numpy.random.Generator

    Returns
    -------
    Verified
        ``states`` (B, dim) in the children's dtype and ``index`` (B,) in ``{-1, 0..K-1}``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> target, draft = np.array([[0.5, 0.0]]), np.zeros((1, 2))
    >>> children = draft[:, None, :] + rng.standard_normal((1, 3, 2))
    >>> out = verify("dgrs", target, draft, 1.0, children, rng)
    >>> out.states.shape, out.index.shape
    ((1, 2), (1,))
    """
    rng = check_rng(rng)
    resolved = get_scheme(scheme)
    kids = check_array(children, "children", 3)
    batch, k, dim = kids.shape
    noise = NodeNoise.draw(rng, batch, check_num_drafts(resolved, k), dim)
    return verify_with_noise(resolved, target_mean, draft_mean, std, kids, noise)


def verify_block(
    target_means: Any, draft_means: Any, std: Any, children: Any, rng: np.random.Generator
) -> BlockVerified:
    r"""Block verification of a batch of drafted chains (Soen et al., arXiv 2606.13426;
    ``docs/continuous/block.md``).

    Parameters
    ----------
    target_means : array_like, shape (B, L + 1, dim)
        Target means at the parents :math:`y_0, \tilde Y_1, \dots, \tilde Y_L`.
    draft_means : array_like, shape (B, L, dim)
        Draft means at :math:`y_0, \dots, \tilde Y_{L-1}`.
    std : float or array_like, shape (B, L + 1)
        :math:`\sigma` of the step leaving each parent.
    children : array_like, shape (B, L, dim)
        The drafted chain :math:`\tilde Y_1, \dots, \tilde Y_L`.
    rng : numpy.random.Generator

    Returns
    -------
    BlockVerified
        ``num_committed`` (B,) :math:`= \tau^*` and ``states`` (B, dim), the extra state.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> y0 = np.zeros((4, 1, 2))
    >>> chain = y0 + rng.standard_normal((4, 2, 2)).cumsum(axis=1)
    >>> parents = np.concatenate([y0, chain], axis=1)
    >>> out = verify_block(parents + 0.3, parents[:, :2], 1.0, chain, rng)
    >>> out.num_committed.shape, out.states.shape
    ((4,), (4, 2))
    """
    return verify_chain_with_noise(
        BLOCK, target_means, draft_means, std, children, _chain_noise(rng, children)
    )


def verify_chain(
    target_means: Any, draft_means: Any, std: Any, children: Any, rng: np.random.Generator
) -> BlockVerified:
    r"""Reflection-coupling verification of drafted chains (De Bortoli et al., arXiv 2501.05370),
    same shapes as :func:`verify_block`.

    Levels are verified in order with the reflection coupling; at the first rejection the
    reflected state is the extra state, and a fully accepted chain adds a target sample.

    Returns
    -------
    BlockVerified
        ``num_committed`` (accepted levels) and the extra state.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> y0 = np.zeros((4, 1, 2))
    >>> chain = y0 + rng.standard_normal((4, 2, 2)).cumsum(axis=1)
    >>> parents = np.concatenate([y0, chain], axis=1)
    >>> verify_chain(parents, parents[:, :2], 1.0, chain, rng).num_committed  # draft == target
    array([2, 2, 2, 2])
    """
    return verify_chain_with_noise(
        REFLECTION, target_means, draft_means, std, children, _chain_noise(rng, children)
    )


# --- explicit-noise entry points: the reference a lowering and boundary-noise tests call -----


def verify_with_noise(
    scheme: ContinuousSchemeLike,
    target_mean: Any,
    draft_mean: Any,
    std: Any,
    children: Any,
    noise: NodeNoise,
) -> Verified:
    r""":func:`verify` with all of its randomness passed in as a :class:`NodeNoise`.

    The same inputs and the same noise give the same states and indices, bit for bit: this is
    the seam that ties a lowering (or a boundary-noise test) to the reference.

    Parameters
    ----------
    scheme : str or ContinuousScheme
        ``"dgrs"`` takes any ``K >= 1``; ``"reflection"`` and ``"block"`` take ``K = 1``.
    target_mean, draft_mean : array_like, shape (B, dim)
        Per-row means (a ``(dim,)`` vector is shared by every row).
    std : float or array_like, shape (B,)
        :math:`\sigma_b > 0`.
    children : array_like, shape (B, K, dim)
        The drafted children, in drafting order.
    noise : NodeNoise
        ``accept`` (B, K) and ``residual`` (B,) uniforms in [0, 1), ``gaussian`` (B, dim)
        standard normals.

    Returns
    -------
    Verified
        ``states`` (B, dim) in the children's dtype and ``index`` (B,) in ``{-1, 0..K-1}``.

    Examples
    --------
    A child at :math:`s = -3` from the draft mean, :math:`\delta = 1`: its likelihood ratio is
    :math:`e^{-3.5} \approx 0.030`, so block accepts it at :math:`u = 0.01` and not at
    :math:`u = 0.5`, where the residual at :math:`u = 0` is its threshold :math:`\delta/2`
    (with the fresh orthogonal noise 0).

    >>> import numpy as np
    >>> target, draft = np.array([1.0, 0.0]), np.array([0.0, 0.0])
    >>> children = np.array([[[-3.0, 0.5]], [[-3.0, 0.5]]])
    >>> noise = NodeNoise(np.array([[0.01], [0.5]]), np.zeros(2), np.zeros((2, 2)))
    >>> out = verify_with_noise("block", target, draft, 1.0, children, noise)
    >>> out.index
    array([ 0, -1])
    >>> out.states
    array([[-3. ,  0.5],
           [ 0.5,  0. ]])
    """
    resolved = get_scheme(scheme)
    kids = check_array(children, "children", 3)
    batch, k, dim = kids.shape
    check_num_drafts(resolved, k)
    target = _means(target_mean, "target_mean", batch, dim)
    draft = _means(draft_mean, "draft_mean", batch, dim)
    frame = Frame.of(target, draft, check_std(std, (batch,)))
    s, zperp = frame.project(kids)
    outcome = resolved.verify_node(frame, s, zperp, _check_noise(noise, batch, k, dim))
    states = frame.reconstruct(outcome.s, outcome.zperp).astype(kids.dtype)
    accepted = np.flatnonzero(outcome.child >= 0)
    states[accepted] = kids[accepted, outcome.child[accepted]]
    return Verified(states, outcome.child)


def verify_chain_with_noise(
    scheme: ContinuousSchemeLike,
    target_means: Any,
    draft_means: Any,
    std: Any,
    children: Any,
    noise: NodeNoise,
) -> BlockVerified:
    r"""Chain verification (:func:`verify_block`, :func:`verify_chain`) with explicit noise.

    Parameters
    ----------
    scheme : str or ChainScheme
        ``"block"`` (as :func:`verify_block`), ``"reflection"`` (as :func:`verify_chain`), or a
        chain scheme object.
    target_means : array_like, shape (B, L + 1, dim)
        Target means at the parents :math:`y_0, \tilde Y_1, \dots, \tilde Y_L`.
    draft_means : array_like, shape (B, L, dim)
        Draft means at :math:`y_0, \dots, \tilde Y_{L-1}`.
    std : float or array_like, shape (B, L + 1)
        :math:`\sigma` of the step leaving each parent.
    children : array_like, shape (B, L, dim)
        The drafted chain :math:`\tilde Y_1, \dots, \tilde Y_L`.
    noise : NodeNoise
        ``accept`` (B, L) uniforms (one per level), ``residual`` (B,) uniforms, ``gaussian``
        (B, dim) standard normals (the target sample after a fully accepted chain, or the
        residual's fresh orthogonal noise).

    Returns
    -------
    BlockVerified
        ``num_committed`` (B,) and ``states`` (B, dim), the extra state, in the children's dtype.

    Examples
    --------
    Where the draft kernels equal the target kernels every level is accepted, and the extra
    state is the target sample ``target_means[:, L] + std * gaussian``.

    >>> import numpy as np
    >>> chain = np.array([[[0.5, 0.0], [1.0, 1.0]]])
    >>> parents = np.concatenate([np.zeros((1, 1, 2)), chain], axis=1)
    >>> noise = NodeNoise(np.full((1, 2), 0.9), np.zeros(1), np.array([[1.0, -1.0]]))
    >>> out = verify_chain_with_noise("block", parents, parents[:, :2], 1.0, chain, noise)
    >>> out.num_committed, out.states
    (array([2]), array([[2., 0.]]))
    """
    resolved = get_scheme(scheme)
    if not isinstance(resolved, ChainScheme):
        raise TypeError(
            f"scheme: {resolved.name!r} verifies single nodes, not chains "
            "(use 'block' or 'reflection')"
        )
    kids = check_array(children, "children", 3)
    batch, length, dim = kids.shape
    target = check_array(target_means, "target_means", 3)
    check_shape(target, "target_means", (batch, length + 1, dim))
    draft = check_array(draft_means, "draft_means", 3)
    check_shape(draft, "draft_means", (batch, length, dim))
    sigma = check_std(std, (batch, length + 1))
    frames = Frame.of(target[:, :length], draft, sigma[:, :length])
    s, zperp = frames.project(kids)
    levels = ChainLevels(frames, s, zperp, target[:, length].astype(np.float64), sigma[:, length])
    outcome = resolved.verify_chain(levels, _check_noise(noise, batch, length, dim))
    return BlockVerified(outcome.num_committed, outcome.state.astype(kids.dtype))


def _chain_noise(rng: Any, children: Any) -> NodeNoise:
    shape = check_array(children, "children", 3).shape
    return NodeNoise.draw(check_rng(rng), *shape)


def _check_noise(noise: Any, batch: int, width: int, dim: int) -> NodeNoise:
    """``noise`` is a :class:`NodeNoise` of ``batch`` rows, ``width`` accept uniforms each."""
    if not isinstance(noise, NodeNoise):
        raise TypeError(f"noise: expected a NodeNoise, got {type(noise).__name__}")
    for name, shape in (
        ("accept", (batch, width)),
        ("residual", (batch,)),
        ("gaussian", (batch, dim)),
    ):
        if np.shape(getattr(noise, name)) != shape:
            raise ValueError(
                f"noise.{name}: expected shape {shape}, got {np.shape(getattr(noise, name))}"
            )
    return noise


def _means(value: Any, name: str, rows: int, dim: int | None = None) -> npt.NDArray[Any]:
    """Means of shape ``(rows, dim)``; a ``(dim,)`` vector is shared by every row.

    ``dim=None`` takes the width of ``value``.
    """
    arr = np.asarray(value)
    arr = check_array(arr, name, arr.ndim if arr.ndim in (1, 2) else 2)
    width = arr.shape[-1] if dim is None else dim
    if arr.shape not in ((width,), (rows, width)):
        raise ValueError(f"{name}: expected shape ({width},) or ({rows}, {width}), got {arr.shape}")
    return arr if arr.ndim == 2 else np.broadcast_to(arr, (rows, width))
