"""The operational side: logs, secret masking, metrics, health, the HTTP endpoints and systemd."""
