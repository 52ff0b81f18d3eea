"""Recorded trees: the file round-trips, replay is exact for the recorded tables, and
:func:`record` captures what the decoder drafted and processed (tiny random HF models).

Statistical checks: 4 comparisons at 4.5 standard errors with fixed seeds (budget < 3e-5).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import specsampling as ss
from proofs_tests.hf_models import perturbed, tiny_causal_lm
from specsampling import simulators as sim
from specsampling.schemes import tables


@pytest.fixture(scope="module")
def recorded() -> sim.RecordedTrees:
    pair = ss.pairs.Random(vocab_size=6, seed=0)
    return sim.RecordedTrees.from_pair(pair, ss.Shape.paths(2, 2), 300, generator=0)


def test_full_storage_round_trips_and_replays_the_exact_tables(recorded, tmp_path) -> None:
    path = recorded.save(tmp_path / "trees.npz")
    back = sim.RecordedTrees.load(path)
    assert len(back) == 300 and back.shape == ss.Shape.paths(2, 2) and back.vocab_size == 6
    assert back.meta["format"] == "specsampling.recorded-trees" and back.meta["version"] == 2
    pair = ss.pairs.Random(vocab_size=6, seed=0)
    assert sum(len(c) != len(set(c)) for i in range(300) for c in back.tree(i).candidates) > 0
    for i in range(0, 300, 37):
        tree = back.tree(i)
        assert tree.law == ss.DrawLaw.IID
        want_t, want_d = tables(pair, tree, ())
        got_t, got_d = back.tables(i)
        np.testing.assert_allclose(got_t, want_t, atol=1e-7)  # float32 storage
        expanded = [bool(tree.candidates[n]) for n in range(tree.num_nodes)]
        np.testing.assert_allclose(got_d[expanded], want_d[expanded], atol=1e-7)
        assert np.allclose(got_t.sum(1), 1, atol=1e-12) and np.allclose(got_d.sum(1), 1, atol=1e-12)
    assert not list(tmp_path.glob("*.part"))  # written atomically


def test_replayed_estimates_agree_with_the_exact_engine(recorded) -> None:
    pair = ss.pairs.Random(vocab_size=6, seed=0)
    shape = ss.Shape.paths(2, 2)
    for name in ("traversal", "specinfer", "spectr"):  # spectr counts repeated draws
        est = sim.estimate(name, recorded)
        assert est.num_trees == 300
        exact = float(ss.expected_emitted(name, pair, shape))
        assert abs(est.mean - exact) <= 4.5 * est.stderr, (name, est, exact)


def test_top_k_storage_keeps_the_head_and_the_children() -> None:
    pair = ss.pairs.Random(vocab_size=40, seed=3)
    shape = ss.Shape.paths(2, 2)
    kept = sim.RecordedTrees.from_pair(pair, shape, 20, generator=1, keep=5)
    full = sim.RecordedTrees.from_pair(pair, shape, 20, generator=1)
    assert kept.ids is not None and kept.ids.shape[-1] == 5 + 2  # K + the most children
    for i in range(20):
        tree = kept.tree(i)
        t_full, _ = full.tables(i)
        t_kept, d_kept = kept.tables(i)
        for n in range(tree.num_nodes):
            ids = kept.ids[i, n][kept.ids[i, n] >= 0]
            for child in tree.candidates[n]:
                assert tree.tokens[child] in ids  # the drafted tokens are always kept
            np.testing.assert_allclose(t_kept[n, ids], t_full[n, ids], atol=1e-6)
            if tree.candidates[n]:  # the head of max(p, q) is kept (leaves: no draft row)
                score = np.maximum(t_full[n], full.tables(i)[1][n])
                assert np.sort(score[ids])[-5] >= np.sort(score)[-5] - 1e-6
            tail = kept.target_tail[i, n]
            rest = np.setdiff1d(np.arange(40), ids)
            np.testing.assert_allclose(t_kept[n, rest], tail / len(rest), atol=1e-12)
        assert np.allclose(t_kept.sum(1), 1) and np.allclose(d_kept.sum(1), 1)
    assert "tail mass" in kept.summary()


def test_load_refuses_other_files(tmp_path, recorded) -> None:
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros(2))
    with pytest.raises(ValueError, match="not a recorded-trees file"):
        sim.RecordedTrees.load(bad)
    path = recorded.save(tmp_path / "ok.npz")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    meta["version"] = 99
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "future.npz", **arrays)
    with pytest.raises(ValueError, match="version 99"):
        sim.RecordedTrees.load(tmp_path / "future.npz")


def test_replay_refuses_schemes_and_shapes_it_is_not_exact_for(recorded) -> None:
    with pytest.raises(ss.UnsupportedShape, match="rsd"):
        sim.estimate("rsd", recorded)
    with pytest.raises(ValueError, match="recorded with paths"):
        sim.estimate("traversal", recorded, ss.Shape.chain(2))
    with pytest.raises(ValueError, match="holds 300 trees"):
        sim.estimate("traversal", recorded, num_trees=301)


def test_trees_of_another_law_are_refused_at_recording(tmp_path) -> None:
    """A recording replays every tree by its shape's law, so a tree of another law (a grafted
    guess, point-mass lookups) is refused when packed, and drafters proposing such trees before
    decoding (they were recorded as the shape's law, their missing draft rows as the target's:
    ``standard`` then replayed every lookup as accepted, and schemes the decoder refused for
    grafted trees were scored)."""
    from specsampling.gpu.hf import MixedDraft, NGramDraft

    shape = ss.Shape.star(2)
    grafted = ss.DraftTree.from_draws([(0, 1), (0, 2)], law="iid").graft([3])
    plain = ss.DraftTree.from_draws([(0, 1), (0, 2)], law="iid")
    rows = np.full((4, 4), 0.25)
    with pytest.raises(ValueError, match=r"trees\[1\]: drawn by law 'grafted' with a grafted"):
        sim.RecordedTrees.from_tables(
            [plain, grafted], [rows[:3], rows], [rows[:3], rows], None, shape=shape, keep=None
        )
    chain = ss.DraftTree.chain([1, 2], law="deterministic")
    with pytest.raises(ValueError, match=r"trees\[0\]: drawn by law 'deterministic'"):
        sim.RecordedTrees.from_tables(
            [chain], [rows[:3]], [rows[:3]], None, shape=ss.Shape.chain(2), keep=None
        )
    assert (
        len(
            sim.RecordedTrees.from_tables(
                [plain], [rows[:3]], [rows[:3]], None, shape=shape, keep=None
            )
        )
        == 1
    )
    target = tiny_causal_lm("llama", 0, vocab=16)
    for draft in (NGramDraft(n=2), MixedDraft(perturbed(target, 0.3, seed=1))):
        with pytest.raises(ValueError, match=f"draft: {type(draft).__name__} proposes trees"):
            sim.record(
                target,
                draft,
                [[1, 2, 1, 2]],
                tmp_path / "r.npz",
                shape=ss.Shape.chain(2),
                keep=None,
                max_new_tokens=4,
            )
        assert not (tmp_path / "r.npz").exists()


def test_record_captures_the_decoders_rounds(tmp_path) -> None:
    target = tiny_causal_lm("llama", 0, vocab=48)
    draft = perturbed(target, 0.3, seed=1)
    shape = ss.Shape.paths(2, 2)
    prompts = [[1, 2, 3], [4, 5, 6, 7]]
    out = sim.record(
        target,
        draft,
        prompts,
        tmp_path / "rec.npz",
        shape=shape,
        temperature=1.0,
        max_new_tokens=8,
        keep=None,
    )
    back = sim.RecordedTrees.load(tmp_path / "rec.npz")
    assert len(back) == len(out) >= 2 * 8 // 3  # at most 3 tokens per round
    assert back.meta["scheme"] == "traversal" and back.meta["temperature"] == 1.0
    assert [p["tokens"] for p in back.meta["prompts"]] == [3, 4]
    # The first tree of prompt 0 drafts after the prompt: its tables are the models' own
    # processed distributions after each node's full prefix (a no-cache forward).
    tree = back.tree(0)
    got_t, got_d = back.tables(0)
    with torch.no_grad():
        for n in range(tree.num_nodes):
            ids = torch.tensor([prompts[0] + list(tree.prefix(n))])
            want_t = torch.softmax(target(ids).logits[0, -1].double(), -1).numpy()
            np.testing.assert_allclose(got_t[n], want_t, atol=1e-5)
            if tree.candidates[n]:
                want_d = torch.softmax(draft(ids).logits[0, -1].double(), -1).numpy()
                np.testing.assert_allclose(got_d[n], want_d, atol=1e-5)
    # Any scheme exact for i.i.d. trees replays them. Independent value: E[tau + 1 | tree] from
    # the reference's full verdict law on each recorded tree (not the estimator's node law).
    scheme = ss.SCHEMES["specinfer"]
    exact = []
    for i in range(len(back)):
        tree, (target, draft) = back.tree(i), back.tables(i)
        law = scheme.verdict_law(tree, target, draft)
        exact.append(sum(float(prob) * (tree.depth(v.node) + 1) for v, prob in law.items()))
    est = sim.estimate("specinfer", back)
    assert est.num_trees == len(back) and est.mean == pytest.approx(np.mean(exact), abs=1e-12)
    plain = sim.estimate("specinfer", back, method="plain", generator=0)
    assert abs(plain.mean - np.mean(exact)) <= 4.5 * plain.stderr + 1e-12, (plain, exact)


# ----------------------------------------------------------------------------- damaged files
def _rewritten(path, tmp_path, name, change):
    """A copy of the recorded file with its arrays changed by ``change(arrays)`` (no seal)."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    change(arrays)
    out = tmp_path / name
    np.savez_compressed(out, **arrays)
    return out


