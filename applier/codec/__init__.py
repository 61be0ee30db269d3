"""TiCDC Open Protocol codec: Kafka record bytes -> typed events (see ../shared/docs/open-protocol.md)."""
