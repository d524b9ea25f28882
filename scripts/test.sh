#!/usr/bin/env bash
# The test command: bash scripts/test.sh [pytest args]
#
# Installs what the suite needs when it is missing, then runs pytest:
#   .venv                 python3 -m venv, then pip install -e '.[all,dev]' and torch==2.13.0
#                         (MCBRIDGE_TEST_TORCH=no: without torch; its tests skip)
#                         (again when pyproject.toml is newer than .venv/.bridge-installed)
#   tests/node            npm ci: Azurite, the Azure Blob emulator (again when its lock changes)
#   redis-server          Debian's package, used when no Redis answers on 127.0.0.1:6379
#   prometheus            Debian's package (with promtool): the dashboard and alert rules tests
#   chromium              Debian's package: tests/test_status_page.py opens the status page headless
# moto and fake-gcs-server come with the Python extras. Set PYTHON to pick the interpreter, and
# MCBRIDGE_TEST_PROCESSES the number of pytest processes (4; 1 for none besides this one).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '==> %s\n' "$*"; }
fail() { printf 'error: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }
apt_updated=
apt_install() {
    if [ -z "$apt_updated" ]; then
        apt-get update -qq
        apt_updated=yes
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

python=${PYTHON:-python3}
venv=.venv
stamp=$venv/.bridge-installed
node_dir=tests/node

[ -f pyproject.toml ] || fail "no pyproject.toml in $(pwd)"

if [ ! -x "$venv/bin/python" ]; then
    step "creating $venv with $("$python" --version 2>&1)"
    if ! "$python" -m venv "$venv"; then
        is_root && command -v apt-get >/dev/null \
            || fail "$python -m venv failed: install python3-venv"
        step "installing python3-venv"
        rm -rf "$venv"
        apt_install python3-venv
        "$python" -m venv "$venv"
    fi
fi

if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    step "installing bridge and its extras [all,dev] into $venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -U pip
    # the distribution was called "mcbridge" before (a name PyPI gives to another project): drop it
    "$venv/bin/python" -m pip uninstall --disable-pip-version-check -q -y mcbridge >/dev/null 2>&1 || true
    "$venv/bin/python" -m pip install --disable-pip-version-check -q -e '.[all,dev]'
    if [ "${MCBRIDGE_TEST_TORCH:-yes}" != no ]; then
        # bridge.torch's tests, at this pin: this project's machines keep its CPU build on disk;
        # elsewhere PyPI's Linux build brings CUDA libraries of several GB (MCBRIDGE_TEST_TORCH=no
        # skips it, and those tests say they skip)
        "$venv/bin/python" -m pip install --disable-pip-version-check -q torch==2.13.0
    fi
    touch "$stamp"
else
    step "python packages up to date ($stamp is newer than pyproject.toml)"
fi

if [ ! -x "$node_dir/node_modules/.bin/azurite-blob" ] \
    || [ "$node_dir/package-lock.json" -nt "$node_dir/node_modules/.package-lock.json" ]; then
    command -v npm >/dev/null || fail "npm not found: Azurite needs Node.js 20 and npm"
    step "installing Azurite with npm ci in $node_dir (node $(node --version))"
    (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
else
    step "Azurite installed in $node_dir"
fi

if command -v redis-server >/dev/null; then
    step "redis-server found"
elif is_root && command -v apt-get >/dev/null; then
    step "installing redis-server"
    apt_install redis-server
else
    step "warning: no redis-server; tests needing Redis fail unless one answers on 127.0.0.1:6379"
fi

if [ -x /usr/bin/prometheus ] && command -v promtool >/dev/null; then
    step "prometheus found"
elif is_root && command -v apt-get >/dev/null; then
    step "installing prometheus (the dashboard and alert rules tests run it and its promtool)"
    apt_install --no-install-recommends prometheus
else
    step "warning: no prometheus; the dashboard and alert rules tests skip"
fi

if command -v chromium >/dev/null; then
    step "chromium found"
elif is_root && command -v apt-get >/dev/null; then
    step "installing chromium"
    apt_install chromium
else
    step "warning: no chromium; tests/test_status_page.py is skipped"
fi

# No test may reach past this machine: cloud SDKs' instance-metadata probes stay off unless a
# test turns one on against its own loopback double.
export AWS_EC2_METADATA_DISABLED=${AWS_EC2_METADATA_DISABLED:-true} NO_GCE_CHECK=${NO_GCE_CHECK:-true}

# Most of the suite waits on subprocesses, emulators and workers rather than on the CPU: it runs in
# MCBRIDGE_TEST_PROCESSES pytest processes (pytest-xdist; each starts the emulators it needs on
# ports of its own). 1 runs it in this process; a -n in the arguments wins.
processes=${MCBRIDGE_TEST_PROCESSES:-4}
spread=()
[ "$processes" -gt 1 ] && spread=(-n "$processes")

step "pytest ${spread[*]} $*"
exec "$venv/bin/python" -m pytest "${spread[@]}" "$@"
