import { Module } from '@nestjs/common';
import { InventoryController } from './inventory.controller.js';
import { InventoryMessages } from './inventory.messages.js';
import { InventoryService } from './inventory.service.js';
import { StockReportJob } from './stock-report.job.js';

@Module({
  controllers: [InventoryController, InventoryMessages],
  providers: [InventoryService, StockReportJob],
})
export class InventoryModule {}
