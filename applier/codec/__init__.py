"""TiCDC Open Protocol codec: Kafka record bytes -> typed events (see docs/open-protocol.md)."""
