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
