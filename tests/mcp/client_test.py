"""Switchyard as an MCP server, driven by the Python `mcp` SDK's client over
both transports: `switchyard mcp` on stdio and the gateway's `/mcp` over
streamable HTTP, against a running `switchyard dev` — and over HTTP in both
revisions: 2025-11-25 (initialize, a session) and 2026-07-28 (stateless,
negotiated by the SDK's `server/discover` probe), where a gated submit_job
asks a client that takes elicitation to come back once a person decided
(`input_required`), and nothing the client answers approves.

    python client_test.py SWITCHYARD_BIN GRPC_URL HTTP_URL CREDENTIALS_FILE

Prints one line per check and `N passed, M failed`; exits 1 on a failure.
"""

import json
import re
import subprocess
import sys

import anyio
import httpx
import mcp_types
from mcp import Client
from mcp.client._input_required import InputRequiredRoundsExceededError
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

BIN, GRPC, HTTP, CREDS = sys.argv[1:5]
TOKENS = {n: p["token"] for n, p in json.load(open(CREDS))["principals"].items()}
RESULTS = {"passed": 0, "failed": 0}

NEEDS_APPROVAL = """plan_id: reviewed-echo
approval:
  intent: echo a message after review
  requires_approval: true
tasks:
  - id: say
    agent: {capability: builtin.echo, input: {text: "approved and done"}}
"""
BAD_NUMBERING = json.dumps(
    {"job_id": "j-gap", "plan_id": "p", "tasks": [
        {"task_number": 1, "command": "sort"},
        {"task_number": 2, "command": "uniq"},
        {"task_number": 4, "command": "wc"}]}
)
TOOLS = ["validate_job", "submit_job", "get_job", "watch_job", "get_result", "cancel_job",
         "list_agents", "list_capabilities", "list_pending_approvals"]


def check(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + str(detail)[:400]}", flush=True)


def text(r):
    return r.content[0].text if r.content else ""


def cli(*args, token):
    out = subprocess.run([BIN, *args, "--url", GRPC, "--token", token],
                         capture_output=True, text=True, timeout=60)
    return out.returncode, out.stdout + out.stderr


def stdio(name):
    return stdio_client(StdioServerParameters(
        command=BIN, args=["mcp", "--url", GRPC], env={"SWITCHYARD_TOKEN": TOKENS[name]}))


async def over_stdio():
    async with stdio("alice") as streams, ClientSession(*streams[:2]) as s:
        init = await s.initialize()
        check("stdio: the server says it is switchyard", init.server_info.name == "switchyard", init)
        names = [t.name for t in (await s.list_tools()).tools]
        check("stdio: the nine tools, none of them approves", names == TOOLS, names)
        r = await s.call_tool("validate_job", {"document": BAD_NUMBERING})
        check("stdio: validate_job refuses bad numbering with the seed's text",
              r.is_error and "gap between task 2 and 4" in text(r), text(r))
        r = await s.call_tool("submit_job", {"document": NEEDS_APPROVAL})
        job = r.structured_content or {}
        check("stdio: submit_job leaves a job pending approval",
              not r.is_error and job.get("state") == "pending" and job.get("submitted_by") == "alice", text(r))
        r = await s.call_tool("list_pending_approvals", {})
        runs = (r.structured_content or {}).get("runs", [])
        check("stdio: the run waits, proposed by alice",
              any(x["run_id"] == job.get("run_id") and x["created_by"] == "alice" for x in runs), runs)
        try:
            r = await s.call_tool("approve", {"run_id": job.get("run_id")})
            refused = r.is_error
        except Exception as e:  # the SDK raises the server's JSON-RPC error
            refused, r = "no tool" in str(e), e
        check("stdio: there is no approve tool", refused, r)
    return job


