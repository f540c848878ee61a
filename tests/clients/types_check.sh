#!/usr/bin/env bash
# tsc (strict) on types_check.ts against clients/node/index.d.ts, then the
# compiled program against a running server. tsc comes from `npm ci` in
# tests/clients (scripts/test.sh); without it: exit 77 (skip).
#   usage: types_check.sh NODE URL LIMITER
set -euo pipefail
node=$1 url=$2 limiter=$3
here=$(cd "$(dirname "$0")" && pwd)
tsc=$here/node_modules/typescript/bin/tsc
[[ -f $tsc ]] || { echo "typescript not installed (npm ci --prefix tests/clients)"; exit 77; }
tmp=$(mktemp -d /tmp/fairgate-ts-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$node" "$tsc" -p "$here/tsconfig.json" --outDir "$tmp/out"
# The compiled program imports 'fairgate' as a user's would: through the package's "exports".
mkdir -p "$tmp/node_modules"
ln -s "$here/../../clients/node" "$tmp/node_modules/fairgate"
"$node" "$tmp/out/types_check.js" "$url" "$limiter"
