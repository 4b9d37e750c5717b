#!/usr/bin/env bash
# Runs the suites whose behaviour depends on the NestJS or ioredis major again, against the oldest
# majors in the peer ranges: NestJS 11 (CommonJS) and ioredis 5, in a scratch copy of the project
# so the working tree's node_modules stay untouched. Which suites: COMPAT in scripts/test-run.mjs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cd "$root"
git ls-files --cached --others --exclude-standard -z | tar --null -cf - -T - | tar -xf - -C "$work"
cp -a node_modules "$work/"
# With COMPAT_REUSE_BUILD=1 (CI, right after npm test built them), the tests as npm test built
# them: the JavaScript does not depend on which majors are installed (what their types accept is
# checked where users compile: the NestJS 11 consumer app of test:consumers). Built here otherwise.
if [ "${COMPAT_REUSE_BUILD:-}" = 1 ]; then cp -a build "$work/"; fi
cd "$work"
npm install --prefer-offline --no-save --no-audit --no-fund --loglevel=error \
  @nestjs/common@^11 @nestjs/core@^11 @nestjs/testing@^11 @nestjs/platform-express@^11 \
  @nestjs/platform-fastify@^11 @nestjs/microservices@^11 @nestjs/websockets@^11 @nestjs/platform-ws@^11 \
  ioredis@^5
node -e "console.log('compat: @nestjs/core', require('@nestjs/core/package.json').version, '/ ioredis', require('ioredis/package.json').version)"
[ "${COMPAT_REUSE_BUILD:-}" = 1 ] || npm run build:test --silent
npm run test:run --silent -- --compat
