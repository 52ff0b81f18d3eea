r"""The data law and the process: a Gaussian mixture and the VP diffusion it starts.

:class:`GaussianMixture` is the data law :math:`\pi_0`; :class:`VPDiffusion` is the VP forward
process from it, with every marginal and score in closed form, and the Euler-Maruyama reverse
chain whose mean :meth:`VPDiffusion.target_mean` is the one target call speculative sampling
counts. The model and its formulas are stated in the package docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specsampling.validation import check_positive_int

Array = np.ndarray

# ------------------------------------------------------------------------- the data law


def _check_finite_array(value: Any, name: str, ndim: int) -> Array:
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: not numeric ({err})") from None
    if arr.ndim != ndim or arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty {ndim}-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: NaN or inf entries")
    return arr


def _check_positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a positive finite number, got {value}")
    return float(value)


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def _component_logits(
    points: Array, means: Array, log_weights: Array, scale: Array, var: Array
) -> tuple[Array, Array]:
    """``log w_m + log N(x; scale * mu_m, var I)`` up to the shared constant, shape (n, M)."""
    centres = scale[:, None, None] * means[None]  # (n, M, d)
    squared = ((points[:, None, :] - centres) ** 2).sum(axis=-1)
    return log_weights[None] - 0.5 * squared / var[:, None], centres


def _mixture_score(
    points: Array, means: Array, log_weights: Array, scale: Array, var: Array
) -> Array:
    """The mixture score with per-row scale and variance."""
    logits, centres = _component_logits(points, means, log_weights, scale, var)
    logits -= logits.max(axis=1, keepdims=True)
    resp = np.exp(logits)
    resp /= resp.sum(axis=1, keepdims=True)
    pulled = np.einsum("nm,nmd->nd", resp, centres)
    return np.asarray((pulled - points) / var[:, None])


@dataclass(frozen=True, eq=False)
class GaussianMixture:
    r"""An isotropic Gaussian mixture :math:`\sum_m w_m N(\mu_m, s^2 I)`.

    Parameters
    ----------
    means : array_like, shape (num_components, dim)
        Component means.
    weights : array_like, shape (num_components,)
        Non-negative weights summing to one (tolerance 1e-6; renormalised).
    std : float
        The common component standard deviation ``s > 0``.

    Examples
    --------
    >>> import numpy as np
    >>> data = GaussianMixture([[-1.0], [1.0]], [0.5, 0.5], std=0.5)
    >>> data.dim, data.num_components
    (1, 2)
    >>> float(data.score(np.zeros((1, 1)))[0, 0])  # symmetric: no pull at the centre
    0.0
    >>> round(float(data.covariance()[0, 0]), 4)  # 1 + 0.5 ** 2
    1.25
    """

    means: Array
    weights: Array
    std: float

    def __post_init__(self) -> None:
        means = _check_finite_array(self.means, "means", ndim=2)
        weights = _check_finite_array(self.weights, "weights", ndim=1)
        if weights.shape[0] != means.shape[0]:
            raise ValueError(
                f"weights: {weights.shape[0]} weights for {means.shape[0]} component means"
            )
        if np.any(weights < 0):
            raise ValueError("weights: negative entry")
        if abs(weights.sum() - 1.0) > 1e-6:
            raise ValueError(f"weights: mass is {weights.sum():.6g}, not 1 (tolerance 1e-06)")
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "weights", weights / weights.sum())
        object.__setattr__(self, "std", _check_positive(self.std, "std"))

    @property
    def dim(self) -> int:
        """Dimension d of the data."""
        return int(self.means.shape[1])

    @property
    def num_components(self) -> int:
        """Number of mixture components."""
        return int(self.means.shape[0])

    def _points(self, points: Any) -> Array:
        arr = _check_finite_array(points, "points", ndim=2)
        if arr.shape[1] != self.dim:
            raise ValueError(f"points: expected shape (n, {self.dim}), got {arr.shape}")
        return arr

    def log_density(self, points: Any) -> Array:
        """Log-density at ``points`` of shape ``(n, dim)``; returns shape ``(n,)``."""
        x = self._points(points)
        ones = np.ones(x.shape[0])
        with np.errstate(divide="ignore"):
            log_weights = np.log(self.weights)
        logits, _ = _component_logits(x, self.means, log_weights, ones, ones * self.std**2)
        top = logits.max(axis=1)
        total = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        return np.asarray(total - 0.5 * self.dim * np.log(2 * np.pi * self.std**2))

    def score(self, points: Any) -> Array:
        r"""Score :math:`\nabla \log \pi(y)` at ``points`` of shape ``(n, dim)``."""
        x = self._points(points)
        ones = np.ones(x.shape[0])
        with np.errstate(divide="ignore"):
            log_weights = np.log(self.weights)
        return _mixture_score(x, self.means, log_weights, ones, ones * self.std**2)

    def sample(self, num_samples: int, rng: np.random.Generator) -> Array:
        """``num_samples`` i.i.d. draws, shape ``(num_samples, dim)``."""
        n = check_positive_int(num_samples, "num_samples")
        rng = _check_rng(rng)
        labels = rng.choice(self.num_components, size=n, p=self.weights)
        return np.asarray(self.means[labels] + self.std * rng.standard_normal((n, self.dim)))

    def mean(self) -> Array:
        """Mean of the mixture, shape ``(dim,)``."""
        return np.asarray(self.weights @ self.means)

    def covariance(self) -> Array:
        """Covariance of the mixture, shape ``(dim, dim)``."""
        centred = self.means - self.mean()
        spread = (self.weights[:, None] * centred).T @ centred
        return np.asarray(spread + self.std**2 * np.eye(self.dim))


# ------------------------------------------------------------------------- the process


@dataclass(frozen=True, eq=False)
class VPDiffusion:
    r"""The VP forward process from a :class:`GaussianMixture` and its Euler-Maruyama reverse.

    Parameters
    ----------
    data : GaussianMixture
        The data law :math:`\pi_0`.
    num_steps : int
        N, the number of reverse steps from ``t = 1`` to ``t_min``.
    beta_min, beta_max : float
        The linear noise schedule :math:`\beta(t)`; ``0 < beta_min <= beta_max``.
    t_min : float
        Last time of the grid, in ``(0, 1)``.

    Attributes
    ----------
    times : ndarray, shape (num_steps + 1,)
        :math:`t_0 = 1 > t_1 > \dots > t_N = t_{\min}`.
    step_size : float
        :math:`\gamma = (1 - t_{\min}) / N`.
    stds : ndarray, shape (num_steps,)
        :math:`\sigma_n = \sqrt{\gamma \beta(t_n)}`, all positive.

    Examples
    --------
    >>> import numpy as np
    >>> data = GaussianMixture([[-2.0, 0.0], [2.0, 0.0]], [0.3, 0.7], std=0.3)
    >>> process = VPDiffusion(data, num_steps=50)
    >>> round(process.marginal(0.0).std, 12)  # time 0 is the data law
    0.3
    >>> round(process.marginal(1.0).std, 3)  # nearly pure noise at t = 1
    1.0
    >>> process.target_mean(np.zeros((3, 2)), np.array([0, 10, 49])).shape
    (3, 2)
    """

    data: GaussianMixture
    num_steps: int
    beta_min: float = 0.1
    beta_max: float = 20.0
    t_min: float = 1e-3
    times: Array = field(init=False, repr=False)
    step_size: float = field(init=False, repr=False)
    stds: Array = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.data, GaussianMixture):
            raise TypeError(f"data: expected a GaussianMixture, got {type(self.data).__name__}")
        n = check_positive_int(self.num_steps, "num_steps")
        low = _check_positive(self.beta_min, "beta_min")
        high = _check_positive(self.beta_max, "beta_max")
        if high < low:
            raise ValueError(f"beta_max: {high} is below beta_min {low}")
        t_min = _check_positive(self.t_min, "t_min")
        if t_min >= 1:
            raise ValueError(f"t_min: expected a time in (0, 1), got {t_min}")
        step = (1.0 - t_min) / n
        times = 1.0 - step * np.arange(n + 1)
        for name, value in [("num_steps", n), ("beta_min", low), ("beta_max", high)]:
            object.__setattr__(self, name, value)
        object.__setattr__(self, "t_min", t_min)
        object.__setattr__(self, "times", times)
        object.__setattr__(self, "step_size", step)
        object.__setattr__(self, "stds", np.sqrt(step * self.beta(times[:-1])))

    def beta(self, t: Any) -> Array:
        r""":math:`\beta(t) = \beta_{\min} + t(\beta_{\max} - \beta_{\min})`."""
        return np.asarray(
            self.beta_min + np.asarray(t, dtype=np.float64) * (self.beta_max - self.beta_min)
        )

    def alpha(self, t: Any) -> Array:
        r""":math:`\alpha_t = \exp(-\tfrac12 \int_0^t \beta)`, the signal scale at time t."""
        t = np.asarray(t, dtype=np.float64)
        return np.asarray(
            np.exp(-0.5 * (self.beta_min * t + 0.5 * (self.beta_max - self.beta_min) * t**2))
        )

    def _scale_var(self, t: Array) -> tuple[Array, Array]:
        scale = self.alpha(t)
        return scale, scale**2 * self.data.std**2 + 1.0 - scale**2

    def marginal(self, t: float) -> GaussianMixture:
        """The law of the forward process at time ``t``: a Gaussian mixture again."""
        scale, var = self._scale_var(np.asarray(float(t)))
        return GaussianMixture(scale * self.data.means, self.data.weights, float(np.sqrt(var)))

    def forward_sample(self, points: Any, t: float, rng: np.random.Generator) -> Array:
        r"""Run the forward process from ``points`` (n, dim) to time ``t``.

        Returns :math:`\alpha_t x + \sqrt{1 - \alpha_t^2}\,\varepsilon`, shape ``(n, dim)``.
        """
        x = self.data._points(points)
        scale = float(self.alpha(t))
        noise = _check_rng(rng).standard_normal(x.shape)
        return np.asarray(scale * x + np.sqrt(1.0 - scale**2) * noise)

    def score(self, points: Any, t: Any) -> Array:
        r"""The exact score :math:`\nabla \log \pi_t`; ``t`` is a scalar or one time per row."""
        x = self.data._points(points)
        times = np.broadcast_to(np.asarray(t, dtype=np.float64), (x.shape[0],))
        scale, var = self._scale_var(times)
        with np.errstate(divide="ignore"):
            log_weights = np.log(self.data.weights)
        return _mixture_score(x, self.data.means, log_weights, scale, var)

    def _steps(self, steps: Any, size: int) -> Array:
        idx = np.broadcast_to(np.asarray(steps), (size,))
        if idx.dtype.kind not in "iu" or np.any(idx < 0) or np.any(idx >= self.num_steps):
            raise ValueError(f"steps: expected integer steps in [0, {self.num_steps})")
        return idx

    def target_mean(self, states: Any, steps: Any) -> Array:
        r"""The target mean, the one expensive call that speculative sampling counts.

        .. math::

            m^t_n(y) = y + \gamma \beta(t_n)\bigl(\tfrac12 y + \nabla \log \pi_{t_n}(y)\bigr)

        ``states`` has shape ``(n, dim)``; ``steps`` holds one step index per row (or one for
        all); returns shape ``(n, dim)``.
        """
        x = self.data._points(states)
        t = self.times[self._steps(steps, x.shape[0])]
        beta = self.beta(t)[:, None]
        return np.asarray(x + self.step_size * beta * (0.5 * x + self.score(x, t)))

    def gaussian_mean(self, states: Any, steps: Any) -> Array:
        """The Euler-Maruyama mean of the moment-matched single-Gaussian data law (linear drift)."""
        x = self.data._points(states)
        t = self.times[self._steps(steps, x.shape[0])]
        eigvals, eigvecs = np.linalg.eigh(self.data.covariance())
        scale = self.alpha(t)[:, None]
        centred = (x - scale * self.data.mean()) @ eigvecs
        score = -(centred / (scale**2 * eigvals + 1.0 - scale**2)) @ eigvecs.T
        beta = self.beta(t)[:, None]
        return np.asarray(x + self.step_size * beta * (0.5 * x + score))

    def prior_sample(self, num_samples: int, rng: np.random.Generator) -> Array:
        """Initial states :math:`Y_0 \\sim N(0, I)`, shape ``(num_samples, dim)``."""
        n = check_positive_int(num_samples, "num_samples")
        return np.asarray(_check_rng(rng).standard_normal((n, self.data.dim)))


__all__ = ["Array", "GaussianMixture", "VPDiffusion"]
