"""A workflow run by the Python SDK with its OpenTelemetry TracingInterceptor,
calling one corral activity by name. Used by the tracing test:

    python3 traced.py --address 127.0.0.1:7233 --activity-queue acme \
        --activity demo:fetch/payments.charge --arg 1250

Prints {"result": ..., "spans": [...]} on stdout: the activity's result and
the SDK's own spans (kept in memory), each with its name, trace id, span id
and parent span id in hex, to compare with the spans corral exported.
"""

import argparse
import json
import uuid
from datetime import timedelta

import sdk_exit

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio import workflow
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import Worker


@workflow.defn
class Traced:
    @workflow.run
    async def run(self, queue: str, activity: str, arg) -> dict:
        return await workflow.execute_activity(
            activity, arg, task_queue=queue, start_to_close_timeout=timedelta(seconds=30)
        )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--activity-queue", required=True)
    parser.add_argument("--activity", required=True)
    parser.add_argument("--arg", required=True, help="the activity's one argument, as JSON")
    args = parser.parse_args()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    client = await Client.connect(args.address, interceptors=[TracingInterceptor()])
    workflow_queue = f"workflows-{uuid.uuid4()}"
    async with Worker(client, task_queue=workflow_queue, workflows=[Traced]):
        result = await client.execute_workflow(
            Traced.run,
            args=[args.activity_queue, args.activity, json.loads(args.arg)],
            id=f"traced-{uuid.uuid4()}",
            task_queue=workflow_queue,
            execution_timeout=timedelta(seconds=60),
        )
    provider.force_flush()
    print(json.dumps({
        "result": result,
        "spans": [
            {
                "name": s.name,
                "trace_id": format(s.context.trace_id, "032x"),
                "span_id": format(s.context.span_id, "016x"),
                "parent_id": format(s.parent.span_id, "016x") if s.parent else None,
            }
            for s in spans.get_finished_spans()
        ],
    }))


if __name__ == "__main__":
    sdk_exit.run(main)
