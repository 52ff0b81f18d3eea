"""Griffe extension: render the package's numpydoc (reStructuredText) docstrings in mkdocs.

The docstrings follow numpydoc, so they use what Sphinx renders natively: ``:math:`` roles,
``.. math::`` directives, bare ``>>>`` doctest blocks and cross-reference roles such as
``:func:`~specsampling.exact.round_law```. mkdocstrings reads docstrings as Markdown, so this
rewrites those four constructs (arithmatex math, fenced ``pycon`` code, code spans) before the
docstring is parsed. Docstrings themselves stay valid numpydoc and doctests.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_XREF_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def convert(text: str) -> str:
    """Rewrite reStructuredText math, doctest blocks and cross-reference roles as Markdown."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        pad = line[: _indent(line)]
        if stripped.startswith(".. math::"):
            body = [stripped[len(".. math::") :].strip()]
            i += 1
            if not body[0] and i < len(lines) and not lines[i].strip():
                i += 1  # directive content may start after one blank line
            while i < len(lines) and lines[i].strip() and _indent(lines[i]) > len(pad):
                body.append(lines[i].strip())
                i += 1
            out += ["", pad + r"\[", pad + " ".join(b for b in body if b), pad + r"\]", ""]
            continue
        if stripped.startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(pad) :] if lines[i].startswith(pad) else lines[i])
                i += 1
            out += [pad + "```pycon", *(pad + b for b in block), pad + "```"]
            continue
        out.append(line)
        i += 1
    # Roles may wrap across lines, so they are rewritten on the whole text.
    text = _MATH_ROLE.sub(lambda m: rf"\({m.group(1)}\)", "\n".join(out))
    return _XREF_ROLE.sub(
        lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text
    )


class RstDocstrings(griffe.Extension):
    """Apply :func:`convert` to every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)
