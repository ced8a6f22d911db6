#!/usr/bin/env bash
# Install hwtrace and everything its tests need, then run the main job on the
# bundled example.  Idempotent: a second run only checks what is there.
#   --no-example   install only (CI uses this, then runs scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: a C compiler (compiled core, QEMU plugin, test programs),
# libipt (the reference decoder, used by the tests as an oracle only),
# qemu-user (the emulated engine's execution source).
need=()
for pkg in gcc libc6-dev libipt-dev qemu-user binutils; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'

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
