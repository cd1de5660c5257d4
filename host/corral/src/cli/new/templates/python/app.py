"""local:{{name}}: activities in Python. Build: ./build.sh; test: corral test."""
import json

import wit_world
from componentize_py_types import Err
from wit_world.exports import api
from wit_world.imports import context
from wit_world.imports.types import Failure


class Api(wit_world.exports.Api):
    def greet(self, who: api.Person) -> str:
        if not who.name:
            raise Err(Failure("a greeting needs a name", "EmptyName", False, None))
        context.log(context.Level.INFO, f"greeting {who.name}")
        if who.title:
            return f"Hello, {who.title} {who.name}!"
        return f"Hello, {who.name}!"

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
