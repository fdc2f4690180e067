#!/usr/bin/env bash
# Debian's headless-capable Chromium for the pool page test. Installs it with apt when it is
# missing (needs root); prints the browser's path on its last line.
set -euo pipefail
for b in chromium chromium-browser; do
  if command -v "$b" >/dev/null 2>&1; then
    command -v "$b"
    exit 0
  fi
done
if [ "$(id -u)" != 0 ]; then
  echo "error: chromium is not installed and installing it needs root (apt-get install chromium)" >&2
  exit 1
fi
(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >&2
command -v chromium
