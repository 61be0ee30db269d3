"""What may be applied now: per-partition listeners, the shared barrier, windows, and the progress
restored from the checkpoint (docs/open-protocol.md §5 for the orders they rely on)."""
