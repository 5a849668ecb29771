"""Drives Switchyard's gateway with third-party clients only: `requests` and
`httpx` against the AITP REST door (seed 002 section 8), the `redis` client
(RESP2 and RESP3) against the AGEniX RESP door (seed 001), and
`openapi-spec-validator` against the published OpenAPI document.

usage: test_gateway.py HTTP_BASE RESP_HOST:PORT ALICE CAROL VIEWER BOB AGENTS ADMIN
       (ALICE and CAROL: submitter keys; VIEWER: a viewer key; BOB: an approver;
        AGENTS: an agent key (OJS worker); ADMIN: an admin key (OJS operator))
prints one line per check, then "N passed, M failed"; exits 1 on a failure.
"""

import json
import socket
import sys
import time
import traceback

import httpx
import redis
import requests
from openapi_spec_validator import validate

BASE, RESP, ALICE, CAROL, VIEWER, BOB, AGENTS, ADMIN = sys.argv[1:9]
RESP_HOST, RESP_PORT = RESP.rsplit(":", 1)
EXERCISED = set()  # (METHOD, route template) the checks called

# Seed 002's paper analysis (sections 2.1 and 3.1): an input schema whose
# defaults are the input, three subtasks with depends_on, ${...} templates
# and output mappings. The capabilities are the executor's built-in echo
# agent, so the test needs no agent process; routing, the DAG and the data
# flow are the seed's.
PAPER = {
    "name": "Research Paper Analysis",
    "description": "Analyze a research paper and extract key findings",
    "goal": "Extract key findings from the research paper including: main hypothesis, methodology, key results, limitations",
    "input": {"type": "object", "properties": {
        "paper_pdf_url": {"type": "string", "format": "uri", "default": "https://example.org/paper.pdf"},
        "max_pages": {"type": "integer", "default": 50}}},
    "output": {"type": "object", "properties": {"hypothesis": {"type": "string"}}},
    "priority": "HIGH",
    "metadata": {"timeout_seconds": 3600, "tags": ["research", "nlp", "analysis"],
                 "retry_policy": {"max_retries": 3, "backoff_strategy": "exponential", "backoff_base_ms": 100}},
    "subtasks": [
        {"subtask_id": "subtask_1", "name": "Extract Text from PDF", "agent_capability": "builtin.echo",
         "input": {"text": "${parent.input.paper_pdf_url}", "max_pages": "${parent.input.max_pages}"},
         "output_mapping": {"text": "raw_text"}, "priority": 1},
        {"subtask_id": "subtask_2", "name": "Analyze Text with NLP", "agent_capability": "builtin.echo",
         "depends_on": ["subtask_1"], "input": {"text": "${subtask_1.output.raw_text}"},
         "output_mapping": {"text": "nlp_results"}, "priority": 2},
        {"subtask_id": "subtask_3", "name": "Aggregate Results", "agent_capability": "builtin.echo",
         "depends_on": ["subtask_1", "subtask_2"],
         "input": {"raw_text": "${subtask_1.output.raw_text}", "nlp_results": "${subtask_2.output.nlp_results}"},
         "output_mapping": {}, "priority": 3},
    ],
}

ENVELOPE = {
    "plan_id": "plan-log-analysis",
    "plan_description": "Count words",
    "tasks": [
        {"task_number": 1, "command": "echo", "args": ["b a b"], "timeout_secs": 30},
        {"task_number": 2, "command": "tr", "args": [" ", "\\n"], "input_from_task": 1, "timeout_secs": 30},
    ],
}


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def call(method, route, path, token=None, **kw):
    EXERCISED.add((method, route))
    headers = kw.pop("headers", {})
    if token:
        headers.update(auth(token))
    return requests.request(method, BASE + path, headers=headers, timeout=20, **kw)


def check_openapi_document_is_valid_and_open():
    r = call("GET", "/openapi.json", "/openapi.json")
    assert r.status_code == 200, r.status_code
    doc = r.json()
    validate(doc)  # raises on an invalid OpenAPI 3.1 document
    assert doc["openapi"] == "3.1.0"
    h = call("GET", "/healthz", "/healthz")
    assert h.json() == {"status": "ok"}, h.text
    check_openapi_document_is_valid_and_open.doc = doc


