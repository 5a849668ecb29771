"""A Python client generated from Switchyard's proto/ with grpcio-tools.

Usage: test_client.py HOST:PORT PROTO_ROOT

Generates stubs into a temporary directory, registers an agent, routes to it,
reserves on a budget until the ledger refuses, and reads the google.rpc
ErrorInfo reason, its metadata and BadRequest field violations from rejected
calls: what a polyglot platform team would do. Prints one line per
check and a final "N passed, N failed" line; exits non-zero on any failure.
"""

import collections
import os
import sys
import time

import grpc

# The same stub generation the examples use.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from stubs import generate  # noqa: E402


def error_details(err: grpc.RpcError):
    """(reason, {field: description}) from a rich gRPC status."""
    reason, fields, _ = error_info(err)
    return reason, fields


def error_info(err: grpc.RpcError):
    """(reason, {field: description}, ErrorInfo metadata) from a rich gRPC status."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    status = rpc_status.from_call(err)
    reason, fields, metadata = None, {}, {}
    for detail in status.details if status else []:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields = {v.field: v.description for v in bad.field_violations}
    return reason, fields, metadata


class _Details(
    collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


class Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call, as any grpcio client can."""

    def __init__(self, token):
        self.token = token

    def _with_token(self, d):
        metadata = list(d.metadata or []) + [("authorization", f"Bearer {self.token}")]
        return _Details(d.method, d.timeout, metadata, d.credentials, getattr(d, "wait_for_ready", None),
                        getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)


def main() -> int:
    addr, proto_root = sys.argv[1], sys.argv[2]
    token = os.environ["SWITCHYARD_TOKEN"]
    generate(proto_root)
    from switchyard.registry.v1 import registry_pb2, registry_pb2_grpc
    from switchyard.common.v1 import common_pb2
    from switchyard.ledger.v1 import ledger_pb2, ledger_pb2_grpc
    from switchyard.router.v1 import router_pb2, router_pb2_grpc

    anonymous = registry_pb2_grpc.RegistryServiceStub(grpc.insecure_channel(addr))
    forged = registry_pb2_grpc.RegistryServiceStub(
        grpc.intercept_channel(grpc.insecure_channel(addr), Bearer("syk_000000000000_" + "0" * 64))
    )
    channel = grpc.intercept_channel(grpc.insecure_channel(addr), Bearer(token))
    registry = registry_pb2_grpc.RegistryServiceStub(channel)
    router = router_pb2_grpc.RouterServiceStub(channel)
    ledger = ledger_pb2_grpc.LedgerServiceStub(channel)
    results = []

    def check(name, cond, info=""):
        results.append(bool(cond))
        print(f"{'ok  ' if cond else 'FAIL'} {name} {info}")

    for name, stub, want in [("no credential", anonymous, "AUTH_REQUIRED"), ("unknown key", forged, "AUTH_INVALID")]:
        try:
            stub.ListAgents(registry_pb2.ListAgentsRequest())
            check(f"{name} refused", False)
        except grpc.RpcError as err:
            reason, _ = error_details(err)
            check(f"{name}: UNAUTHENTICATED with {want}", err.code() == grpc.StatusCode.UNAUTHENTICATED and reason == want, str(reason))

    spec = registry_pb2.AgentSpec(
        id="py_summarizer",
        name="Python Summarizer",
        endpoint="http://127.0.0.1:9",
        capabilities=[registry_pb2.Capability(name="text.summarize", price_per_unit_micro_usd=500, unit="page")],
        trust_score=77,
    )
    resp, call = registry.RegisterAgent.with_call(
        registry_pb2.RegisterAgentRequest(agent=spec), metadata=[("x-correlation-id", "py-corr-1")]
    )
    echoed = dict(call.initial_metadata()).get("x-correlation-id")
    check("register agent", resp.created and resp.lease.ttl.seconds > 0)
    check("correlation id echoed", echoed == "py-corr-1", repr(echoed))

    routed = None
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            routed = router.Route(router_pb2.RouteRequest(capability="text.summarize"))
            if routed.candidates:
                break
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    check(
        "route to the registered agent",
        routed is not None and routed.candidates and routed.candidates[0].agent_id == "py_summarizer",
        str(routed.candidates[0].breakdown).replace("\n", " ") if routed and routed.candidates else "",
    )

    try:
        registry.RegisterAgent(registry_pb2.RegisterAgentRequest(agent=registry_pb2.AgentSpec(id="Bad Id", endpoint="x")))
        check("invalid registration rejected", False)
    except grpc.RpcError as err:
        reason, fields = error_details(err)
        check(
            "invalid registration: INVALID_ARGUMENT with field violations",
            err.code() == grpc.StatusCode.INVALID_ARGUMENT and reason == "INVALID_ARGUMENT" and "agent.id" in fields,
            f"{reason} {sorted(fields)}",
        )

    try:
        router.Route(router_pb2.RouteRequest(capability="no.such.capability"))
        check("unroutable capability rejected", False)
    except grpc.RpcError as err:
        reason, _ = error_details(err)
        check(
            "unroutable capability: NOT_FOUND with CAPABILITY_UNAVAILABLE",
            err.code() == grpc.StatusCode.NOT_FOUND and reason == "CAPABILITY_UNAVAILABLE",
            str(reason),
        )

    ledger.CreateBudget(
        ledger_pb2.CreateBudgetRequest(budget_id="py/team", token_limit=1000, cost_limit=common_pb2.Money(micro_usd=5000))
    )
    ledger.CreateBudget(ledger_pb2.CreateBudgetRequest(budget_id="py/team/job", parent_id="py/team"))
    first = ledger.Reserve(
        ledger_pb2.ReserveRequest(
            budget_id="py/team/job", tokens=700, cost=common_pb2.Money(micro_usd=100), idempotency_key="py-1"
        )
    )
    check("reserve on a nested budget", first.reservation.tokens == 700)
    try:
        ledger.Reserve(
            ledger_pb2.ReserveRequest(
                budget_id="py/team/job", tokens=400, cost=common_pb2.Money(micro_usd=100), idempotency_key="py-2"
            )
        )
        check("reservation over the parent's limit refused", False)
    except grpc.RpcError as err:
        reason, _, meta = error_info(err)
        check(
            "refusal: RESOURCE_EXHAUSTED with BUDGET_EXCEEDED naming the parent and what remains",
            err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and reason == "BUDGET_EXCEEDED"
            and meta.get("refused_by") == "py/team"
            and meta.get("tokens_remaining") == "300",
            f"{reason} {meta}",
        )

    passed = sum(results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
