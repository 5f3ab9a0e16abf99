"""The web console (issue 17): server-rendered pages at /ui over the API's own views."""

from services.command_api.console.routes import console_router

__all__ = ["console_router"]
