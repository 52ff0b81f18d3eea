"""Adaptive drafting in the HF decoder: draft-length policies, early stopping, mixed drafts.

* **exactness of data-dependent lengths**, by the exact engine in Fractions: for every chain
  scheme, a chain whose length is a stopping time of the drafting (stop after a token of low
  draft probability, transformers' confidence rule, and other rules that read only the path
  drafted) has the target's stream law exactly; the mutant that *drops* the low-probability
  token (a decision that depends on the dropped token) is caught;
* **greedy equality**: every new option at temperature 0 emits ``model.generate(do_sample=
  False)``'s tokens, B = 1 and B = 3 with ragged prompts, with a draft that accepts little and
  with a self-draft that accepts everything (the schedule's lengths grow and are cut by the
  budget);
* **sampling losslessness**: the first two tokens' law over thousands of rows (chi-square on
  counts) for every new drafting option (an int8 weight-only draft among them), and an
  always-accept mutant under the same options that must fail;
* the policies' own rules (transformers' ``+2 / -1``; the cost model's argmax), early
  stopping's saved forwards, and refusals of what is not exact or not built.

False-positive budget: ``1e-3`` for the file, split evenly over its chi-square tests that must
accept; the negative control rejects at the same ``ALPHA`` (a power check).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specsampling as ss  # noqa: E402
import specsampling.gpu as ssg  # noqa: E402
from proofs_tests.chisquare import chi_square_pvalue  # noqa: E402
from proofs_tests.hf_models import (  # noqa: E402
    AcceptAll,
    left_pad,
    no_grad,  # noqa: F401 (autouse fixture)
    one_thread,  # noqa: F401 (autouse fixture)
    perturbed,
    tiny_causal_lm,
)
from specsampling.errors import UnsupportedShape  # noqa: E402
from specsampling.exact import target_joint  # noqa: E402
from specsampling.gpu.hf import (  # noqa: E402
    CostModelLength,
    HeuristicLength,
    LayerSkipDraft,
    MixedDraft,
    ModelDraft,
    NGramDraft,
    SpeculativeDecoder,
    quantize_int8,
)
from specsampling.gpu.hf import generate as hf_generate  # noqa: E402
from specsampling.gpu.hf.drafters import Proposal  # noqa: E402
from specsampling.gpu.hf.model_draft import graft  # noqa: E402
from specsampling.schemes.base import tables  # noqa: E402
from specsampling.simulators import CostModel  # noqa: E402
from specsampling.tree import DraftTree, DrawLaw  # noqa: E402

Shape = ss.Shape
CHAIN_SCHEMES = [
    name
    for name, scheme in ss.SCHEMES.items()
    if isinstance(ssg.SCHEMES.get(name), ssg.schemes.TreeLowering)
    and scheme.supports(Shape.chain(2))
]


# ----------------------------------------------------------------------------- exact engine
def round_law(scheme, pair, prefix, tree_of):
    """Exact law of one round's emitted tokens after ``prefix``: a chain grows token by token
    from the draft until ``tree_of(path)`` gives the tree to verify (``None``: draw on)."""
    law = {}

    def grow(path, weight):
        tree = tree_of(path)
        if tree is not None:
            for verdict, prob in scheme.verdict_law(tree, *tables(pair, tree, prefix)).items():
                emitted = (*tree.prefix(verdict.node), verdict.token)
                law[emitted] = law.get(emitted, 0) + weight * prob
            return
        draft = pair.draft(prefix + tuple(path))
        for token in range(pair.vocab_size):
            if draft[token] > 0:
                grow([*path, token], weight * draft[token])

    grow([], 1)
    return law


def stream_error(pair, round_law_after, length=3):
    """Max deviation of the first ``length`` emitted tokens' law from the target's, rounds
    after rounds, each round's law ``round_law_after(context)``."""
    rounds = {}

    def after(context, remaining):
        if remaining == 0:
            return {(): 1}
        if context not in rounds:
            rounds[context] = round_law_after(context)
        out = {}
        for emitted, prob in rounds[context].items():
            if len(emitted) >= remaining:
                out[emitted[:remaining]] = out.get(emitted[:remaining], 0) + prob
                continue
            for tail, tail_prob in after(context + emitted, remaining - len(emitted)).items():
                out[emitted + tail] = out.get(emitted + tail, 0) + prob * tail_prob
        return out

    law, target = after((), length), target_joint(pair, length)
    return max(abs(law.get(s, 0) - target.get(s, 0)) for s in {*law, *target})


