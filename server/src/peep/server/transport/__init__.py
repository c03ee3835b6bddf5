"""Transports: how templates and requests reach the server (MQTT consumer, gRPC service)."""
