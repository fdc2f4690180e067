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
# read-bandwidth probe of the same sittings (and airs' decode against probe passes between its
# steps, `bench decode --probe-steps`). Progress on stderr.
#
# Placement: a virtual machine's host moves its vCPUs every few seconds to minutes, and on the
# 2-vCPU benchmark host two threads read either ~36 or ~66 GB/s (one chiplet's link to memory
# or two) and sometimes get one core's multipliers instead of two (`airs bench host`,
# crates/airs-engine/src/cores.rs). Every engine's prefill and decode run is bracketed by
# `airs bench host`; a decode run is "2 links" when both probes found the threads' read paths
# their own (two threads read >= 1.5x one thread), "1 link" when both found them shared
# (< 1.3x), else "moved"; a prefill run "2 cores" / "1 core" likewise by the multipliers (the
# int8 dot rate). The last tables compare the engines within each placement.
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
ik() { # model, llama-bench test args... -> its one test's tokens/s
  local m=$1
  shift
  "$ik_bin/llama-bench" -m "$m" -t $threads -r 3 -o json "$@" 2>/dev/null |
    python3 -c 'import json,sys
print("%.1f" % json.load(sys.stdin)[0]["avg_ts"])'
}
host() { # -> "multipliers read_path" of the threads right now: own, shared or between
  "$airs" bench host --threads $threads --json 2>/dev/null |
    python3 -c 'import json,sys
d = json.load(sys.stdin)
print(d["multipliers"], d["read_path"])'
}
airs_json() { # model, prompt tokens → bench decode's JSON
  "$airs" bench decode --model "$1" --threads $threads --prompt-tokens "$2" --gen-tokens 128 \
    --reps 3 --loader eager --json 2>/dev/null
}
# -> "pp weight_bytes_per_token probe_gb_per_s tg_after_prompt" from the 512-token prompt's
# run, or "tg probe_gb_per_s" from the 1-token prompt's run: llama-bench's tg128 decodes from an
# empty cache, so airs' decode to compare with it is the one after a 1-token prompt; the decode
# after the 512-token prompt (attention over 512-640 positions) is reported beside it.
airs_prefill() {
  python3 -c 'import json,sys
d = json.loads(sys.argv[1])
probes = [p for p in d["read_probe_gb_per_s"] if p is not None]
print("%.1f %d %.2f %.1f" % (d["prefill_tokens_per_s"], d["weight_bytes_per_token"], max(probes), d["decode_tokens_per_s"]))' "$(airs_json "$1" 512)"
}
airs_decode() {
  python3 -c 'import json,sys
d = json.loads(sys.argv[1])
probes = [p for p in d["read_probe_gb_per_s"] if p is not None]
print("%.1f %.2f" % (d["decode_tokens_per_s"], max(probes)))' "$(airs_json "$1" 1)"
}
# -> decode's weight bandwidth as a fraction of the read probe, step by step: a separate run of
# 128 tokens after a 1-token prompt with a probe pass between every two steps (`bench decode
# --probe-steps`), each step against the passes just before and after it, the median over the
# steps. The fraction of the table above sets medians of whole runs against probes run
# seconds apart, which this host moves by a third (BENCHMARKS.md).
airs_stepwise() {
  "$airs" bench decode --model "$1" --threads $threads --prompt-tokens 1 --gen-tokens 128 \
    --reps 1 --loader eager --probe-steps --json 2>/dev/null |
    python3 -c 'import json,sys
print("%.3f" % json.load(sys.stdin)["probe_steps"]["decode_fraction_median"])'
}
# One run bracketed by host probes, appended as
# "KIND ENGINE MODEL RESULT... | multipliers_before read_path_before multipliers_after read_path_after".
bracketed() {
  local kind=$1 engine=$2 m=$3 before out after
  shift 3
  before=$(host)
  out=$("$@")
  after=$(host)
  echo "$kind $engine $m $out | $before $after" >>"$results"
}

load_before=$(load)
for m in "${models[@]}"; do
  for s in $(seq 1 "$sittings"); do
    echo "$(basename "$m"): sitting $s/$sittings" >&2
    bracketed pp ik "$m" ik "$m" -p 512 -n 0
    bracketed tg ik "$m" ik "$m" -p 0 -n 128
    bracketed pp ik-rtr "$m" ik "$m" -p 512 -n 0 -rtr 1
    bracketed tg ik-rtr "$m" ik "$m" -p 0 -n 128 -rtr 1
    bracketed pp airs "$m" airs_prefill "$m"
    bracketed tg airs "$m" airs_decode "$m"
    bracketed sw airs "$m" airs_stepwise "$m"
    tail -n 7 "$results" | sed "s|$m|$(basename "$m")|; s/^/  /" >&2
  done
done
load_after=$(load)