def stopping_round_law(scheme, pair, max_length, stop, prefix, drop=False):
    """Exact law of one round whose chain ends after the first token ``x`` with
    ``stop(prefix, path)`` (or at ``max_length``); ``drop``: the mutant that removes that last
    token again."""

    def tree_of(path):
        if path and (len(path) == max_length or stop(prefix, path)):
            kept = path[:-1] if drop and len(path) > 1 and len(path) < max_length else path
            return DraftTree.chain(kept, law="iid")
        return None

    return round_law(scheme, pair, prefix, tree_of)


def stopping_stream_error(scheme, pair, stop, length=3, drop=False):
    """Max deviation of the first ``length`` emitted tokens' law from the target's."""
    return stream_error(
        pair, lambda context: stopping_round_law(scheme, pair, 3, stop, context, drop), length
    )


def low_confidence(pair):
    """transformers' rule: stop after a token of draft probability under 1/3."""
    return lambda prefix, path: pair.draft(prefix + tuple(path[:-1]))[path[-1]] < Fraction(1, 3)


def stop_rules(pair):
    return {
        "confidence": low_confidence(pair),
        "top of the next draft row": lambda prefix, path: (
            max(pair.draft(prefix + tuple(path))) < Fraction(1, 2)
        ),
        "token value": lambda prefix, path: path[-1] == 1,
    }


@pytest.mark.parametrize("name", CHAIN_SCHEMES)
def test_every_chain_scheme_is_exact_for_stopping_time_lengths(name):
    scheme = ss.SCHEMES[name]
    stopped = 0
    for seed in (0, 1):
        pair = ss.pairs.Random(vocab_size=3, seed=seed, exact=True)
        for rule in stop_rules(pair).values():
            assert stopping_stream_error(scheme, pair, rule) == 0
        law = stopping_round_law(scheme, pair, 3, low_confidence(pair), ())
        stopped += sum(p for e, p in law.items() if len(e) < 4) > 0
    assert stopped  # the rule did cut chains short


@pytest.mark.parametrize("name", ["standard", "block"])
def test_dropping_the_low_confidence_token_is_caught(name):
    errors = []
    for seed in (0, 1):
        pair = ss.pairs.Random(vocab_size=3, seed=seed, exact=True)
        scheme, rule = ss.SCHEMES[name], low_confidence(pair)
        errors.append(stopping_stream_error(scheme, pair, rule, drop=True))
    assert max(errors) > Fraction(1, 100)


def guessed(prefix, vocab_size):
    """A deterministic two-token guess from the context alone (a stand-in for prompt lookup)."""
    last = prefix[-1] if prefix else 0
    return [(last + 1) % vocab_size, (last + 2) % vocab_size]


def grafted_round_law(scheme, pair, prefix, law=None, depth=2):
    """Exact law of one round whose tree is a sampled chain of ``depth`` from the draft with
    :func:`guessed` grafted beside it (:func:`graft`, the decoder's own); ``law``: the mutant
    that labels the grafted tree with a law the scheme takes."""

    def tree_of(path):
        if len(path) < depth:
            return None
        drafted = DraftTree.from_draws(list(enumerate(path)), law="iid")
        proposal = Proposal(ssg.TreeBatch.from_trees([drafted]))
        tree = graft(proposal, [guessed(prefix, pair.vocab_size)]).tree.to_trees()[0]
        return tree if law is None else DraftTree(tree.parents, tree.tokens, tree.candidates, law)

    return round_law(scheme, pair, prefix, tree_of)


def grafted_stream_error(scheme, pair, law=None, length=3):
    """Max deviation of the first ``length`` emitted tokens' law from the target's."""
    return stream_error(pair, lambda context: grafted_round_law(scheme, pair, context, law), length)


@pytest.mark.parametrize("name", ["nss", "specinfer"])
def test_nss_and_specinfer_are_exact_for_grafted_trees(name):
    """A sampled chain with a deterministic guess grafted beside it (the decoder's own
    :func:`graft`): the stream law of nss and of specinfer (the guess a point mass) is the
    target's, exactly in Fractions; the tree reached them as law ``grafted``."""
    for seed in (0, 1):
        pair = ss.pairs.Random(vocab_size=3, seed=seed, exact=True)
        assert grafted_stream_error(ss.SCHEMES[name], pair) == 0
    with pytest.raises(UnsupportedShape, match="law 'grafted'"):
        grafted_stream_error(ss.SCHEMES["rsd"], pair)


