r"""Toy diffusion models with an exact drift, and end-to-end speculative samplers for them.

The data law is a Gaussian mixture :math:`\pi_0 = \sum_m w_m N(\mu_m, s^2 I)` in a few
dimensions. The forward process is the variance-preserving (VP, Ornstein-Uhlenbeck) SDE
:math:`dX = -\tfrac12 \beta(t) X\,dt + \sqrt{\beta(t)}\,dW` on :math:`[0, 1]` with the linear
schedule :math:`\beta(t) = \beta_{\min} + t(\beta_{\max} - \beta_{\min})`. Given :math:`X_0`,
:math:`X_t = \alpha_t X_0 + \sqrt{1 - \alpha_t^2}\,\varepsilon` with
:math:`\alpha_t = \exp(-\tfrac12 \int_0^t \beta)`, so every marginal is again a Gaussian
mixture, with means :math:`\alpha_t \mu_m` and isotropic variance
:math:`s_t^2 = \alpha_t^2 s^2 + 1 - \alpha_t^2`, and its score is exact in closed form:

.. math::

    \nabla \log \pi_t(y) = \sum_m r_m(y, t)\,\frac{\alpha_t \mu_m - y}{s_t^2},
    \qquad r_m \propto w_m N(y; \alpha_t \mu_m, s_t^2 I).

Sampling runs the reverse-time SDE, discretised by Euler-Maruyama on the uniform grid
:math:`t_n = 1 - n\gamma`, :math:`\gamma = (1 - t_{\min})/N`, from :math:`Y_0 \sim N(0, I)`.
Step :math:`n` is the Gaussian kernel (P = target)

.. math::

    P_n(\cdot \mid y) = N\bigl(m^t_n(y), \sigma_n^2 I\bigr), \quad
    m^t_n(y) = y + \gamma\, b^t(y, t_n), \quad
    b^t(y, t) = \beta(t)\bigl(\tfrac12 y + \nabla \log \pi_t(y)\bigr), \quad
    \sigma_n = \sqrt{\gamma \beta(t_n)} > 0,

so every step can be speculated (no deterministic last step). A draft Q_n has the same
:math:`\sigma_n` and its own mean :math:`m^d_n`:

* ``"frozen"`` (:class:`FrozenDraft`, De Bortoli et al. 2025, training free):
  :math:`m^d(y) = y + (m^t(\tilde Y) - \tilde Y)`, the target increment last computed at a
  verified state :math:`\tilde Y` (the parent of the last committed state), reused as is
  (root-drift prefetching: no target call beyond the verification pass; one warm-up pass at
  :math:`n = 0`, which is the first plain step);
* ``"gaussian"`` (:class:`GaussianDraft`): the exact reverse drift of the single Gaussian
  moment-matched to the data mixture (a linear drift, no target call at all);
* ``"exact"`` (:class:`ExactDraft`): the target itself, an oracle for tests (every draft is
  accepted).

One speculative **round** drafts a chain (:func:`reflection_chain`, :func:`block_chain`) or a
tree (:func:`dgrs_tree`) from the committed state, makes **one** target pass (one batched
network call, one NFE) over every node that needs the target mean, and verifies with
:mod:`specsampling.continuous`. A chain of length L evaluates L + 1 rows and commits up to L + 1
states; a uniform tree of K children per node and depth L evaluates its
:math:`1 + K + \dots + K^{L-1}` internal nodes and commits up to L states (the walk stops at a
leaf). Near the horizon the lookahead is truncated. Plain sampling makes N target passes.
The samplers return a :class:`Run` with the final states and, per sample path, the target
passes, the rows evaluated and the states drafted.

References: De Bortoli, Galashov, Gretton, Doucet, arXiv 2501.05370 (reflection coupling);
Soen, Husain, De Bortoli, Doucet, arXiv 2606.13426 (block verification); Bullo, Liu, Güner,
Mukherjee, Gündüz, arXiv 2609.17691 (draft trees, D-GRS). See ``docs/diffusion.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from specsampling import continuous
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


# ------------------------------------------------------------------------- drafts


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


# ------------------------------------------------------------------------- lookaheads


class _Advance(NamedTuple):
    committed: Array  # (n,) states committed this round (>= 1)
    states: Array  # (n, dim) the last committed state
    anchors: Array  # (n, dim) target increment at its parent
    rows: int  # rows of the one target pass, per path
    drafted: int  # states drafted, per path


ChainVerifier = Callable[[Array, Array, Array, Array, np.random.Generator], Any]


def _verify_chain(*args: Any) -> Any:
    return continuous.verify_chain(*args)


def _verify_block(*args: Any) -> Any:
    return continuous.verify_block(*args)


def _draft_children(
    draft: Draft,
    process: VPDiffusion,
    nodes: Array,
    steps: Array,
    anchors: Array,
    num: int,
    rng: np.random.Generator,
) -> tuple[Array, Array]:
    """Draft means at ``nodes`` (n, m, d) and ``num`` i.i.d. children each, (n, m, num, d)."""
    n, m, d = nodes.shape
    means = draft.means(
        process, nodes.reshape(-1, d), np.repeat(steps, m), np.repeat(anchors, m, axis=0)
    ).reshape(n, m, d)
    noise = rng.standard_normal((n, m, num, d))
    return means, means[:, :, None, :] + process.stds[steps][:, None, None, None] * noise


@dataclass(frozen=True)
class Chain:
    """A drafted chain of ``length`` states verified in one pass by ``verifier``.

    ``verifier`` has the signature of :func:`specsampling.continuous.verify_block`. Build the
    library's chains with :func:`reflection_chain` and :func:`block_chain`.
    """

    length: int
    verifier: ChainVerifier = field(repr=False)
    label: str = "chain"

    def __post_init__(self) -> None:
        check_positive_int(self.length, "length")

    def span(self, remaining: Array) -> Array:
        """Lookahead used with ``remaining`` steps left (0 means a plain step)."""
        return np.asarray(np.minimum(self.length, remaining - 1))

    def advance(
        self,
        process: VPDiffusion,
        draft: Draft,
        steps: Array,
        states: Array,
        anchors: Array,
        depth: int,
        rng: np.random.Generator,
    ) -> _Advance:
        n = states.shape[0]
        parents, draft_means, children = [states], [], []
        for level in range(depth):
            means, kids = _draft_children(
                draft, process, parents[-1][:, None], steps + level, anchors, 1, rng
            )
            draft_means.append(means[:, 0])
            children.append(kids[:, 0, 0])
            parents.append(kids[:, 0, 0])
        nodes = np.stack(parents, axis=1)  # (n, depth + 1, d)
        node_steps = steps[:, None] + np.arange(depth + 1)
        target = process.target_mean(nodes.reshape(n * (depth + 1), -1), node_steps.ravel())
        target = target.reshape(nodes.shape)
        out = self.verifier(
            target, np.stack(draft_means, 1), process.stds[node_steps], np.stack(children, 1), rng
        )
        accepted = np.asarray(out.num_committed, dtype=np.int64)
        rows = np.arange(n)
        anchors = target[rows, accepted] - nodes[rows, accepted]
        return _Advance(accepted + 1, np.asarray(out.states), anchors, depth + 1, depth)


def reflection_chain(length: int) -> Chain:
    """Reflection-coupling chain lookahead (:func:`specsampling.continuous.verify_chain`)."""
    return Chain(length, _verify_chain, f"reflection chain L={length}")


def block_chain(length: int) -> Chain:
    """Block-verification chain lookahead (:func:`specsampling.continuous.verify_block`)."""
    return Chain(length, _verify_block, f"block chain L={length}")


@dataclass(frozen=True)
class Tree:
    """A uniform draft tree, ``num_children`` i.i.d. children per node and ``depth`` levels.

    The target is evaluated at the internal nodes only, in one pass; the walk verifies the
    children of the current node with :func:`specsampling.continuous.verify` (``scheme``
    ``"dgrs"``, or ``"reflection"`` with one child), descends into an accepted child and ends
    the round at a rejection (committing the residual state) or at a leaf.
    """

    num_children: int
    depth: int
    scheme: str = "dgrs"

    def __post_init__(self) -> None:
        check_positive_int(self.num_children, "num_children")
        check_positive_int(self.depth, "depth")
        if self.scheme not in ("dgrs", "reflection"):
            raise ValueError(f"scheme: expected 'dgrs' or 'reflection', got {self.scheme!r}")
        if self.scheme == "reflection" and self.num_children != 1:
            raise ValueError(
                f"num_children: reflection verifies one child, got {self.num_children}"
            )

    @property
    def label(self) -> str:
        return f"{self.scheme} tree K={self.num_children} L={self.depth}"

    def span(self, remaining: Array) -> Array:
        """Depth used with ``remaining`` steps left (the tree is truncated at the horizon)."""
        return np.asarray(np.minimum(self.depth, remaining))

    def advance(
        self,
        process: VPDiffusion,
        draft: Draft,
        steps: Array,
        states: Array,
        anchors: Array,
        depth: int,
        rng: np.random.Generator,
    ) -> _Advance:
        n, dim = states.shape
        width = self.num_children
        levels, draft_means, children = [states[:, None]], [], []
        for level in range(depth):
            means, kids = _draft_children(
                draft, process, levels[-1], steps + level, anchors, width, rng
            )
            draft_means.append(means)
            children.append(kids)
            levels.append(kids.reshape(n, -1, dim))
        internal = np.concatenate(levels[:depth], axis=1)  # (n, num_internal, d)
        sizes = [lv.shape[1] for lv in levels[:depth]]
        node_steps = steps[:, None] + np.repeat(np.arange(depth), sizes)
        target = process.target_mean(internal.reshape(-1, dim), node_steps.ravel())
        target_levels = np.split(target.reshape(internal.shape), np.cumsum(sizes)[:-1], axis=1)

        committed = np.zeros(n, dtype=np.int64)
        out_states, out_anchors = np.empty_like(states), np.empty_like(states)
        walking, node = np.arange(n), np.zeros(n, dtype=np.int64)
        for level in range(depth):
            at = node[walking]
            target_mean = target_levels[level][walking, at]
            out = continuous.verify(
                self.scheme,
                target_mean,
                draft_means[level][walking, at],
                process.stds[steps[walking] + level],
                children[level][walking, at],
                rng,
            )
            index = np.asarray(out.index)
            out_states[walking] = out.states
            out_anchors[walking] = target_mean - levels[level][walking, at]
            committed[walking] = level + 1
            accepted = index >= 0
            node[walking[accepted]] = at[accepted] * width + index[accepted]
            walking = walking[accepted]
            if walking.size == 0:
                break
        return _Advance(committed, out_states, out_anchors, internal.shape[1], sum(sizes) * width)


def dgrs_tree(num_children: int, depth: int) -> Tree:
    """A D-GRS draft tree with ``num_children`` per node and ``depth`` levels."""
    return Tree(num_children, depth, "dgrs")


class Lookahead(Protocol):
    """What a round drafts and how it verifies: a :class:`Chain` or a :class:`Tree`."""

    @property
    def label(self) -> str: ...

    def span(self, remaining: Array) -> Array: ...

    def advance(
        self,
        process: VPDiffusion,
        draft: Draft,
        steps: Array,
        states: Array,
        anchors: Array,
        depth: int,
        rng: np.random.Generator,
    ) -> _Advance: ...


# ------------------------------------------------------------------------- samplers


@dataclass(frozen=True, eq=False)
class Run:
    """Final samples of a sampler and, per sample path, what it cost.

    Attributes
    ----------
    samples : ndarray, shape (num_samples, dim)
        The states after ``num_steps`` steps.
    target_calls : ndarray of int, shape (num_samples,)
        Sequential target passes (NFEs) of each path, the warm-up pass included.
    target_rows : ndarray of int, shape (num_samples,)
        Target means evaluated for each path, summed over its passes.
    drafted : ndarray of int, shape (num_samples,)
        States drafted for each path.
    num_steps : int
        N; plain sampling makes N passes per path.
    """

    samples: Array
    target_calls: Array
    target_rows: Array
    drafted: Array
    num_steps: int

    @property
    def mean_calls(self) -> float:
        """Average target passes per path."""
        return float(self.target_calls.mean())

    @property
    def saved(self) -> float:
        """Fraction of target passes saved against plain sampling: ``1 - mean_calls / N``."""
        return 1.0 - self.mean_calls / self.num_steps

    @property
    def batch_passes(self) -> int:
        """Passes of a batch advanced in lockstep: the slowest path's count."""
        return int(self.target_calls.max())


