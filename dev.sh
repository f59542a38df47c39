#!/usr/bin/env bash
# One entry point for a fresh machine; each command installs what it needs first.
#   ./dev.sh demo     run the built-in simulated turns through the real guard (no server needed)
#   ./dev.sh test     run the whole test suite (installs Debian's prometheus, chromium, tmux and zstd if root)
#   ./dev.sh bench    run the benchmarks and print figures and ratios
#   ./dev.sh lint     ruff, the duplicates gate (tools/similar_code.py), then mypy over src/ and the docs' Python blocks (tools/typecheck.py)
#   ./dev.sh run ARGS run the turnguard CLI
#   ./dev.sh collector  build the Collector from its builder manifest (builder-config.yaml) (once; cached) and print its path
#   ./dev.sh prometheus build Prometheus 3 from its Go module (once; cached) and print its path
#   ./dev.sh lock     resolve the [dev] extra afresh and pin what it installs in tools/constraints.txt
# Every command first installs the repository's git hooks (.githooks/, git config core.hooksPath).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
VENV=${TG_VENV:-.venv}
CACHE=${TG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/turnguard}
MANIFEST=builder-config.yaml
# The versions the tests ran with: a release of a framework or of the SDK reaches the checkout when
# `./dev.sh lock` takes it and the suite passes with it, never in the middle of a CI run.
CONSTRAINTS=tools/constraints.txt
# Go builds the test components only; never fetch another toolchain, and find the machine's Go
# even where PATH lacks it.
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOFLAGS=${GOFLAGS:--buildvcs=false}
case ":$PATH:" in *:/usr/local/go/bin:*) ;; *) [ -x /usr/local/go/bin/go ] && PATH=$PATH:/usr/local/go/bin ;; esac

