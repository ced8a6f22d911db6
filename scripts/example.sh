#!/usr/bin/env bash
# The main job on the bundled example: dump a real Intel PT capture.
set -euo pipefail
cd "$(dirname "$0")/.."
hwtrace dump examples/real-capture.pt | head -n 40
echo "..."
hwtrace dump --stat examples/real-capture.pt