def _check_process(process: Any) -> VPDiffusion:
    if not isinstance(process, VPDiffusion):
        raise TypeError(f"process: expected a VPDiffusion, got {type(process).__name__}")
    return process


def _plain_step(
    process: VPDiffusion, steps: Array, states: Array, rng: np.random.Generator
) -> tuple[Array, Array]:
    """One exact Euler-Maruyama step per row; also returns the target increment."""
    means = process.target_mean(states, steps)
    noise = rng.standard_normal(states.shape)
    return means + process.stds[steps][:, None] * noise, means - states


def plain_sample(process: VPDiffusion, num_samples: int, rng: np.random.Generator) -> Run:
    """Plain Euler-Maruyama sampling: N target passes per path.

    Examples
    --------
    >>> import numpy as np
    >>> data = GaussianMixture([[-2.0], [2.0]], [0.5, 0.5], std=0.3)
    >>> run = plain_sample(VPDiffusion(data, num_steps=20), 500, np.random.default_rng(0))
    >>> run.samples.shape, run.mean_calls, run.saved
    ((500, 1), 20.0, 0.0)
    """
    process = _check_process(process)
    states = process.prior_sample(num_samples, rng)
    n = states.shape[0]
    for step in range(process.num_steps):
        states, _ = _plain_step(process, np.full(n, step), states, rng)
    full = np.full(n, process.num_steps)
    return Run(states, full, full.copy(), np.zeros(n, dtype=np.int64), process.num_steps)