#: Tree schemes that take trees of some sampled law: each, handed a grafted tree labelled with
#: its own law (specinfer: ``iid``, its guesses read as draws from q), is biased (the reason
#: MixedDraft(graft=True) refuses them, and specinfer tests guesses as point masses). standard
#: and block verify chains only; spechub's trees must hold its hub.
LABELLED = {
    "specinfer": "iid",
    "rsd": "without",
    "traversal": "iid",
    "spectr": "iid",
    "greedy": "greedy",
    "resispec": "iid",
    "ot_optimal": "iid",
    "ot_binned": "iid",
    "khisti": "iid",
}


@pytest.mark.parametrize("name", sorted(LABELLED))
def test_every_other_tree_scheme_is_biased_on_grafted_trees(name):
    errors = []
    for seed in (0, 1):
        pair = ss.pairs.Random(vocab_size=3, seed=seed, exact=True)
        errors.append(grafted_stream_error(ss.SCHEMES[name], pair, DrawLaw(LABELLED[name])))
    assert max(errors) > Fraction(1, 100)


def test_labelled_schemes_are_every_tree_scheme_but_nss():
    trees = {
        name
        for name, scheme in ss.SCHEMES.items()
        if isinstance(ssg.SCHEMES.get(name), ssg.schemes.TreeLowering)
        and any(scheme.exact_for(law, False) for law in DrawLaw)
    }
    assert trees - set(LABELLED) == {"nss", "spechub"}


# ----------------------------------------------------------------------------- policies
def test_heuristic_schedule_is_transformers_rule():
    policy = HeuristicLength(initial=3, max_length=8)
    policy.start(5)
    seen = []
    for drafted, accepted in [(3, 3), (5, 5), (7, 2), (6, 0), (5, 5), (7, 7), (8, 8), (8, 8)]:
        seen.append(policy.length(1))
        assert seen[-1] == drafted
        policy.update([drafted], [accepted], {}, drafted, 1)
    assert seen == [3, 5, 7, 6, 5, 7, 8, 8]
    policy.start(5)  # transient: every call starts afresh
    assert policy.length(1) == 3
    batch = HeuristicLength()
    batch.start(4)
    batch.update([4, 4], [4, 3], {}, 4, 2)  # one row rejected: -1
    assert batch.length(2) == 3
    batch.update([2, 1], [2, 1], {}, 2, 2)  # rows stopped early, all their drafts accepted: +2
    assert batch.length(2) == 5
    for _ in range(10):
        batch.update([1], [0], {}, 1, 1)
    assert batch.length(1) == 1


def test_cost_model_length_is_the_predicted_argmax():
    costs = CostModel(0.10, 0.004, 0.03, 0.0)
    policy = CostModelLength(max_length=12, costs=costs, prior_alpha=0.5, prior_weight=1)
    policy.start(4)
    for _ in range(30):
        policy.update([6], [5], {}, 6, 1)  # 5 successes of 6 trials a round
    alpha = (30 * 5 + 0.5) / (30 * 6 + 1)
    assert policy.alpha == pytest.approx(alpha)
    speeds = [
        (1 - alpha ** (k + 1)) / (1 - alpha) / costs.round_seconds(Shape.chain(k))
        for k in range(1, 13)
    ]
    assert policy.length(1) == 1 + speeds.index(max(speeds))
    fitted = CostModelLength(max_length=6, warmup=2)
    fitted.start(3)
    assert fitted.length(1) == 3  # the shape's length until measured
    prefill = {"draft": 1.0, "target": 5.0, "verify": 0}  # the first round also ran the prompt
    fitted.update([2], [2], prefill, 2, 1)
    assert fitted.length(1) == 3  # the first round is not measured
    for drafted in (5, 3):
        seconds = {"draft": 0.02 * drafted, "target": 0.1 + 0.01 * (drafted + 1), "verify": 0}
        fitted.update([drafted], [drafted], seconds, drafted, 1)
    model = fitted.fitted()
    assert model.draft_fixed == pytest.approx(0.02)
    assert model.target_fixed == pytest.approx(0.1)
    assert model.target_per_token == pytest.approx(0.01)
    assert fitted.length(1) == 6  # everything accepted, cheap draft: the longest chain


# ----------------------------------------------------------------------------- greedy
PROMPTS = [[3, 5, 7, 9, 11], [4, 2], [8, 1, 6, 6]]


def llama(seed, vocab=64, layers=2):
    return tiny_causal_lm("llama", seed, vocab=vocab, attn="eager", layers=layers)


@pytest.fixture(scope="module")
def pair():
    target = llama(0)
    return target, perturbed(target, 0.05, 1)


def greedy_reference(model, prompt, length):
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=length)
    return out[0, len(prompt) :].tolist()


