r"""Chain verification from logits: :func:`verify_chain_logits`.

``verify_chain_logits(scheme, tokens, target_logits, draft_logits, temperature=T, top_k=K,
top_p=P)`` returns the tokens of ``verify_chain(scheme, tokens, process(target_logits, T, K, P),
process(draft_logits, T, K, P))`` -- the same verdicts, the same noise drawn from the same
generator. What it saves is the processing of rows the verifier never reads. A chain's standard
rule reads :math:`p_i(x_i), q_i(x_i)` only up to the first rejected draft, and whole rows only
there (the residual :math:`(p_k - q_k)_+`) or at the bonus row: with ``k`` drafts accepted it reads
``k + 1`` rows of each table, not ``γ + 1`` and ``γ``. ``ssg.process`` is row-local (each row's
probabilities depend on that row's logits alone, computed by the same kernel whatever the table
around it, and with top-p the kept set by integer masses and the divisor by the kept integer mass,
both functions of the row alone; with top-k the ``k + 1`` largest logits and sums over them, which
run in one thread for ``k`` below :data:`ROW_LOCAL_TOP_K`; tested bit for bit), so a row formed on
first read holds the values the whole table would. At one or two sequences on the CPU (outside
``torch.compile``, validation off, a temperature given as a number, top-k off or below
:data:`ROW_LOCAL_TOP_K`, top-p off or a number, the schemes whose chains take the standard rule --
``standard``, ``specinfer``, ``rsd``, ``spectr``, ``resispec``, ``spechub``, ``ot_optimal``,
``ot_binned``, ``khisti`` -- ``greedy``, which reads the same rows, and ``nss``, which reads target
rows alone) the walk forms rows as it reads them; everywhere else the tables are processed whole
and :func:`~specsampling.gpu.chain.verify_chain` runs on them (a batch's rows are all read anyway,
and an accelerator wants one kernel, not a host loop).
"""

from __future__ import annotations

import numbers
import re
from typing import Any

import torch

from specsampling.errors import InvalidDistribution, UnsupportedShape
from specsampling.tree import DrawLaw

from . import ops
from .chain import (
    GREEDY_CHAIN,
    HOST_STANDARD_ROWS,
    ChainTables,
    GreedyChain,
    HostChain,
    ShapedChain,
    StandardChain,
    chain_round,
    draft_lengths,
    padded_tables,
    round_noise,
    standard_rule_engine,
    takes_standard_rule,
    verify_chain,
)
from .chain_rules import NSS_CHAIN, ChainRound, NSSChain
from .noise import Noise
from .processing import process
from .schemes import tree_lowering
from .schemes.base import Verified
from .schemes.greedy import Greedy
from .schemes.nss import NSS

#: Lanes of a sequence's first chunk of rows formed on read; each next chunk doubles. Two:
#: ``process`` spreads a table's rows over torch's threads, so one row alone runs on one
#: thread and two take about its time on two.
FIRST_CHUNK = 2

#: ``process``'s positional temperature, top-k and top-p, as the walk on read applies them.
_Settings = tuple[float, int | None, float | None]

ROW_LOCAL_TOP_K = 16_384
"""Top-k below this walks on read: ``process``'s top-k route sums each row's ``k + 1`` weights,
and torch splits one row's sum over its threads from 32,768 elements (its grain size), so a
larger ``k`` may round a row alone differently from the same row in a table (seen at
``k = 40,000``); ``verify_chain_logits`` then processes the whole tables."""