def check_paper_analysis_submitted_followed_over_sse_and_read():
    r = call("POST", "/aitp/tasks", "/aitp/tasks", ALICE, json=PAPER)
    assert r.status_code == 201, r.text
    body = r.json()
    tid = body["task_id"]
    assert body["status"] in ("PENDING", "EXECUTING", "COMPLETED"), body
    assert isinstance(body["created_at"], int), body
    assert r.headers["Location"] == f"/aitp/tasks/{tid}", r.headers
    # SSE with requests' streaming: every event in order, then `end`.
    events = []
    with call("GET", "/aitp/tasks/{task_id}/events", f"/aitp/tasks/{tid}/events", ALICE, stream=True) as s:
        assert s.headers["Content-Type"].startswith("text/event-stream"), s.headers
        current = {}
        for line in s.iter_lines(decode_unicode=True):
            if line.startswith(":"):
                continue
            if not line:
                if current:
                    events.append(current)
                    if current.get("event") == "end":
                        break
                current = {}
                continue
            key, _, value = line.partition(":")
            current[key] = value.strip()
    assert events[-1]["event"] == "end", events[-1]
    assert json.loads(events[-1]["data"])["status"] == "COMPLETED", events[-1]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "job.submitted" and "task.state" in kinds, kinds
    ids = [int(e["id"]) for e in events if "id" in e]
    assert ids == list(range(1, len(ids) + 1)), ids
    # Status (httpx), then the result.
    with httpx.Client(base_url=BASE, headers=auth(ALICE), timeout=20) as c:
        EXERCISED.add(("GET", "/aitp/tasks/{task_id}"))
        st = c.get(f"/aitp/tasks/{tid}").json()
        assert st["status"] == "COMPLETED" and st["state"] == "completed", st
        assert st["progress"]["total_steps"] == 3 and st["progress"]["percent_complete"] == 100, st
        assert [s["status"] for s in st["progress"]["steps"]] == ["COMPLETED"] * 3, st
        assert isinstance(st["cost_so_far"], float) and st["cost_so_far_micro_usd"] == 0, st
        EXERCISED.add(("GET", "/aitp/tasks/{task_id}/result"))
        res = c.get(f"/aitp/tasks/{tid}/result")
        assert res.status_code == 200, res.text
        out = res.json()
        assert out["status"] == "COMPLETED", out
        assert out["result"]["subtask_3"]["raw_text"] == "https://example.org/paper.pdf", out
        assert out["result"]["subtask_3"]["nlp_results"] == "https://example.org/paper.pdf", out
        assert isinstance(out["execution_time_ms"], int) and out["cost"] == 0.0, out
    # Resumed after the third event with Last-Event-ID.
    with call("GET", "/aitp/tasks/{task_id}/events", f"/aitp/tasks/{tid}/events", ALICE,
              headers={"Last-Event-ID": "3"}, stream=True) as s:
        first = next(l for l in s.iter_lines(decode_unicode=True) if l.startswith("id:"))
        assert first == "id: 4" or first == "id:4", first


