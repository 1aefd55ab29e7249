"""Middleware for the ``--middleware`` tests: an ASGI class and an http function, each
adding a response header, and an object that is neither."""


class StampHeader:
    """ASGI middleware: every HTTP response carries ``x-stamp: class``."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def stamped(msg):
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), (b"x-stamp", b"class")]}
            await send(msg)

        await self.app(scope, receive, stamped)


async def stamp_function(request, call_next):
    """http middleware: every response carries ``x-stamp-fn: function``."""
    response = await call_next(request)
    response.headers["x-stamp-fn"] = "function"
    return response


NOT_MIDDLEWARE = 42
