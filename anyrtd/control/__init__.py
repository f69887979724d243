"""The control API: the daemon's local HTTP surface over the registry and the mirror."""
