"""The api wing: the gRPC services, request validation, protobuf building and the
Work stream's protocol. The only part of service/ that imports the generated protos
(cyclone.v1) besides the wiring (service/server.py). May import service.engine and
service.db."""