def options(target, draft):
    """(label, drafter, length policy) of every new option, and some combinations."""
    return [
        ("confidence", ModelDraft(draft, confidence=0.6), None),
        ("heuristic", draft, HeuristicLength(initial=1, max_length=6)),
        ("cost model", draft, CostModelLength(max_length=6, costs=CostModel.relative(0.2))),
        ("cost model fitted", draft, CostModelLength(max_length=6, warmup=1)),
        ("mixed", MixedDraft(draft, NGramDraft(n=2, min_n=1)), None),
        ("all", MixedDraft(ModelDraft(draft, confidence=0.6)), HeuristicLength(initial=2)),
        ("layerskip", ModelDraft(LayerSkipDraft(target, [0]), confidence=0.9), HeuristicLength()),
        ("int8", ModelDraft(quantize_int8(draft, max_rows=64), confidence=0.6), HeuristicLength()),
    ]


@pytest.mark.parametrize("scheme", ["standard", "block", "traversal", "nss"])
def test_greedy_equals_generate_for_every_option(pair, scheme):
    target, weak = pair
    ids, mask = left_pad(PROMPTS)
    expected = [greedy_reference(target, p, 12) for p in PROMPTS]
    for draft in (weak, target):  # little accepted; everything accepted (lengths grow)
        for label, drafter, length in options(target, draft):
            dec = SpeculativeDecoder(target, drafter, scheme, Shape.chain(3), length=length)
            out = dec.generate(ids, attention_mask=mask, max_new_tokens=12, temperature=0)
            assert out.sequences[:, ids.shape[1] :].tolist() == expected, label
            alone = dec.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=12, temperature=0)
            assert alone.sequences[0, 5:].tolist() == expected[0], label
            if draft is target and label in ("heuristic", "cost model"):
                assert max(alone.stats.emitted[0]) > 4, label  # a chain longer than the shape's


def test_self_draft_schedule_grows_and_stops_at_the_budget(pair):
    target, _ = pair
    dec = SpeculativeDecoder(target, target, "standard", Shape.chain(3), length=HeuristicLength())
    out = dec.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=30, temperature=0)
    assert out.stats.emitted == ((4, 6, 8, 10, 2),)  # chains of 3, 5, 7, 9, then the room


def test_a_chain_is_cut_to_the_budget(pair):
    """Without a length policy too, no token is drafted that the budget could not keep."""
    target, _ = pair
    dec = SpeculativeDecoder(target, target, "standard", Shape.chain(4))
    out = dec.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=7, temperature=0)
    assert out.sequences[0, 5:].tolist() == greedy_reference(target, PROMPTS[0], 7)
    assert out.stats.emitted == ((5, 2),)
    assert out.stats.draft_forwards == 4 + 1  # chain(4) (the first with the prompt), chain(1)


def test_a_round_with_one_token_left_drafts_nothing(pair):
    """Where every row may emit one more token the target draws it: no draft forward, no
    drafted node scored (as transformers' assisted generation; chain(1) was drafted), for
    trees as for chains, and the greedy tokens unchanged."""
    target, _ = pair
    prompt = torch.tensor([PROMPTS[0]])
    for scheme, shape, first in [
        ("standard", Shape.chain(4), 4),
        ("specinfer", Shape.paths(2, 2), 2),
    ]:
        dec = SpeculativeDecoder(target, target, scheme, shape)
        dec.traces = []
        out = dec.generate(prompt, max_new_tokens=1, temperature=0)
        assert out.sequences[0, 5:].tolist() == greedy_reference(target, PROMPTS[0], 1)
        assert (out.stats.draft_forwards, out.stats.target_forwards) == (0, 1)
        assert [int(t.tree.num_nodes.max()) for t in dec.traces] == [1]
        out = dec.generate(prompt, max_new_tokens=first + 2, temperature=0)
        assert out.sequences[0, 5:].tolist() == greedy_reference(target, PROMPTS[0], first + 2)
        assert out.stats.emitted == ((first + 1, 1),) and out.stats.draft_forwards == first


def test_early_stopping_spends_no_forward_past_the_stop(pair):
    target, draft = pair
    stopped = SpeculativeDecoder(target, ModelDraft(draft, confidence=1.0), "standard")
    out = stopped.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=10, seed=0)
    assert out.stats.draft_forwards == out.stats.rounds  # one per round
    assert all(e <= 2 for e in out.stats.emitted[0])
    full = SpeculativeDecoder(target, draft, "standard").generate(
        torch.tensor([PROMPTS[0]]), max_new_tokens=10, seed=0
    )
    assert full.stats.draft_forwards == 4 * full.stats.rounds  # chain(4): four levels


