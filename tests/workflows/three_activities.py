"""A Temporal workflow, written with the Python SDK, that calls three corral
activities by name with ordinary JSON values. Used by the end-to-end tests:

    python3 three_activities.py --address 127.0.0.1:7233 --activity-queue acme

Prints the workflow's result as JSON on stdout.
"""

import argparse
import json
import uuid
from datetime import timedelta

import sdk_exit

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import Worker


@workflow.defn
class ThreeActivities:
    @workflow.run
    async def run(self, queue: str, name: str) -> dict:
        options = dict(task_queue=queue, start_to_close_timeout=timedelta(seconds=30))
        greeting = await workflow.execute_activity(
            "Greet", args=[{"name": name, "language": "english"}, "formal"], **options
        )
        everyone = await workflow.execute_activity(
            "demo:greeter/api.greet-all",
            args=[[{"name": name, "language": "french"}, {"name": "Bo", "language": "german"}]],
            **options,
        )
        counted = await workflow.execute_activity(
            "demo:progress/api.count-to", args=[3, 10], **options
        )
        return {"greeting": greeting["message"], "everyone": everyone, "counted": counted}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--activity-queue", required=True)
    args = parser.parse_args()
    client = await Client.connect(args.address)
    workflow_queue = f"workflows-{uuid.uuid4()}"
    async with Worker(client, task_queue=workflow_queue, workflows=[ThreeActivities]):
        result = await client.execute_workflow(
            ThreeActivities.run,
            args=[args.activity_queue, "Ada"],
            id=f"three-activities-{uuid.uuid4()}",
            task_queue=workflow_queue,
            execution_timeout=timedelta(seconds=60),
        )
    print(json.dumps(result))


if __name__ == "__main__":
    sdk_exit.run(main)
