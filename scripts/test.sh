#!/usr/bin/env bash
# Run the test suite in the environment scripts/install.sh made (.venv), both
# the compiled core and the Python twin where tests parametrize over them.
#   bash scripts/test.sh [PYTEST ARGS...]      e.g. -x, -k NAME, tests/test_x86.py
#   HWTRACE_SLOW=1 bash scripts/test.sh        also the slow, exhaustive runs (CI)
# Needs ../shared beside the clone (or HWTRACE_SHARED=DIR) for the tests over
# Intel's conformance corpus and the hardware captures; without it they are
# skipped, and the run says so first.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    echo "test: no .venv here: run 'bash scripts/install.sh' first" >&2
    exit 1
fi
# As if activated: tests run hwtrace, python3 and pytest from the environment.
export VIRTUAL_ENV=$PWD/.venv
export PATH=$VIRTUAL_ENV/bin:$PATH
unset PYTHONHOME
exec python -m pytest -q "$@"
