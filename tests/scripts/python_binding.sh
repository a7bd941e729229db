#!/usr/bin/env bash
# The Python binding's pytest suite (tests/python) against the built
# libcolibri.so. pytest and numpy are required (scripts/install-deps.sh
# installs Debian's python3-pytest and python3-numpy): their absence, or a run
# that collects no test, is a failure, never a skip.
set -euo pipefail
build_dir=$(cd "$1" && pwd)
data_dir=$(cd "$2" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)

library=$build_dir/lib/libcolibri.so
if [[ ! -f $library ]]; then echo "FAIL: $library is not built"; exit 1; fi

# The first python3 on PATH may be one without Debian's packages (e.g. pyenv):
# take the first interpreter that has both.
python=
for candidate in ${COLIBRI_PYTHON:-} /usr/bin/python3 python3; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import numpy, pytest' >/dev/null 2>&1; then
    python=$(command -v "$candidate")
    break
  fi
done
if [[ -z $python ]]; then
  echo "FAIL: no python3 with numpy and pytest (apt-get install python3-numpy python3-pytest, or run scripts/install-deps.sh)"
  exit 1
fi

export COLIBRI_LIBRARY=$library
export COLIBRI_BUILD_DIR=$build_dir
export COLIBRI_TEST_DATA_DIR=$data_dir
export PYTHONDONTWRITEBYTECODE=1
status=0
"$python" -m pytest -q -p no:cacheprovider "$root/tests/python" || status=$?
if [[ $status -eq 5 ]]; then
  echo "FAIL: pytest collected no tests"
  exit 1
fi
exit $status
