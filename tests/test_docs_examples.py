"""The README's and the docs' examples run, and what they print is what the page says.

Conventions, all checked here (docs are part of the feature):

- Every fenced ``python`` block runs in a fresh interpreter from a scratch directory (blocks that
  write files do not touch the checkout) and must exit with status 0.
- A block that prints is followed directly by its output, a fenced block opened with
  ``text title="Output"``. Its stdout must match that block: trailing whitespace and runs of
  whitespace are ignored, ``...`` matches anything, and a decimal number matches any printed
  number that agrees to the digits written (``0.6583`` matches ``0.6583333333333333``, as pytest's
  ``NUMBER`` doctest flag; integers and fractions match exactly). A block that prints nothing has
  no output block.
- A comment on a ``print`` statement, or on the comment lines right after one, states no value
  (no digits, no ``True``/``False``/``None``): values live in the output block, where they are
  checked, so ``print(x)  # 8/9`` cannot go stale.
- A fenced ``console`` block is a shell session: each ``$ command`` runs in bash in a scratch
  directory (one directory per block, so later commands see earlier files), and the lines up to
  the next ``$`` are its expected output, matched as above. A console block can opt out with
  ``<!-- docs-test: skip -->`` on the line before it (for commands that need the checkout or a
  network); python blocks cannot.
- A block (python or console) preceded by ``<!-- docs-test: slow -->`` still runs and is still
  checked, but only in the long run (``python -m pytest -m slow``, its own CI step): for examples
  that load real weights or sample for tens of seconds, so the default run stays short.

To refresh the output blocks after a deliberate change, run the examples and let them write what
they print (then read the diff: a changed value is a changed claim)::

    python tests/test_docs_examples.py --write [PAGE ...]
"""

from __future__ import annotations

import ast
import io
import math
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TIMEOUT = 300

FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.S | re.M
)
OUTPUT_INFO = 'text title="Output"'
SKIP = "<!-- docs-test: skip -->"
SLOW = "<!-- docs-test: slow -->"
NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
TOKEN = re.compile(rf"(?P<ellipsis>\.\.\.)|(?P<number>{NUMBER})|(?P<space>\s+)")
VALUE_IN_COMMENT = re.compile(r"(?<![A-Za-z_])\d|\b(?:True|False|None)\b")


@dataclass(frozen=True)
class Fence:
    info: str
    body: str
    start: int  # offsets of the whole fence in the page
    end: int
    skip: bool  # preceded by the skip marker
    slow: bool = False  # preceded by the slow marker: runs under ``-m slow`` only


