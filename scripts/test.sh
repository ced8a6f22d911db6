#!/usr/bin/env bash
# Run the whole test suite (both the compiled core and the Python twin where
# tests parametrize over them).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m pytest -q "$@"
