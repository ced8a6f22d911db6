#!/usr/bin/env bash
# Install hwtrace and everything its tests need into a virtual environment in
# this clone (.venv), then run the main job on the bundled example.
# Idempotent: a second run only checks what is there.
#   --no-example   install only (CI uses this, then runs scripts/test.sh)
#
# Works with Debian's own python3 (PEP 668 "externally managed": nothing is
# installed into it; the packages go into .venv) and with any other
# python3 >= 3.11 first on PATH (pyenv, CI).  HWTRACE_PYTHON=/path/python3
# picks the interpreter; HWTRACE_SHARED=DIR the shared material (default
# ../shared).  The compiled core must build (HWTRACE_REQUIRE_EXTENSIONS=0 lets
# the install go on with the pure-Python twins instead).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=$root/.venv
shared=${HWTRACE_SHARED:-$(dirname "$root")/shared}
say() { printf 'install: %s\n' "$*"; }
die() { printf 'install: error: %s\n' "$*" >&2; exit 1; }

# --- Debian packages ---------------------------------------------------------
# python3, python3-venv (Debian's python3 has no venv/ensurepip without it),
# python3-dev (headers for the compiled core), a C compiler (compiled core,
# QEMU plugin, stepper, test programs; g++ for the C++ exception test),
# libipt (the reference decoder, used by the tests as an oracle only),
# qemu-user (the emulated engine's execution source), binutils
# (objdump/c++filt: x86 differential tests, demangling), gdb (tests step real
# programs with it as an independent witness).  Optional, for the viewer
# tests: chromium (opens exported timelines in a real viewer) and npm
# (installs that viewer, speedscope).
required=(python3 python3-venv python3-dev gcc g++ libc6-dev
          libipt-dev qemu-user binutils gdb)
optional=(chromium)
command -v npm >/dev/null 2>&1 || optional+=(npm)

missing() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" \
            || printf '%s\n' "$pkg"
    done
}

