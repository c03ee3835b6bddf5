"""Forwarders from the spool to receivers: MQTT, gRPC, in-memory (import the one you need)."""
