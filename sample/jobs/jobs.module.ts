import { Module } from '@nestjs/common';
import { ScheduleModule } from '@nestjs/schedule';
import { InventoryModule } from '../inventory/inventory.module.js';
import { LowStockMonitor } from './low-stock.monitor.js';
import { StockReportJob } from './stock-report.job.js';

/** Work that runs once across the fleet: a scheduled report and a leader-only worker. */
@Module({
  imports: [ScheduleModule.forRoot(), InventoryModule],
  providers: [StockReportJob, LowStockMonitor],
})
export class JobsModule {}