async def as_bob_over_stdio(job):
    # An approver's MCP host cannot approve either: approving is a person's act.
    async with stdio("bob") as streams, ClientSession(*streams[:2]) as s:
        await s.initialize()
        names = [t.name for t in (await s.list_tools()).tools]
        check("stdio as an approver: still no approve tool", not any("approve" in n for n in names), names)
        r = await s.call_tool("get_job", {"job_id": job["job_id"]})
        check("stdio as bob: the job is still pending", (r.structured_content or {}).get("state") == "pending", text(r))


async def over_http(job):
    plain = httpx.post(HTTP, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    check("http: no token is 401 with WWW-Authenticate: Bearer",
          plain.status_code == 401 and plain.headers.get("www-authenticate") == "Bearer", plain.status_code)
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKENS['alice']}"})
    async with client, streamable_http_client(HTTP, http_client=client) as streams, \
            ClientSession(*streams[:2]) as s:
        await s.initialize()
        r = await s.call_tool("watch_job", {"job_id": job["job_id"], "after_sequence": 0,
                                            "max_events": 500, "wait_ms": 20000})
        w = r.structured_content or {}
        kinds = [e["kind"] for e in w.get("events", [])]
        decided = [e for e in w.get("events", []) if e["kind"] == "approval.decided"]
        check("http: watch_job follows the job to its end",
              w.get("job_ended") and "job.submitted" in kinds and kinds[-1] == "job.state", kinds)
        check("http: the run was approved by bob, outside MCP",
              decided and decided[0]["data"].get("by") == "bob", decided)
        r = await s.call_tool("get_result", {"job_id": job["job_id"]})
        res = r.structured_content or {}
        check("http: get_result has the output and the cost",
              res.get("state") == "completed" and res["tasks"][0]["output"].get("text") == "approved and done"
              and "micro_usd" in res.get("cost", {}), res)
        r = await s.call_tool("list_agents", {"capability": "builtin.echo"})
        agents = [a["agent_id"] for a in (r.structured_content or {}).get("agents", [])]
        check("http: list_agents finds the built-in agent", agents == ["builtin"], agents)
        r = await s.call_tool("list_capabilities", {})
        check("http: list_capabilities lists agents", bool((r.structured_content or {}).get("agents")), text(r))
        templates = [t.uri_template for t in (await s.list_resource_templates()).resource_templates]
        check("http: jobs and results are resource templates",
              templates == ["switchyard://jobs/{job_id}", "switchyard://jobs/{job_id}/result"], templates)
        read = json.loads((await s.read_resource(f"switchyard://jobs/{job['job_id']}")).contents[0].text)
        check("http: a job resource reads in the session revision too", read.get("job_id") == job["job_id"], read)


async def viewer_over_http(token):
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, streamable_http_client(HTTP, http_client=client) as streams, \
            ClientSession(*streams[:2]) as s:
        await s.initialize()
        r = await s.call_tool("submit_job", {"document": NEEDS_APPROVAL})
        check("http as a viewer: submit_job is refused by the executor's table",
              r.is_error and "PERMISSION_DENIED" in text(r), text(r))


async def modern_over_http(job):
    # mode="auto": the SDK probes server/discover at 2026-07-28 and adopts
    # it, or falls back to initialize; every request then carries its _meta.
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKENS['alice']}"})
    async with client, Client(streamable_http_client(HTTP, http_client=client), mode="auto") as c:
        check("http 2026-07-28: the SDK negotiates the stateless revision",
              c.protocol_version == "2026-07-28", c.protocol_version)
        names = [t.name for t in (await c.list_tools()).tools]
        check("http 2026-07-28: the nine tools, none of them approves", names == TOOLS, names)
        r = await c.call_tool("get_job", {"job_id": job["job_id"]})
        check("http 2026-07-28: get_job as alice", (r.structured_content or {}).get("state") == "completed", text(r))
        r = await c.call_tool("validate_job", {"document": BAD_NUMBERING})
        check("http 2026-07-28: a tool's refusal is a tool error",
              r.is_error and "gap between task 2 and 4" in text(r), text(r))
        uri = f"switchyard://jobs/{job['job_id']}"
        listed = [x.uri for x in (await c.list_resources()).resources]
        check("http 2026-07-28: alice's jobs are resources", uri in listed, listed)
        read = json.loads((await c.read_resource(uri)).contents[0].text)
        check("http 2026-07-28: reading a job resource is get_job", read.get("state") == "completed", read)
        read = json.loads((await c.read_resource(uri + "/result")).contents[0].text)
        check("http 2026-07-28: reading its result resource is get_result",
              read["tasks"][0]["output"].get("text") == "approved and done", read)
    # The same client pinned to the handshake era still gets a session.
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKENS['alice']}"})
    async with client, Client(streamable_http_client(HTTP, http_client=client), mode="legacy") as c:
        check("http 2025-11-25: the handshake era is still served",
              c.protocol_version == "2025-11-25", c.protocol_version)