def check_status_codes_400_404_409_401_403_and_cancel():
    bad = dict(PAPER, subtasks=[dict(PAPER["subtasks"][1], depends_on=["nowhere"])])
    r = call("POST", "/aitp/tasks", "/aitp/tasks", ALICE, json=bad)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["status"] == "INVALID_ARGUMENT" and err["fields"], err
    assert err["request_id"] == r.headers["x-correlation-id"], (err, r.headers)
    assert call("GET", "/aitp/tasks/{task_id}", "/aitp/tasks/nope", ALICE).status_code == 404
    slow = {"task_id": "py-slow-1", "subtasks": [{"subtask_id": "nap", "agent_capability": "builtin.sleep", "input": {"ms": 60000}}]}
    assert call("POST", "/aitp/tasks", "/aitp/tasks", ALICE, json=slow).status_code == 201
    r = call("GET", "/aitp/tasks/{task_id}/result", "/aitp/tasks/py-slow-1/result", ALICE)
    assert r.status_code == 409 and r.json()["error"]["reason"] == "JOB_NOT_FINISHED", r.text
    # Another submitter does not see it; a viewer may not cancel it.
    assert call("GET", "/aitp/tasks/{task_id}", "/aitp/tasks/py-slow-1", CAROL).status_code == 404
    r = call("DELETE", "/aitp/tasks/{task_id}", "/aitp/tasks/py-slow-1", VIEWER)
    assert r.status_code == 403 and r.json()["error"]["reason"] == "PERMISSION_DENIED", r.text
    # No step of it waits for input: nothing to list, an answer is refused
    # (409), and a viewer may not answer at all.
    r = call("GET", "/aitp/tasks/{task_id}/input", "/aitp/tasks/py-slow-1/input", ALICE)
    assert r.status_code == 200 and r.json() == {"task_id": "py-slow-1", "waiting": []}, r.text
    r = call("POST", "/aitp/tasks/{task_id}/input", "/aitp/tasks/py-slow-1/input", ALICE,
             json={"answer": 1, "idempotency_key": "py-1"})
    assert r.status_code == 409 and r.json()["error"]["reason"] == "INPUT_NOT_WAITING", r.text
    r = call("POST", "/aitp/tasks/{task_id}/input", "/aitp/tasks/py-slow-1/input", VIEWER, json={"answer": 1})
    assert r.status_code == 403 and r.json()["error"]["reason"] == "PERMISSION_DENIED", r.text
    # It is no conversation: a message and the history are refused (409),
    # and a viewer may not send one at all.
    r = call("POST", "/aitp/tasks/{task_id}/messages", "/aitp/tasks/py-slow-1/messages", ALICE,
             json={"text": "hello?"}, headers={"Idempotency-Key": "py-m-1"})
    assert r.status_code == 409 and r.json()["error"]["reason"] == "CONVERSATION_CLOSED", r.text
    r = call("GET", "/aitp/tasks/{task_id}/messages", "/aitp/tasks/py-slow-1/messages", ALICE)
    assert r.status_code == 409 and r.json()["error"]["reason"] == "CONVERSATION_CLOSED", r.text
    r = call("POST", "/aitp/tasks/{task_id}/messages", "/aitp/tasks/py-slow-1/messages", VIEWER, json={"text": "hi"})
    assert r.status_code == 403 and r.json()["error"]["reason"] == "PERMISSION_DENIED", r.text
    assert call("POST", "/aitp/tasks", "/aitp/tasks", None, json=PAPER).status_code == 401
    r = call("DELETE", "/aitp/tasks/{task_id}", "/aitp/tasks/py-slow-1", ALICE)
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text


def check_ojs_binding_enqueues_reads_cancels_and_keeps_workers_routes_for_workers():
    OJS = {"Content-Type": "application/openjobspec+json"}
    r = call("GET", "/ojs/manifest", "/ojs/manifest")
    assert r.status_code == 200 and r.json()["specversion"] == "1.0", r.text
    r = call("GET", "/ojs/v1/health", "/ojs/v1/health")
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    job = {"type": "email.send", "args": ["a@example.com"], "options": {"queue": "py-mail"}, "x_kept": 1}
    r = call("POST", "/ojs/v1/jobs", "/ojs/v1/jobs", ALICE, json=job, headers=dict(OJS))
    assert r.status_code == 201 and r.headers["OJS-Version"] == "1.0", r.text
    j = r.json()["job"]
    assert j["state"] == "available" and j["x_kept"] == 1, j
    r = call("POST", "/ojs/v1/jobs/batch", "/ojs/v1/jobs/batch", ALICE, json={"jobs": [job, job]}, headers=dict(OJS))
    assert r.status_code == 201 and r.json()["count"] == 2, r.text
    r = call("GET", "/ojs/v1/jobs/{id}", f"/ojs/v1/jobs/{j['id']}", ALICE)
    assert r.status_code == 200 and r.json()["job"]["queue"] == "py-mail", r.text
    r = call("GET", "/ojs/v1/jobs/{id}", f"/ojs/v1/jobs/{j['id']}", CAROL)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    r = call("GET", "/ojs/v1/events", "/ojs/v1/events?types=job.enqueued&queues=py-mail", ALICE)
    assert r.status_code == 200 and r.json()["events"][0]["data"]["queue"] == "py-mail", r.text
    # A producer does not pull: every worker route needs task.work.
    for route in ("fetch", "ack", "nack", "heartbeat"):
        r = call("POST", f"/ojs/v1/workers/{route}", f"/ojs/v1/workers/{route}", ALICE,
                 json={"queues": ["py-mail"], "job_id": j["id"], "worker_id": "w"}, headers=dict(OJS))
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (route, r.text)
    r = call("DELETE", "/ojs/v1/jobs/{id}", f"/ojs/v1/jobs/{j['id']}", ALICE)
    assert r.status_code == 200 and r.json()["job"]["state"] == "cancelled", r.text
    r = call("DELETE", "/ojs/v1/jobs/{id}", f"/ojs/v1/jobs/{j['id']}", ALICE)
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict", r.text


