"""A Switchyard agent written in Python with grpcio, from the generated stubs.

Usage: SWITCHYARD_TOKEN=<agent key> agent.py REGISTRY_HOST:PORT PROTO_ROOT [--id ID]

Generates Python stubs from Switchyard's proto/ with grpcio-tools, serves
switchyard.agent.v1.AgentService on an ephemeral port, registers itself with
the registry (capability `text.sentiment`), heartbeats to keep its lease and
deregisters on SIGTERM/SIGINT. Prints `listening grpc=HOST:PORT` once ready.

The work is real and needs no LLM: a lexicon-based sentiment score of
input.text, streamed as progress, then one final AgentResponse.
"""

import os
import re
import signal
import sys
import threading
from concurrent import futures

import grpc

from stubs import generate

POSITIVE = {"good", "great", "excellent", "fast", "reliable", "improved", "success", "win", "love", "clean", "stable"}
NEGATIVE = {"bad", "slow", "error", "errors", "failure", "failed", "broken", "timeout", "crash", "refused", "down"}


def sentiment(text: str) -> dict:
    words = re.findall(r"[a-z']+", text.lower())
    pos = sum(w in POSITIVE for w in words)
    neg = sum(w in NEGATIVE for w in words)
    score = 0.0 if pos + neg == 0 else (pos - neg) / (pos + neg)
    label = "positive" if score > 0.2 else "negative" if score < -0.2 else "neutral"
    return {"label": label, "score": round(score, 3), "positive": pos, "negative": neg, "words": len(words)}


def main() -> int:
    registry_addr, proto_root = sys.argv[1], sys.argv[2]
    agent_id = sys.argv[sys.argv.index("--id") + 1] if "--id" in sys.argv else "py_sentiment"
    generate(proto_root)
    from google.protobuf import struct_pb2
    from switchyard.agent.v1 import agent_pb2, agent_pb2_grpc
    from switchyard.registry.v1 import registry_pb2, registry_pb2_grpc

    class Sentiment(agent_pb2_grpc.AgentServiceServicer):
        def Describe(self, request, context):
            return agent_pb2.DescribeResponse(name="Python sentiment", capabilities=["text.sentiment"])

        def Invoke(self, request, context):
            text = request.input.fields["text"].string_value if "text" in request.input.fields else ""
            if not text:
                yield agent_pb2.InvokeResponse(response=agent_pb2.AgentResponse(
                    status=agent_pb2.RESPONSE_STATUS_REFUSED, error="text.sentiment needs input.text"))
                return
            yield agent_pb2.InvokeResponse(progress=agent_pb2.Progress(message="scoring", percent=50))
            result = sentiment(text)
            out = struct_pb2.Struct()
            out.update(result)
            yield agent_pb2.InvokeResponse(response=agent_pb2.AgentResponse(
                status=agent_pb2.RESPONSE_STATUS_SUCCESS,
                content=f"{result['label']} ({result['score']})",
                output=out))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(Sentiment(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    # The agent's API key (role agent) rides every registry call.
    auth = [("authorization", f"Bearer {os.environ['SWITCHYARD_TOKEN']}")]
    registry = registry_pb2_grpc.RegistryServiceStub(grpc.insecure_channel(registry_addr))
    spec = registry_pb2.AgentSpec(
        id=agent_id, name="Python sentiment",
        description="Lexicon-based sentiment of input.text; written in Python with grpcio.",
        endpoint=f"http://127.0.0.1:{port}",
        capabilities=[registry_pb2.Capability(name="text.sentiment", proficiency=0.9, price_per_unit_micro_usd=5, unit="call")],
        trust_score=70, latency_estimate_ms=5)
    lease = registry.RegisterAgent(registry_pb2.RegisterAgentRequest(agent=spec), metadata=auth).lease
    print(f"listening grpc=127.0.0.1:{port}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    every = max(lease.ttl.seconds / 3, 0.5)
    while not stop.wait(every):
        try:
            registry.Heartbeat(registry_pb2.HeartbeatRequest(agent_id=agent_id), metadata=auth)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                registry.RegisterAgent(registry_pb2.RegisterAgentRequest(agent=spec), metadata=auth)
    registry.DeregisterAgent(registry_pb2.DeregisterAgentRequest(agent_id=agent_id), metadata=auth)
    server.stop(grace=2).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
