"""demo:shout — a Python activity built with componentize-py.

Build: examples/build.sh (needs `pip install componentize-py`).
Run:   corral run examples/dist/python-shout.wasm shout '"hello"' 2
"""
import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import context, store
from wit_world.imports.types import Failure


# What `remember` keeps: every task must start without it.
_held: list[str] = []
_ballast: list[bytes] = []


class WitWorld(wit_world.WitWorld):
    def greet(self, name: str) -> str:
        try:
            greeting = store.get("greeting") or "Hello"
        except Err as e:
            raise Err(Failure(f"reading greeting: {e.value}", "Config", True, None))
        return f"{greeting}, {name}!"

    def shout(self, text: str, times: int) -> str:
        attempt = context.info().attempt
        result = " ".join([text.upper()] * times)
        context.heartbeat(json.dumps({"length": len(result)}))
        context.log(context.Level.INFO, f"shouted {times} times on attempt {attempt}")
        return result

    def shout_checked(self, text: str) -> str:
        if not text:
            raise Err(Failure("nothing to shout", "Empty", False, None))
        return text.upper()

    def remember(self, text: str, times: int) -> list[str]:
        for _ in range(times):
            _ballast.append((text + " ").encode() * (4 * 1024 * 1024 // (len(text) + 1)))
            _held.append(text)
        return list(_held)

    def count(self, to: int) -> int:
        # A retry resumes from the count the last attempt heartbeated.
        last = context.info().last_heartbeat
        n = json.loads(last)["count"] if last else 0
        while n < to:
            if context.is_cancelled():
                raise Err(Failure(f"cancelled at {n}", "Cancelled", False, None))
            n += 1
            context.heartbeat(json.dumps({"count": n}))
        return n