def test_mixed_draft_uses_the_lookup_where_it_matches(pair):
    target, draft = pair
    mixed = MixedDraft(draft, NGramDraft(n=2, min_n=1))
    dec = SpeculativeDecoder(target, mixed, "standard", Shape.chain(3))
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    out = dec.generate(torch.tensor([prompt]), max_new_tokens=12, temperature=0)
    assert out.sequences[0, len(prompt) :].tolist() == greedy_reference(target, prompt, 12)
    assert 0 < mixed.lookup_rounds < out.stats.rounds or mixed.lookup_rounds == out.stats.rounds
    assert mixed.lookup_rounds > 0


def test_graft_follows_drafted_children_then_hangs_the_rest():
    trees = [
        DraftTree.from_draws([(0, 5), (0, 6), (1, 7)], law="iid"),
        DraftTree.from_draws([(0, 5), (1, 7)], law="iid"),
        DraftTree.from_draws([(0, 2)], law="iid"),
    ]
    batch = ssg.TreeBatch.from_trees(trees)
    expanded = torch.tensor([[True, True] + [False] * 2] * 2 + [[True] + [False] * 3])
    values = torch.arange(5.0)[:, None].expand(5, 3)
    raw = torch.zeros((3, 4, 3))
    proposal = Proposal(batch, (expanded, values), raw, drawn="bookkeeping")
    grown = graft(proposal, [[5, 8, 9], [5, 7], []])
    rows = grown.tree.to_trees()
    # row 0: 5 is drafted, 8 is not: nodes 4 (8 under 5) and 5 (9 under 8), law grafted
    assert rows[0].tokens == (-1, 5, 6, 7, 8, 9)
    assert rows[0].parents == (-1, 0, 0, 1, 1, 4)
    assert rows[0].candidates[1] == (3, 4)
    assert rows[0].law is DrawLaw.GRAFTED and rows[0].guesses == (-1, 4, -1, -1, 5, -1)
    # row 1: the guess lies in the drafted tree; row 2: no guess. Both keep tree and law.
    assert rows[1:] == trees[1:]
    assert grown.tree.chains == (False, True, True)
    wide, kept = grown.draft_rows
    assert wide.shape == (3, 6) and torch.equal(wide[:, :4], expanded) and not wide[:, 4:].any()
    assert kept is values and grown.drawn == "bookkeeping"
    assert grown.draft_logits.shape == (3, 6, 3) and grown.draft_logits[:, 4:].isnan().all()
    with pytest.raises(ValueError, match=r"chains: expected one per row \(3\), got 1"):
        graft(proposal, [[1]])
    # A drafter's batch padded past every row's nodes (repeated draws merged): padding dropped.
    pad = torch.nn.functional.pad
    wide = ssg.TreeBatch(
        pad(batch.parents, (0, 3), value=-1),
        pad(batch.tokens, (0, 3), value=-1),
        batch.num_nodes,
        pad(batch.candidates, (0, 0, 0, 3), value=-1),
        pad(batch.depth, (0, 3), value=-1),
        batch.laws,
    )
    padded = Proposal(wide, (pad(expanded, (0, 3)), values), pad(raw, (0, 0, 0, 3)))
    grown = graft(padded, [[6, 1], [], []])  # one node more than row 0's four
    assert grown.tree.parents.shape == (3, 5) and grown.draft_rows[0].shape == (3, 5)
    assert grown.draft_logits.shape == (3, 5, 3)
    assert torch.equal(grown.draft_rows[0][:, :4], expanded)
    assert grown.tree.to_trees()[0].tokens == (-1, 5, 6, 7, 1)


@pytest.mark.parametrize("scheme", ["nss", "specinfer"])
@pytest.mark.parametrize("branch", [False, True], ids=["extends-the-chain", "beside-it"])
def test_grafted_nodes_are_never_checked_against_a_draft_row(branch, scheme):
    """Greedy tables (one-hot rows) and a draft stopped after one token: a lookup that agrees
    with it and runs on extends the model's chain (still a chain), one that disagrees hangs
    beside it; either way the grafted tokens have no draft row of their own, the target's
    argmax path is emitted, and no zero-draft-probability check may fire."""
    from types import SimpleNamespace

    from specsampling.gpu.hf.verification import verification_for

    drafted = DraftTree.chain([2], law="iid")
    proposal = Proposal(
        ssg.TreeBatch.from_trees([drafted]),
        (torch.tensor([[True, False]]), torch.eye(5)[[2]].double()),  # q(. | root): 2
    )
    grown = graft(proposal, [[4, 3] if branch else [2, 3, 1]])
    assert grown.tree.chains == (not branch,) and grown.tree.laws == (DrawLaw.GRAFTED,)
    argmax = [2, 4, 0, 0]  # the target's greedy token at each depth
    nodes = grown.tree.num_nodes.item()
    target = torch.zeros((1, nodes, 5), dtype=torch.float64)
    for node in range(nodes):
        target[0, node, argmax[grown.tree.depth[0, node]]] = 1.0
    state = SimpleNamespace(generator=torch.Generator().manual_seed(0))
    verified = verification_for(scheme, Shape.chain(3)).verify(state, grown, target)
    assert verified.tokens[0, : verified.num_emitted[0]].tolist() == [2, 4]


