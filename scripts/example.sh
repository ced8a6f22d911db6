#!/usr/bin/env bash
# The main job on the bundled example: record a real program with the
# emulated Intel PT engine (or real Intel PT where this CPU has it), then show
# what it did: packets, a call summary, the call history, and a timeline file
# for speedscope / Perfetto / chrome://tracing.
set -euo pipefail
cd "$(dirname "$0")/.."
# hwtrace from the clone's environment (scripts/install.sh) when there is one.
if [ -x .venv/bin/hwtrace ]; then PATH=$PWD/.venv/bin:$PATH; fi
out=build/example
mkdir -p "$out"
gcc -O1 -g -o "$out/fib" examples/fib.c

rm -rf "$out/trace"
echo "== hwtrace record -o $out/trace -- $out/fib 12"
hwtrace record -o "$out/trace" -- "$out/fib" 12

echo; echo "== hwtrace dump (first packets of the busiest stream)"
stream=$(ls -S "$out"/trace/*.pt | head -n 1)
hwtrace dump "$stream" | head -n 12

echo; echo "== hwtrace summary"
hwtrace summary "$out/trace" 2>/dev/null | head -n 14

echo; echo "== hwtrace branches --kinds call,return --within fib (first records)"
hwtrace branches --kinds call,return --within fib "$out/trace" 2>/dev/null | head -n 8 || true

echo; echo "== hwtrace export --chrome $out/fib-timeline.json --folded $out/fib.folded"
hwtrace export "$out/trace" --chrome "$out/fib-timeline.json" --folded "$out/fib.folded"
