#!/usr/bin/env bash
# One entry point for a fresh machine; each command installs what it needs first.
#   ./dev.sh demo     run the built-in simulated turns through the real guard (no server needed)
#   ./dev.sh test     run the whole test suite (installs Debian's prometheus and chromium if root)
#   ./dev.sh bench    run the benchmarks and print figures and ratios
#   ./dev.sh lint     ruff
#   ./dev.sh run ARGS run the turnguard CLI
set -euo pipefail
cd "$(dirname "$0")"
VENV=${TG_VENV:-.venv}

ensure_python() { # $1: extras
  local extras=$1 stamp hash
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  stamp="$VENV/.turnguard-installed-$extras"
  hash=$(sha256sum pyproject.toml | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$hash" ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[$extras]"
    echo "$hash" >"$stamp"
  fi
}

ensure_system() { # Debian packages the integration tests use: a real Prometheus and Chromium.
  local missing=()
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "dev.sh: installing ${missing[*]} (apt-get)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "dev.sh: ${missing[*]} missing and not root: the tests that need them will skip" >&2
  fi
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo) ensure_python cli; exec "$VENV/bin/turnguard" demo "$@" ;;
  run) ensure_python cli; exec "$VENV/bin/turnguard" "$@" ;;
  test) ensure_system; ensure_python dev; exec "$VENV/bin/python" -m pytest "$@" ;;
  bench) ensure_python dev; exec "$VENV/bin/python" benchmarks/run.py "$@" ;;
  lint) ensure_python dev; exec "$VENV/bin/ruff" check ;;
  *) sed -n '2,/^set /{/^#/p}' "$0"; exit 2 ;;
esac
