#!/usr/bin/env bash
# Install the pinned agent CLIs (Claude Code, Codex, opencode, Qwen Code) with npm into DIR
# (default: $LLMD_AGENTS_DIR, else ~/.cache/llmd/agents/<versions>), once: a second run with
# the same versions only checks they are there. Prints DIR/node_modules/.bin on success.
# Exit 3 when node/npm are missing, 4 when the install fails (e.g. no network).
# The versions are the ones in daemon/llmd/cli/agent_config.py (PACKAGES).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
py="${PYTHON:-python3}"
specs="$(PYTHONPATH="$root/daemon" "$py" -c 'from llmd.cli.agent_config import PACKAGES; print(" ".join(f"{p}@{v}" for p, v in PACKAGES.values()))')"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "node/npm not found (Debian: apt-get install nodejs npm)" >&2
  exit 3
fi
tag="$(echo "$specs" | sha256sum | cut -c1-12)"
dir="${1:-${LLMD_AGENTS_DIR:-$HOME/.cache/llmd/agents/$tag}}"
mkdir -p "$dir"
if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$specs" ]; then
  echo "$dir/node_modules/.bin"
  exit 0
fi
cd "$dir"
[ -f package.json ] || echo '{"name": "llmd-test-agents", "private": true}' > package.json
# shellcheck disable=SC2086
if ! timeout 900 npm install --no-audit --no-fund --loglevel=error $specs >&2; then
  echo "npm install failed for: $specs" >&2
  exit 4
fi
# Claude Code's `claude` is a stub until its postinstall links the platform's native package,
# an optional dependency npm sometimes leaves out when several packages install together:
# install that package by name and rerun the postinstall.
cc="node_modules/@anthropic-ai/claude-code"
if [ -f "$cc/install.cjs" ] && ! node_modules/.bin/claude --version >/dev/null 2>&1; then
  version="$(node -p "require('./$cc/package.json').version")"
  platform="$(node -p 'process.platform + "-" + process.arch')"
  timeout 600 npm install --no-audit --no-fund --loglevel=error --no-save \
    "@anthropic-ai/claude-code-$platform@$version" >&2 || true
  (cd "$cc" && node install.cjs >&2) || true
fi
for bin in claude codex opencode qwen; do
  if ! timeout 120 "node_modules/.bin/$bin" --version >/dev/null 2>&1; then
    echo "the installed $bin does not run (node_modules/.bin/$bin --version failed)" >&2
    exit 4
  fi
done
echo "$specs" > .installed
echo "$dir/node_modules/.bin"