python3 - "$results" "$load_before" "$load_after" "$sittings" <<'EOF'
import os, statistics, sys
# Per file, engine and kind (pp, tg): the runs as (tokens/s, placement).
runs, bytes_per_token, probes, deep = {}, {}, {}, {}
def placement(kind, probe):
    mult_b, read_b, mult_a, read_a = probe
    if kind == "pp":
        classes, names = {mult_b, mult_a}, {"own": "2 cores", "shared": "1 core"}
    else:
        classes, names = {read_b, read_a}, {"own": "2 links", "shared": "1 link"}
    return names.get(classes.pop(), "moved") if len(classes) == 1 else "moved"
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    head, probe = line.split("|")
    kind, engine, m, rate, *extra = head.split()
    runs.setdefault(m, {}).setdefault(engine, {}).setdefault(kind, []).append(
        (float(rate), placement(kind, probe.split())))
    if engine == "airs" and kind == "pp":
        bytes_per_token[m] = int(extra[0])
        probes.setdefault(m, []).append(float(extra[1]))
        deep.setdefault(m, []).append(float(extra[2]))
    elif engine == "airs" and kind == "tg":
        probes.setdefault(m, []).append(float(extra[0]))
med = statistics.median
def rates(m, engine, kind, where=None):
    return [r for r, p in runs[m][engine][kind] if where is None or p == where]
print(f"{sys.argv[4]} sittings, 2 threads, load average {sys.argv[2]} before, {sys.argv[3]} after")
print()
print("| file | ik pp / tg | ik -rtr pp / tg | airs pp / tg | airs ÷ best ik, prefill / decode | airs tg after pp512 |")
print("|---|---|---|---|---|---|")
for m in runs:
    cell = lambda k: f"{med(rates(m, k, 'pp')):.1f} / {med(rates(m, k, 'tg')):.1f}"
    best = {kind: max(med(rates(m, k, kind)) for k in ("ik", "ik-rtr")) for kind in ("pp", "tg")}
    a = {kind: med(rates(m, "airs", kind)) for kind in ("pp", "tg")}
    print(f"| {os.path.basename(m)} | {cell('ik')} | {cell('ik-rtr')} | {cell('airs')} | "
          f"{a['pp'] / best['pp']:.2f}× / {a['tg'] / best['tg']:.2f}× | {med(deep[m]):.1f} |")
# Decode as weight bandwidth: each engine's median tokens/s times the weight bytes a token
# reads (airs' count for the same file), against the median of airs' read-bandwidth probes.
print()
# Beside it, airs' step-wise fraction (`airs_stepwise`): the median over sittings, and its range.
print("| file | weights per token | ik GB/s | ik -rtr GB/s | airs GB/s | read probe GB/s | airs step by step |")
print("|---|---|---|---|---|---|---|")
for m in runs:
    b = bytes_per_token[m]
    probe = med(probes[m])
    gbps = lambda k: med(rates(m, k, "tg")) * b / 1e9
    cells = " | ".join(f"{gbps(k):.1f} ({100 * gbps(k) / probe:.0f} %)" for k in ("ik", "ik-rtr", "airs"))
    sw = rates(m, "airs", "sw")
    stepwise = f"{100 * med(sw):.0f} % ({100 * min(sw):.0f}-{100 * max(sw):.0f})" if sw else "–"
    print(f"| {os.path.basename(m)} | {b / 1e6:.1f} MB | {cells} | {probe:.1f} | {stepwise} |")
# Like with like: medians within one placement (how many runs in brackets), and the ratio
# where airs and an ik variant both ran under it.
for kind, title, places in (("tg", "Decode (tg128) by placement", ("2 links", "1 link")),
                            ("pp", "Prefill (pp512) by placement", ("2 cores", "1 core"))):
    print()
    print(f"{title}: median tokens/s (runs); a run whose two probes disagree counts as moved")
    print()
    print("| file | placement | ik | ik -rtr | airs | airs ÷ best ik |")
    print("|---|---|---|---|---|---|")
    for m in runs:
        for place in places:
            cells, meds = [], {}
            for k in ("ik", "ik-rtr", "airs"):
                r = rates(m, k, kind, place)
                meds[k] = med(r) if r else None
                cells.append(f"{meds[k]:.1f} ({len(r)})" if r else "–")
            peers = [meds[k] for k in ("ik", "ik-rtr") if meds[k] is not None]
            ratio = f"{meds['airs'] / max(peers):.2f}×" if peers and meds["airs"] else "–"
            print(f"| {os.path.basename(m)} | {place} | {' | '.join(cells)} | {ratio} |")
        moved = sum(p == "moved" for k in ("ik", "ik-rtr", "airs") for _, p in runs[m][k][kind])
        if moved:
            print(f"| {os.path.basename(m)} | moved | {moved} runs | | | |")
EOF
