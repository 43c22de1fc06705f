"""Runnable example applications (not part of the installed package)."""
