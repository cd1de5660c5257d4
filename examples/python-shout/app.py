"""demo:shout — a Python activity built with componentize-py.

Build: examples/build.sh (needs `pip install componentize-py`).
Run:   corral run examples/dist/python-shout.wasm shout '"hello"' 2
"""
import json

import wit_world
from wit_world.imports import context


class WitWorld(wit_world.WitWorld):
    def shout(self, text: str, times: int) -> str:
        attempt = context.info().attempt
        result = " ".join([text.upper()] * times)
        context.heartbeat(json.dumps({"length": len(result)}))
        context.log(context.Level.INFO, f"shouted {times} times on attempt {attempt}")
        return result
