"""Optional integrations with frameworks; each is imported only by those who use it."""
