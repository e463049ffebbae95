#!/usr/bin/env bash
# Formats the C++/Objective-C++ sources with clang-format (.clang-format) and lints the Python
# with ruff (pyproject.toml, [tool.ruff]). Default: rewrite the C++ files and apply ruff's safe
# fixes in place. --check: change nothing, show what differs and fail if anything does (.ci/run).
#
# Tools, pinned because their output changes between versions (.ci/run installs these):
#   apt-get install clang-format-19        (CLANG_FORMAT=... names another clang-format 19)
#   python3 -m pip install ruff==0.17.6    (RUFF=... names another command running it)
#
# Left out, as .clang-format-ignore lists them for clang-format run by hand or by an editor: the
# MSL sources (shaders/) and the CPU runtime's MSL headers (csrc/gpu/cpu/msl*/). The CPU runtime
# compiles both at run time and their bytes key its kernel cache (a reformat recompiles every
# kernel); tests find and mutate shader lines by their exact text; and the headers are written one
# declaration a line on purpose, as tables of the MSL library.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT="${CLANG_FORMAT:-clang-format-19}"
RUFF="${RUFF:-python3 -m ruff}"
CLANG_FORMAT_MAJOR=19
RUFF_VERSION=0.17.6
PYTHON_DIRS=(python tests bench tools)

check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: tools/format.sh [--check]" >&2; exit 2 ;;
esac

fail() { echo "format: $*" >&2; exit 1; }

version="$($CLANG_FORMAT --version 2>/dev/null)" || fail "$CLANG_FORMAT not found (apt-get install clang-format-$CLANG_FORMAT_MAJOR)"
[[ "$version" =~ version\ $CLANG_FORMAT_MAJOR\. ]] || fail "$CLANG_FORMAT is not clang-format $CLANG_FORMAT_MAJOR: $version"
version="$($RUFF --version 2>/dev/null)" || fail "ruff not found (python3 -m pip install ruff==$RUFF_VERSION)"
[ "$version" = "ruff $RUFF_VERSION" ] || fail "ruff $RUFF_VERSION wanted, found: $version"
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || fail "not a git work tree (git lists the files)"

# The C++ files, tracked or new (not ignored), NUL-separated (bash 3.2 on macOS: no mapfile).
cxx_files() {
  git ls-files -z --cached --others --exclude-standard -- \
    'csrc/*.cpp' 'csrc/*.h' 'csrc/*.mm' 'bench/*.cpp' 'bench/*.h' 'tools/*.cpp' 'tools/*.h' 'tests/*.cpp' 'tests/*.h' \
    ':!csrc/gpu/cpu/msl/*' ':!csrc/gpu/cpu/msl_strict/*' ':!csrc/gpu/cpu/msl_opencl/*'
}

status=0
while IFS= read -r -d '' file; do
  [ -f "$file" ] || continue  # deleted in the work tree, not yet in the index
  if [ "$check" = 1 ]; then
    $CLANG_FORMAT --style=file "$file" | diff -u --label "$file" --label "$file (clang-format)" "$file" - || status=1
  else
    $CLANG_FORMAT --style=file -i "$file"
  fi
done < <(cxx_files)
[ "$status" = 0 ] || echo "format: C++ files differ from .clang-format's layout (above); tools/format.sh rewrites them" >&2

if [ "$check" = 1 ]; then
  $RUFF check --no-fix "${PYTHON_DIRS[@]}" || status=1
else
  # Safe fixes only; ruff lists what it cannot fix, and that fails the run.
  $RUFF check --fix "${PYTHON_DIRS[@]}" || status=1
fi
exit "$status"