async def viewer_modern_over_http(token):
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, Client(streamable_http_client(HTTP, http_client=client), mode="2026-07-28") as c:
        r = await c.call_tool("submit_job", {"document": NEEDS_APPROVAL})
        check("http 2026-07-28 as a viewer: submit_job is refused by the executor's table",
              r.is_error and "PERMISSION_DENIED" in text(r), text(r))


def alice_client():
    return create_mcp_http_client(headers={"Authorization": f"Bearer {TOKENS['alice']}"})


def pending_of(name, c_runs):
    return [r for r in c_runs if r["created_by"] == name]


async def gated_modern_over_http(other_token):
    # Without elicitation: the job is answered as it is, pending.
    async with (client := alice_client()), Client(streamable_http_client(HTTP, http_client=client),
                                                  mode="2026-07-28") as c:
        r = await c.call_tool("submit_job", {"document": NEEDS_APPROVAL})
        plain = r.structured_content or {}
        check("2026-07-28 without elicitation: a gated submit_job is answered pending",
              not r.is_error and plain.get("state") == "pending", text(r))
        before = len(pending_of("alice", (await c.call_tool("list_pending_approvals", {})).structured_content["runs"]))

    # With elicitation: asked once; bob approves outside MCP while the user
    # is asked; the retry reads the job again and answers it decided.
    asked = []

    async def approve_then_accept(_ctx, params):
        asked.append(params.message)
        run = re.search(r"approval run (\S+)\)", params.message)
        if run and len(asked) == 1:
            code, out = await anyio.to_thread.run_sync(
                lambda: cli("approval", "approve", run.group(1), "-m", "asked over MCP", token=TOKENS["bob"]))
            check("bob approves the run the MCP user was told of", code == 0, out)
        return mcp_types.ElicitResult(action="accept", content={})

    async with (client := alice_client()), Client(streamable_http_client(HTTP, http_client=client),
                                                  mode="2026-07-28", elicitation_callback=approve_then_accept) as c:
        r = await c.call_tool("submit_job", {"document": NEEDS_APPROVAL})
        job = r.structured_content or {}
        check("2026-07-28 with elicitation: input_required once, answered when a person decided",
              len(asked) == 1 and (job.get("approval") == "approved"
                                   or job.get("state") in ("available", "active", "completed")), (asked, text(r)))

    # Accepting is never approving: the same answer, no person, the job waits.
    async def accept(_ctx, _params):
        return mcp_types.ElicitResult(action="accept", content={})

    async with (client := alice_client()), Client(streamable_http_client(HTTP, http_client=client),
                                                  mode="2026-07-28", elicitation_callback=accept,
                                                  input_required_max_rounds=3) as c:
        try:
            r = await c.call_tool("submit_job", {"document": NEEDS_APPROVAL})
            check("2026-07-28: accepting does not approve", False, text(r))
        except InputRequiredRoundsExceededError:
            runs = (await c.call_tool("list_pending_approvals", {})).structured_content["runs"]
            check("2026-07-28: accepting three times approves nothing (the run still waits)",
                  len(pending_of("alice", runs)) == before + 1, runs)

    # Declining stops the waiting: the job is answered as it is.
    async def decline(_ctx, _params):
        return mcp_types.ElicitResult(action="decline")

    async with (client := alice_client()), Client(streamable_http_client(HTTP, http_client=client),
                                                  mode="2026-07-28", elicitation_callback=decline) as c:
        r = await c.call_tool("submit_job", {"document": NEEDS_APPROVAL})
        declined = r.structured_content or {}
        check("2026-07-28: declining answers the job still pending",
              declined.get("state") == "pending" and declined.get("submitted_by") == "alice", text(r))

    # The request state names a job: another submitter naming alice's is
    # refused as get_job refuses it, and learns nothing of it.
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}
    body = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "submit_job", "arguments": {"document": NEEDS_APPROVAL}, "_meta": meta,
        "inputResponses": {"approval": {"action": "accept", "content": {}}},
        "requestState": declined.get("job_id", "")}}
    headers = {"Authorization": f"Bearer {other_token}", "MCP-Protocol-Version": "2026-07-28",
               "Mcp-Method": "tools/call", "Mcp-Name": "submit_job",
               "Accept": "application/json, text/event-stream"}
    # Nor can it read alice's job as a resource: not found, as a job that
    # does not exist, and it is not among the resources it lists.
    other = create_mcp_http_client(headers={"Authorization": f"Bearer {other_token}"})
    async with other, Client(streamable_http_client(HTTP, http_client=other), mode="2026-07-28") as c:
        uri = f"switchyard://jobs/{declined.get('job_id', '')}"
        try:
            got = await c.read_resource(uri)
            check("2026-07-28: another submitter cannot read alice's job resource", False, got)
        except Exception as e:
            check("2026-07-28: another submitter cannot read alice's job resource (Resource not found)",
                  "Resource not found" in str(e) and "pending" not in str(e), e)
        listed = [x.uri for x in (await c.list_resources()).resources]
        check("2026-07-28: another submitter lists none of alice's jobs", uri not in listed, listed)
    r = httpx.post(HTTP, json=body, headers=headers).json().get("result", {})
    shown = json.dumps(r)
    check("2026-07-28: a request state naming another submitter's job is refused, nothing shown",
          r.get("isError") and "NOT_FOUND" in shown and "pending" not in shown
          and "alice" not in shown, shown)