GRAFT_SHAPES = [Shape.chain(3), Shape.paths(2, 3)]


@pytest.mark.parametrize("shape", GRAFT_SHAPES, ids=str)
def test_grafted_greedy_equals_generate(pair, shape):
    """B = 3 ragged and B = 1, a draft that accepts little and a self-draft, prompts whose
    lookups hit; with early stopping and lengths on chains."""
    target, weak = pair
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [4, 2], [8, 1, 6, 6, 8, 1]]
    ids, mask = left_pad(prompts)
    expected = [greedy_reference(target, p, 14) for p in prompts]
    for draft in (weak, target):
        setups = [(MixedDraft(draft, NGramDraft(n=2, min_n=1), graft=True), None)]
        if shape.is_chain:
            stopping = MixedDraft(ModelDraft(draft, confidence=0.6), graft=True)
            setups.append((stopping, HeuristicLength(initial=2)))
        for (mixed, length), scheme in itertools.product(setups, ["nss", "specinfer"]):
            dec = SpeculativeDecoder(target, mixed, scheme, shape, length=length)
            out = dec.generate(ids, attention_mask=mask, max_new_tokens=14, temperature=0)
            assert out.sequences[:, ids.shape[1] :].tolist() == expected, (repr(mixed), scheme)
            assert mixed.lookup_rounds > 0
            alone = dec.generate(torch.tensor([prompts[0]]), max_new_tokens=14, temperature=0)
            assert alone.sequences[0, len(prompts[0]) :].tolist() == expected[0], repr(mixed)


# ----------------------------------------------------------------------------- sampling
FALSE_POSITIVE_BUDGET = 1e-3
NUM_ROWS = 3000
SMALL_VOCAB = 10
PROMPT = [1, 2, 3, 1, 2]
SAMPLING_CASES = [
    ("standard", "confidence", {}),
    ("block", "confidence", {"temperature": 0.5}),
    ("standard", "heuristic", {}),
    ("traversal", "cost model", {}),
    ("standard", "mixed", {}),
    ("standard", "all", {"temperature": 0.8, "top_p": 0.95}),
    ("standard", "int8", {"temperature": 0.8}),
    ("nss", "graft", {}),
    ("nss", "graft, stopping", {"temperature": 0.8}),
    ("specinfer", "graft", {"temperature": 0.8}),
    ("specinfer", "graft, stopping", {}),
]
NUM_CHI_SQUARE_TESTS = len(SAMPLING_CASES)
ALPHA = FALSE_POSITIVE_BUDGET / NUM_CHI_SQUARE_TESTS


@pytest.fixture(scope="module")
def small_pair():
    return llama(5, vocab=SMALL_VOCAB), llama(6, vocab=SMALL_VOCAB)


def small_options(draft):
    return {
        "confidence": (ModelDraft(draft, confidence=0.3), None),
        "heuristic": (draft, HeuristicLength(initial=1)),
        "cost model": (draft, CostModelLength(max_length=4, costs=CostModel.relative(0.1))),
        "mixed": (MixedDraft(draft, NGramDraft(n=2, min_n=1)), None),
        "all": (MixedDraft(ModelDraft(draft, confidence=0.3)), HeuristicLength(initial=1)),
        # every call through the int8 kernel, the batch of rows included
        "int8": (quantize_int8(draft, max_rows=10**6), HeuristicLength(initial=1)),
        "graft": (MixedDraft(draft, NGramDraft(n=2, min_n=1), graft=True), None),
        "graft, stopping": (
            MixedDraft(ModelDraft(draft, confidence=0.3), NGramDraft(n=2, min_n=1), graft=True),
            HeuristicLength(initial=1),
        ),
    }


def two_token_law(target, settings):
    """The exact law of the first two tokens after ``PROMPT`` from no-cache forwards."""

    def probs(tokens):
        logits = target(input_ids=torch.tensor([tokens])).logits[0, -1].double()
        return ssg.process(logits, **settings)

    first = probs(PROMPT)
    law = {}
    for x in range(SMALL_VOCAB):
        if first[x] > 0:
            second = probs([*PROMPT, x])
            for y in range(SMALL_VOCAB):
                law[(x, y)] = float(first[x] * second[y])
    return law


