"""A request's first pool slot, lent to the reader of its body (:class:`LentSlot`,
from :meth:`FrontEnd.lend_first_slot <infscaler.runtime.serving.frontend.FrontEnd.lend_first_slot>`)."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["LentSlot"]


class LentSlot:
    """A request's first slot lent before its body is read (:meth:`FrontEnd.lend_first_slot`):
    one of the front end's idle out-tokens, laid out for the pipeline's first slot (its
    front inputs, then the empty trace), so the reader writes each input's bytes straight
    into :attr:`views` and the front end hands the slot over without a copy.

    Attributes:
        token: the out-token (the front end's, as a kept slot is: nothing was sent).
        used: the bytes the layout takes (the DATA token's ``length``).
        views: input name -> writable ``uint8`` view of its data in the slot.
    """

    __slots__ = ("_client", "_lock", "_state", "token", "used", "views")

    def __init__(self, client: Any, token: Any, used: int, views: dict[str, memoryview]) -> None:
        self._client, self.token, self.used, self.views = client, token, used, views
        self._lock = threading.Lock()
        self._state = "lent"  # -> "taken" (handed over) or "returned"

    def take(self) -> bool:
        """For the hand-over (the front end's thread): True once, unless released first."""
        with self._lock:
            if self._state != "lent":
                return False
            self._state = "taken"
            return True

    def release(self) -> None:
        """Any thread, any number of times: the slot goes back to the front end's
        out-tokens unless it was taken (handed over) or released already."""
        with self._lock:
            if self._state != "lent":
                return
            self._state = "returned"
        self.views = {}
        self._client.give_back(self.token)
