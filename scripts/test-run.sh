#!/usr/bin/env bash
# Runs the compiled test files in two phases, two files at a time in each: first every suite that
# measures time (bounds, leases, waits, handoffs), then the heavy ones (the chaos short profile and
# the benchmark's smoke run, each several processes at full load on their own), so that those never
# starve these of the CPU. Both phases always run; the run fails if either did. A test
# (or suite) still running after 10 minutes fails instead of holding the run up for ever (the
# longest suites, a chaos deployment or the bench smoke run, take ~2 min).
set -uo pipefail
cd "$(dirname "$0")/.."
run() {
  node --test --test-concurrency=2 --test-timeout=600000 --test-reporter=spec --import ./build/test/support/setup.js "$@"
}
mapfile -t heavy < <(find build/test/chaos build/test/bench -name '*.spec.js' | sort)
mapfile -t timed < <(find build/test -name '*.spec.js' -not -path 'build/test/chaos/*' -not -path 'build/test/bench/*' | sort)
status=0
run "${timed[@]}" || status=1
run "${heavy[@]}" || status=1
exit "$status"
