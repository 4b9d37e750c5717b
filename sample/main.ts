import 'reflect-metadata';
import { Logger } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Transport, type MicroserviceOptions } from '@nestjs/microservices';
import { AppModule } from './app.module.js';
import { InventoryService } from './inventory/inventory.service.js';
import { SampleConfig } from './sample.config.js';

async function bootstrap(): Promise<void> {
  const app = await NestFactory.create(AppModule);
  const config = app.get(SampleConfig);
  app.connectMicroservice<MicroserviceOptions>({
    transport: Transport.TCP,
    options: { host: '127.0.0.1', port: config.microservicePort },
  });
  app.enableShutdownHooks();
  await app.startAllMicroservices();
  await app.listen(config.httpPort, '127.0.0.1');

  const inventory = app.get(InventoryService);
  if ((await inventory.skus()).length === 0) {
    await inventory.setStock('widget', 10);
    await inventory.setStock('gadget', 10);
  }
  const url = await app.getUrl();
  const logger = new Logger('Sample');
  logger.log(
    `Inventory on ${url}/products (Redis ${config.redisUrl}, TCP microservice on ${config.microservicePort})`,
  );
  logger.log(
    `Try: for i in $(seq 20); do curl -s -X POST ${url}/products/widget/purchase & done; wait`,
  );
}

void bootstrap();
