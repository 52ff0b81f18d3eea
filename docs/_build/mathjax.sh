#!/usr/bin/env bash
# Install MathJax for the docs site from the npm registry into docs/javascripts/mathjax/
# (ignored by git; mkdocs copies it into the site, so the built pages need no CDN).
#   bash docs/_build/mathjax.sh          # needs npm; then: mkdocs build --strict / mkdocs serve
set -euo pipefail
VERSION=3.2.2  # MathJax 3: its es5/ bundle serves its own fonts (MathJax 4 fetches them from a CDN)
cd "$(dirname "$0")/.."
dest=javascripts/mathjax
if [[ -f "$dest/tex-mml-chtml.js" && "$(cat "$dest/VERSION" 2>/dev/null)" == "$VERSION" ]]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "mathjax@$VERSION" >/dev/null)  # npm checks the tarball's integrity
rm -rf "$dest" && mkdir -p "$dest"
tar -xzf "$tmp/mathjax-$VERSION.tgz" -C "$dest" --strip-components=2 package/es5
tar -xzf "$tmp/mathjax-$VERSION.tgz" -C "$dest" --strip-components=1 package/LICENSE
echo "$VERSION" >"$dest/VERSION"
echo "MathJax $VERSION installed in docs/$dest"