def two_token_counts(dec, settings, seed):
    out = dec.generate(torch.tensor([PROMPT] * NUM_ROWS), max_new_tokens=2, seed=seed, **settings)
    return Counter(tuple(row) for row in out.sequences[:, len(PROMPT) :].tolist()), out


@pytest.mark.parametrize(("scheme", "option", "settings"), SAMPLING_CASES)
def test_sampling_two_token_law(small_pair, scheme, option, settings):
    target, draft = small_pair
    drafter, length = small_options(draft)[option]
    dec = SpeculativeDecoder(target, drafter, scheme, Shape.chain(3), length=length)
    counts, out = two_token_counts(dec, settings, seed=13)
    assert chi_square_pvalue(counts, two_token_law(target, settings)) > ALPHA
    assert max(max(e) for e in out.stats.emitted) >= 2  # some rows emitted 2 in one round


@pytest.mark.parametrize(
    ("option", "settings"),
    [("confidence", {"temperature": 0.5}), ("heuristic", {"temperature": 0.5}), ("all", {})],
)
def test_negative_control_always_accept_fails(small_pair, option, settings):
    """At temperature 1 the tiny models' rows are near uniform, too close to tell one token
    apart: the controls sharpen them (0.5) or let the mutant accept a point mass."""
    target, draft = small_pair
    drafter, length = small_options(draft)[option]
    lowering = ssg.schemes.tree_lowering(ssg.schemes.get_lowering("standard"))
    mutant = AcceptAll(lowering, Shape.chain(3))
    dec = SpeculativeDecoder(target, drafter, mutant, Shape.chain(3), length=length)
    counts, _ = two_token_counts(dec, settings, seed=13)
    assert chi_square_pvalue(counts, two_token_law(target, settings)) < ALPHA


def test_negative_control_grafted_trees_under_a_sampled_law_fail(small_pair, monkeypatch):
    """The same grafted rounds verified by spectr, its refusal bypassed (the trees labelled
    i.i.d.): the law check must catch the bias the exact engine shows."""
    from specsampling.gpu.hf import model_draft
    from specsampling.gpu.hf.verification import verification_for

    target, draft = small_pair

    def labelled(proposal, chains):
        grown = graft(proposal, chains)
        batch = grown.tree
        iid = ssg.TreeBatch(
            batch.parents,
            batch.tokens,
            batch.num_nodes,
            batch.candidates,
            batch.depth,
            (DrawLaw.IID,) * batch.batch_size,
        )
        return grown._replace(tree=iid)

    monkeypatch.setattr(model_draft, "graft", labelled)
    mixed = MixedDraft(draft, NGramDraft(n=2, min_n=1), graft=True)
    dec = SpeculativeDecoder(target, mixed, "nss", Shape.chain(3))
    dec.verification = verification_for("spectr", Shape.chain(3))
    counts, _ = two_token_counts(dec, {}, seed=13)
    assert mixed.lookup_rounds > 0
    assert chi_square_pvalue(counts, two_token_law(target, {})) < ALPHA


