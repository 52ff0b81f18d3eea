"""Batched torch lowering of the discrete schemes (installed as ``specsampling.gpu``).

The numpy reference (:mod:`specsampling.schemes`) is written for clarity and exactness; the
lowering here is written for speed: one call verifies a padded batch of draft trees
(:class:`TreeBatch`) with per-node uniforms (:class:`Noise`) and returns, for every row, the
reference :class:`~specsampling.Verdict`. Both are tied together by *path-wise equality*: fed
the same tree, tables and noise, the float64 lowering returns the reference verdict for every
row (``tests/test_gpu_pathwise.py``). Guide: ``docs/torch.md``.

>>> import numpy as np
>>> import specsampling as ss
>>> import specsampling.gpu as ssg
>>> from specsampling.schemes import tables
>>> pair = ss.pairs.Random(vocab_size=4, seed=0)
>>> tree = ss.Shape.star(2).draft(pair, np.random.default_rng(0))
>>> target, draft = tables(pair, tree)
>>> noise = ss.Noise.draw(np.random.default_rng(1), tree.num_nodes)
>>> batch = ssg.TreeBatch.from_trees([tree])
>>> out = ssg.verify("specinfer", batch, *ssg.tables_batch([target], [draft]),
...                  ssg.Noise.from_reference([noise]))
>>> (int(out.node[0]), int(out.token[0])) == tuple(ss.SCHEMES["specinfer"].verify(
...     tree, target, draft, noise))
True
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError('specsampling.gpu needs torch: pip install "specsampling[torch]"') from error

from . import drafting, keyed
from .api import tables_batch, verify
from .chain import verify_chain
from .chain_logits import verify_chain_logits
from .generate import KeyedGeneration, generate
from .noise import Noise
from .processing import process
from .schemes import SCHEMES, Verified, get_lowering
from .speculate import Speculation, speculate
from .tree import TreeBatch

__all__ = [
    "SCHEMES",
    "KeyedGeneration",
    "Noise",
    "Speculation",
    "TreeBatch",
    "Verified",
    "drafting",
    "generate",
    "get_lowering",
    "keyed",
    "process",
    "speculate",
    "tables_batch",
    "verify",
    "verify_chain",
    "verify_chain_logits",
]