@dataclass(frozen=True)
class Example:
    """A python block and the output block that follows it (``None`` if there is none)."""

    page: Path
    index: int
    code: Fence
    output: Fence | None

    @property
    def id(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page.name
        return f"{page}#{self.index}"


def fences(text: str) -> list[Fence]:
    found = []
    for match in FENCE.finditer(text):
        indent = len(match["indent"])
        body = "".join(line[indent:] for line in match["body"].splitlines(keepends=True))
        before = text[: match.start()].rstrip().splitlines()
        marker = before[-1].strip() if before else ""
        found.append(
            Fence(
                match["info"].strip(),
                body,
                match.start(),
                match.end(),
                marker == SKIP,
                marker == SLOW,
            )
        )
    return found


def examples(page: Path, text: str | None = None) -> list[Example]:
    text = page.read_text() if text is None else text
    blocks = fences(text)
    found = []
    for i, block in enumerate(blocks):
        if block.info.split(" ")[0] != "python":
            continue
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        attached = nxt is not None and not text[block.end : nxt.start].strip()
        output = nxt if attached and nxt is not None and nxt.info == OUTPUT_INFO else None
        found.append(Example(page, len(found), block, output))
    return found


def sessions(page: Path) -> list[tuple[str, Fence]]:
    blocks = [b for b in fences(page.read_text()) if b.info == "console" and not b.skip]
    return [(f"{page.relative_to(ROOT)}$console{i}", block) for i, block in enumerate(blocks)]


# --- matching printed text against the page --------------------------------------------------


def _decimals(number: str) -> tuple[int, int] | None:
    """(digits after the point, exponent) of a decimal literal; None for an integer."""
    mantissa, _, exponent = number.lower().partition("e")
    if "." not in mantissa and not exponent:
        return None
    digits = len(mantissa.partition(".")[2])
    return digits, int(exponent or 0)


def output_matches(want: str, got: str) -> bool:
    """Whether printed text ``got`` is what ``want`` says (see the module docstring)."""
    want, got = want.strip(), got.strip()
    pattern, numbers, last = [], [], 0
    for token in TOKEN.finditer(want):
        pattern.append(re.escape(want[last : token.start()]))
        last = token.end()
        if token["ellipsis"]:
            pattern.append(r".*?")
        elif token["space"]:
            pattern.append(r"\s+")
        elif _decimals(token["number"]) is None:
            pattern.append(rf"(?<![\d.]){re.escape(token['number'])}(?![\d.])")
        else:
            pattern.append(rf"({NUMBER})")
            numbers.append(token["number"])
    pattern.append(re.escape(want[last:]))
    match = re.fullmatch("".join(pattern), got, re.S)
    if match is None:
        return False
    for written, printed in zip(numbers, match.groups(), strict=True):
        digits, exponent = _decimals(written) or (0, 0)
        if not math.isclose(float(written), float(printed), abs_tol=10.0 ** (exponent - digits)):
            return False
    return True


def value_comments(code: str) -> list[str]:
    """Comments on or right after a ``print`` statement that state a value (see above)."""
    tree = ast.parse(code)
    prints = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
        and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "print"
            for call in ast.walk(node)
        )
    ]
    # A print statement's own lines, and the comment lines right after any statement that
    # prints (a transcript after a loop is a claim too).
    spans = [
        (node.lineno if isinstance(node, ast.Expr) else end + 1, end)
        for node in prints
        for end in [node.end_lineno or node.lineno]
    ]
    comments = {
        tok.start[0]: tok.string
        for tok in tokenize.generate_tokens(io.StringIO(code).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = code.splitlines()
    bad = []
    for first, last in spans:
        attached = [n for n in range(first, last + 1) if n in comments]
        n = last + 1
        while n <= len(lines) and lines[n - 1].strip().startswith("#"):
            attached.append(n)
            n += 1
        bad += [
            f"line {n}: {comments[n]}" for n in attached if VALUE_IN_COMMENT.search(comments[n])
        ]
    return bad


# --- running -----------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["COLUMNS"] = "200"
    return env


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=_env(),
    )


def check_example(example: Example, cwd: Path) -> None:
    bad = value_comments(example.code.body)
    assert not bad, (
        f"{example.id}: comments on print statements state values; move them to the output "
        "block, where they are checked:\n" + "\n".join(bad)
    )
    done = run_python(example.code.body, cwd)
    assert done.returncode == 0, f"{example.id} failed:\n{done.stderr[-3000:]}"
    if example.output is None:
        assert not done.stdout.strip(), (
            f"{example.id} prints, but no ```{OUTPUT_INFO} block follows it; it printed:\n"
            + done.stdout
        )
    else:
        assert output_matches(example.output.body, done.stdout), (
            f"{example.id}: the page says\n{example.output.body}\nbut the code prints\n"
            f"{done.stdout}"
        )


def console_commands(body: str) -> list[tuple[str, str]]:
    """(command, expected output) pairs of a console block."""
    pairs: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        elif pairs:
            pairs[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block starts with output, not a '$ ' command: {line!r}")
    return [(command, "\n".join(out)) for command, out in pairs]


# --- the tests ---------------------------------------------------------------------------------


def _marks(block: Fence) -> list[pytest.MarkDecorator]:
    return [pytest.mark.slow] if block.slow else []


EXAMPLES = [
    pytest.param(ex, id=ex.id, marks=_marks(ex.code)) for page in PAGES for ex in examples(page)
]
SESSIONS = [
    pytest.param(block, id=name, marks=_marks(block))
    for page in PAGES
    for name, block in sessions(page)
]


def test_the_docs_have_examples() -> None:
    assert len(EXAMPLES) >= 40
    assert sum(ex.values[0].output is not None for ex in EXAMPLES) >= 35
    assert len(SESSIONS) >= 5


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_prints_what_the_page_says(example: Example, tmp_path: Path) -> None:
    check_example(example, tmp_path)


@pytest.mark.parametrize("block", SESSIONS)
def test_console_session_prints_what_the_page_says(block: Fence, tmp_path: Path) -> None:
    for command, want in console_commands(block.body):
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=_env(),
        )
        assert done.returncode == 0, f"$ {command}\n{done.stderr[-3000:]}"
        assert output_matches(want, done.stdout), (
            f"$ {command}\nthe page says\n{want}\nbut it prints\n{done.stdout}"
        )


# --- self-tests: the checks can fail -----------------------------------------------------------


def test_output_matching() -> None:
    assert output_matches("0.49 0.658333...", "0.49 0.6583333333333333")
    assert output_matches("0.6583", "0.6583333333333333")
    assert output_matches("0.59", "0.5899999999999999")
    assert output_matches("3.6e-35", "3.62e-35")
    assert output_matches("[0.632 0.448]\n(0, 1)", "[0.632  0.448]  \n(0, 1)\n")
    assert output_matches("head\n...\ntail", "head\nmiddle\nlines\ntail")
    assert not output_matches("0.6583", "0.6593")
    assert not output_matches("8/9", "7/9")
    assert not output_matches("1", "10")
    assert not output_matches("2", "2.5")
    assert not output_matches("14 schemes", "15 schemes")
    assert not output_matches("True", "False")
    assert not output_matches("a\nb", "a")


def test_a_stale_value_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    code = "```python\nfrom fractions import Fraction as F\n\nprint(F(8, 9))\n```\n\n"
    page.write_text(f"{code}```{OUTPUT_INFO}\n7/9\n```\n")
    (stale,) = examples(page)
    with pytest.raises(AssertionError, match="the page says"):
        check_example(stale, tmp_path)
    page.write_text(f"{code}```{OUTPUT_INFO}\n8/9\n```\n")
    (fresh,) = examples(page)
    check_example(fresh, tmp_path)


def test_a_missing_output_block_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text('```python\nprint(1)\n```\n\nSome prose.\n\n```text title="Output"\n1\n```\n')
    (example,) = examples(page)
    assert example.output is None  # prose between: not the block's output
    with pytest.raises(AssertionError, match="no ```text"):
        check_example(example, tmp_path)


def test_a_value_in_a_print_comment_is_caught(tmp_path: Path) -> None:
    assert value_comments("print(1)  # 8/9") == ["line 1: # 8/9"]
    assert value_comments("print(\n    1,\n)  # True\n# 2 more\n") == [
        "line 3: # True",
        "line 4: # 2 more",
    ]
    assert value_comments("print(1)  # exactly\nx = 2  # 2, not after a print\n") == []
    loop = "for i in range(2):\n    print(i)\n    x = i  # 1, not a print\n# 0\n# 1\n\n# 2, a gap\n"
    assert value_comments(loop) == ["line 4: # 0", "line 5: # 1"]
    assert value_comments("print(x_1)  # eta_1 wins") == []
    page = tmp_path / "page.md"
    page.write_text(f"```python\nprint(2)  # 2\n```\n\n```{OUTPUT_INFO}\n2\n```\n")
    (example,) = examples(page)
    with pytest.raises(AssertionError, match="state values"):
        check_example(example, tmp_path)


def test_console_blocks_parse() -> None:
    body = "$ echo a\na\n$ true\n"
    assert console_commands(body) == [("echo a", "a"), ("true", "")]
    page_text = f"{SKIP}\n```console\n$ slow\n```\n```console\n$ echo b\nb\n```\n"
    assert [f.skip for f in fences(page_text)] == [True, False]
    page_text = f"{SLOW}\n```python\nprint(1)\n```\n\n```python\nprint(2)\n```\n"
    assert [(f.skip, f.slow) for f in fences(page_text)] == [(False, True), (False, False)]
    assert [m.name for m in _marks(fences(page_text)[0])] == ["slow"]
    assert _marks(fences(page_text)[1]) == []


# --- refreshing the output blocks ----------------------------------------------------------------


def write_outputs(page: Path, cwd: Path) -> int:
    """Rewrite the output blocks of ``page`` that no longer match; returns how many changed."""
    text = page.read_text()
    edits = []
    for example in examples(page, text):
        done = run_python(example.code.body, cwd)
        if done.returncode != 0:
            print(f"{example.id} FAILED:\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        got = done.stdout.rstrip()
        out = example.output
        if out is not None and got and output_matches(out.body, got):
            continue
        if out is None and not got:
            continue
        after = text[example.code.start :]
        indent = " " * (len(after) - len(after.lstrip(" ")))
        lines = [f"```{OUTPUT_INFO}", *got.splitlines(), "```"]
        fresh = "\n".join((indent + line).rstrip() for line in lines)
        if out is None:
            edits.append((example.code.end, example.code.end, "\n\n" + fresh))
        elif got:
            edits.append((out.start, out.end, fresh))
        else:
            edits.append((example.code.end, out.end, ""))
        print(f"{example.id}: output block {'written' if got else 'removed'}")
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    page.write_text(text)
    return len(edits)


if __name__ == "__main__":
    import tempfile

    args = sys.argv[1:]
    if not args or args[0] != "--write":
        sys.exit(__doc__)
    chosen = [Path(a).resolve() for a in args[1:]] or PAGES
    with tempfile.TemporaryDirectory() as scratch:
        total = sum(write_outputs(page, Path(scratch)) for page in chosen)
    print(f"{total} output block(s) changed")
