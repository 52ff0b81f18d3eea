"""mkdocs hook: refuse to build a site whose math would not render.

MathJax is served with the site from ``docs/javascripts/mathjax/`` (ignored by git), which
``bash docs/_build/mathjax.sh`` installs from the npm registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

MATHJAX = Path(__file__).resolve().parents[1] / "javascripts" / "mathjax" / "tex-mml-chtml.js"


def on_config(config: Any) -> Any:
    if not MATHJAX.is_file():
        raise PluginError(
            f"MathJax is missing ({MATHJAX}): run `bash docs/_build/mathjax.sh` (needs npm) "
            "before `mkdocs build` or `mkdocs serve`"
        )
    return config
