#!/usr/bin/env bash
# Install hwtrace and everything its tests need, then run the main job on the
# bundled example.  Idempotent: a second run only checks what is there.
#   --no-example   install only (CI uses this, then runs scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: a C compiler (compiled core, QEMU plugin, stepper, test
# programs; g++ for the C++ exception test), libipt (the reference decoder,
# used by the tests as an oracle only), qemu-user (the emulated engine's
# execution source), binutils (objdump/c++filt: x86 differential tests,
# demangling), gdb (tests step real programs with it as an independent
# witness), chromium (opens exported timelines in a real viewer in tests),
# npm (installs that viewer, speedscope).
need=()
for pkg in gcc g++ libc6-dev libipt-dev qemu-user binutils gdb chromium; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if ! command -v npm >/dev/null 2>&1; then need+=(npm); fi
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'
python3 -m pip install -q --disable-pip-version-check -e '.[dask]'   # decode --dask
# atheris: the fuzz harnesses' coverage-guided mode (fuzz/run.py --atheris).
# Optional: a prebuilt wheel where one exists; the mutation mode needs nothing.
python3 -m pip install -q --disable-pip-version-check atheris 2>/dev/null \
    || echo "note: atheris not installable here; fuzz/run.py --atheris is unavailable"

# speedscope, the flame-graph viewer the viewer tests open exports in (offline).
if [ ! -f build/viewer/node_modules/speedscope/dist/release/index.html ]; then
    mkdir -p build/viewer
    npm install --prefix build/viewer --no-audit --no-fund --loglevel=error speedscope >/dev/null
fi

# The reference oracle (Debian's libipt) for differential tests and benchmarks.
mkdir -p build
if [ ! -x build/ptoracle ] || [ ../shared/oracle/ptoracle.c -nt build/ptoracle ]; then
    if [ -f ../shared/oracle/ptoracle.c ]; then
        sh ../shared/oracle/build.sh build/ptoracle
    fi
fi

if [ "${1:-}" != "--no-example" ]; then
    bash scripts/example.sh
fi
