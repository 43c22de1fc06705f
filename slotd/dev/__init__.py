"""Development: the embedded PostgreSQL used when no database URL is set, and the fault
injection used by the chaos tests."""
