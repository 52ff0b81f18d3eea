"""Tree-logits parity in ragged batches whose rows finish at different rounds (float64, 1e-10).

Every target and draft logit row a round used must equal a plain no-cache forward of that node's
full prefix, in float64 to 1e-10, at B = 3 and B = 8 with left-padded prompts of different
lengths, rows leaving the batch at several rounds (EOS and ``max_new_tokens``), the longest
prompt's row leaving first (the remaining rows then share hole columns at the front of both
caches), with the caches never compacted and compacted every round. The cache
surgery only copies entries, so anything above rounding is a wrong value: a position, a mask
entry, a stale slot. Mutants of that surgery must fail the same check.

Why the models get float64 norms (:func:`float64_norms`): Hugging Face's Llama / Qwen2
``RMSNorm`` casts its input to float32 even in a float64 model. A float64 difference of 1e-14
between the cached forward and the plain one (other reduction orders, other matmul shapes) that
happens to straddle a float32 rounding boundary then becomes a one-ulp float32 step (6e-8
relative), which the remaining layers grow to ~1e-6 in the logits. On SmolLM2-135M (30 layers,
hidden 576) that was seen once in ~250 nodes: a single leaf, its ancestors at 1e-14; the first
differing value was one float32-cast element of layer 10's post-attention norm. With norms in
float64 the same node agrees to 1e-13. Eager attention has the same kind of island (its softmax
runs in float32), so only sdpa is checked here.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from proofs_tests.hf_models import (  # noqa: E402
    float64_norms,
    left_pad,
    no_grad,  # noqa: F401 (autouse fixture)
    one_thread,  # noqa: F401 (autouse fixture)
    perturbed,
    plain_logits,
    tiny_causal_lm,
    trace_prefixes,
)
from specsampling import Shape  # noqa: E402
from specsampling.gpu import hf  # noqa: E402
from specsampling.gpu.hf import SpeculativeDecoder  # noqa: E402
from specsampling.gpu.hf.attention import KVState  # noqa: E402

#: Max |cached - plain| over every logit row used; float64 rounding is ~1e-15 on these models.
ATOL = 1e-10

#: The longest prompt first; the others of different lengths, no token shared at their start.
PROMPTS_3 = [[3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25], [4, 2], [8, 1, 6]]
PROMPTS_8 = [
    [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51],
    [1],
    [2, 3, 4],
    [5, 6, 8, 9, 10],
    [11, 12],
    [14, 16, 18, 20, 22, 24, 26],
    [27, 28, 29, 31],
    [32, 33, 34, 35, 36, 37, 38, 39, 41],
]

#: (family, prompts, scheme, shape, seed, eos): fixed seeds under which rows leave at several
#: rounds and the longest prompt's row is among the first to leave (asserted in the test).
CASES = [
    ("llama", PROMPTS_3, "standard", Shape.chain(3), 0, (7, 13)),
    ("qwen", PROMPTS_3, "specinfer", Shape.paths(2, 3), 1, (7, 13)),
    ("llama", PROMPTS_8, "specinfer", Shape.paths(2, 3), 2, (7,)),
    ("qwen", PROMPTS_8, "standard", Shape.chain(3), 2, (7, 13)),
]
IDS = ["llama-B3-chain", "qwen-B3-tree", "llama-B8-tree", "qwen-B8-chain"]


def pair(family):
    """A float64 sdpa target and a perturbed draft, both with float64 norms."""
    target = tiny_causal_lm(family, 0, attn="sdpa", dtype=torch.float64)
    draft = perturbed(target, 0.3, 2)
    return float64_norms(target), float64_norms(draft)


def decode(family, prompts, scheme, shape, seed, eos):
    target, draft = pair(family)
    dec = SpeculativeDecoder(target, draft, scheme, shape)
    dec.traces = []
    ids, mask = left_pad(prompts)
    dec.generate(ids, attention_mask=mask, max_new_tokens=10, seed=seed, eos_token_id=list(eos))
    return target, draft, dec.traces


def parity_errors(target, draft, traces):
    """Per round: ``(batch size, max error of the target rows, of the expanded draft rows,
    rows checked)``."""
    rounds = []
    for trace in traces:
        where, prefixes = trace_prefixes(trace)
        errors, checked = [], 0
        for model, used in ((target, trace.target_logits), (draft, trace.draft_logits)):
            if used is None:  # the last round, one token left: nothing drafted
                assert model is draft and trace.tree.max_depth == 0
                errors.append(0.0)
                continue
            rows = torch.stack([used[b, n] for b, n in where])  # [R, V]
            expanded = ~torch.isnan(rows).any(-1)  # draft rows: the nodes drafting expanded
            error = (rows[expanded] - plain_logits(model, prefixes)[expanded]).abs()
            errors.append(float(error.max()))
            checked += int(expanded.sum())
        rounds.append((len(trace.contexts), errors[0], errors[1], checked))
    return rounds


@pytest.fixture(params=["compact-never", "compact-every-round"])
def compaction(request, monkeypatch):
    """Both caches kept with every hole, or compacted after every round (holes moved away)."""
    slack = 10**9 if request.param == "compact-never" else -(10**9)
    monkeypatch.setattr(hf.DecodeState, "compact_slack", slack)
    return request.param


@pytest.mark.parametrize(("family", "prompts", "scheme", "shape", "seed", "eos"), CASES, ids=IDS)
def test_parity_while_rows_leave(family, prompts, scheme, shape, seed, eos, compaction):
    target, draft, traces = decode(family, prompts, scheme, shape, seed, eos)
    sizes = [len(trace.contexts) for trace in traces]
    assert len(set(sizes)) >= 3, sizes  # rows left the batch at two rounds at least
    first_leave = next(r for r, size in enumerate(sizes) if size < len(prompts))
    longest = prompts[0]
    assert all(c[: len(longest)] != longest for c in traces[first_leave].contexts), sizes
    rounds = parity_errors(target, draft, traces)
    worst = [(size, f"{t:.1e}", f"{d:.1e}") for size, t, d, _ in rounds]
    assert max(max(t, d) for _, t, d, _ in rounds) <= ATOL, worst
    after = sum(checked for size, _, _, checked in rounds if size < len(prompts))
    assert after >= 20, rounds  # many rows checked after rows left


# ----------------------------------------------------------------------------- mutants
def _select_rows_keeps_first_masks(self, rows):
    """Mutant: the kept rows' cache entries, but the first rows' validity masks."""
    self.valid = self.valid[: rows.numel()]
    for layer in self.layers():
        layer.keys, layer.values = layer.keys[rows], layer.values[rows]


def _compact_moves_keys_only(self):
    """Mutant: compaction gathers the keys but leaves the values where they were."""
    counts = self.valid.sum(1)
    width = int(counts.max())
    if width == self.committed:
        return
    order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :width]
    for layer in self.layers():
        batch, heads, _, dim = layer.keys.shape
        index = order[:, None, :, None].expand(batch, heads, width, dim)
        layer.keys, layer.values = layer.keys.gather(2, index), layer.values[:, :, :width]
    self.valid = torch.arange(width)[None, :] < counts[:, None]


def _lengths_count_holes(self):
    """Mutant: a row's next position counts its hole slots too."""
    return torch.full((self.valid.shape[0],), self.committed, dtype=torch.long)


