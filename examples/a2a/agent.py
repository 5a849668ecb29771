"""An A2A agent built with the Python `a2a-sdk` (1.x) and served by that SDK's
own server (Starlette routes for the agent card and JSON-RPC): Switchyard's
A2A example, and the agent its A2A tests run against. Its skills:

- `text.shout`: streams two working updates and an artifact, then completes
  with the text upper-cased;
- `text.fail`: fails with a message;
- `text.refuse`: rejects the task;
- `text.ask`: asks for more input (input-required);
- `text.wait`: works for a long time in small steps, recording on
  cancellation.

    python agent.py LOG_FILE [PORT [TENANT [VERSION]]]

It listens on 127.0.0.1 at PORT (default 0: one the kernel picks), printed
on stderr as `LISTENING <port>`; requests and cancellations are appended to
LOG_FILE. TENANT (default none) is named by the card's interface; VERSION
`0.3` serves an A2A 0.3 card (one `url`) and takes 0.3 requests, logging
each JSON-RPC method called.
"""

import asyncio
import json
import socket
import sys

import uvicorn
from a2a.helpers.proto_helpers import new_text_artifact, new_text_message
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.request_handlers.default_request_handler_v2 import DefaultRequestHandlerV2
from a2a.server.routes.agent_card_routes import create_agent_card_routes
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse
from starlette.routing import Route

LOG = sys.argv[1]


def note(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def skill(skill_id: str, description: str) -> AgentSkill:
    return AgentSkill(
        id=skill_id,
        name=skill_id,
        description=description,
        tags=["text"],
        input_modes=["text/plain"],
        output_modes=["text/plain"],
    )


class TextAgent(AgentExecutor):
    """Picks the skill from the first word of the request ("shout: ...")."""

    async def execute(self, context, event_queue) -> None:
        text = context.get_user_input()
        what, _, rest = text.partition(":")
        rest = rest.strip()
        note(f"request {what.strip()}: {rest}")
        if context.tenant:
            note(f"tenant {context.tenant}")
        task = context.current_task or Task(
            id=context.task_id,
            context_id=context.context_id,
            status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
        )
        if context.current_task is None:
            await event_queue.enqueue_event(task)
        up = TaskUpdater(event_queue, task.id, task.context_id)
        say = lambda s: new_text_message(s, role=Role.ROLE_AGENT, context_id=task.context_id, task_id=task.id)
        match what.strip():
            case "shout":
                await up.start_work(say("reading the text"))
                await asyncio.sleep(0.05)
                await up.update_status(TaskState.TASK_STATE_WORKING, say("raising its voice"))
                await up.add_artifact(new_text_artifact("shouted", rest.upper()).parts, name="shouted")
                await up.complete(say(rest.upper()))
            case "fail":
                await up.start_work(say("trying"))
                await up.failed(say(f"cannot do it: {rest}"))
            case "refuse":
                await up.reject(say(f"not my kind of work: {rest}"))
            case "ask":
                await up.requires_input(say("which language should I answer in?"))
            case "wait":
                await up.start_work(say("waiting"))
                try:
                    for i in range(600):
                        await asyncio.sleep(0.1)
                        if i % 5 == 0:
                            await up.update_status(TaskState.TASK_STATE_WORKING, say(f"step {i}"))
                except asyncio.CancelledError:
                    note(f"cancelled {task.id}")
                    raise
                await up.complete(say("waited"))
            case _:
                await up.reject(say(f"unknown request {what!r}"))

    async def cancel(self, context, event_queue) -> None:
        note(f"cancel requested {context.task_id}")
        up = TaskUpdater(event_queue, context.task_id, context.context_id)
        await up.cancel()


def listen(port: int = 0) -> tuple[socket.socket, int]:
    """A listening socket on 127.0.0.1 (`port` 0: one the kernel picks)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock, sock.getsockname()[1]


def agent_card(url: str, tenant: str = "") -> AgentCard:
    """The agent's card, its JSON-RPC interface at `url` (for `tenant`, when
    one is named: A2A 1.0 multi-tenancy)."""
    return AgentCard(
        name="Text tricks",
        description="Shouts, fails, refuses, asks and waits: an A2A agent for tests.",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0",
                                             tenant=tenant)],
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            skill("text.shout", "Upper-cases a text. Ask: 'shout: <text>'."),
            skill("text.fail", "Always fails. Ask: 'fail: <why>'."),
            skill("text.refuse", "Always rejects the task."),
            skill("text.ask", "Asks a question back (input-required)."),
            skill("text.wait", "Works for a minute; cancel it."),
        ],
    )


def card_v03(card: AgentCard, url: str) -> dict:
    """`card` as an A2A 0.3 card: one JSON-RPC `url`, that version's names."""
    return {
        "protocolVersion": "0.3.0", "name": card.name, "description": card.description,
        "url": url, "preferredTransport": "JSONRPC", "version": card.version,
        "capabilities": {"streaming": card.capabilities.streaming},
        "defaultInputModes": list(card.default_input_modes),
        "defaultOutputModes": list(card.default_output_modes),
        "skills": [{"id": k.id, "name": k.name, "description": k.description, "tags": list(k.tags)}
                   for k in card.skills],
    }


class LogMethods(BaseHTTPMiddleware):
    """Notes the JSON-RPC method of each POST (`method message/send`)."""

    async def dispatch(self, request, call_next):
        if request.method == "POST":
            try:
                note(f"method {json.loads(await request.body()).get('method')}")
            except ValueError:
                pass
        return await call_next(request)


def serve(sock: socket.socket, card: AgentCard, extra_routes=(), v03: bool = False) -> None:
    """Serves `card` and the agent's JSON-RPC endpoint on `sock` (the SDK's
    own routes) until interrupted; `extra_routes` come first (and so may
    take a path over). With `v03`, the card is served as A2A 0.3 and the
    endpoint takes 0.3 requests too."""
    handler = DefaultRequestHandlerV2(agent_executor=TextAgent(), task_store=InMemoryTaskStore(), agent_card=card)
    if v03:
        url = card.supported_interfaces[0].url
        legacy = JSONResponse(card_v03(card, url))
        cards = [Route("/.well-known/agent-card.json", lambda _request: legacy)]
    else:
        cards = create_agent_card_routes(card)
    rpc = create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=v03)
    routes = list(extra_routes) + cards + rpc
    print(f"LISTENING {sock.getsockname()[1]}", file=sys.stderr, flush=True)
    app = Starlette(routes=routes)
    if v03:
        app.add_middleware(LogMethods)
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


def main() -> None:
    sock, port = listen(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    tenant = sys.argv[3] if len(sys.argv) > 3 else ""
    v03 = len(sys.argv) > 4 and sys.argv[4] == "0.3"
    serve(sock, agent_card(f"http://127.0.0.1:{port}/", tenant), v03=v03)


if __name__ == "__main__":
    main()
