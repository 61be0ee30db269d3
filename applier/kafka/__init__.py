"""Kafka access: the embedded broker for demos and tests, and the partition reader."""
