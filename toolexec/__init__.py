"""toolexec: the composition root (settings, CLI, gateways, embedded infrastructure)."""
