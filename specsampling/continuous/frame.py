r"""The rank-1 Gaussian frame of a draft/target kernel pair.

As in Bullo et al.'s code, ``marcellobullo/tree-specdiff`` (arXiv 2609.17691).

Both kernels are isotropic Gaussians with the same scale: the draft :math:`Q = N(m_d, \sigma^2 I)`
and the target :math:`P = N(m_t, \sigma^2 I)`. They differ only along the unit vector
:math:`e = (m_t - m_d)/\|m_t - m_d\|`, so a state :math:`y` splits into a scalar coordinate along
:math:`e` and an orthogonal remainder, both measured from the draft mean in units of
:math:`\sigma`:

.. math::

    \delta = \frac{\|m_t - m_d\|}{\sigma}, \qquad
    s = \frac{e \cdot (y - m_d)}{\sigma}, \qquad
    z_\perp = \frac{y - m_d}{\sigma} - s\, e, \qquad
    y = m_d + \sigma (s\, e + z_\perp).

Under the draft :math:`s \sim N(0, 1)`, under the target :math:`s \sim N(\delta, 1)`, and
:math:`z_\perp` is a standard Gaussian on :math:`e^\perp` under both, independent of :math:`s`.
The likelihood ratio (target over draft) is
:math:`\rho(s) = \varphi(s - \delta)/\varphi(s) = \exp(\delta (s - \delta/2))`; the densities are
never formed. Everything here is float64 whatever the dtype of the states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr

Array = npt.NDArray[np.float64]

#: Mismatches :math:`\delta \le` this are degenerate: every scheme accepts the (first) child.
DEGENERATE_DELTA = 1e-10


def maximal_coupling_acceptance(delta: Any) -> Any:
    r"""One draft, maximal coupling: :math:`1 - \mathrm{TV} = 2\Phi(-\delta/2)`; 1 on
    degenerate :math:`\delta \le 10^{-10}` (accepted unconditionally).

    >>> round(float(maximal_coupling_acceptance(1.0)), 4)
    0.6171
    """
    delta = np.asarray(delta, dtype=np.float64)
    return np.where(delta <= DEGENERATE_DELTA, 1.0, 2.0 * ndtr(-delta / 2))


@dataclass(frozen=True)
class Frame:
    r"""Rank-1 frame of a batch of kernel pairs; leading shape ``batch`` (often ``(B,)``).

    Attributes
    ----------
    delta : ndarray, shape batch
        :math:`\delta = \|m_t - m_d\|/\sigma` (float64).
    direction : ndarray, shape batch + (dim,)
        The unit vector :math:`e`; the first basis vector where :math:`m_t = m_d`.
    draft_mean : ndarray, shape batch + (dim,)
        :math:`m_d` (float64).
    std : ndarray, shape batch
        :math:`\sigma > 0` (float64).

    Examples
    --------
    >>> import numpy as np
    >>> frame = Frame.of(np.array([[3.0, 4.0]]), np.zeros((1, 2)), np.array([2.5]))
    >>> frame.delta
    array([2.])
    >>> s, zperp = frame.project(np.array([[3.0, 4.0]]))
    >>> s, zperp
    (array([2.]), array([[0., 0.]]))
    >>> frame.reconstruct(s, zperp)
    array([[3., 4.]])
    """

    delta: Array
    direction: Array
    draft_mean: Array
    std: Array

    @classmethod
    def of(cls, target_mean: Any, draft_mean: Any, std: Any) -> Frame:
        r"""Frame of :math:`N(m_t, \sigma^2 I)` against :math:`N(m_d, \sigma^2 I)`.

        Parameters
        ----------
        target_mean, draft_mean : array_like, shape batch + (dim,)
            :math:`m_t` and :math:`m_d`; cast to float64 before subtracting.
        std : array_like, shape batch
            :math:`\sigma`, positive (not checked here; the public entry points check it).

        Returns
        -------
        Frame
        """
        target = np.asarray(target_mean, dtype=np.float64)
        draft = np.asarray(draft_mean, dtype=np.float64)
        sigma = np.asarray(std, dtype=np.float64)
        diff = target - draft
        norm = np.linalg.norm(diff, axis=-1)
        fallback = np.zeros_like(diff)
        fallback[..., 0] = 1.0
        safe = np.where(norm > 0, norm, 1.0)[..., None]
        direction = np.where(norm[..., None] > 0, diff / safe, fallback)
        return cls(norm / sigma, direction, draft, sigma)

    @property
    def degenerate(self) -> npt.NDArray[np.bool_]:
        r"""Rows with :math:`\delta \le 10^{-10}` (accept unconditionally; no :math:`\tau`)."""
        return np.asarray(self.delta <= DEGENERATE_DELTA)

    def log_ratio(self, s: Array) -> Array:
        r""":math:`\log\rho(s) = \delta(s - \delta/2)`, 0 on degenerate rows.

        ``s`` has shape batch or batch + (K,).
        """
        delta = _expand(self.delta, s.ndim)
        return np.where(_expand(self.degenerate, s.ndim), 0.0, delta * (s - delta / 2))

    def project(self, y: Any) -> tuple[Array, Array]:
        r"""Coordinates :math:`(s, z_\perp)` of states ``y``.

        Parameters
        ----------
        y : array_like, shape batch + (dim,) or batch + (K, dim)
            States (any float dtype); a ``K`` axis holds several children of each parent.

        Returns
        -------
        s : ndarray, shape batch or batch + (K,)
        zperp : ndarray, same shape as ``y``
        """
        y = np.asarray(y, dtype=np.float64)
        extra = y.ndim - self.draft_mean.ndim
        mean = _expand_vec(self.draft_mean, extra)
        direction = _expand_vec(self.direction, extra)
        scaled = (y - mean) / _expand(self.std, y.ndim - 1)[..., None]
        s: Array = np.einsum("...d,...d->...", scaled, direction)
        return s, scaled - s[..., None] * direction

    def reconstruct(self, s: Any, zperp: Any) -> Array:
        r"""The state :math:`m_d + \sigma(s\, e + z_\perp)`.

        Parameters
        ----------
        s : array_like, shape batch
        zperp : array_like, shape batch + (dim,)

        Returns
        -------
        ndarray, shape batch + (dim,), float64
        """
        s = np.asarray(s, dtype=np.float64)
        zperp = np.asarray(zperp, dtype=np.float64)
        out: Array = self.draft_mean + self.std[..., None] * (s[..., None] * self.direction + zperp)
        return out

    def orthogonal(self, gaussian: Any) -> Array:
        r"""A fresh :math:`z_\perp`: Gaussians ``(batch, dim)`` projected on :math:`e^\perp`."""
        g = np.asarray(gaussian, dtype=np.float64)
        along: Array = np.einsum("...d,...d->...", g, self.direction)
        return g - along[..., None] * self.direction

    def select(
        self, level: npt.NDArray[np.intp], rows: npt.NDArray[np.intp] | None = None
    ) -> Frame:
        """The frames at ``[rows[j], level[j]]`` of a ``(B, L)`` batch (``rows`` default: all)."""
        if rows is None:
            rows = np.arange(level.shape[0])
        return Frame(
            self.delta[rows, level],
            self.direction[rows, level],
            self.draft_mean[rows, level],
            self.std[rows, level],
        )


def _expand(a: Any, ndim: int) -> Any:
    """Append singleton axes to ``a`` up to ``ndim`` dimensions (broadcast over children)."""
    a = np.asarray(a)
    return a.reshape(a.shape + (1,) * (ndim - a.ndim))


def _expand_vec(a: Array, extra: int) -> Array:
    """Insert ``extra`` singleton axes before the last (vector) axis of ``a``."""
    return a.reshape(a.shape[:-1] + (1,) * extra + a.shape[-1:])
