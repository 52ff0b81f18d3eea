r"""Recursive rejection sampling without replacement, lowered (reference:
:mod:`specsampling.schemes.rsd`).

As ``specinfer``, except that after rejecting :math:`x_i` the residual is taken with the
**current** draft :math:`q'` and then :math:`q' \leftarrow \mathrm{norm}(q' \text{ without }
x_i)`. Exact on without-replacement drafts.
"""

from __future__ import annotations

import torch

from .. import ops
from .specinfer import RecursiveRejection


class RSD(RecursiveRejection):
    """Recursive rejection sampling without replacement, batched."""

    name = "rsd"

    def update(
        self, target: torch.Tensor, draft: torch.Tensor, token: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual with the current draft, then the token removed from the draft."""
        return ops.residual(target, draft), ops.remove_token(draft, token)


LOWERING = RSD()
LOWERINGS = (LOWERING,)