ensure_python() { # $1: extras
  local extras=$1 stamp hash
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  stamp="$VENV/.turnguard-installed-$extras"
  hash=$(cat pyproject.toml "$CONSTRAINTS" | sha256sum | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$hash" ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$CONSTRAINTS" -e ".[$extras]"
    echo "$hash" >"$stamp"
  fi
  # An editable install leaves the package uncompiled, and where PYTHONDONTWRITEBYTECODE is set
  # Python never writes the cache: every command would compile the package again (~0.5 s).
  "$VENV/bin/python" -m compileall -q src >/dev/null
}

lock_python() { # the [dev] extra resolved in a throwaway environment, as a fresh machine would
  local env
  env=$(mktemp -d)
  python3 -m venv "$env"
  "$env/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  "$env/bin/python" -m pip install -q --disable-pip-version-check ".[dev]"
  { echo "# The [dev] environment the suite passes with (pip -c). Written by ./dev.sh lock; edit pyproject.toml, not this."
    "$env/bin/python" -m pip freeze --exclude turnguard; } >"$CONSTRAINTS"
  rm -rf "$env"
  echo "dev.sh: pinned $(grep -c '==' "$CONSTRAINTS") packages in $CONSTRAINTS" >&2
}

ensure_system() { # Debian packages the integration tests use: a real Prometheus, Chromium, tmux
  # (the terminal the interactive Claude Code test types into), and zstd (a compressed backup).
  local missing=()
  command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v tmux >/dev/null 2>&1 || missing+=(tmux)
  command -v zstd >/dev/null 2>&1 || missing+=(zstd)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "dev.sh: installing ${missing[*]} (apt-get)" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "dev.sh: ${missing[*]} missing and not root: the tests that need them will skip" >&2
  fi
}

go_build() { # $1: cache key prefix, $2: key text, $3: binary path inside the build dir, $4...: build steps
  local name=$1 key=$2 rel=$3 out work start
  shift 3
  out="$CACHE/$name-$(printf '%s' "$key" | sha256sum | cut -c1-16)"
  if [ ! -x "$out/$rel" ]; then
    command -v go >/dev/null 2>&1 || { echo "dev.sh: go not found: cannot build $name" >&2; return 1; }
    mkdir -p "$CACHE"
    work=$(mktemp -d "$CACHE/.$name-build.XXXXXX")
    start=$(date +%s)
    echo "dev.sh: building $name in $work (a few minutes on 2 cores; cached in $out)" >&2
    (cd "$work" && "$@") >"$work/build.log" 2>&1 || { echo "dev.sh: $name build failed, see $work/build.log" >&2; return 1; }
    echo "$(( $(date +%s) - start ))" >"$work/build-seconds"
    rm -rf "$out" && mv "$work" "$out"
    echo "dev.sh: built $name in $(cat "$out/build-seconds") s" >&2
  fi
  echo "$out/$rel"
}

build_collector_steps() { # in the build dir: the official builder of the manifest's own release
  cp "$ROOT/$MANIFEST" .
  go run "go.opentelemetry.io/collector/cmd/builder@v$(sed -n 's/^  version: //p' builder-config.yaml)" \
    --config builder-config.yaml
}

ensure_collector() {
  go_build otelcol "$(sed "/^ *#/d" "$MANIFEST")" turnguard-otelcol/turnguard-otelcol build_collector_steps
}

PROMETHEUS_MODULE=github.com/prometheus/prometheus@v0.316.0
PROMETHEUS_TAGS=remove_all_sd
# Prometheus 3.16.0 (its Go module numbers 3.x.y as v0.3xx.y), without the cloud service
# discoveries (static and file targets only: the tests need no more, and the build is much smaller).

build_prometheus_steps() {
  GOBIN=$PWD go install -tags "$PROMETHEUS_TAGS" "${PROMETHEUS_MODULE%@*}/cmd/prometheus@${PROMETHEUS_MODULE#*@}" \
    "${PROMETHEUS_MODULE%@*}/cmd/promtool@${PROMETHEUS_MODULE#*@}"
}

ensure_prometheus3() {
  go_build prometheus "$PROMETHEUS_MODULE $PROMETHEUS_TAGS" prometheus build_prometheus_steps
}

ensure_go_components() { # the real Collector and Prometheus 3 the chain tests run, built once and cached
  local path
  if path=$(ensure_collector); then export TG_OTELCOL=$path; fi
  if path=$(ensure_prometheus3); then export TG_PROMETHEUS3=$path; fi
}

ensure_agents() { # the coding-agent CLIs the end-to-end hook tests drive, pinned by tests/coding_agents/
  [ -n "${TG_AGENTS_DIR:-}" ] && return 0
  local pins=tests/coding_agents dir work
  dir="$CACHE/agents-$(sha256sum "$pins/package-lock.json" | cut -c1-16)"
  if [ ! -d "$dir/node_modules/.bin" ]; then
    command -v npm >/dev/null 2>&1 || { echo "dev.sh: npm not found: the coding-agent tests will skip" >&2; return 0; }
    mkdir -p "$CACHE"
    work=$(mktemp -d "$CACHE/.agents-install.XXXXXX")
    cp "$pins/package.json" "$pins/package-lock.json" "$work/"
    echo "dev.sh: installing the coding-agent CLIs in $dir (npm ci, ~860 MB)" >&2
    # No install scripts (they would build or fetch what the tests never use) but Claude Code's, which
    # links its native binary into place.
    (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund && node node_modules/@anthropic-ai/claude-code/install.cjs) \
      >"$work/install.log" 2>&1 ||
      { echo "dev.sh: npm ci failed, see $work/install.log" >&2; return 0; }
    rm -rf "$dir" && mv "$work" "$dir"
  fi
  export TG_AGENTS_DIR=$dir
}

ensure_hooks() { # the repository's git hooks (.githooks/commit-msg: subjects <= 72 characters), on any command
  local current
  git rev-parse --is-inside-work-tree >/dev/null 2>&1 || return 0
  current=$(git config --local --get core.hooksPath || true)
  [ "$current" = .githooks ] && return 0
  if [ -n "$current" ]; then
    echo "dev.sh: core.hooksPath is $current; not replaced (git config core.hooksPath .githooks installs ours)" >&2
    return 0
  fi
  git config --local core.hooksPath .githooks && echo "dev.sh: installed the git hooks (core.hooksPath = .githooks)" >&2
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
command -v git >/dev/null 2>&1 && ensure_hooks
case "$cmd" in
  demo) ensure_python otlp; exec "$VENV/bin/turnguard" demo "$@" ;;
  run) ensure_python cli; exec "$VENV/bin/turnguard" "$@" ;;
  test) ensure_system; ensure_python dev; ensure_agents; ensure_go_components; exec "$VENV/bin/python" -m pytest "$@" ;;
  bench) ensure_python dev; exec "$VENV/bin/python" benchmarks/run.py "$@" ;;
  lint) ensure_python dev; "$VENV/bin/ruff" check; "$VENV/bin/python" tools/similar_code.py; exec "$VENV/bin/python" tools/typecheck.py ;;
  collector) ensure_collector ;;
  prometheus) ensure_prometheus3 ;;
  lock) lock_python ;;
  *) sed -n '2,/^set /{/^#/p}' "$0"; exit 2 ;;
esac