if command -v dpkg-query >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    # The interpreter's own venv/dev packages when it is a Debian python3.X.
    py=${HWTRACE_PYTHON:-python3}
    pypath=$(command -v "$py" 2>/dev/null || true)
    case "$pypath" in
        /usr/bin/python3.*|/bin/python3.*) v=${pypath##*/}; required+=("$v-venv" "$v-dev") ;;
    esac
    mapfile -t need < <(missing "${required[@]}")
    mapfile -t want < <(missing "${optional[@]}")
    if [ ${#need[@]} -gt 0 ] || [ ${#want[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ]; then SUDO=()
        elif command -v sudo >/dev/null 2>&1; then SUDO=(sudo)
        else die "need root or sudo to install: ${need[*]} ${want[*]}"; fi
        say "apt-get install ${need[*]} ${want[*]}"
        "${SUDO[@]}" apt-get update -qq
        if [ ${#need[@]} -gt 0 ]; then
            DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq \
                "${need[@]}" >/dev/null
        fi
        for pkg in "${want[@]}"; do
            DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq \
                "$pkg" >/dev/null 2>&1 \
                || say "note: $pkg not installable here; the viewer tests will be skipped"
        done
    fi
else
    say "note: not a Debian/Ubuntu system: install a C compiler, Python >= 3.11 with venv and headers, qemu-user, libipt, binutils and gdb yourself"
fi

# --- the interpreter and the virtual environment -----------------------------
py=${HWTRACE_PYTHON:-python3}
command -v "$py" >/dev/null 2>&1 || die "$py not found (set HWTRACE_PYTHON=/path/to/python3.11+)"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "hwtrace needs Python >= 3.11, $py is $("$py" -c 'import sys; print(sys.version.split()[0])'): install python3.11 (and python3.11-venv, python3.11-dev) and run HWTRACE_PYTHON=python3.11 bash scripts/install.sh"

# An environment made by another interpreter (or a broken one) is rebuilt.
want_base=$("$py" -c 'import sys; print(sys.base_prefix)')
have_base=$("$venv/bin/python" -c 'import sys; print(sys.base_prefix)' 2>/dev/null || true)
if [ "$have_base" != "$want_base" ]; then
    [ -e "$venv" ] && say "recreating $venv (made by another Python)"
    rm -rf "$venv"
    say "creating $venv with $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    "$py" -m venv "$venv" || die "'$py -m venv' failed: on Debian/Ubuntu install python3-venv"
fi
vpy=$venv/bin/python
pip=("$vpy" -m pip install -q --disable-pip-version-check)

# The package, editable, with its compiled core and test extras (the C core
# is built by setup.py during the install).  Reinstalled only when what the
# build depends on changed.
stamp=$venv/.hwtrace-installed
digest=$(cat pyproject.toml setup.py src/hwtrace/*/_c_*.c src/hwtrace/*/*.h \
             src/hwtrace/*/core/*.[ch] 2>/dev/null \
         | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$digest" ] \
        || ! "$vpy" -c 'import hwtrace, capstone, pytest' 2>/dev/null; then
    say "pip install -e '.[test,dask]' into $venv (builds the compiled core)"
    HWTRACE_REQUIRE_EXTENSIONS=${HWTRACE_REQUIRE_EXTENSIONS:-1} "${pip[@]}" -e '.[test,dask]'
    echo "$digest" > "$stamp"
fi
HWTRACE_REQUIRE_EXTENSIONS=${HWTRACE_REQUIRE_EXTENSIONS:-1} "$vpy" - <<'EOF' || die "the compiled core did not load (see above)"
import sys
from hwtrace.pt import _impl
from hwtrace.flow import fast
from hwtrace.branches import _impl as branches_impl
from hwtrace.export import _textcols_impl
from hwtrace.analysis import _runs_impl
cores = (_impl.STATUS, fast.STATUS, branches_impl.STATUS, _textcols_impl.STATUS,
         _runs_impl.STATUS)
bad = [s for s in cores if s.expected and not s.loaded]
for s in cores:
    print("install:", s.describe(), file=sys.stderr if s in bad else sys.stdout)
sys.exit(1 if bad else 0)
EOF

# atheris: the fuzz harnesses' coverage-guided mode (fuzz/run.py --atheris).
# Optional: a prebuilt wheel where one exists; the mutation mode needs nothing.
if ! "$vpy" -c 'import atheris' 2>/dev/null; then
    "${pip[@]}" --only-binary=:all: atheris 2>/dev/null \
        || say "note: atheris not installable here; fuzz/run.py --atheris is unavailable"
fi

# speedscope, the flame-graph viewer the viewer tests open exports in (offline).
if [ ! -f build/viewer/node_modules/speedscope/dist/release/index.html ]; then
    if command -v npm >/dev/null 2>&1; then
        mkdir -p build/viewer
        # Trust the system's CA store as apt and pip do (node has its own).
        if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
            export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
        fi
        npm install --prefix build/viewer --no-audit --no-fund --no-update-notifier --loglevel=error \
            speedscope >/dev/null \
            || say "note: npm could not install speedscope; the viewer tests will be skipped"
    fi
fi

# The reference oracle (Debian's libipt) for differential tests and benchmarks.
mkdir -p build
if [ -f "$shared/oracle/ptoracle.c" ]; then
    if [ ! -x build/ptoracle ] || [ "$shared/oracle/ptoracle.c" -nt build/ptoracle ]; then
        sh "$shared/oracle/build.sh" build/ptoracle
    fi
else
    say "note: $shared not found (the conformance corpus, hardware captures and the oracle's source): the tests that need it will be skipped; see README, 'Set up'"
fi

if [ "${1:-}" != "--no-example" ]; then
    PATH=$venv/bin:$PATH bash scripts/example.sh
fi

echo
echo "hwtrace is installed in $venv: run 'source $venv/bin/activate' to put hwtrace on PATH, or call $venv/bin/hwtrace"
