#!/usr/bin/env bash
# Linux check of the Metal backend, which can only run on a Mac:
#  1. type-checks every csrc/gpu/metal/*.mm as Objective-C++ with ARC against the
#     hand-written API stubs in tools/metal_check/include: an unknown selector, a
#     method sent to the wrong protocol or a wrong argument type fails
#     (-Werror -Wobjc-method-access; the sources use no `id`-typed receivers);
#     Each file is checked as built with the macOS 15 SDK and with the macOS 14 SDK;
#  2. proves (1) bites: each mutation below breaks metal_device.mm the way a
#     mistyped API call would, and must make the check fail;
#  3. builds and runs the plain-C++ checks of metal_rules.h;
#  4. checks the default-device rule (below) and that each of its mutations breaks it.
# check_api_names.py separately proves the stubs declare only real SDK API.
# Needs clang++ (Debian: apt-get install -y clang); CLANGXX overrides it.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
CLANGXX="${CLANGXX:-clang++}"
if ! command -v "$CLANGXX" >/dev/null; then
  echo "metal_check: $CLANGXX not found (Debian: apt-get install -y clang)" >&2
  exit 2
fi

# -fobjc-runtime only picks ARC and blocks semantics for the parse; nothing is linked.
# `lang` is shared by the parses and the mutants' precompiled headers (below).
lang=(-std=c++20 -fobjc-arc -fblocks -fobjc-runtime=macosx-11.0 -Werror -Wall -Wextra -Wshadow -Wobjc-method-access
      -I "$root/tools/metal_check/include" -I "$root/csrc")
flags=(-fsyntax-only -x objective-c++ "${lang[@]}")

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0

shopt -s nullglob
sources=(csrc/gpu/metal/*.mm)
if [ ${#sources[@]} -eq 0 ]; then
  echo "metal_check: no csrc/gpu/metal/*.mm" >&2
  exit 1
fi
# Both sides of the SDK guards: the macOS 15 SDK (mathMode) and the macOS 14 SDK.
sdks=(150000 140000)
for source in "${sources[@]}"; do
  for sdk in "${sdks[@]}"; do
    if "$CLANGXX" "${flags[@]}" -D__MAC_OS_X_VERSION_MAX_ALLOWED=$sdk "$source"; then
      echo "metal_check: ok $source (SDK $sdk)"
    else
      echo "metal_check: FAILED $source (SDK $sdk)" >&2
      failed=1
    fi
  done
done

# sed expression | the mistake it stands for | SDK
mutations=(
  's/offset:offset atIndex:index\]/offset:offset atIndx:index]/|misspelt selector|150000'
  's/\[encoder_ endEncoding\];/[commands_ endEncoding];/|method of another protocol|150000'
  's/commands_\.status ==/commands_.state ==/|unknown property|150000'
  's/dispatchThreads:to_mtl(threads)/dispatchThreads:threads/|Size3 for MTLSize|150000'
  's/computeCommandEncoderWithDispatchType:MTLDispatchTypeConcurrent/computeCommandEncoderWithDispatchType:1/|int for an NS_ENUM|150000'
  's/setBytes:data length:size/setBytes:size length:data/|swapped arguments|150000'
  's/options\.mathMode = MTLMathModeSafe/options.mathMode = MTLMathFloatingPointFunctionsPrecise/|constant of another enum|150000'
  's/deallocator:\^(void\*, NSUInteger)/deallocator:^(void*)/|wrong block signature|150000'
  's/error:&error\]/error:error]/|NSError* for NSError**|150000'
  's/\[\[MTLCompileOptions alloc\] init\]/[MTLCompileOptions new]/|undeclared class method|150000'
  's/newBufferWithBytes:data length:size/newBufferWithBytes:data size:size/|wrong selector part|150000'
  's/^#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000/#if 1/|macOS 15 API outside the SDK guard|140000'
  's/supportsFamily:MTLGPUFamilyApple7\]/supportsFamily:7]/|int for an NS_ENUM (GPU family)|150000'
  's/options\.languageVersion = MTLLanguageVersion3_1/options.languageVersion = 3/|int for an NS_ENUM (language version)|150000'
  's/MTLCopyAllDevices()\.firstObject/MTLCopyAllDevices().first/|unknown NSArray property|150000'
  's/\[queue addResidencySet:set\]/[queue addResidencySet:descriptor]/|descriptor for a residency set|150000'
  's/\[set addAllocation:buffer\]/[set addAllocation:set]/|residency set for an allocation|150000'
  's/\[set requestResidency\]/[set requestResidency:YES]/|wrong selector arity|150000'
  's/^#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000  \/\/ macOS 15 SDK: residency sets/#if 1/|residency sets outside the SDK guard|140000'
  's/completionHandler:\^(id<MTLComputePipelineState> pipeline, NSError\* error)/completionHandler:^(id<MTLComputePipelineState> pipeline, NSError* error, NSUInteger)/|wrong completion handler signature|150000'
  's/newLibraryWithURL:\[NSURL fileURLWithPath:file\]/newLibraryWithURL:file/|NSString for NSURL|150000'
  's/info\.errorState/info.status/|property of another protocol (encoder info)|150000'
)
target=csrc/gpu/metal/metal_device.mm
# The mutants parse with a precompiled header per SDK of the target's <...> includes (the
# standard library and the stubs: most of a parse). The unmutated target must pass with it, so
# a broken header cannot make every mutant fail for the wrong reason. (1) parses without it.
sed -n 's|^\(#include <[^>]*>\).*|\1|p' "$target" >"$tmp/prefix.h"
for sdk in "${sdks[@]}"; do
  if ! "$CLANGXX" -x objective-c++-header "${lang[@]}" -D__MAC_OS_X_VERSION_MAX_ALLOWED=$sdk \
      "$tmp/prefix.h" -o "$tmp/prefix-$sdk.pch" ||
     ! "$CLANGXX" "${flags[@]}" -D__MAC_OS_X_VERSION_MAX_ALLOWED=$sdk -include-pch "$tmp/prefix-$sdk.pch" "$target"; then
    echo "metal_check: FAILED $target with the precompiled header of its includes (SDK $sdk)" >&2
    failed=1
  fi
done
for entry in "${mutations[@]}"; do
  IFS='|' read -r expression mistake sdk <<<"$entry"
  mutant="$tmp/$(basename "$target")"
  sed "$expression" "$target" >"$mutant"
  if cmp -s "$target" "$mutant"; then
    echo "metal_check: FAILED mutation '$mistake' no longer applies to $target: update run.sh" >&2
    failed=1
  elif "$CLANGXX" "${flags[@]}" -D__MAC_OS_X_VERSION_MAX_ALLOWED=$sdk -include-pch "$tmp/prefix-$sdk.pch" "$mutant" \
      2>"$tmp/log"; then
    echo "metal_check: FAILED the check missed a $mistake ($expression)" >&2
    failed=1
  else
    echo "metal_check: ok catches $mistake: $(grep -m1 'error:' "$tmp/log" | sed 's/^[^ ]* //')"
  fi
done

# The default-device rule: MTLCreateSystemDefaultDevice returns nil in command-line processes
# that do not link CoreGraphics (Apple's documentation), so metal.cmake finds CoreGraphics and
# links it into _core, and every MTLCreateSystemDefaultDevice() call is followed within two
# lines by a MTLCopyAllDevices() fallback. Prints what is wrong and fails.
default_device_rule() {  # metal.cmake, metal_device.mm
  local cmake="$1" source="$2" var
  var="$(sed -n 's/^ *find_library(\([A-Za-z0-9_]*\) CoreGraphics REQUIRED).*/\1/p' "$cmake")"
  if [ -z "$var" ]; then
    echo "$cmake does not find_library CoreGraphics"
    return 1
  fi
  if ! grep -Eq "^ *target_link_libraries\(_core .*\\\$\{$var\}" "$cmake"; then
    echo "$cmake does not link CoreGraphics (\${$var}) into _core"
    return 1
  fi
  if ! awk '/^[[:space:]]*\/\//{next}
            /MTLCreateSystemDefaultDevice\(\)/{if (open) exit 1; open = NR}
            /MTLCopyAllDevices\(\)/{if (open && NR - open <= 2) open = 0}
            open && NR - open > 2 {exit 1}
            END {exit open ? 1 : 0}' "$source"; then
    echo "$source calls MTLCreateSystemDefaultDevice() without a MTLCopyAllDevices() fallback"
    return 1
  fi
}
cmake_file=cmake/metal.cmake
if problem="$(default_device_rule "$cmake_file" "$target")"; then
  echo "metal_check: ok default-device rule ($cmake_file, $target)"