@pytest.mark.parametrize(
    ("method", "mutant"),
    [
        ("select_rows", _select_rows_keeps_first_masks),
        ("compact", _compact_moves_keys_only),
        ("lengths", _lengths_count_holes),
    ],
    ids=["select-rows-stale-masks", "compact-keys-only", "positions-count-holes"],
)
def test_parity_check_fails_on_broken_cache_surgery(method, mutant, monkeypatch):
    monkeypatch.setattr(hf.DecodeState, "compact_slack", -(10**9))
    monkeypatch.setattr(KVState, method, mutant)
    target, draft, traces = decode(*CASES[2])
    rounds = parity_errors(target, draft, traces)
    assert max(max(t, d) for _, t, d, _ in rounds) > 1e-4, rounds


def test_hf_rms_norm_rounds_a_float64_model_to_float32():
    """The reason for :func:`float64_norms`: a nudge far below float32's resolution and far
    above float64's is rounded away by HF's norm, kept by the float64 one."""
    norm = tiny_causal_lm("llama", 0, attn="sdpa", dtype=torch.float64).model.norm
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((8, 32), dtype=torch.float64, generator=generator)
    nudged = x.clone()
    nudged[:, 0] *= 1 + 2.0**-40
    assert torch.equal(norm(x), norm(nudged))
    float64_norms(norm)
    difference = (norm(x) - norm(nudged)).abs()
    assert 0 < float(difference.max()) < 1e-10


