"""The sink-state view in the Airflow UI: sinks, their epochs, and the actions on them (docs/ui.md).

Airflow imports plugins in every process that loads them (scheduler, DAG processor, each task's
process), but only the API server ever serves the view. So the plugin declares a small ASGI app
that imports FastAPI, Jinja2 and the view's routes on its first request, not at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, MutableMapping

    Scope = MutableMapping[str, Any]
    Message = MutableMapping[str, Any]
    Receive = Callable[[], Awaitable[Message]]
    Send = Callable[[Message], Awaitable[None]]


class SinkStateApp:
    """The view's ASGI app as Airflow mounts it: ``create_app()`` built on the first request."""

    def __init__(self) -> None:
        self._app: Any = None

    @property
    def app(self) -> Any:
        if self._app is None:
            from airflow_provider_exactly_once.plugins.ui.app import create_app

            self._app = create_app()
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


__all__ = ["SinkStateApp"]
