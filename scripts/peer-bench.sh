#!/usr/bin/env bash
# Side-by-side speed of airs and ik_llama.cpp (plain and -rtr 1) on the same files, on this
# machine, in one sitting: the engines alternate, every sitting runs each once (3 repetitions
# inside, as llama-bench -r 3), and the table reports the medians over sittings with the load
# average before and after. Prefill pp512 and decode tg128, 2 threads, weights read eagerly by
# airs (llama-bench maps the file and touches it all before timing). Decode is compared at the
# same depth: llama-bench's tg128 starts from an empty cache, so airs' is measured after a
# 1-token prompt; its decode after the 512-token prompt is shown beside (more attention).
#
# The peer is built outside the repository (../shared/tools/README.md: fetch
# github:ikawrakow/ik_llama.cpp, build it with build-peer.sh); nothing fetched is committed.
#
# Usage: scripts/peer-bench.sh IK_BUILD_BIN MODEL.gguf... [-- SITTINGS]   (default 3 sittings)
#   IK_BUILD_BIN: the directory holding ik_llama.cpp's llama-bench
# Prints markdown tables on stdout: the speeds, and decode as weight bandwidth against airs'
# read-bandwidth probe of the same sittings. Progress on stderr.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 IK_BUILD_BIN MODEL.gguf... [-- SITTINGS]" >&2
  exit 2
fi
ik_bin=$1
shift
models=()
sittings=3
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then
    sittings=$2
    break
  fi
  models+=("$1")
  shift
done
here=$(cd "$(dirname "$0")/.." && pwd)
airs=${AIRS_BIN:-$here/target/release/airs}
[ -x "$airs" ] || (cd "$here" && cargo build --release -q)
[ -x "$ik_bin/llama-bench" ] || { echo "error: no llama-bench in $ik_bin" >&2; exit 1; }
threads=2
results=$(mktemp)
trap 'rm -f "$results"' EXIT

load() { cut -d' ' -f1 /proc/loadavg; }
ik() { # model, extra args... → "pp tg"
  local m=$1
  shift
  "$ik_bin/llama-bench" -m "$m" -t $threads -r 3 -p 512 -n 128 -o json "$@" 2>/dev/null |
    python3 -c 'import json,sys
d = json.load(sys.stdin)
pp = [r["avg_ts"] for r in d if r["n_gen"] == 0][0]
tg = [r["avg_ts"] for r in d if r["n_prompt"] == 0][0]
print(f"{pp:.1f} {tg:.1f}")'
}
airs_json() { # model, prompt tokens → bench decode's JSON
  "$airs" bench decode --model "$1" --threads $threads --prompt-tokens "$2" --gen-tokens 128 \
    --reps 3 --loader eager --json 2>/dev/null
}
# → "pp tg weight_bytes_per_token probe_gb_per_s tg_after_prompt". llama-bench's tg128 decodes
# from an empty cache, so airs' decode to compare with it is the one after a 1-token prompt;
# the decode after the 512-token prompt (attention over 512-640 positions) is reported too.
airs_run() {
  local deep shallow
  deep=$(airs_json "$1" 512)
  shallow=$(airs_json "$1" 1)
  python3 -c 'import json,sys
deep, shallow = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pp, tg_deep = deep["prefill_tokens_per_s"], deep["decode_tokens_per_s"]
tg = shallow["decode_tokens_per_s"]
probes = [p for d in (deep, shallow) for p in d["read_probe_gb_per_s"] if p is not None]
weights = deep["weight_bytes_per_token"]
print(f"{pp:.1f} {tg:.1f} {weights} {max(probes):.2f} {tg_deep:.1f}")' "$deep" "$shallow"
}

load_before=$(load)
for m in "${models[@]}"; do
  for s in $(seq 1 "$sittings"); do
    echo "$(basename "$m"): sitting $s/$sittings" >&2
    echo "$m ik $(ik "$m")" >>"$results"
    echo "$m ik-rtr $(ik "$m" -rtr 1)" >>"$results"
    echo "$m airs $(airs_run "$m")" >>"$results"
    tail -n 3 "$results" | sed 's/^/  /' >&2
  done
done
load_after=$(load)

python3 - "$results" "$load_before" "$load_after" "$sittings" <<'EOF'
import os, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by, bytes_per_token, probes, deep = {}, {}, {}, {}
for m, engine, pp, tg, *extra in rows:
    by.setdefault(m, {}).setdefault(engine, []).append((float(pp), float(tg)))
    if extra:
        bytes_per_token[m] = int(extra[0])
        probes.setdefault(m, []).append(float(extra[1]))
        deep.setdefault(m, []).append(float(extra[2]))
med = lambda xs: statistics.median(xs)
print(f"{sys.argv[4]} sittings, 2 threads, load average {sys.argv[2]} before, {sys.argv[3]} after")
print()
print("| file | ik pp / tg | ik -rtr pp / tg | airs pp / tg | airs ÷ best ik, prefill / decode | airs tg after pp512 |")
print("|---|---|---|---|---|---|")
for m, e in by.items():
    cell = lambda k: f"{med([p for p, _ in e[k]]):.1f} / {med([t for _, t in e[k]]):.1f}"
    best_pp = max(med([p for p, _ in e[k]]) for k in ("ik", "ik-rtr"))
    best_tg = max(med([t for _, t in e[k]]) for k in ("ik", "ik-rtr"))
    a_pp = med([p for p, _ in e["airs"]])
    a_tg = med([t for _, t in e["airs"]])
    print(f"| {os.path.basename(m)} | {cell('ik')} | {cell('ik-rtr')} | {cell('airs')} | "
          f"{a_pp / best_pp:.2f}× / {a_tg / best_tg:.2f}× | {med(deep[m]):.1f} |")
# Decode as weight bandwidth: each engine's median tokens/s times the weight bytes a token
# reads (airs' count for the same file), against the median of airs' read-bandwidth probes.
print()
print("| file | weights per token | ik GB/s | ik -rtr GB/s | airs GB/s | read probe GB/s |")
print("|---|---|---|---|---|---|")
for m, e in by.items():
    b = bytes_per_token[m]
    probe = med(probes[m])
    gbps = lambda k: med([t for _, t in e[k]]) * b / 1e9
    cells = " | ".join(f"{gbps(k):.1f} ({100 * gbps(k) / probe:.0f} %)" for k in ("ik", "ik-rtr", "airs"))
    print(f"| {os.path.basename(m)} | {b / 1e6:.1f} MB | {cells} | {probe:.1f} |")
EOF
