"""The pure-Python parts of the vLLM plugin (no vLLM needed): configuration, refusals, the version
pin, and the metadata -> verify_chain adapter on hand-made tensors in vLLM's flat layout."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import specsampling as ss  # noqa: E402
from specsampling.gpu import vllm_plugin as plugin  # noqa: E402


def test_config_from_env():
    assert plugin.config_from_env({}) is None
    assert plugin.config_from_env({plugin.ENV_SCHEME: "  "}) is None
    assert plugin.config_from_env({plugin.ENV_SCHEME: "block"}) == plugin.Config("block", False)
    with pytest.raises(ValueError, match="SPECSAMPLING_VLLM_VALIDATE: expected 0 or 1"):
        plugin.config_from_env({plugin.ENV_SCHEME: "block", plugin.ENV_VALIDATE: "yes"})


@pytest.mark.parametrize("name", ["standard", "nss", "specinfer", "rsd", "block", "traversal"])
def test_schemes_exact_on_chains_are_accepted(name):
    assert name in plugin.SCHEMES
    assert plugin.check_scheme(name) == name


@pytest.mark.parametrize("name", ["gumbel", "poisson", "gls", "gls_strong"])
def test_keyed_couplings_are_refused(name):
    with pytest.raises(ValueError, match="keyed coupling"):
        plugin.check_scheme(name)
    with pytest.raises(ValueError, match="SPECSAMPLING_VLLM_SCHEME"):
        plugin.config_from_env({plugin.ENV_SCHEME: name})


def test_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match="unknown or unsupported scheme 'blok'"):
        plugin.check_scheme("blok")


def test_version_pin():
    plugin.check_vllm_version("0.32.0")
    for version in ("0.31.2", "0.32.1", "0.33.0"):
        with pytest.raises(RuntimeError, match=f"found vLLM {version}"):
            plugin.check_vllm_version(version)


def test_request_refusals():
    plugin.check_request(SimpleNamespace(min_p=0.0, logit_bias=None, temperature=1.0))
    with pytest.raises(ValueError, match=r"^min_p: "):
        plugin.check_request(SimpleNamespace(min_p=0.05, logit_bias=None))
    with pytest.raises(ValueError, match=r"^logit_bias: "):
        plugin.check_request(SimpleNamespace(min_p=0.0, logit_bias={3: 1.0}))


def test_verify_step_names_a_layout_that_disagrees_with_the_counts():
    """Shapes that disagree with ``num_draft_tokens`` are refused naming the argument (they
    failed at indexing, unnamed), checked or not: host metadata, no device read."""
    probs = torch.full((6, 5), 0.2)  # T + B = 3 + 3 rows
    ids, counts = torch.tensor([1, 2, 3]), [2, 0, 1]
    cases = [
        ({"probs": probs[:5]}, r"^probs: expected shape \(6, V\)"),
        ({"draft_token_ids": ids[:2]}, r"^draft_token_ids: expected shape \(3,\)"),
        ({"draft_probs": torch.full((2, 5), 0.2)}, r"^draft_probs: expected shape \(3, V\)"),
        ({"draft_probs": torch.full((3, 4), 0.25)}, r"^draft_probs: expected 5 columns"),
        ({"generators": {5: torch.Generator()}}, r"^generators: request index 5"),
        ({"greedy": torch.tensor([True, False])}, r"^greedy: expected shape \(3,\)"),
        ({"num_draft_tokens": [2, -1, 2]}, r"^num_draft_tokens: expected non-negative"),
    ]
    for validate in (True, False):
        for change, message in cases:
            arguments = {
                "draft_token_ids": ids,
                "num_draft_tokens": counts,
                "probs": probs,
                "draft_probs": None,
                "greedy": None,
                "generators": {},
            } | change
            with pytest.raises(ValueError, match=message):
                plugin.verify_step("block", validate=validate, **arguments)
    assert plugin.verify_step("block", ids, counts, probs, None, None, {}).shape == (3, 3)


def test_checked_step_names_flat_rows_as_passed():
    """With ``validate=True`` a bad value is named by the argument and flat row the caller
    passed (``probs[4]``, ``draft_probs[2]``, ``draft_token_ids[2]``), not by the gathered
    ``[B, γ + 1, V]`` tables' (request, lane) coordinates under internal names; a greedy
    request's drafts (argmaxes) may have zero draft probability."""
    counts = [2, 1]  # T = 3, B = 2: probs rows 0-1 (+ bonus 2) and 3 (+ bonus 4)
    ids = torch.tensor([1, 2, 3])
    probs = torch.full((5, 4), 0.25)
    draft = torch.full((3, 4), 0.25)
    arguments = {
        "draft_token_ids": ids,
        "num_draft_tokens": counts,
        "probs": probs,
        "draft_probs": draft,
        "greedy": None,
        "generators": {},
    }
    nan_probs = probs.clone()
    nan_probs[4, 3] = float("nan")
    zero_draft = draft.clone()
    zero_draft[2] = torch.tensor([0.5, 0.5, 0.0, 0.0])  # row 2 drafted token 3
    cases = [
        ({"probs": nan_probs}, r"^probs\[4\]: NaN or inf at index 3"),
        ({"draft_probs": zero_draft}, r"^draft_probs\[2\]: the drafted token 3 has zero"),
        ({"draft_token_ids": torch.tensor([1, 2, 9])}, r"^draft_token_ids\[2\]: token id 9"),
        ({"draft_token_ids": ids.double()}, r"^draft_token_ids: expected an integer tensor"),
        ({"draft_probs": draft * 2}, r"^draft_probs\[0\]: mass is 2"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            plugin.verify_step("block", validate=True, **(arguments | change))
    greedy_second = {"draft_probs": zero_draft, "greedy": torch.tensor([False, True])}
    tokens = plugin.verify_step("block", validate=True, **(arguments | greedy_second))
    assert tokens.shape == (2, 3)


def test_chain_layout():
    layout = plugin.chain_layout([3, 0, 2])
    # logits rows: request 0 -> 0..3 (bonus 3), request 1 -> 4, request 2 -> 5..7 (bonus 7)
    assert layout.target_index.tolist() == [[0, 1, 2, 3], [4, 4, 4, 4], [5, 6, 7, 7]]
    # real lanes only (padding lanes are clamped in range and never read)
    assert layout.draft_index[0].tolist() == [0, 1, 2]
    assert layout.draft_index[2, :2].tolist() == [3, 4]
    assert int(layout.draft_index.max()) <= 4
    assert layout.num_drafts.tolist() == [3, 0, 2]
    with pytest.raises(ValueError, match="num_draft_tokens"):
        plugin.chain_layout([1, -1])


def _flat_case(rng, counts, vocab):
    """Random processed targets [T + B, V], drafts [T] and draft probs [T, V] in vLLM's layout."""
    rows = sum(counts) + len(counts)
    target = torch.tensor(rng.dirichlet(np.ones(vocab), size=rows))
    draft = torch.tensor(rng.dirichlet(np.ones(vocab), size=sum(counts)))
    tokens = torch.tensor([rng.choice(vocab, p=row.numpy()) for row in draft], dtype=torch.long)
    return target, tokens, draft


@pytest.mark.parametrize("scheme", ["standard", "block"])
def test_verify_step_equals_verify_chain_per_request(scheme):
    """Each request's row is verify_chain on that request alone with its own noise lanes."""
    rng = np.random.default_rng(0)
    counts, vocab = [3, 0, 2, 1], 5
    target, tokens, draft = _flat_case(rng, counts, vocab)
    generators = {row: torch.Generator().manual_seed(10 + row) for row in range(len(counts))}
    out = plugin.verify_step(scheme, tokens, counts, target, draft, None, generators)
    assert out.dtype == torch.int32 and out.shape == (4, 4)
    start = draft_start = 0
    for row, count in enumerate(counts):
        own = torch.Generator().manual_seed(10 + row)
        draws = torch.rand(2 * count + 1, dtype=torch.float64, generator=own)
        width = max(count, 1)
        accept = torch.zeros((1, width + 1), dtype=torch.float64)
        sample = torch.zeros((1, width + 1), dtype=torch.float64)
        accept[0, 1 : count + 1] = draws[:count]
        sample[0, : count + 1] = draws[count:]
        chain_target = torch.zeros((1, width + 1, vocab), dtype=torch.float64)
        chain_target[0, : count + 1] = target[start : start + count + 1]
        chain_target[0, count + 1 :] = target[start + count]
        chain_draft = torch.zeros((1, width, vocab), dtype=torch.float64)
        chain_draft[0, :count] = draft[draft_start : draft_start + count]
        chain_draft[0, count:] = 1.0 / vocab
        chain_tokens = torch.zeros((1, width), dtype=torch.long)
        chain_tokens[0, :count] = tokens[draft_start : draft_start + count]
        alone = ss.gpu.verify_chain(
            scheme,
            chain_tokens,
            chain_target,
            chain_draft,
            ss.gpu.Noise(accept, sample),
            num_draft_tokens=[count],
        )
        expected = alone.tokens[0, : max(counts) + 1].tolist()
        expected += [-1] * (max(counts) + 1 - len(expected))
        assert out[row].tolist() == expected, (row, count)
        start += count + 1
        draft_start += count


def test_seeded_request_ignores_its_neighbours():
    rng = np.random.default_rng(1)
    vocab = 6
    target, tokens, draft = _flat_case(rng, [2, 3, 1], vocab)
    first = plugin.verify_step(
        "block", tokens, [2, 3, 1], target, draft, None, {1: torch.Generator().manual_seed(5)}
    )
    # the same request (rows 3..6 of the targets, drafts 2..4) alone in another batch
    alone = plugin.verify_step(
        "block",
        tokens[2:5],
        [3],
        target[3:7],
        draft[2:5],
        None,
        {0: torch.Generator().manual_seed(5)},
    )
    assert first[1].tolist() == alone[0].tolist()


def test_greedy_rows_verify_against_the_argmax():
    """A greedy request emits its drafts while they equal the target argmax, then the argmax,
    whatever its draft probabilities say (they are replaced by the drafts' one-hot)."""
    target = torch.tensor(
        [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.3, 0.3, 0.4], [0.5, 0.4, 0.1]]
    )  # request 0: 3 drafts + bonus; request 1: bonus only
    tokens = torch.tensor([1, 1, 2])  # agrees, disagrees (argmax 0), never reached
    draft = torch.full((3, 3), 1 / 3)
    greedy = torch.tensor([True, True])
    for scheme in ("standard", "block", "traversal", "nss"):
        out = plugin.verify_step(scheme, tokens, [3, 0], target, draft, greedy, {})
        assert out.tolist() == [[1, 0, -1, -1], [0, -1, -1, -1]], scheme


def test_zero_draft_step():
    """A step where no request drafted: every row emits its bonus row's draw."""
    target = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    for scheme in ("standard", "block"):
        out = plugin.verify_step(
            scheme, torch.zeros(0, dtype=torch.long), [0, 0], target, None, None, {}
        )
        assert out.tolist() == [[1], [2]]


def _one_hot(index: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(index, vocab).to(torch.float64)


@pytest.mark.parametrize("scheme", plugin.SCHEMES)
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_greedy_verdicts_are_every_schemes_verdict_on_point_masses(scheme, with_draft_probs):
    """The greedy shortcut (no table read) emits what verify_chain emits for point-mass
    targets, for every scheme the plugin runs, whatever the noise and the draft law."""
    rng = np.random.default_rng(2)
    vocab, batch_size, width = 4, 64, 3
    best = torch.tensor(rng.integers(0, vocab, (batch_size, width + 1)))
    # drafts agree with the target's token often, so that every accepted length occurs
    agree = torch.tensor(rng.random((batch_size, width)) < 0.7)
    other = torch.tensor(rng.integers(0, vocab, (batch_size, width)))
    tokens = torch.where(agree, best[:, :width], other)
    counts = torch.tensor(rng.integers(0, width + 1, batch_size))
    draft = None
    if with_draft_probs:
        draft = torch.tensor(rng.dirichlet(np.ones(vocab), size=(batch_size, width)))
    noise = ss.gpu.Noise(
        torch.tensor(rng.random((batch_size, width + 1))),
        torch.tensor(rng.random((batch_size, width + 1))),
    )
    expected = ss.gpu.verify_chain(
        scheme, tokens, _one_hot(best, vocab), draft, noise, num_draft_tokens=counts
    ).tokens
    got = plugin.greedy_verdicts(
        torch.where(torch.arange(width)[None, :] < counts[:, None], tokens, 0), counts, best
    )
    assert got.tolist() == expected.tolist()
    lengths = (got != -1).sum(-1) - 1
    assert set(lengths.tolist()) == set(range(width + 1))


def test_greedy_verdicts_mutant_is_caught(monkeypatch):
    """A shortcut that counts every agreeing draft, not the agreeing prefix, fails the check
    above."""

    def counting_all(draft_tokens, num_drafts, best):
        width = draft_tokens.shape[1]
        agree = (torch.arange(width)[None, :] < num_drafts[:, None]) & (
            draft_tokens == best[:, :width]
        )
        lanes = torch.arange(width + 1)[None, :]
        accepted = agree.sum(-1, keepdim=True)
        drafts = torch.cat([draft_tokens, draft_tokens[:, :1]], 1)
        out = torch.where(lanes < accepted, drafts, -1)
        return torch.where(lanes == accepted, best.gather(1, accepted), out)

    monkeypatch.setattr(plugin, "greedy_verdicts", counting_all)
    with pytest.raises(AssertionError):
        test_greedy_verdicts_are_every_schemes_verdict_on_point_masses("standard", False)


@pytest.mark.parametrize("scheme", ["standard", "specinfer", "rsd", "block", "traversal", "nss"])
def test_flat_fast_path_equals_the_checked_path(scheme):
    """validate=False reads vLLM's flat tables in place (standard-rule schemes) or gathers them
    with index_select; validate=True runs verify_chain's checks on gathered tables: the same
    tokens for the same generators."""
    rng = np.random.default_rng(3)
    counts, vocab = [3, 0, 2, 1, 3, 3], 300
    target, tokens, draft = _flat_case(rng, counts, vocab)
    target, draft = target.float(), draft.float()
    for draft_probs in (draft, None):
        for seed in range(20):
            outs = [
                plugin.verify_step(
                    scheme,
                    tokens,
                    counts,
                    target,
                    draft_probs,
                    None,
                    {row: torch.Generator().manual_seed(seed * 10 + row) for row in range(6)},
                    validate,
                )
                for validate in (False, True)
            ]
            assert outs[0].tolist() == outs[1].tolist(), (draft_probs is None, seed)


def test_all_greedy_without_tables_equals_greedy_rows_with_tables():
    """probs=None (every request greedy, only the argmax given) gives the verdict the greedy
    rows get from the tables; a mixed batch keeps its sampled rows' verdicts."""
    rng = np.random.default_rng(4)
    counts, vocab = [3, 1, 0, 2], 7
    target, tokens, draft = _flat_case(rng, counts, vocab)
    argmax = target.argmax(-1)
    for scheme in ("standard", "block", "traversal"):
        bare = plugin.verify_step(scheme, tokens, counts, None, None, None, {}, argmax=argmax)
        every = torch.ones(len(counts), dtype=torch.bool)
        tabled = plugin.verify_step(scheme, tokens, counts, target, draft, every, {})
        assert bare.tolist() == tabled.tolist()
        mixed = torch.tensor([True, False, True, False])
        generators = {1: torch.Generator().manual_seed(1), 3: torch.Generator().manual_seed(3)}
        sampled = plugin.verify_step(scheme, tokens, counts, target, draft, None, dict(generators))
        generators = {1: torch.Generator().manual_seed(1), 3: torch.Generator().manual_seed(3)}
        both = plugin.verify_step(scheme, tokens, counts, target, draft, mixed, generators)
        assert both[[0, 2]].tolist() == bare[[0, 2]].tolist()
        assert both[[1, 3]].tolist() == sampled[[1, 3]].tolist()
    with pytest.raises(ValueError, match="argmax: required"):
        plugin.verify_step("standard", tokens, counts, None, None, None, {})