async def agent_reads_no_job_resource(token, job):
    # An agent key is no submitter: alice's job is not a resource it reads.
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with client, Client(streamable_http_client(HTTP, http_client=client), mode="2026-07-28") as c:
        try:
            got = await c.read_resource(f"switchyard://jobs/{job['job_id']}")
            check("2026-07-28: an agent key cannot read alice's job resource", False, got)
        except Exception as e:
            check("2026-07-28: an agent key cannot read alice's job resource (Resource not found)",
                  str(e) == "Resource not found", e)


async def main():
    job = await over_stdio()
    await as_bob_over_stdio(job)
    code, out = cli("approval", "approve", job["run_id"], "-m", "looks fine", token=TOKENS["bob"])
    check("a person (bob) approves with the CLI", code == 0, out)
    await over_http(job)
    await modern_over_http(job)
    code, out = cli("auth", "key", "create", "--subject", "vera", "--roles", "viewer", "-o", "json",
                    token=TOKENS["admin"])
    check("an admin makes a viewer key", code == 0, out)
    if code == 0:
        await viewer_over_http(json.loads(out)["secret"])
        await viewer_modern_over_http(json.loads(out)["secret"])
    code, out = cli("auth", "key", "create", "--subject", "sam", "--roles", "submitter", "-o", "json",
                    token=TOKENS["admin"])
    check("an admin makes a key for another submitter", code == 0, out)
    if code == 0:
        await gated_modern_over_http(json.loads(out)["secret"])
    code, out = cli("auth", "key", "create", "--subject", "bot", "--roles", "agent", "--kind", "agent",
                    "-o", "json", token=TOKENS["admin"])
    check("an admin makes an agent key", code == 0, out)
    if code == 0:
        await agent_reads_no_job_resource(json.loads(out)["secret"], job)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    sys.exit(1 if RESULTS["failed"] else 0)


anyio.run(main)