else
  echo "metal_check: FAILED default-device rule: $problem" >&2
  failed=1
fi
# file | sed expression | the mistake it stands for
rule_mutations=(
  "$cmake_file|s/ \\\${MQ_COREGRAPHICS_FRAMEWORK}//|CoreGraphics found but not linked"
  "$cmake_file|/find_library(MQ_COREGRAPHICS_FRAMEWORK/d|CoreGraphics not found"
  "$target|/MTLCopyAllDevices()/d|no MTLCopyAllDevices fallback"
  "$target|s/^\\(.*MTLCreateSystemDefaultDevice();\\)$/\\1\\n\\n\\n/|fallback too far from the call"
)
for entry in "${rule_mutations[@]}"; do
  IFS='|' read -r file expression mistake <<<"$entry"
  mutant="$tmp/$(basename "$file")"
  sed "$expression" "$file" >"$mutant"
  if [ "$file" = "$cmake_file" ]; then pair=("$mutant" "$target"); else pair=("$cmake_file" "$mutant"); fi
  if cmp -s "$file" "$mutant"; then
    echo "metal_check: FAILED rule mutation '$mistake' no longer applies to $file: update run.sh" >&2
    failed=1
  elif problem="$(default_device_rule "${pair[@]}")"; then
    echo "metal_check: FAILED the default-device rule missed: $mistake" >&2
    failed=1
  else
    echo "metal_check: ok default-device rule catches $mistake: $problem"
  fi
done

if "$CLANGXX" -std=c++20 -Werror -Wall -Wextra -I csrc tools/metal_check/metal_rules_test.cpp csrc/gpu/apple_chips.cpp \
    -o "$tmp/metal_rules_test" && "$tmp/metal_rules_test"; then
  echo "metal_check: ok metal_rules_test"
else
  echo "metal_check: FAILED metal_rules_test" >&2
  failed=1
fi
exit $failed
