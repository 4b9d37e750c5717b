import { Controller, Inject } from '@nestjs/common';
import { MessagePattern, Payload } from '@nestjs/microservices';
import { WithLock } from '../../lib/index.js';
import { InventoryService, type PurchaseResult } from './inventory.service.js';
import { PurchaseMessagePipe, type PurchaseMessage } from './purchase.dto.js';

/** The same purchase over the TCP microservice transport, for other services. */
@Controller()
export class InventoryMessages {
  constructor(@Inject(InventoryService) private readonly inventory: InventoryService) {}

  /** The message is checked and its SKU canonicalised (as the routes' `SkuPipe`) before the lock. */
  @MessagePattern('inventory.purchase')
  @WithLock({ key: 'sku:{0.sku}', ttl: 5_000, acquireTimeout: 1_000 })
  async purchase(@Payload(PurchaseMessagePipe) message: PurchaseMessage): Promise<PurchaseResult> {
    return this.inventory.purchase(message.sku, message.quantity);
  }
}
