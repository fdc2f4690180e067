#!/usr/bin/env bash
# Build and run a fuzz target for N seconds: `gguf_parse` (Gguf::parse + every view of an
# accepted file: metadata arrays walked recursively, tensor data, LayerMap, ModelConfig) by
# default, `openai_request` (the server's request bodies, through chat templates) or
# `kld_reference` (`airs perplexity --kld-ref` files).
#
#   fuzz/run.sh [SECONDS=600] [extra libFuzzer flags...]
#   TARGET=openai_request fuzz/run.sh 660
#   SANITIZER=none fuzz/run.sh 60      # without AddressSanitizer
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). The toolchain is stable, so RUSTC_BOOTSTRAP=1
# lets cargo-fuzz pass its nightly-only flags (-Zsanitizer, coverage instrumentation); the
# build is release with debug assertions and overflow checks. One libFuzzer process (one
# core). Corpus: fuzz/corpus/gguf_parse (gitignored, grows across runs), seeded from the
# committed small synthesized files in fuzz/seeds/ (regenerate with
# `AIRS_WRITE_FUZZ_SEEDS=1 cargo test -p airs-gguf --test fuzz_seeds`) and the first
# MAX_LEN bytes of the real files models/stories260K.gguf and testdata/tokenizer/*.gguf
# (inputs are capped at MAX_LEN, default 64 KiB, so only their headers take part).
# -malloc_limit_mb makes any single allocation above 64 MiB a crash: "no huge allocation".
# Crashes land in fuzz/artifacts/gguf_parse/; reproduce one with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -s address gguf_parse fuzz/artifacts/gguf_parse/crash-...
# and add it as a test in crates/airs-gguf/tests/malformed.rs.
set -euo pipefail
secs=${1:-600}
shift || true
san=${SANITIZER:-address}
max_len=${MAX_LEN:-65536}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
target=${TARGET:-gguf_parse}
corpus=$here/corpus/$target
mkdir -p "$corpus"
if [ "$target" = gguf_parse ]; then
    seeds=$here/seeds
    for f in "$root"/models/stories260K.gguf "$root"/testdata/tokenizer/*.gguf; do
        dest=$corpus/real-$(basename "$f")
        [ -e "$dest" ] || head -c "$max_len" "$f" >"$dest"
    done
else
    seeds=$here/seeds_$target
fi
cd "$here"
export RUSTC_BOOTSTRAP=1
cargo fuzz build -s "$san" "$target"
exec cargo fuzz run -s "$san" "$target" "$corpus" "$seeds" -- \
    -max_len="$max_len" -max_total_time="$secs" -malloc_limit_mb=64 -rss_limit_mb=2048 \
    -print_final_stats=1 -timeout=10 "$@"
