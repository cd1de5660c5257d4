"""A Temporal workflow, written with the Python SDK, that calls one corral
activity continuously (four at a time) while a fleet of hosts rolls out a
new version. Used by the fleet test:

    python3 rollout.py --address 127.0.0.1:7233 --activity-queue fleet

Prints `started` once the workflow has completed its first activities.
Reads lines on stdin: `mark` records how many activities were scheduled so
far (the test says it at each point of the roll-out it checks) and prints
`marked` once eight more have completed; `stop` ends the loop. Prints
the workflow's result as JSON: every activity's result in scheduling
order, the marks, and the failures (none are expected).
"""

import argparse
import asyncio
import json
import sys
import uuid
from datetime import timedelta

import sdk_exit

from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.worker import Worker


@workflow.defn
class Rollout:
    def __init__(self) -> None:
        self.stopping = False
        self.marks = []
        self.scheduled = 0
        self.results = []

    @workflow.query
    def completed(self) -> int:
        return len(self.results)

    @workflow.signal
    def stop(self) -> None:
        self.stopping = True

    @workflow.signal
    def record_mark(self) -> None:
        self.marks.append(self.scheduled)

    @workflow.run
    async def run(self, queue: str) -> dict:
        options = dict(
            task_queue=queue,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200)),
        )
        results, failures = self.results, []
        while not self.stopping:
            batch = []
            for _ in range(4):
                self.scheduled += 1
                batch.append(workflow.execute_activity("demo:versioned/api.hold", args=[0], **options))
            for outcome in await asyncio.gather(*batch, return_exceptions=True):
                if isinstance(outcome, ActivityError):
                    failures.append(str(outcome.cause or outcome))
                    results.append(None)
                else:
                    results.append(outcome)
        return {"results": results, "marks": self.marks, "failures": failures}


async def completed_at_least(handle, count: int) -> None:
    while await handle.query(Rollout.completed) < count:
        await asyncio.sleep(0.2)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--activity-queue", required=True)
    args = parser.parse_args()
    client = await Client.connect(args.address)
    workflow_queue = f"workflows-{uuid.uuid4()}"
    async with Worker(client, task_queue=workflow_queue, workflows=[Rollout]):
        handle = await client.start_workflow(
            Rollout.run,
            args=[args.activity_queue],
            id=f"rollout-{uuid.uuid4()}",
            task_queue=workflow_queue,
            execution_timeout=timedelta(minutes=5),
        )
        await completed_at_least(handle, 4)
        print("started", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            command = line.strip()
            if command == "mark":
                await handle.signal(Rollout.record_mark)
                done = await handle.query(Rollout.completed)
                await completed_at_least(handle, done + 8)
                print("marked", flush=True)
            elif command == "stop" or not line:
                await handle.signal(Rollout.stop)
                break
        result = await handle.result()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sdk_exit.run(main)
