/**
 * Runs the README's quick start as pasted into an app (a NestJS 11 CommonJS one, and one as NestJS
 * 12's `nest new` makes it: the same file for both; its src/app.module.ts and
 * src/orders.controller.ts are taken from the README by scripts/test-consumers.sh): two payments
 * of one order at once are served one after the other, and `ship` locks through LockService.
 */
import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { AppModule } from './app.module.js';

async function main(): Promise<void> {
  const app = await NestFactory.create(AppModule, { logger: false });
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  // First, so that the app is warm (its Redis connection open, its route compiled) before the
  // payments are timed: on a loaded machine a cold first request takes a while.
  const ship = (await (await fetch(`${url}/orders/1/ship`, { method: 'POST' })).json()) as {
    fence: number;
  };
  if (!(ship.fence > 0)) throw new Error('quick start: ship returned no fence');
  console.log('ok - the quick start locks through LockService.using() with a fence');
  const started = Date.now();
  const pay = async (): Promise<[number, number]> => {
    const response = await fetch(`${url}/orders/1/pay`, { method: 'POST' });
    return [response.status, Date.now() - started];
  };
  const [[first, firstAt], [second, secondAt]] = await Promise.all([pay(), pay()]);
  const last = Math.max(firstAt, secondAt);
  if (first !== 201 || second !== 201 || last < 1_900) {
    throw new Error(
      `quick start: expected two payments one after the other, got ${first} at ${firstAt} ms and ${second} at ${secondAt} ms`,
    );
  }
  console.log(
    `ok - the quick start serves two payments of one order one after the other (${firstAt} / ${secondAt} ms)`,
  );
  await app.close();
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
