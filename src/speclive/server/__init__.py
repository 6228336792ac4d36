"""``speclive serve``: an OpenAI-compatible HTTP server over the speculative engine.

``create_app(ServerConfig(...))`` builds the FastAPI app; ``speclive serve`` runs it with
uvicorn. See ``docs/server.md`` for the endpoints, the error shapes and the worker design.
Importing this package needs the ``serve`` extra (fastapi, uvicorn, python-multipart,
prometheus-client).
"""
