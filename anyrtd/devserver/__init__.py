"""`anyrtd devserver`: the local edition of the any server (see docs/server-api.md)."""
