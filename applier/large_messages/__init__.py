"""Large messages: claim-check objects and handle-key-only rows (docs/open-protocol.md §9).

``storage`` reads claim-check objects under the configured root; ``claim_check`` turns one into
its row event; ``upstream`` reads handle-key-only rows as of their commit ts; ``resolver`` is the
stage between the decoder and the listeners; ``settings`` builds it from the configuration.
"""
