#!/usr/bin/env bash
# Re-fetch the chat page's third-party scripts and styles into src/glmserve/web/vendor/ from the
# npm registry (npm pack: no install, no build), at the versions pinned below. The page loads
# them from glmserve itself, so it works offline. Source-map comments are dropped (the maps are
# not shipped). Run from the repository root: bash scripts/vendor_web.sh
set -euo pipefail
MARKED=18.2.1        # Markdown -> HTML (MIT)
DOMPURIFY=3.4.18     # HTML sanitizer for model output (Apache-2.0 or MPL-2.0)
HIGHLIGHT=11.12.0    # code highlighting, common languages (BSD-3-Clause)
out=src/glmserve/web/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "marked@$MARKED" "dompurify@$DOMPURIFY" "@highlightjs/cdn-assets@$HIGHLIGHT" >/dev/null)
for tgz in "$work"/*.tgz; do mkdir -p "${tgz%.tgz}" && tar xzf "$tgz" -C "${tgz%.tgz}"; done
m=$work/marked-$MARKED/package d=$work/dompurify-$DOMPURIFY/package h=$work/highlightjs-cdn-assets-$HIGHLIGHT/package
copy() { grep -v '^//# sourceMappingURL=' "$1" >"$out/$2" || true; }
mkdir -p "$out"
copy "$m/lib/marked.esm.js" marked.esm.js
copy "$d/dist/purify.es.mjs" purify.es.mjs
copy "$h/es/highlight.min.js" highlight.min.js
copy "$h/styles/github.min.css" highlight-github.min.css
copy "$h/styles/github-dark.min.css" highlight-github-dark.min.css
cp "$m/LICENSE" "$out/LICENSE.marked"
cp "$d/LICENSE" "$out/LICENSE.dompurify"
cp "$h/LICENSE" "$out/LICENSE.highlight.js"
{
  echo "# Vendored front-end libraries"
  echo
  echo "Fetched by \`scripts/vendor_web.sh\` with \`npm pack\` from the npm registry; only source-map"
  echo "comments removed. Do not edit by hand: change the versions in the script and run it."
  echo
  echo "| file | package | version | license |"
  echo "|---|---|---|---|"
  echo "| marked.esm.js | marked (lib/marked.esm.js) | $MARKED | MIT (LICENSE.marked) |"
  echo "| purify.es.mjs | dompurify (dist/purify.es.mjs) | $DOMPURIFY | Apache-2.0 or MPL-2.0 (LICENSE.dompurify) |"
  echo "| highlight.min.js | @highlightjs/cdn-assets (es/highlight.min.js) | $HIGHLIGHT | BSD-3-Clause (LICENSE.highlight.js) |"
  echo "| highlight-github.min.css, highlight-github-dark.min.css | @highlightjs/cdn-assets (styles/) | $HIGHLIGHT | BSD-3-Clause |"
  echo
  echo "sha256:"
  echo
  echo '```'
  (cd "$out" && sha256sum marked.esm.js purify.es.mjs highlight.min.js highlight-github.min.css highlight-github-dark.min.css)
  echo '```'
} >"$out/README.md"
