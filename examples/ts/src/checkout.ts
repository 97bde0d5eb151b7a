// The checkout workflow: one node per language.
//
//   price  (checkout.price, a Python worker)  totals the order's items
//   charge (checkout.charge, a Go or TypeScript worker)  books the total in the
//                                             ledger, in the same transaction as its
//                                             completion

import { seconds, type WorkflowInit } from "@cyclone-workflows/sdk";

export type Item = {
  sku: string;
  qty: number;
  /** Price of one, in cents. */
  unit_price: number;
};

/** The run input: who pays, for what. */
export type Order = {
  customer: string;
  items: Item[];
};

export const checkoutWorkflow: WorkflowInit = {
  name: "checkout",
  nodes: [
    { name: "price", action: "checkout.price", timeout: seconds(30) },
    {
      name: "charge",
      action: "checkout.charge",
      dependsOn: ["price"],
      // A declined card is not retried (the worker says so); a crash is, twice.
      retry: { maxAttempts: 3 },
      timeout: seconds(60),
    },
  ],
};

/** "tea:2:450" -> { sku: "tea", qty: 2, unit_price: 450 }. */
export function parseItem(text: string): Item {
  const [sku, qty, unitPrice] = text.split(":");
  const item = { sku, qty: Number(qty), unit_price: Number(unitPrice) };
  if (!sku || !Number.isInteger(item.qty) || item.qty < 1 || !Number.isInteger(item.unit_price)) {
    throw new Error(`bad item ${JSON.stringify(text)}: expected SKU:QTY:UNIT_PRICE_CENTS, e.g. tea:2:450`);
  }
  return item;
}