def check_ojs_dead_letter_and_activate_are_operators_and_approvers():
    OJS = {"Content-Type": "application/openjobspec+json"}
    job = {"type": "report.build", "args": [7], "options": {
        "queue": "py-dlq", "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}}
    r = call("POST", "/ojs/v1/jobs", "/ojs/v1/jobs", ALICE, json=job, headers=dict(OJS))
    jid = r.json()["job"]["id"]
    r = call("POST", "/ojs/v1/workers/fetch", "/ojs/v1/workers/fetch", AGENTS,
             json={"queues": ["py-dlq"], "worker_id": "py-w", "wait_ms": 5000}, headers=dict(OJS))
    assert r.status_code == 200 and r.json()["jobs"][0]["id"] == jid, r.text
    r = call("POST", "/ojs/v1/workers/nack", "/ojs/v1/workers/nack", AGENTS, headers=dict(OJS),
             json={"job_id": jid, "worker_id": "py-w", "error": {"code": "boom", "message": "Database connection timed out"}})
    assert r.status_code == 200 and r.json()["state"] == "discarded", r.text
    r = call("GET", "/ojs/v1/dead-letter", "/ojs/v1/dead-letter?limit=10", ALICE)
    listed = {j["id"]: j for j in r.json()["jobs"]}
    assert r.status_code == 200 and listed[jid]["errors"][0]["type"] == "ConnectionTimeout", r.text
    # A producer neither retries nor deletes dead letters; an operator does.
    r = call("POST", "/ojs/v1/dead-letter/{id}/retry", f"/ojs/v1/dead-letter/{jid}/retry", ALICE, headers=dict(OJS))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
    assert r.json()["error"]["details"]["reason"] == "PERMISSION_DENIED", r.text
    r = call("POST", "/ojs/v1/dead-letter/{id}/retry", f"/ojs/v1/dead-letter/{jid}/retry", ADMIN, headers=dict(OJS))
    assert r.status_code == 200 and (r.json()["job"]["state"], r.json()["job"]["attempt"]) == ("available", 0), r.text
    r = call("DELETE", "/ojs/v1/dead-letter/{id}", f"/ojs/v1/dead-letter/{jid}", ADMIN)
    assert r.status_code == 404 and r.json()["error"]["details"]["reason"] == "NOT_IN_DEAD_LETTER", r.text
    # Activate = approve: a pending job waits for an approver, never its submitter.
    pending = {"type": "report.review", "args": [], "options": {"queue": "py-review", "pending": True}}
    r = call("POST", "/ojs/v1/jobs", "/ojs/v1/jobs", ALICE, json=pending, headers=dict(OJS))
    pid = r.json()["job"]["id"]
    assert r.json()["job"]["state"] == "pending", r.text
    r = call("POST", "/ojs/v1/jobs/{id}/activate", f"/ojs/v1/jobs/{pid}/activate", ALICE, headers=dict(OJS))
    assert r.status_code == 403, r.text
    r = call("POST", "/ojs/v1/jobs/{id}/activate", f"/ojs/v1/jobs/{pid}/activate", BOB, headers=dict(OJS))
    assert r.status_code == 200 and r.json()["job"]["state"] == "available", r.text


def check_mcp_endpoint_needs_a_token_and_speaks_mcp():
    mcp = {"Accept": "application/json, text/event-stream"}
    r = call("POST", "/mcp", "/mcp", None, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=dict(mcp))
    assert r.status_code == 401 and r.headers.get("WWW-Authenticate") == "Bearer", r.text
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "py", "version": "1"}}}
    r = call("POST", "/mcp", "/mcp", ALICE, json=init, headers=dict(mcp))
    assert r.status_code == 200 and '"switchyard"' in r.text, r.text
    sid = r.headers["mcp-session-id"]
    # The session's event stream needs the token too (with it, it would stay open).
    r = call("GET", "/mcp", "/mcp", None, headers={"mcp-session-id": sid, "Accept": "text/event-stream"})
    assert r.status_code == 401, r.text
    r = call("DELETE", "/mcp", "/mcp", ALICE, headers={"mcp-session-id": sid})
    assert r.status_code in (200, 202, 204), r.text


