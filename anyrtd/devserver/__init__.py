"""`anyrtd devserver`: the local edition of the any server (see docs/server-api.md)."""

from anyrtd.devserver.server import DevServer, DevServerError, start_devserver

__all__ = ["DevServer", "DevServerError", "start_devserver"]
