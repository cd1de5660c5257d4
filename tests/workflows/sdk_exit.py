"""Runs a client script's `main` and exits without CPython's teardown.

The Temporal SDK's Rust bridge keeps runtime threads that can abort
CPython's finalization ("PyGILState_Release: thread state ... must be
current", temporalio/sdk-python#300) after the result is already printed:
the test then sees a crash instead of the result. Nothing is left to clean
up, so the scripts skip the teardown.
"""

import asyncio
import os
import sys


def run(main):
    asyncio.run(main())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
