"""muster: supervised training runs that never report a false success."""

__version__ = "0.1.0"
