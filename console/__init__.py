"""The console: a web page for operators, served beside Cyclone.

It is a client of Cyclone's gRPC API and nothing else (no database access), so it works
against any deployment and its rules are the API's: the token a person gives it decides
what they may do, and every action is the RPC the CLI and grpcurl call, with the same
audit. ``app`` builds the web application, ``pages`` holds what every page shares
(templates, the request's session and client), ``views`` holds the pages and actions,
``survey`` gathers what needs a person and who the workers are, ``graph`` lays out the
DAG. Starlette serves it (through uvicorn), Jinja2 renders it, htmx refreshes it; the
static files ship in this package.
"""

from console.app import ListenError, create_app, serve

__all__ = ["ListenError", "create_app", "serve"]
