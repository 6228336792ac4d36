"""Streaming sessions: objects fed a growing input (``update``) and closed with ``finish``."""