class _RowsOnRead:
    """A chain engine's host route reading probability rows formed on first read (the engine's
    other methods unchanged). A lane is formed with the lanes of its chunk: lanes 0-1, 2-5,
    6-13, ... of its sequence (:data:`FIRST_CHUNK` lanes, then twice as many each time), each
    chunk by one ``process`` call on its logits rows -- two rows of each table where the first
    draft is rejected, and the whole tables' work in a few calls where every draft is accepted.
    ``formed`` counts the rows processed."""

    def __init__(
        self,
        gamma: int,
        target_logits: torch.Tensor,
        draft_logits: torch.Tensor,
        settings: _Settings,
    ) -> None:
        self.logits = (target_logits, draft_logits)  # [R, V] each, flat rows
        self.lanes = (gamma + 1, gamma)  # lanes per sequence in each table
        self.settings = settings  # process's (temperature, top_k, top_p)
        self.chunks: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def formed(self) -> int:
        return sum(chunk.shape[0] for chunk in self.chunks.values())

    def row(self, table: int, flat: int) -> torch.Tensor:
        """Row ``flat`` of the target (``table=0``) or draft (``1``) probabilities, ``[1, V]``
        (a view of its chunk)."""
        lanes = self.lanes[table]
        base, lane = divmod(flat, lanes)
        size = FIRST_CHUNK << (lane // FIRST_CHUNK + 1).bit_length() - 1  # this chunk's lanes
        first = size - FIRST_CHUNK  # its first lane: the chunks before it hold that many
        start = base * lanes + first
        key = (table, start)
        if key not in self.chunks:
            stop = base * lanes + min(first + size, lanes)  # [start, stop): the chunk's rows
            logits = self.logits[table][start:stop]  # [n, V]
            self.chunks[key] = process(logits, *self.settings, validate=False)
        return self.chunks[key][flat - start : flat - start + 1]  # [1, V]


class _TablesOnRead(_RowsOnRead):
    """:class:`~specsampling.gpu.chain.StandardChain`'s host-route seams on formed rows."""

    def host_gathered(self, tables: ChainTables, noise: Noise) -> list[list[list[float]]]:
        return []  # read lane by lane (host_pair)

    def host_pair(
        self, tables: ChainTables, host: HostChain, row: int, lane: int
    ) -> tuple[float, float]:
        assert host.draft_index is not None
        token = host.drafted[row][lane]
        target_x = self.row(0, host.target_index[row][lane])[0, token].item()
        draft_x = self.row(1, host.draft_index[row][lane])[0, token].item()
        return float(target_x), float(draft_x)

    def host_target_row(self, tables: ChainTables, host: HostChain, flat: int) -> torch.Tensor:
        return self.row(0, flat)  # contiguous, in the tables' dtype (the logits')

    def host_draft_row(self, tables: ChainTables, host: HostChain, flat: int) -> torch.Tensor:
        return self.row(1, flat)


class _StandardOnRead(_TablesOnRead, StandardChain):
    """:class:`~specsampling.gpu.chain.StandardChain`'s host route on rows formed on read."""


class _ShapedOnRead(_TablesOnRead, ShapedChain):
    """:class:`~specsampling.gpu.chain.ShapedChain`'s host route on rows formed on read."""


class _GreedyOnRead(_TablesOnRead, GreedyChain):
    """:class:`~specsampling.gpu.chain.GreedyChain`'s host route on rows formed on read."""


class _NSSOnRead(_RowsOnRead, NSSChain):
    """:class:`~specsampling.gpu.chain_rules.NSSChain`'s host route on target rows formed on
    read (NSS reads no draft row)."""

    def host_node_rows(
        self, chain: ChainRound, sample: torch.Tensor, alive: list[int], node: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lanes = self.lanes[0]
        rows = [self.row(0, row * lanes + node) for row in alive]  # [1, V] each
        stacked = rows[0] if len(rows) == 1 else torch.cat(rows)  # [L, V]
        return stacked, sample[alive, node]  # [L, V] in the chain's dtype (the logits'), [L]


_ON_READ: dict[type, Any] = {
    StandardChain: _StandardOnRead,
    ShapedChain: _ShapedOnRead,
    GreedyChain: _GreedyOnRead,
    NSSChain: _NSSOnRead,
}


def _chain_engine(lowering: Any) -> Any:
    """The engine ``verify_chain`` runs ``lowering`` on with draft tables, if it is one of
    :data:`_ON_READ`'s, else ``None``."""
    if type(lowering) is Greedy:
        return GREEDY_CHAIN
    if type(lowering) is NSS:
        return NSS_CHAIN
    if takes_standard_rule(lowering):
        engine = standard_rule_engine(lowering)
        return engine if type(engine) in _ON_READ else None
    return None


def verify_chain_logits(
    scheme: Any,
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    noise: Noise | None = None,
    *,
    temperature: Any = 1.0,
    top_k: Any = None,
    top_p: Any = None,
    generator: torch.Generator | None = None,
    validate: bool = True,
    num_draft_tokens: Any = None,
    dtype: torch.dtype | None = None,
) -> Verified:
    """Verify a batch of drafted chains from logits: the verdicts of
    ``verify_chain(scheme, draft_tokens, process(target_logits, temperature, top_k, top_p),
    process(draft_logits, temperature, top_k, top_p), noise, ...)``, forming only the
    probability rows the walk reads where it walks on the host (see the module docstring).

    Parameters
    ----------
    scheme, draft_tokens, noise, generator, validate, num_draft_tokens, dtype
        As :func:`~specsampling.gpu.chain.verify_chain` (``validate`` also checks the logits,
        as :func:`~specsampling.gpu.processing.process` does; with it the tables are processed
        whole).
    target_logits : Tensor [B, γ + 1, V]
        The target's logits after each of ``0..γ`` drafts.
    draft_logits : Tensor [B, γ, V]
        The draft's logits each drafted token was sampled from (after ``temperature``).
    temperature : number, or per-sequence values of shape (B, 1)
        As :func:`~specsampling.gpu.processing.process`, for both tables (so per-row values
        must broadcast to both: one per sequence). A positive finite real number (Python or
        numpy) lets the host walk form rows on read; ``0`` (greedy rows) and tensors take the
        whole-table route.
    top_k : int or None, or per-sequence values of shape (B, 1)
        As :func:`~specsampling.gpu.processing.process`, for both tables (default ``None``:
        off). An integer below :data:`ROW_LOCAL_TOP_K` (or at least ``V``: off) lets the host
        walk form rows on read; larger ones, tensors and sequences take the whole-table route.
    top_p : number or None, or per-sequence values of shape (B, 1)
        As :func:`~specsampling.gpu.processing.process`, for both tables (default ``None``:
        off). A real number in ``(0, 1]`` (or ``None``) lets the host walk form rows on read
        (top-p is row-local below float64 too: each row divided by its kept integer mass);
        tensors and sequences take the whole-table route.

    Returns
    -------
    Verified
        As :func:`~specsampling.gpu.chain.verify_chain`.

    Examples
    --------
    >>> import specsampling.gpu as ssg
    >>> target_logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]])
    >>> draft_logits = torch.tensor([[[0.0, 2.0, 0.0]]])
    >>> noise = ssg.Noise(torch.full((1, 2), 0.5, dtype=torch.float64),
    ...                   torch.full((1, 2), 0.3, dtype=torch.float64))
    >>> out = ssg.verify_chain_logits("standard", torch.tensor([[1]]), target_logits,
    ...                               draft_logits, noise, validate=False)
    >>> out.tokens.tolist()
    [[0, -1]]
    >>> eager = ssg.verify_chain("standard", torch.tensor([[1]]), ssg.process(target_logits),
    ...                          ssg.process(draft_logits), noise, validate=False)
    >>> eager.tokens.tolist()
    [[0, -1]]
    """
    engine = _walk_engine(
        scheme,
        draft_tokens,
        target_logits,
        draft_logits,
        noise,
        temperature,
        top_k,
        top_p,
        validate,
        dtype,
    )
    if engine is not None:
        settings = (
            float(temperature),
            None if top_k is None else int(top_k),
            None if top_p is None else float(top_p),
        )
        return _walk_on_read(
            engine,
            draft_tokens,
            target_logits,
            draft_logits,
            noise,
            settings,
            generator,
            num_draft_tokens,
        )[0]
    tables = []
    for name, logits in (("target_logits", target_logits), ("draft_logits", draft_logits)):
        try:
            tables.append(process(logits, temperature, top_k, top_p, validate=validate))
        except InvalidDistribution as error:  # process names its table "logits"
            raise InvalidDistribution(_renamed(str(error), {"logits": name})) from None
    try:
        return verify_chain(
            scheme,
            draft_tokens,
            *tables,
            noise,
            generator=generator,
            validate=validate,
            num_draft_tokens=num_draft_tokens,
            dtype=dtype,
        )
    except InvalidDistribution as error:  # named after verify_chain's processed tables
        raise InvalidDistribution(_renamed(str(error), _TABLE_NAMES)) from None


#: :func:`~specsampling.gpu.chain.verify_chain`'s names for the processed tables, and what
#: :func:`verify_chain_logits` calls the logits they come from.
_TABLE_NAMES = {"target_probs": "target_logits", "draft_probs": "draft_logits"}


def _renamed(message: str, names: dict[str, str]) -> str:
    """``message`` with the argument it starts with renamed by ``names`` (``logits[2]: ...`` ->
    ``draft_logits[2]: ...``), and the hint of a drafted token of zero draft probability put in
    terms of logits (its cause here is a top-k or top-p cut of the draft's row, not underflow)."""
    for old, new in names.items():
        if re.match(rf"{old}\b", message):
            message = new + message[len(old) :]
            break
    return message.replace(
        "cannot have been sampled (underflow in a low precision softmax? pass draft_probs=None "
        "for deterministic drafts)",
        "cannot have been sampled from the processed draft (outside its top-k / top-p set?)",
    )


def _walk_engine(
    scheme: Any,
    draft_tokens: Any,
    target_logits: Any,
    draft_logits: Any,
    noise: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    validate: bool,
    dtype: torch.dtype | None,
) -> Any:
    """The engine :func:`verify_chain_logits` walks on rows formed on read, or ``None`` where
    it processes the whole tables. It walks with validation off, one or two rows of
    well-formed CPU tensors of one float dtype outside ``torch.compile`` (the noise too, if
    given: ``[B, γ + 1]`` each), a positive finite number for the temperature, ``None`` or an
    integer in ``[1, ROW_LOCAL_TOP_K)`` or ``>= V`` for ``top_k``, ``None`` or a number in
    ``(0, 1]`` for ``top_p``, a scheme whose chain engine has a walk on read (the
    standard rule's, greedy's, nss's). Anything else takes the whole-table route, which
    raises what ``process`` and ``verify_chain`` raise."""
    if validate or not (noise is None or isinstance(noise, Noise)):
        return None
    if not all(isinstance(t, torch.Tensor) for t in (draft_tokens, target_logits, draft_logits)):
        return None
    if (
        draft_tokens.ndim != 2
        or draft_tokens.is_floating_point()
        or draft_tokens.dtype == torch.bool
    ):
        return None
    batch_size, gamma = draft_tokens.shape
    if not (0 < batch_size <= HOST_STANDARD_ROWS and gamma > 0):
        return None
    if target_logits.ndim != 3 or draft_logits.ndim != 3:
        return None
    vocab = target_logits.shape[-1]
    if tuple(target_logits.shape) != (batch_size, gamma + 1, vocab):
        return None
    if tuple(draft_logits.shape) != (batch_size, gamma, vocab) or vocab == 0:
        return None
    if target_logits.dtype not in (torch.float32, torch.float64):
        return None
    if draft_logits.dtype != target_logits.dtype or dtype not in (None, target_logits.dtype):
        return None
    if not all(ops.host_reads_free(t) for t in (draft_tokens, target_logits, draft_logits)):
        return None
    if noise is not None:
        lanes = (batch_size, gamma + 1)
        for uniforms in (noise.accept, noise.sample):
            if not isinstance(uniforms, torch.Tensor) or tuple(uniforms.shape) != lanes:
                return None
            if not ops.host_reads_free(uniforms):
                return None
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        return None
    if not 0 < float(temperature) < float("inf"):
        return None
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)):
        return None
    if top_p is not None and not 0 < float(top_p) <= 1:
        return None
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)):
        return None
    if top_k is not None and not (1 <= int(top_k) < ROW_LOCAL_TOP_K or int(top_k) >= vocab):
        return None
    try:
        lowering = tree_lowering(scheme)
    except (KeyError, TypeError, ValueError, UnsupportedShape):
        return None  # the whole-table route names the problem
    if not lowering.reference_scheme.exact_for(DrawLaw.IID, True):
        return None  # verify_chain refuses it
    return _chain_engine(lowering)