def check_a2a_door_reads_and_cancels_a_job_as_the_caller():
    r = call("GET", "/.well-known/agent-card.json", "/.well-known/agent-card.json")
    assert r.status_code == 200, r.text
    card = r.json()
    assert card["supportedInterfaces"][0]["protocolBinding"] == "JSONRPC", card
    # Signed (switchyard dev keeps a key): its key set is public too.
    r = call("GET", "/.well-known/jwks.json", "/.well-known/jwks.json")
    assert r.status_code == 200, r.text
    kids = [k["kid"] for k in r.json()["keys"]]
    assert card["signatures"] and kids, (card, kids)
    slow = {"task_id": "py-a2a-1", "subtasks": [{"subtask_id": "nap", "agent_capability": "builtin.sleep", "input": {"ms": 60000}}]}
    assert call("POST", "/aitp/tasks", "/aitp/tasks", ALICE, json=slow).status_code == 201

    def rpc(method, params, token=ALICE):
        return call("POST", "/a2a", "/a2a", token, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})

    r = rpc("GetTask", {"id": "py-a2a-1"})
    assert r.status_code == 200, r.text
    task = r.json()["result"]
    assert task["id"] == "py-a2a-1" and task["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"), task
    # Another submitter: as if it did not exist; no credential: 401.
    r = rpc("GetTask", {"id": "py-a2a-1"}, CAROL)
    assert r.json()["error"]["code"] == -32001, r.text
    assert rpc("GetTask", {"id": "py-a2a-1"}, None).status_code == 401
    r = rpc("CancelTask", {"id": "py-a2a-1"})
    assert r.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED", r.text

    # The HTTP+JSON binding: the same operations on their REST paths, its
    # errors as google.rpc.Status JSON with A2A's ErrorInfo reason.
    assert [i["protocolBinding"] for i in card["supportedInterfaces"]] == ["JSONRPC", "HTTP+JSON"], card
    slow["task_id"] = "py-a2a-2"
    assert call("POST", "/aitp/tasks", "/aitp/tasks", ALICE, json=slow).status_code == 201
    task_route = "/a2a/tasks/{task_id}"
    r = call("GET", task_route, "/a2a/tasks/py-a2a-2", ALICE)
    assert r.status_code == 200 and r.json()["id"] == "py-a2a-2", r.text
    r = call("GET", task_route, "/a2a/tasks/py-a2a-2", CAROL)
    err = r.json()["error"]
    assert r.status_code == 404 and err["status"] == "NOT_FOUND", r.text
    assert err["details"][0]["reason"] == "TASK_NOT_FOUND" and err["details"][0]["domain"] == "a2a-protocol.org", r.text
    assert call("GET", task_route, "/a2a/tasks/py-a2a-2").status_code == 401
    r = call("POST", task_route, "/a2a/tasks/py-a2a-2:cancel", CAROL)
    assert r.status_code == 404, r.text
    r = call("POST", task_route, "/a2a/tasks/py-a2a-2:archive", ALICE)
    assert r.status_code == 404 and r.json()["error"]["details"][0]["reason"] == "METHOD_NOT_FOUND", r.text
    r = call("POST", task_route, "/a2a/tasks/py-a2a-2:cancel", ALICE)
    assert r.status_code == 200 and r.json()["status"]["state"] == "TASK_STATE_CANCELED", r.text
    send = {"message": {"messageId": "py-m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    r = call("POST", "/a2a/message:send", "/a2a/message:send", ALICE, json=send)
    assert r.status_code == 400 and r.json()["error"]["details"][0]["reason"] == "INVALID_PARAMS", r.text
    r = call("POST", "/a2a/message:send", "/a2a/message:send", ALICE, json={**send, "tenant": "tenant-b"})
    assert r.status_code == 403 and r.json()["error"]["status"] == "PERMISSION_DENIED", r.text


def check_metrics_on_the_http_door_need_metrics_read_and_parse_as_prometheus():
    """Late: by now jobs have finished and runs were decided, so both
    histograms have samples."""
    from prometheus_client.parser import text_string_to_metric_families

    assert call("GET", "/metrics", "/metrics").status_code == 401
    r = call("GET", "/metrics", "/metrics", ALICE)
    assert r.status_code == 403 and r.json()["error"]["reason"] == "PERMISSION_DENIED", r.text
    r = call("GET", "/metrics", "/metrics", ADMIN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.status_code
    names = {f.name for f in text_string_to_metric_families(r.text)}
    assert "switchyard_queue_depth" in names, names
    for h in ("switchyard_job_duration_seconds", "switchyard_approval_wait_seconds"):
        assert f"# TYPE {h} histogram" in r.text, h


def check_trigger_webhook_refuses_the_unauthenticated_the_malformed_and_the_unknown():
    route = "/v1/triggers/{trigger_id}/events"
    path = "/v1/triggers/no-such-trigger/events"
    event = {"action": "opened"}
    r = call("POST", route, path, json=event, headers={"idempotency-key": "e-1"})
    assert r.status_code == 401 and r.json()["error"]["reason"] == "AUTH_REQUIRED", r.text
    r = call("POST", route, path, ALICE, data="{not json", headers={"idempotency-key": "e-1", "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["reason"] == "MALFORMED_REQUEST", r.text
    r = call("POST", route, path, ALICE, json=event)
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["error"]["message"], r.text
    r = call("POST", route, path, ALICE, json=event, headers={"idempotency-key": "e-1"})
    assert r.status_code == 404 and r.json()["error"]["reason"] == "TRIGGER_NOT_FOUND", r.text
    r = call("POST", route, path, BOB, json=event, headers={"idempotency-key": "e-1"})
    assert r.status_code == 403 and r.json()["error"]["reason"] == "PERMISSION_DENIED", r.text


def check_every_documented_route_was_exercised():
    doc = check_openapi_document_is_valid_and_open.doc
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item if m in ("get", "post", "put", "patch", "delete")}
    missing = documented - EXERCISED
    assert not missing, f"documented but not exercised: {missing}"


def resp_client(protocol, token=ALICE, username="alice"):
    return redis.Redis(host=RESP_HOST, port=int(RESP_PORT), protocol=protocol, username=username,
                       password=token, decode_responses=True, socket_timeout=20)


def check_redis_client_resp2_submits_the_envelope_and_reads_it_back():
    r = resp_client(2)
    assert r.ping() is True
    ok = r.execute_command("PLAN.SUBMIT", json.dumps(ENVELOPE))
    assert ok.startswith("OK job_id="), ok
    job = ok.split("=", 1)[1]
    for _ in range(400):
        try:
            res = r.execute_command("JOB.RESULT", job)
            break
        except redis.ResponseError as e:
            assert "has not finished" in str(e), e
            time.sleep(0.025)
    fields = dict(zip(res[::2], res[1::2]))
    assert fields["state"] == "completed", fields
    tasks = [dict(zip(t[::2], t[1::2])) for t in fields["tasks"]]
    assert [t["task_number"] for t in tasks] == [1, 2], tasks
    assert tasks[1]["stdout"] == "b\na\nb\n" and tasks[1]["exit_code"] == 0, tasks
    status = r.execute_command("JOB.STATUS", job)
    assert dict(zip(status[::2], status[1::2]))["percent_complete"] == 100, status
    try:
        r.execute_command("JOB.SUBMIT", json.dumps(dict(ENVELOPE, tasks=[dict(ENVELOPE["tasks"][0], task_number=2)])))
        raise AssertionError("a bad envelope was accepted")
    except redis.ResponseError as e:
        assert str(e) == "Invalid task numbering: must start at 1, found 2", str(e)


def check_redis_client_gets_every_agenix_validation_text():
    r = resp_client(2)

    def task(n, **extra):
        return dict({"task_number": n, "command": "sort"}, **extra)

    def env(tasks, **top):
        return json.dumps(dict({"plan_id": "p", "tasks": tasks}, **top))

    cases = [
        (env([]), "Invalid job: tasks must contain at least one task"),
        (env([task(1), task(2), task(4)]), "Invalid task numbering: gap between task 2 and 4"),
        (env([task(2)]), "Invalid task numbering: must start at 1, found 2"),
        (env([task(1), task(1)]), "Invalid task numbering: duplicate or out-of-order task 1 after task 1"),
        (env([task(n) for n in range(1, 102)]), "Invalid job: 101 tasks exceed the limit of 100"),
        (env([task(1, input_from_task=1)]), "Invalid input reference: task 1 cannot read its own output"),
        (env([task(1, input_from_task=2), task(2)]), "Invalid input reference: task 1 reads task 2, which does not come before it"),
        (env([task(1, command="")]), "Invalid command: task 1 has an empty command"),
        (json.dumps({"tasks": [task(1)]}), "Invalid job: plan_id is required"),
    ]
    for doc, want in cases:
        try:
            r.execute_command("PLAN.SUBMIT", doc)
            raise AssertionError(f"accepted: {doc[:80]}")
        except redis.ResponseError as e:
            assert str(e) == want, (str(e), want)


def check_malformed_frames_and_huge_lengths_close_the_connection():
    def exchange(payload):
        with socket.create_connection((RESP_HOST, int(RESP_PORT)), timeout=20) as s:
            s.sendall(payload)
            got = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    return got  # the server closed the connection
                got += chunk

    got = exchange(b"*1\r\n:5\r\n")
    assert got.startswith(b"-ERR Protocol error"), got
    # 100 MB announced, none of it sent: refused from the header at once.
    got = exchange(b"*2\r\n$11\r\nPLAN.SUBMIT\r\n$104857600\r\n")
    assert got.startswith(b"-ERR Protocol error: invalid bulk length"), got


def check_redis_client_resp3_and_pipelining():
    r = resp_client(3)
    hello = r.execute_command("HELLO", "3")
    assert hello["server"] == "switchyard" and hello["proto"] == 3, hello
    pipe = r.pipeline(transaction=False)
    for i in range(20):
        pipe.execute_command("PLAN.SUBMIT", json.dumps(dict(ENVELOPE, job_id=f"py-pipe-{i}")))
    pipe.execute_command("JOB.STATUS", "py-pipe-0")
    replies = pipe.execute()
    assert replies[:20] == [f"OK job_id=py-pipe-{i}" for i in range(20)], replies[:3]
    assert replies[20]["job_id"] == "py-pipe-0", replies[20]


def check_redis_client_auth_is_required_and_roles_hold():
    # Without credentials redis-py is refused as soon as it connects: its
    # first command (CLIENT SETINFO) needs AUTH, as on a Redis with a password.
    anon = redis.Redis(host=RESP_HOST, port=int(RESP_PORT), protocol=2, decode_responses=True, socket_timeout=20)
    try:
        anon.execute_command("PLAN.SUBMIT", json.dumps(ENVELOPE))
        raise AssertionError("submitted without AUTH")
    except redis.AuthenticationError as e:
        assert "Authentication required" in str(e), e
    # The handshake itself is open: PING answers before AUTH.
    with socket.create_connection((RESP_HOST, int(RESP_PORT)), timeout=20) as s:
        s.sendall(b"*1\r\n$4\r\nPING\r\n*2\r\n$10\r\nJOB.STATUS\r\n$1\r\nx\r\n")
        got = b""
        while got.count(b"\r\n") < 2:
            got += s.recv(4096)
        assert got == b"+PONG\r\n-NOAUTH Authentication required.\r\n", got
    try:
        resp_client(2, token="syk_wrong").ping()
        raise AssertionError("a wrong key was accepted")
    except redis.AuthenticationError:
        pass
    viewer = resp_client(2, token=VIEWER, username="default")
    try:
        viewer.execute_command("PLAN.SUBMIT", json.dumps(ENVELOPE))
        raise AssertionError("a viewer submitted")
    except redis.exceptions.NoPermissionError:
        pass


def main():
    checks = [v for k, v in globals().items() if k.startswith("check_")]
    passed = failed = 0
    for check in checks:
        try:
            check()
            passed += 1
            print(f"ok     {check.__name__}")
        except Exception:
            failed += 1
            print(f"FAILED {check.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
