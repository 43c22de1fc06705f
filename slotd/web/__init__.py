"""slotd's web dashboard (the optional extra `slotd[web]`): `create_app()` is an ASGI app
to mount in a FastAPI or Starlette application, `slotd dashboard` serves it alone.
Nothing here is imported unless the dashboard is used."""

from slotd.web.app import create_app

__all__ = ["create_app"]
