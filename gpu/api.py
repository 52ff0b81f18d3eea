"""The entry point: ``verify(scheme, batch, target_probs, draft_probs, noise)``.

Validates like the reference's :func:`specsampling.schemes.base.check_round` (shapes, vocab
match, NaN/inf/negative/mass of every real node's rows, token ids in range, noise in [0, 1)),
with the argument named in every :class:`~specsampling.InvalidDistribution`; the checks cost one
host synchronisation, and ``validate=False`` skips them (the sync-free hot path).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from specsampling.errors import InvalidDistribution
from specsampling.validation import MASS_TOLERANCE, mass_error

from . import ops
from .noise import Noise
from .schemes import tree_lowering
from .schemes.base import Verified
from .tree import GUESSES_RULE, TreeBatch, guesses_valid, structure_defect, structure_valid

#: Default row-mass tolerance by input dtype (low-precision softmaxes sum to 1 only roughly).
TOLERANCE = {
    torch.float64: MASS_TOLERANCE,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 1e-2,
}


def tables_batch(
    target_tables: Sequence[Any],
    draft_tables: Sequence[Any],
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    pad: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack per-tree ``(num_nodes, V)`` tables into ``[B, N, V]`` tensors, padding the rows
    of missing nodes with ``pad`` (never read). ``dtype`` is a float dtype; the draft tables
    must match the target tables in count, vocabulary and each tree's node count."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype: expected a torch float dtype, got {dtype!r}")
    stacked = []
    shapes: list[tuple[int, ...]] = []
    for name, tables in (("target_tables", target_tables), ("draft_tables", draft_tables)):
        if isinstance(tables, (str, bytes)) or not isinstance(tables, Iterable):
            raise TypeError(f"{name}: expected a sequence of (num_nodes, V) tables, got {tables!r}")
        arrays = []
        for row, table in enumerate(tables):
            try:
                array = np.asarray(table)
            except ValueError as err:  # ragged rows
                raise ValueError(f"{name}[{row}]: not a (num_nodes, V) table ({err})") from None
            real = array.dtype.kind in "iuf"
            if array.dtype.kind == "O":  # Fractions (an exact pair's tables), ints, floats
                try:
                    array, real = array.astype(np.float64), array.size > 0
                except (TypeError, ValueError):
                    real = False
            if not real:
                raise ValueError(
                    f"{name}[{row}]: expected real numbers, got an array of dtype {array.dtype}"
                )
            if array.ndim != 2 or array.shape[1] == 0:
                raise ValueError(
                    f"{name}[{row}]: expected a (num_nodes, V) table, got shape {array.shape}"
                )
            arrays.append(array.astype(np.float64))
        if not arrays:
            raise ValueError(f"{name}: expected one (num_nodes, V) table per tree, got none")
        for row, array in enumerate(arrays):
            if array.shape[1] != arrays[0].shape[1]:
                raise ValueError(
                    f"{name}[{row}]: expected shape (num_nodes, {arrays[0].shape[1]}), got "
                    f"{array.shape}"
                )
        if stacked and stacked[0].shape[0] != len(arrays):
            raise ValueError(
                f"draft_tables: {len(arrays)} tables, but target_tables has {stacked[0].shape[0]}"
            )
        if shapes:
            for row, (array, want) in enumerate(zip(arrays, shapes, strict=True)):
                if array.shape != want:
                    raise ValueError(
                        f"draft_tables[{row}]: shape {array.shape}, but target_tables[{row}] "
                        f"has {want} (one row per node, one vocabulary)"
                    )
        shapes = [a.shape for a in arrays]
        num_nodes = max(a.shape[0] for a in arrays)
        out = np.full((len(arrays), num_nodes, arrays[0].shape[1]), pad)  # [B, N, V]
        for row, array in enumerate(arrays):
            out[row, : array.shape[0]] = array
        stacked.append(torch.tensor(out, dtype=dtype, device=device))
    return stacked[0], stacked[1]


def verify(
    scheme: Any,
    batch: TreeBatch,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    noise: Noise | None = None,
    *,
    generator: torch.Generator | None = None,
    validate: bool = True,
    tolerance: float | None = None,
) -> Verified:
    """Verify every row of ``batch``; row ``b`` gets the reference verdict of its tree.

    Parameters
    ----------
    scheme : str or lowering object
        A name in :data:`specsampling.gpu.SCHEMES` (or its object).
    batch : TreeBatch
        ``B`` trees padded to ``N`` nodes.
    target_probs, draft_probs : Tensor [B, N, V]
        Row ``n`` is the distribution after node ``n`` (float64/32, bf16, fp16). Tables that
        require grad are read as their detached values (a verdict has no gradient).
    noise : Noise, optional
        Uniforms ``[B, N]``; ``None`` draws fresh ones (from ``generator`` when given).
    validate : bool, default True
        Check the inputs (one host synchronisation); ``False`` trusts them.
    tolerance : float, optional
        Row-mass tolerance; by default :data:`TOLERANCE` of the input dtype.

    Returns
    -------
    Verified
        ``node [B]``, ``token [B]``, ``tokens [B, max_depth + 1]`` (``-1`` padded),
        ``num_emitted [B]``.
    """
    lowering = tree_lowering(scheme)
    if not isinstance(batch, TreeBatch):
        raise TypeError(f"batch: expected a TreeBatch, got {type(batch).__name__}")
    lowering.check_batch(batch)
    if noise is None:
        noise = Noise.draw(batch, generator)
    elif not isinstance(noise, Noise):
        raise TypeError(
            f"noise: expected a specsampling.gpu.Noise (Noise(accept, sample), or "
            f"Noise.from_reference), got {type(noise).__name__}"
        )
    tolerance = check_tolerance(tolerance)
    if validate:
        check_batch_round(batch, target_probs, draft_probs, noise, tolerance)
    dtype = ops.compute_dtype(target_probs, draft_probs)
    device = batch.device
    # detached: a verdict has no gradient, and the lowerings write into buffers (out=)
    target = target_probs.detach().to(device=device, dtype=dtype)  # [B, N, V]
    draft = draft_probs.detach().to(device=device, dtype=dtype)  # [B, N, V]
    noise = Noise(
        noise.accept.to(device=device, dtype=torch.float64),
        noise.sample.to(device=device, dtype=torch.float64),
    )
    return lowering.walk(batch, target, draft, noise)


def check_tolerance(tolerance: Any) -> float | None:
    """``tolerance``: ``None`` (the input dtype's :data:`TOLERANCE`) or a finite float >= 0.

    >>> check_tolerance(-1)
    Traceback (most recent call last):
    ...
    ValueError: tolerance: expected None or a finite number >= 0, got -1
    """
    if tolerance is None:
        return None
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, (int, float, np.integer, np.floating))
        or not np.isfinite(tolerance)
        or tolerance < 0
    ):
        raise ValueError(f"tolerance: expected None or a finite number >= 0, got {tolerance!r}")
    return float(tolerance)


def check_batch_round(
    batch: TreeBatch,
    target_probs: Any,
    draft_probs: Any,
    noise: Noise | None = None,
    tolerance: float | None = None,
) -> None:
    """The batched ``check_round``: raise :class:`~specsampling.InvalidDistribution` naming the
    argument (and the row ``[b, n]``) for the first defect: the batch's structure
    (:func:`~specsampling.gpu.tree.structure_valid`), then the tables (only real nodes' rows),
    the guesses and the token range."""
    shape = tuple(batch.parents.shape)
    for name, table in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        check_table_kind(name, table, f"({shape[0]}, {shape[1]}, vocab_size)")
        if table.ndim != 3 or tuple(table.shape[:2]) != shape or table.shape[2] == 0:
            raise InvalidDistribution(
                f"{name}: expected shape ({shape[0]}, {shape[1]}, vocab_size), got "
                f"{tuple(table.shape)}"
            )
    vocab_size = int(target_probs.shape[2])
    if draft_probs.shape[2] != vocab_size:
        raise InvalidDistribution(
            f"draft_probs: vocabulary mismatch, {draft_probs.shape[2]} columns but vocab_size "
            f"is {vocab_size}"
        )
    if noise is not None:
        noise.check(batch)
    real = batch.real_nodes()  # [B, N]
    token_ok = (batch.tokens < vocab_size) | ~real  # [B, N]
    row_checks = []
    for name, table in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        tol = TOLERANCE.get(table.dtype, 1e-4) if tolerance is None else tolerance
        values = table.to(device=real.device, dtype=ops.compute_dtype(table))  # [B, N, V]
        mass = values.sum(-1)  # [B, N]; NaN/inf rows have a NaN/inf mass
        negative = values.amin(-1) < 0  # [B, N], no [B, N, V] temporary (NaN rows fail on mass)
        ok = (((mass - 1).abs() <= tol) & ~negative) | ~real  # [B, N]
        row_checks.append((name, values, mass, ok, tol))
    guesses_ok = guesses_valid(batch)  # 0-dim
    structure_ok = structure_valid(batch).all()  # 0-dim
    flags = token_ok.all() & row_checks[0][3].all() & row_checks[1][3].all() & guesses_ok
    if bool(flags & structure_ok):  # the one host read of sound inputs
        return
    if not bool(structure_ok):
        raise InvalidDistribution(structure_defect(batch))
    for name, values, mass, ok, tol in row_checks:
        if not bool(ok.all()):
            raise_row_defect(name, values, mass, ok, tol)
    if not bool(guesses_ok):
        raise InvalidDistribution(GUESSES_RULE)
    row, node = (int(i) for i in (~token_ok).nonzero()[0])
    raise InvalidDistribution(
        f"batch.tokens[{row}, {node}]: token id {int(batch.tokens[row, node])} >= vocab_size "
        f"{vocab_size}"
    )


#: The dtypes a probability table may have (float8 has no arithmetic to verify with).
TABLE_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def check_table_kind(name: str, table: Any, shape: str) -> None:
    """Raise :class:`~specsampling.InvalidDistribution` naming ``name`` unless ``table`` is a
    tensor of a :data:`TABLE_DTYPES` dtype holding values (not on the ``meta`` device);
    ``shape`` is the expected shape, as the message words it.

    >>> check_table_kind("p", torch.zeros(2).to(torch.float8_e4m3fn), "(2,)")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    specsampling.errors.InvalidDistribution: p: expected a float tensor (...), got ...float8_e4m3fn
    """
    if not isinstance(table, torch.Tensor) or table.dtype not in TABLE_DTYPES:
        raise InvalidDistribution(
            f"{name}: expected a float tensor (float64, float32, bfloat16 or float16) of shape "
            f"{shape}, got {type(table).__name__}"
            + (f" of dtype {table.dtype}" if isinstance(table, torch.Tensor) else "")
        )
    if table.device.type == "meta":
        raise InvalidDistribution(f"{name}: a tensor on the meta device holds no values")


def raise_row_defect(
    name: str,
    values: torch.Tensor,
    mass: torch.Tensor,
    ok: torch.Tensor,
    tol: float,
    *,
    flat: bool = False,
    tolerance_hint: str | None = "tolerance={}",
) -> None:
    """Raise :class:`~specsampling.InvalidDistribution` for the first row ``[b, n]`` of
    ``values [B, N, V]`` that ``ok [B, N]`` marks bad: NaN/inf, a negative entry, or its
    ``mass [B, N]`` off 1 by more than ``tol`` (the argument and the row named: ``name[b, n]``,
    or ``name[b]`` when ``flat``, for a table ``[B, V]`` passed as ``[B, 1, V]``; a mass error
    suggests a tolerance as ``tolerance_hint`` words it, none when ``None``)."""
    row, node = (int(i) for i in (~ok).nonzero()[0])
    label = f"{name}[{row}]" if flat else f"{name}[{row}, {node}]"
    entries = values[row, node]  # [V]
    finite = torch.isfinite(entries)
    if not bool(finite.all()):
        index = int((~finite).nonzero()[0, 0])
        raise InvalidDistribution(f"{label}: NaN or inf at index {index}")
    if bool((entries < 0).any()):
        index = int((entries < 0).nonzero()[0, 0])
        raise InvalidDistribution(
            f"{label}: negative entry at index {index} (raw logits? apply "
            "specsampling.gpu.process first)"
        )
    raise InvalidDistribution(
        mass_error(
            label,
            float(mass[row, node]),
            tol,
            process="specsampling.gpu.process first",
            tolerance_hint=tolerance_hint,
        )
    )
