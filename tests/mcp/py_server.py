"""An MCP server written with the Python SDK (mcp 2.x `MCPServer`), served
over streamable HTTP, for Switchyard's MCP client tests: a slow tool that
reports progress and records its cancellation, a tool that fails, and a
tool that adds a tool and announces `notifications/tools/list_changed`. It
speaks both eras: the stateless 2026-07-28 (what Switchyard's client picks)
and the session revisions.

    python py_server.py LOG_FILE

It listens on 127.0.0.1 at a port the kernel picks, printed on stderr as
`LISTENING <port>`; what happened to calls is appended to LOG_FILE.
"""

import socket
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

LOG = sys.argv[1]
server = MCPServer("switchyard-test-py")


def note(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(line + "\n")


@server.tool()
async def wait(seconds: float, ctx: Context) -> str:
    """Waits `seconds`, reporting progress every 0.1 s."""
    steps = max(1, int(seconds * 10))
    try:
        for i in range(steps):
            await ctx.report_progress(i + 1, steps, f"step {i + 1}")
            await anyio.sleep(0.1)
    except anyio.get_cancelled_exc_class():
        note(f"cancelled wait {seconds}")
        raise
    note(f"finished wait {seconds}")
    return f"waited {seconds} s"


@server.tool()
def fail(why: str) -> str:
    """Always fails, saying `why` (an anticipated error: the model reads it)."""
    raise ToolError(why)


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Adds a tool called `name` and tells the client its tool list changed."""

    def shout(text: str) -> str:
        return text.upper()

    server.add_tool(shout, name=name, description=f"{name}: upper-cases text")
    # Told in both eras: on a session (2025-11-25 and before) as a
    # notification on it; at 2026-07-28 to `subscriptions/listen` streams.
    await ctx.session.send_tool_list_changed()
    await ctx.notify_tools_changed()
    return f"added {name}"


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    print(f"LISTENING {sock.getsockname()[1]}", file=sys.stderr, flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
