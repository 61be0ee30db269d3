"""The downstream MySQL/MariaDB/TiDB side: URL and secrets, sessions, error classes, retry, and the
single-active lock. Each concern has its own module; import from them directly.
"""