def _damaged(path, tmp_path):
    """``(label, file)`` of every corruption: truncation at every 1/16th, 24 seeded byte flips,
    each member dropped, meta not JSON, and sealed-looking but inconsistent arrays."""
    raw = path.read_bytes()
    cases = []
    for sixteenth in range(16):
        cases.append((f"truncated at {sixteenth}/16", raw[: len(raw) * sixteenth // 16]))
    rng = np.random.default_rng(7)
    for position in rng.choice(len(raw), size=24, replace=False):
        flipped = bytearray(raw)
        flipped[position] ^= 1 << int(rng.integers(8))
        cases.append((f"bit flipped at byte {position}", bytes(flipped)))
    cases.append(("random bytes", rng.bytes(len(raw))))
    files = []
    for label, content in cases:
        out = tmp_path / f"case{len(files)}.npz"
        out.write_bytes(content)
        files.append((label, out))
    with np.load(path) as data:
        names = list(data.files)
    for dropped in names:
        files.append(
            (
                f"{dropped} dropped",
                _rewritten(path, tmp_path, f"no-{dropped}.npz", lambda a, d=dropped: a.pop(d)),
            )
        )

    def not_json(arrays):
        arrays["meta"] = np.array("{not json")

    def cut_target(arrays):
        arrays["target"] = arrays["target"][:3]

    def bad_ids(arrays):
        arrays["tokens"] = np.where(arrays["tokens"] >= 0, 10**6, -1)

    def old_version(change):
        def apply(arrays):
            change(arrays)
            meta = json.loads(str(arrays["meta"]))
            meta["version"] = 1  # version 1 carries no seal: the layout checks must catch it
            arrays["meta"] = np.array(json.dumps(meta))

        return apply

    files.append(("meta not JSON", _rewritten(path, tmp_path, "notjson.npz", not_json)))
    for label, change in (("target cut to 3 rows", cut_target), ("token ids >= V", bad_ids)):
        name = label.replace(" ", "-") + ".npz"
        files.append((label, _rewritten(path, tmp_path, name, old_version(change))))
    return files


def test_every_damaged_file_is_refused_at_load(recorded, tmp_path) -> None:
    """No corruption reaches ``estimate``: each gives one ValueError naming the file."""
    path = recorded.save(tmp_path / "good.npz")
    assert len(sim.RecordedTrees.load(path)) == len(recorded)
    refused = 0
    for label, damaged in _damaged(path, tmp_path):
        with pytest.raises(ValueError, match=f"path: {damaged}") as caught:
            sim.RecordedTrees.load(damaged)
        assert "refused" in str(caught.value) or "version" in str(caught.value), label
        refused += 1
    assert refused == 16 + 24 + 1 + 10 + 3  # a full-storage file has 10 members


def test_a_version_1_file_still_loads_and_save_is_atomic(recorded, tmp_path, monkeypatch) -> None:
    path = recorded.save(tmp_path / "good.npz")

    def as_version_1(arrays):
        meta = json.loads(str(arrays["meta"]))
        meta["version"] = 1
        arrays["meta"] = np.array(json.dumps(meta))

    old = sim.RecordedTrees.load(_rewritten(path, tmp_path, "v1.npz", as_version_1))
    np.testing.assert_array_equal(old.target, recorded.target)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez_compressed", interrupted)
    with pytest.raises(KeyboardInterrupt):
        recorded.save(tmp_path / "never.npz")
    assert not (tmp_path / "never.npz").exists()