# ----------------------------------------------------------------------------- grafted trees
#: Cycles of the tiny target's own greedy continuations: prompt lookup predicts them.
GRAFT_PROMPTS = [[49, 20, 18, 49, 20, 18, 49, 20, 18], [3, 10, 35, 24, 10, 35, 24, 10]]


def decode_grafted(shape, monkeypatch):
    """A batch decoded greedily (nss) by an unrelated draft model with a lookup branch grafted
    beside its tree each round, recording each grafted round's node counts before the graft."""
    from specsampling.gpu.hf import model_draft

    target, _ = pair("llama")
    draft = float64_norms(tiny_causal_lm("llama", 3, attn="sdpa", dtype=torch.float64))
    before = {}

    def recording(proposal, chains):
        grown = graft(proposal, chains)
        before[id(grown.tree)] = proposal.tree.num_nodes.tolist()
        return grown

    graft = model_draft.graft
    monkeypatch.setattr(model_draft, "graft", recording)
    mixed = hf.MixedDraft(draft, hf.NGramDraft(n=2, min_n=1), graft=True)
    dec = SpeculativeDecoder(target, mixed, "nss", shape)
    dec.traces = []
    ids, mask = left_pad(GRAFT_PROMPTS)
    dec.generate(ids, attention_mask=mask, max_new_tokens=16, temperature=0)
    return target, draft, dec.traces, before


def grafted_tokens_accepted(traces, before):
    """Per row and round: accepted tokens past the drafted nodes (on the grafted branch)."""
    counts = []
    for trace in traces:
        drafted = before.get(id(trace.tree))
        if drafted is None:
            continue
        parents, tokens = trace.tree.parents.tolist(), trace.tree.tokens.tolist()
        for b, emitted in enumerate(trace.emitted):
            node, past = 0, 0
            for token in emitted[:-1]:
                children = [c for c, p in enumerate(parents[b]) if p == node]
                node = next(c for c in children if tokens[b][c] == token)
                past += node >= drafted[b]
            counts.append(past)
    return counts


@pytest.mark.parametrize("shape", [Shape.chain(3), Shape.paths(2, 3)], ids=["chain", "tree"])
def test_parity_when_the_accepted_path_runs_through_a_grafted_branch(shape, monkeypatch):
    """The draft never forwarded a grafted node: after a path through one, its cache must take
    every emitted token from the fork on as pending (here up to 4), and its next rows must
    still equal no-cache forwards."""
    target, draft, traces, before = decode_grafted(shape, monkeypatch)
    assert max(grafted_tokens_accepted(traces, before)) == 3  # a whole grafted branch
    rounds = parity_errors(target, draft, traces)
    assert max(max(t, d) for _, t, d, _ in rounds) <= ATOL, rounds


def _commit_assumes_the_drafted_path(self, state, proposal, verified):
    """Mutant: the commit before grafting existed: the accepted path is taken to lie in the
    drafted nodes, so at most the last two emitted tokens are left pending."""
    kv = self.kv
    tokens, accepted = verified.tokens, verified.num_emitted - 1
    slots, offset = [], 0
    for depth in range(1, len(self.level_paths)):
        paths, exists = self.level_paths[depth], self.level_exists[depth]
        same = (paths == tokens[:, None, :depth]).all(-1) & exists
        use = same.any(-1) & (accepted >= depth)
        slots.append(torch.where(use, same.int().argmax(-1) + offset, -1))
        offset += paths.shape[1]
    kv.commit(torch.stack(slots, dim=1) if slots else torch.empty((tokens.shape[0], 0)).long())
    cached = accepted.clamp_max(len(self.level_paths) - 1)
    index = accepted[:, None] - 1 + torch.arange(2)[None, :]
    self.pending = tokens.gather(1, index.clamp_min(0))
    self.pending_valid = index >= cached[:, None]


def test_parity_check_fails_when_the_commit_ignores_the_graft(monkeypatch):
    monkeypatch.setattr(hf.ModelDraft, "commit", _commit_assumes_the_drafted_path)
    target, draft, traces, _ = decode_grafted(Shape.chain(3), monkeypatch)
    rounds = parity_errors(target, draft, traces)
    assert max(max(t, d) for _, t, d, _ in rounds) > 1e-4, rounds
