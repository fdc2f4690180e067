#!/usr/bin/env bash
# Decode at depth, side by side: ik_llama.cpp's `llama-bench -gp DEPTH,128` (128 tokens generated
# after a DEPTH-token prompt, plain and -rtr 1, flash attention as it defaults) against
# `airs bench decode --prompt-tokens DEPTH --gen-tokens 128`, 2 threads, 2 repetitions inside
# each run, the engines alternating, every run bracketed by `airs bench host` (the threads'
# read path before and after it: own, shared or between; see scripts/peer-bench.sh). Where
# peer-bench.sh compares decode from an empty cache, this one weighs attention over DEPTH
# positions too.
#
# Usage: scripts/peer-depth.sh IK_BUILD_BIN MODEL.gguf [DEPTH (1900)] [SITTINGS (3)]
# Prints one line per run: "ENGINE TOKENS/S | PATH_BEFORE PATH_AFTER", and the load average
# before and after. The peer is built outside the repository (../shared/tools/README.md).
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 IK_BUILD_BIN MODEL.gguf [DEPTH] [SITTINGS]" >&2
  exit 2
fi
ik_bin=$1
model=$2
depth=${3:-1900}
sittings=${4:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
airs=${AIRS_BIN:-$here/target/release/airs}
[ -x "$airs" ] || (cd "$here" && cargo build --release -q)
[ -x "$ik_bin/llama-bench" ] || { echo "error: no llama-bench in $ik_bin" >&2; exit 1; }

path() {
  "$airs" bench host --threads 2 --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["read_path"])'
}
ik() {
  "$ik_bin/llama-bench" -m "$model" -t 2 -r 2 -p 0 -n 0 -gp "$depth,128" -o json "$@" \
    2>/dev/null | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["avg_ts"])'
}
airs_decode() {
  "$airs" bench decode --model "$model" --threads 2 --prompt-tokens "$depth" --gen-tokens 128 \
    --reps 2 --loader eager --probe-mib 0 --json 2>/dev/null |
    python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["decode_tokens_per_s"])'
}
run() { # label, command...
  local label=$1 before out after
  shift
  before=$(path)
  out=$("$@")
  after=$(path)
  echo "$label $out | $before $after"
}

echo "load $(cut -d' ' -f1 /proc/loadavg); $(basename "$model"), decode of 128 after $depth"
for _ in $(seq 1 "$sittings"); do
  run ik ik
  run ik-rtr ik -rtr 1
  run airs airs_decode
done
echo "load $(cut -d' ' -f1 /proc/loadavg)"
