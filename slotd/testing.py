"""slotd's pytest plugin: test modes for application handlers (see issue 6)."""
