"""FastAPI + SQLAlchemy (asyncio, psycopg driver) producing slotd tasks; see README.md here."""
