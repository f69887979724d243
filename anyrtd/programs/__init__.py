"""Programs shipped with anyrtd: the built-ins a trigger can name."""
