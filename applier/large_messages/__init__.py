"""Large messages: claim-check objects and handle-key-only rows."""
