// Connections to a Cyclone server: gRPC over HTTP/2 with Connect for Node.

import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

export const DEFAULT_ADDRESS = "127.0.0.1:50051";

/** `$CYCLONE_ADDRESS`, else 127.0.0.1:50051. */
export function defaultAddress(): string {
  return process.env.CYCLONE_ADDRESS || DEFAULT_ADDRESS;
}

export interface ConnectOptions {
  /** host:port (default $CYCLONE_ADDRESS, else 127.0.0.1:50051), or a URL with http(s)://. */
  address?: string;
  /** Sent as `authorization: Bearer TOKEN`. */
  token?: string;
  /** Sent as `cyclone-actor`: who the audit trail names for operator actions. */
  actor?: string;
  /** A transport of your own (TLS options, interceptors); address, token and actor are then ignored. */
  transport?: Transport;
}

export function makeTransport(options: ConnectOptions = {}): Transport {
  if (options.transport) return options.transport;
  const address = options.address ?? defaultAddress();
  const baseUrl = /^https?:\/\//.test(address) ? address : `http://${address}`;
  const interceptors: Interceptor[] = [];
  if (options.token || options.actor) {
    const { token, actor } = options;
    interceptors.push((next) => (request) => {
      if (token) request.header.set("authorization", `Bearer ${token}`);
      if (actor) request.header.set("cyclone-actor", actor);
      return next(request);
    });
  }
  return createGrpcTransport({ baseUrl, interceptors });
}
