#!/usr/bin/env bash
# Packs the package as npm would publish it, installs the tarball (not the source tree) into each
# consumer app of test/consumers/ in a scratch directory, builds the app as its Nest CLI would and
# runs it against a private redis-server on a free port: NestJS 12 (ES modules) with ioredis 6,
# and NestJS 11 (CommonJS, TypeScript 5) with ioredis 5 (the declared peer ranges are what these
# prove); then the README's quick start, taken from the README as a user pastes it, in a NestJS 11
# CommonJS app and in a NestJS 12 app as `nest new` makes it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
redis_pid=
cleanup() {
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

cd "$root"
tarball="$work/$(npm pack --silent --pack-destination "$work" | tail -1)"
echo "consumers: packed $(basename "$tarball") ($SECONDS s)"

port=$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

# Each app is installed and built first, two at a time (four at once took longer), then run, one at a time: the
# quick start's timing check (two payments one after the other within the lock's 2 s wait) must
# not run beside a tsc build, nor beside another app locking the same order on the same Redis (a
# CI run got 201 at 3,004 ms and 409 at 2,011 ms: the two quick starts' payments had met).
# Each step's output is printed in one piece when it is done, and any failure fails the script.
consumer() {
  local app=$1
  cp -r "test/consumers/$app" "$work/$app"
  cp test/consumers/app.ts "$work/$app/app.ts"
  cd "$work/$app"
  npm install --prefer-offline --no-audit --no-fund --loglevel=error "$tarball"
  npm ls --depth=0 @nestjs/core ioredis typescript nestjs-redis-lock | tail -n +2
  npm run build --silent
}
quickstart() {
  # The README's quick start as printed: in a Nest 11 CommonJS CLI app (quickstart), and in an app
  # as NestJS 12's `nest new` makes it, ES modules, nodenext, strict (quickstart-esm).
  local app=$1
  mkdir -p "$work/$app/src"
  cp "test/consumers/$app/package.json" "test/consumers/$app/tsconfig.json" "$work/$app/"
  cp test/consumers/quickstart/main.ts "$work/$app/src/main.ts" # one runner for both apps
  node scripts/readme-files.mjs README.md "$work/$app/src"
  cd "$work/$app"
  npm install --prefer-offline --no-audit --no-fund --loglevel=error "$tarball"
  npm run build --silent
}
run() {
  local app=$1 main=$2
  cd "$work/$app"
  REDIS_URL="redis://127.0.0.1:$port" node "$main"
}
status=0
wave() {
  local jobs=("$@") pids=() started=$SECONDS
  for job in "${jobs[@]}"; do
    ( set -e; $job ) >"$work/${job//[ \/]/-}.log" 2>&1 &
    pids+=("$!")
  done
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then result=ok; else result=FAILED; status=1; fi
    echo "consumers: ${jobs[$i]}: $result ($((SECONDS - started)) s)"
    sed 's/^/  /' "$work/${jobs[$i]//[ \/]/-}.log"
  done
}
wave "consumer nest12-esm" "consumer nest11-cjs"
wave "quickstart quickstart" "quickstart quickstart-esm"
[ "$status" = 0 ] || exit "$status"
wave "run nest12-esm dist/app.js"
wave "run nest11-cjs dist/app.js"
wave "run quickstart dist/main.js"
wave "run quickstart-esm dist/src/main.js"
exit "$status"
