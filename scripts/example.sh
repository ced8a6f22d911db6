#!/usr/bin/env bash
# The main job on the bundled example: record a real program with the
# emulated Intel PT engine (or real Intel PT where this CPU has it), then show
# what it did -- packets, a call summary, the calls and returns of fib -- and
# write a timeline to open in a viewer.  Each step says what it shows.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1       # each command's lines in the order it prints them
# hwtrace from the clone's environment (scripts/install.sh) when there is one.
if [ -x .venv/bin/hwtrace ]; then PATH=$PWD/.venv/bin:$PATH; fi
out=build/example
mkdir -p "$out"
gcc -O1 -g -o "$out/fib" examples/fib.c
step() { printf '\n== %s\n' "$*"; }
note() { sed 's/^/   /'; }

rm -rf "$out/trace"
step "1. record: hwtrace record -o $out/trace -- $out/fib 12"
hwtrace record -o "$out/trace" -- "$out/fib" 12

stream=$(ls -S "$out"/trace/*.pt | head -n 1)
step "2. the packets: hwtrace dump $stream | head -n 12"
note <<'EOF'
offset in the trace, packet, payload.  psb/psbend: a sync point and its
header (decoding can start there); tsc: time stamp; cbr: core/bus clock
ratio; mode.exec cs.l: 64-bit code; tip.pge: tracing starts at this address;
tnt.8: outcomes of conditional branches, ! taken . not taken; tip: target
of an indirect branch or return; tip.pgd: tracing stops (a syscall, exit).
EOF
hwtrace dump "$stream" | head -n 12

step "3. the instructions: hwtrace decode --lines $out/trace | grep -m1 -A9 '  fib  '"
note <<'EOF'
address, function+offset, disassembly, source line (--lines; the program
was built with -g): the first call of fib, as it ran.
EOF
hwtrace decode --lines "$out/trace" | grep -m1 -A9 '  fib  '

step "4. where the instructions went: hwtrace summary --sort calls --top 8 $out/trace"
note <<'EOF'
calls: times the function was entered; excl insns: instructions executed in
the function itself, incl insns: with what it called; excl%: share of all
instructions.  The first rows by exclusive instructions are the dynamic
loader (ld.so) starting the program; sorted by calls, fib is first.
EOF
hwtrace summary --sort calls --top 8 "$out/trace"

step "5. calls and returns inside fib: hwtrace branches --kinds call,return --within fib $out/trace | sed -n 9,20p"
note <<'EOF'
columns: thread (pid/tid; - where the stream does not say), call depth of
the code taking the branch, kind, from -> to (address, function+offset).
fib(12) recurses 11 calls deep, then returns and calls again as it unwinds.
EOF
hwtrace branches --kinds call,return --within fib "$out/trace" | sed -n 9,20p

step "6. a timeline and a flame graph: hwtrace export $out/trace --chrome $out/fib-timeline.json --folded $out/fib.folded"
hwtrace export "$out/trace" --chrome "$out/fib-timeline.json" --folded "$out/fib.folded"
viewer=build/viewer/node_modules/.bin/speedscope
echo "   open the timeline in speedscope (a browser window):"
if [ -x "$viewer" ]; then
    echo "     $viewer $out/fib-timeline.json"
else
    echo "     npx speedscope $out/fib-timeline.json"
fi
echo "   or in Perfetto: open https://ui.perfetto.dev and drop $out/fib-timeline.json on it (Open trace file)."
