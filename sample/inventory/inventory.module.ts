import { Module } from '@nestjs/common';
import { InventoryController } from './inventory.controller.js';
import { InventoryMessages } from './inventory.messages.js';
import { InventoryService } from './inventory.service.js';

@Module({
  controllers: [InventoryController, InventoryMessages],
  providers: [InventoryService],
  exports: [InventoryService],
})
export class InventoryModule {}