# ----------------------------------------------------------------------------- refusals
def test_refusals(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="confidence: expected a number in"):
        ModelDraft(draft, confidence=0)
    with pytest.raises(ValueError, match="confidence: expected a number in"):
        ModelDraft(draft, confidence="high")
    stopping = ModelDraft(draft, confidence=0.5)
    with pytest.raises(UnsupportedShape, match="confidence: adaptive draft lengths draft chains"):
        SpeculativeDecoder(target, stopping, "specinfer", Shape.paths(2, 2))
    with pytest.raises(UnsupportedShape, match=r"confidence: .*keyed coupling"):
        SpeculativeDecoder(target, ModelDraft(draft, confidence=0.5), "gumbel", Shape.chain(2))
    with pytest.raises(UnsupportedShape, match="length: adaptive draft lengths draft chains"):
        SpeculativeDecoder(target, draft, "specinfer", Shape.paths(2, 2), length=HeuristicLength())
    with pytest.raises(UnsupportedShape, match=r"length: .*keyed coupling"):
        SpeculativeDecoder(target, draft, "gls", Shape.chain(2), length=HeuristicLength())
    with pytest.raises(ValueError, match="length: expected a DraftLength policy"):
        SpeculativeDecoder(target, draft, "standard", Shape.chain(2), length=4)
    with pytest.raises(UnsupportedShape, match="MixedDraft"):
        SpeculativeDecoder(target, MixedDraft(draft), "specinfer", Shape.paths(2, 2))
    with pytest.raises(ValueError, match="ngram: expected an NGramDraft"):
        MixedDraft(draft, ngram=3)
    with pytest.raises(ValueError, match="graft: expected True or False"):
        MixedDraft(draft, graft="yes")
    grafting = MixedDraft(draft, graft=True)
    for scheme, shape in [("standard", Shape.chain(2)), ("spectr", Shape.paths(2, 2))]:
        with pytest.raises(UnsupportedShape, match=r"law 'grafted'.*\['nss', 'specinfer'\]"):
            SpeculativeDecoder(target, grafting, scheme, shape)
    # a lookup branch beside draws without replacement: nss alone
    with pytest.raises(UnsupportedShape, match=r"law 'unknown'.*\['nss'\]"):
        SpeculativeDecoder(target, grafting, "rsd", Shape.star(2, replacement=False))
    with pytest.raises(UnsupportedShape, match=r"keyed coupling.*'nss'"):
        SpeculativeDecoder(target, grafting, "gumbel", Shape.chain(2))
    with pytest.raises(ValueError, match="initial: expected at most max_length"):
        HeuristicLength(initial=9, max_length=4)
    with pytest.raises(ValueError, match="max_length"):
        CostModelLength(max_length=0)
    with pytest.raises(ValueError, match=r"costs: expected a specsampling\.simulators\.CostModel"):
        CostModelLength(costs=1.0)
    with pytest.raises(ValueError, match="prior_alpha"):
        CostModelLength(prior_alpha=1.0)
    for weight in (True, math.inf, float("nan"), 0):
        with pytest.raises(ValueError, match="prior_weight: expected a finite number > 0"):
            CostModelLength(prior_weight=weight)
    assert CostModelLength(prior_weight=np.float32(2.0), prior_alpha=np.float64(0.5)).alpha == 0.5
    assert ModelDraft(draft, confidence=np.float32(0.5)).confidence == 0.5  # numpy numbers too
    with pytest.raises(TypeError, match="model: expected a Hugging Face causal LM"):
        ModelDraft("x")
    with pytest.raises(ValueError, match="layers: expected increasing distinct integer"):
        LayerSkipDraft(target, [0.5])  # was taken as layer 0
    for seed in (2**64, -1):
        with pytest.raises(ValueError, match="seed: expected an integer"):
            SpeculativeDecoder(target, draft).generate(torch.tensor([[1, 2]]), 2, seed=seed)


def test_custom_generate_takes_the_new_options(pair):
    target, _ = pair
    ids = torch.tensor([PROMPTS[0]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=9, pad_token_id=0)
    out = target.generate(
        input_ids=ids,
        custom_generate=hf_generate,
        draft_model=MixedDraft(ModelDraft(target, confidence=0.5)),
        draft_length=HeuristicLength(),
        shape=Shape.chain(2),
        do_sample=False,
        max_new_tokens=9,
        pad_token_id=0,
    )
    assert torch.equal(out, expected)


@pytest.mark.slow
def test_greedy_equals_generate_on_real_weights():
    """SmolLM2-135M (float32; the draft its own first 6 of 30 layers, as tests/test_hf_real.py):
    every new option at T = 0, B = 1 and B = 3, emits transformers' greedy tokens."""
    from specsampling.gpu import hf

    model, tokenizer = hf.load_model("smollm2-135m", dtype=torch.float32)
    model.generation_config.eos_token_id = None
    texts = ["def fibonacci(n):", "The capital of France is", "a b c a b c a b"]
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    expected = [greedy_reference(model, p, 10) for p in prompts]
    pad = tokenizer.pad_token_id or 0
    ids, mask = left_pad(prompts, pad)
    skip = LayerSkipDraft(model, list(range(6)))
    for label, drafter, length in [
        ("confidence + heuristic", ModelDraft(skip, confidence=0.4), HeuristicLength()),
        ("cost model", skip, CostModelLength(max_length=8)),
        ("mixed", MixedDraft(ModelDraft(skip, confidence=0.4)), CostModelLength(max_length=8)),
    ]:
        dec = SpeculativeDecoder(model, drafter, "standard", Shape.chain(4), length=length)
        out = dec.generate(ids, attention_mask=mask, max_new_tokens=10, temperature=0)
        assert out.sequences[:, ids.shape[1] :].tolist() == expected, label
        alone = dec.generate(torch.tensor([prompts[0]]), max_new_tokens=10, temperature=0)
        assert alone.sequences[0, len(prompts[0]) :].tolist() == expected[0], label