def speculative_sample(
    process: VPDiffusion,
    draft: Any,
    lookahead: Lookahead,
    num_samples: int,
    rng: np.random.Generator,
) -> Run:
    """Speculative sampling of the Euler-Maruyama chain; the output law is exactly plain's.

    Paths are advanced together, one round each per loop (rows at different steps; rows with
    the same truncated depth share a library call). Each round is one target pass for its path.
    With a draft that uses an anchor (``"frozen"``), the warm-up pass at ``n = 0`` is a plain
    step whose target increment seeds the draft.

    Parameters
    ----------
    process : VPDiffusion
        The process and its discretisation (N steps).
    draft : str or Draft
        ``"frozen"``, ``"gaussian"``, ``"exact"`` or a draft object.
    lookahead : Chain or Tree
        For example ``reflection_chain(4)``, ``block_chain(4)`` or ``dgrs_tree(2, 3)``.
    num_samples : int
        Independent sample paths.
    rng : numpy.random.Generator
        All randomness (initial states, drafts, verification).

    Returns
    -------
    Run
        Final samples and per-path target passes, rows and drafted states.

    Examples
    --------
    >>> import numpy as np
    >>> data = GaussianMixture([[-2.0], [2.0]], [0.5, 0.5], std=0.3)
    >>> process = VPDiffusion(data, num_steps=20)
    >>> run = speculative_sample(process, "exact", block_chain(3), 100, np.random.default_rng(0))
    >>> run.mean_calls  # a perfect draft commits L + 1 = 4 states per pass
    5.0
    >>> run = speculative_sample(process, "frozen", dgrs_tree(2, 3), 200, np.random.default_rng(0))
    >>> bool(run.mean_calls < process.num_steps)
    True
    """
    process = _check_process(process)
    draft = get_draft(draft)
    if not callable(getattr(lookahead, "advance", None)) or not callable(
        getattr(lookahead, "span", None)
    ):
        raise TypeError(f"lookahead: expected a Chain or Tree, got {lookahead!r}")
    states = process.prior_sample(num_samples, rng)
    total = process.num_steps
    n = states.shape[0]
    steps = np.zeros(n, dtype=np.int64)
    calls, rows, drafted = (np.zeros(n, dtype=np.int64) for _ in range(3))
    anchors = np.zeros_like(states)
    if draft.uses_anchor:  # warm-up pass at n = 0, used as the first plain step
        states, anchors = _plain_step(process, steps, states, rng)
        steps += 1
        calls += 1
        rows += 1
    while np.any(active := steps < total):
        live = np.flatnonzero(active)
        depths = lookahead.span(total - steps[live])
        for depth in np.unique(depths):
            sel = live[depths == depth]
            if depth == 0:
                new, increments = _plain_step(process, steps[sel], states[sel], rng)
                out = _Advance(np.ones(sel.size, dtype=np.int64), new, increments, 1, 0)
            else:
                out = lookahead.advance(
                    process, draft, steps[sel], states[sel], anchors[sel], int(depth), rng
                )
            states[sel], anchors[sel] = out.states, out.anchors
            steps[sel] += out.committed
            calls[sel] += 1
            rows[sel] += out.rows
            drafted[sel] += out.drafted
    if np.any(steps != total):  # a lookahead that overshoots the horizon is a bug
        raise RuntimeError("lookahead committed past the last step")
    return Run(states, calls, rows, drafted, total)


__all__ = [
    "DRAFTS",
    "Chain",
    "Draft",
    "ExactDraft",
    "FrozenDraft",
    "GaussianDraft",
    "GaussianMixture",
    "Lookahead",
    "Run",
    "Tree",
    "VPDiffusion",
    "block_chain",
    "dgrs_tree",
    "get_draft",
    "plain_sample",
    "reflection_chain",
    "speculative_sample",
]
