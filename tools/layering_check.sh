#!/bin/bash
# Checks that the dependency arrows go one way (issue 22): daemon/ -> gpu/ -> common/, and
# client/ -> gpu/, common/; the engine client library never reaches the daemon.
#   1. no file under gpu/ or client/ includes "daemon/...";
#   2. the build closure of //gpu/... has nothing under //daemon;
#   3. the build closure of the C++ client library (//client/cpp:tutti_client) has nothing under
#      //daemon and not the host-engine simulator (//client/hostengine).
# Prints "layering: PASSED", or one line per offending include or dependency path (its last
# arrow is the edge to remove) and "layering: FAILED". CI (.ci/run) counts it as one test.
#
#   tools/layering_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
failed=0

# 1. Includes.
while IFS= read -r hit; do
  echo "layering: ${hit%%:*} line $(cut -d: -f2 <<<"$hit"): $(cut -d: -f3- <<<"$hit" | tr -s ' ')"
  failed=1
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]daemon/' gpu client \
           --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' --include='*.cpp')

# 2 and 3. Build closures: for each forbidden target reached (at most 3 shown), the path to it.
# `from` is the root, `forbidden` a regular expression over labels.
check_closure() {
  local from=$1 forbidden=$2 bad target
  if ! bad=$(bazel query --noshow_progress \
      "filter('${forbidden}', kind(rule, deps(${from})))" 2>/dev/null); then
    echo "layering: bazel query deps(${from}) failed"
    failed=1
    return
  fi
  for target in $(head -3 <<<"$bad"); do
    echo "layering: $(bazel query --noshow_progress "somepath(${from}, ${target})" 2>/dev/null |
      paste -sd' ' | sed 's/ / -> /g')"
    failed=1
  done
}
check_closure '//gpu/...' '^//daemon[/:]'
check_closure '//client/cpp:tutti_client' '^//(daemon|client/hostengine)[/:]'

if [ "$failed" -ne 0 ]; then
  echo "layering: FAILED (gpu/ and client/ must not reach daemon/; see tools/layering_check.sh)"
  exit 1
fi
echo "layering: PASSED"
