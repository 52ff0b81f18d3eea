"""Int8 weight-only drafts (``specsampling.gpu.hf.quantize_int8``).

* the quantization: each weight within half a step of its row's scale, the row's largest
  magnitude on +-127, small calls equal to a matmul by the dequantized weight (computed here
  independently), large calls to the floating layer bit for bit;
* the copy: the original model is left as it is, the copy shares its floating tensors (tied
  heads stay tied) and Hugging Face's assisted generation takes it as an assistant;
* decoding with it: greedy output equals the target's own at T = 0 (the sampled law under an
  int8 draft is checked with the other drafting options in ``tests/test_hf_adaptive.py``);
* refusals naming the argument.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import specsampling as ss  # noqa: E402
from proofs_tests.hf_models import (  # noqa: E402
    left_pad,
    no_grad,  # noqa: F401 (autouse fixture)
    one_thread,  # noqa: F401 (autouse fixture)
    perturbed,
    tiny_causal_lm,
)
from specsampling.gpu.hf import Int8Linear, SpeculativeDecoder, quantize_int8  # noqa: E402


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """Symmetric per-row int8 quantization of ``weight``, written out again here."""
    scale = weight.double().abs().amax(dim=1, keepdim=True) / 127
    return (weight.double() / scale).round().clamp(-127, 127) * scale


@pytest.fixture
def linear():
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 40)
    with torch.no_grad():
        layer.weight[3].mul_(50)  # rows of very different scales
        layer.weight[7].mul_(1e-3)
    return layer


def test_each_weight_is_within_half_a_step(linear):
    q = Int8Linear(linear)
    steps = q.scale.double()[:, None]  # [out, 1]
    error = (linear.weight.double() - q.int8_weight.double() * steps).abs()
    assert bool((error <= steps / 2 * (1 + 1e-6)).all())
    assert q.int8_weight.abs().amax(dim=1).tolist() == [127] * linear.out_features


def test_small_calls_multiply_by_the_int8_weight_large_ones_by_the_float_weight(linear):
    q = Int8Linear(linear, max_rows=4)
    small = torch.randn(2, 2, 48)  # 4 rows: the int8 kernel
    expected = small.double() @ dequantized(linear.weight).T + linear.bias.double()
    assert torch.allclose(q(small).double(), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(q(small), linear(small), rtol=1e-7, atol=1e-7)  # not the float one
    large = torch.randn(5, 48)  # 5 rows: the floating weight, bit for bit
    assert torch.equal(q(large), linear(large))


def test_the_copy_shares_the_float_tensors_and_leaves_the_model_alone():
    model = tiny_causal_lm("qwen", 0, tie_word_embeddings=True)
    before = {name: type(m) for name, m in model.named_modules()}
    made = quantize_int8(model)
    assert {name: type(m) for name, m in model.named_modules()} == before
    swapped = [m for m in made.modules() if isinstance(m, Int8Linear)]
    assert len(swapped) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    for (name, module), copied in zip(model.named_modules(), made.modules(), strict=True):
        if isinstance(module, torch.nn.Linear):
            assert copied.weight.data_ptr() == module.weight.data_ptr(), name
    assert made.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert made.model.embed_tokens.weight is model.model.embed_tokens.weight


PROMPTS = [[3, 5, 7, 9, 11], [4, 2], [8, 1, 6, 6]]


@pytest.mark.parametrize("scheme", ["standard", "traversal"])
def test_greedy_decoding_with_an_int8_draft_equals_the_target(scheme):
    target = tiny_causal_lm("llama", 0)
    draft = quantize_int8(perturbed(target, 0.05, 1), max_rows=64)
    ids, mask = left_pad(PROMPTS)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    dec = SpeculativeDecoder(target, draft, scheme, ss.Shape.chain(3))
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=12, temperature=0)
    assert torch.equal(out.sequences, expected)
    assert max(max(e) for e in out.stats.emitted) > 1  # the int8 draft's tokens were accepted


def test_hf_assisted_generation_takes_the_copy():
    target = tiny_causal_lm("llama", 0)
    draft = quantize_int8(perturbed(target, 0.05, 1))
    prompt = torch.tensor([PROMPTS[0]])
    plain = target.generate(prompt, do_sample=False, max_new_tokens=10)
    assisted = target.generate(prompt, do_sample=False, max_new_tokens=10, assistant_model=draft)
    assert torch.equal(assisted, plain)


def test_refusals():
    with pytest.raises(TypeError, match=r"model: expected a torch\.nn\.Module"):
        quantize_int8("qwen")
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match="max_rows"):
            quantize_int8(torch.nn.Linear(4, 4), max_rows=bad)
    with pytest.raises(ValueError, match="model: int8 weight-only quantisation takes float32"):
        quantize_int8(torch.nn.Linear(4, 4).double())  # torch's int8 kernel would fail later