def rows_on_read(
    scheme: Any,
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    noise: Noise | None,
    temperature: float,
    generator: torch.Generator | None = None,
    num_draft_tokens: Any = None,
    top_p: float | None = None,
    top_k: int | None = None,
) -> tuple[Verified, int]:
    """``(verdicts, rows processed)`` of the host walk on rows formed on read, as
    :func:`verify_chain` with ``validate=False`` on the tables processed with ``temperature``,
    ``top_k`` and ``top_p`` (one stop round; the same noise from the same generator)."""
    engine = _chain_engine(tree_lowering(scheme))
    settings = (temperature, top_k, top_p)
    return _walk_on_read(
        engine,
        draft_tokens,
        target_logits,
        draft_logits,
        noise,
        settings,
        generator,
        num_draft_tokens,
    )


def _walk_on_read(
    engine: Any,
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    noise: Noise | None,
    settings: _Settings,
    generator: torch.Generator | None,
    num_draft_tokens: Any,
) -> tuple[Verified, int]:
    """:func:`rows_on_read` on ``engine`` (one of :data:`_ON_READ`'s), the rows processed with
    ``settings`` (``process``'s temperature, top-k and top-p)."""
    draft_tokens = draft_tokens.to(torch.long)
    batch_size, gamma = draft_tokens.shape
    num_drafts = draft_lengths(draft_tokens, num_draft_tokens)
    noise = round_noise(noise, batch_size, gamma, generator, draft_tokens.device)
    target_logits, draft_logits = target_logits.detach(), draft_logits.detach()
    dtype = target_logits.dtype
    vocab = target_logits.shape[-1]
    on_read = _ON_READ[type(engine)](
        gamma,
        target_logits.reshape(batch_size * (gamma + 1), vocab),  # flat rows, views
        draft_logits.reshape(batch_size * gamma, vocab),
        settings,
    )
    if isinstance(engine, NSSChain):  # the chain's shape; the walk reads rows through on_read
        verified = on_read.host_run(
            chain_round(draft_tokens, num_drafts, target_logits, None, dtype), noise
        )
    else:
        tables = padded_tables(draft_tokens, num_drafts, target_logits, draft_logits, dtype)
        verified, _ = on_read.host_run(tables, noise, 1)
    return verified, on_read.formed


__all__ = ["ROW_LOCAL_TOP_K", "rows_on_read", "verify_chain_logits"]
