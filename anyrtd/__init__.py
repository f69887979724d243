"""anyrtd: the scheduling daemon of the any agent runtime."""

__version__ = "0.1.0"
