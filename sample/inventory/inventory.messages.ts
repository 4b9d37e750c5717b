import { Controller, Inject } from '@nestjs/common';
import { MessagePattern, Payload } from '@nestjs/microservices';
import { WithLock } from '../../lib/index.js';
import { InventoryService, type PurchaseResult } from './inventory.service.js';

/** The same purchase over the TCP microservice transport, for other services. */
@Controller()
export class InventoryMessages {
  constructor(@Inject(InventoryService) private readonly inventory: InventoryService) {}

  @MessagePattern('inventory.purchase')
  @WithLock({ key: 'sku:{0.sku}', ttl: 5_000, acquireTimeout: 1_000 })
  async purchase(@Payload() message: { sku: string; quantity: number }): Promise<PurchaseResult> {
    return this.inventory.purchase(message.sku, message.quantity);
  }
}
