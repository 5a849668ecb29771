"""Drives Switchyard's A2A door with the reference a2a-sdk client.

usage: door_client.py BASE_URL TOKEN STEPS_JSON [BINDING]

BASE_URL is the gateway (its card at /.well-known/agent-card.json); TOKEN
the bearer credential; STEPS_JSON a list of steps, each one of
  {"send": "text", "task": "JOB_ID"}          SendMessage, a text part
  {"send_data": {...}, "task": "JOB_ID"}      SendMessage, a data part
  {"get": "JOB_ID"}                           GetTask
  {"cancel": "JOB_ID"}                        CancelTask
BINDING is the protocol binding the client is to use from the card:
JSONRPC (the default) or HTTP+JSON. Prints one JSON line per step: the task's id, context id, state and the
text of its status message, or the error the SDK raised.
"""

import asyncio
import json
import sys

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_data_message, new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Role,
    SendMessageRequest,
    TaskState,
)


def task_line(task):
    text = "\n".join(p.text for p in task.status.message.parts if p.text)
    return {
        "id": task.id,
        "context_id": task.context_id,
        "state": TaskState.Name(task.status.state),
        "text": text,
    }


async def main(base, token, steps, binding):
    http = httpx.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=60.0
    )
    config = ClientConfig(streaming=False, httpx_client=http, supported_protocol_bindings=[binding])
    client = await ClientFactory(config).create_from_url(base)
    for step in steps:
        try:
            if "send" in step or "send_data" in step:
                if "send" in step:
                    m = new_text_message(
                        step["send"], task_id=step["task"], context_id=step["task"],
                        role=Role.ROLE_USER,
                    )
                else:
                    m = new_data_message(
                        step["send_data"], task_id=step["task"], context_id=step["task"],
                        role=Role.ROLE_USER,
                    )
                line = {"error": "no answer"}
                async for r in client.send_message(SendMessageRequest(message=m)):
                    task = r[0] if isinstance(r, tuple) else r
                    if hasattr(task, "task") and task.HasField("task"):
                        task = task.task
                    line = task_line(task)
            elif "get" in step:
                line = task_line(await client.get_task(GetTaskRequest(id=step["get"])))
            else:
                line = task_line(
                    await client.cancel_task(CancelTaskRequest(id=step["cancel"]))
                )
        except Exception as e:  # the SDK's error, as the test reads it
            line = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(line), flush=True)
    await http.aclose()


if __name__ == "__main__":
    binding = sys.argv[4] if len(sys.argv) > 4 else "JSONRPC"
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), binding))
