"""A Switchyard pull worker in Python with grpcio, from the generated stubs.

Usage: SWITCHYARD_TOKEN=<agent key> worker.py HOST:PORT PROTO_ROOT [--queue Q] [--id ID] [--max N]

Fetches tasks of queue Q (default `text.count`) from the executor's WorkerService,
runs each, and acks it with its result (or nacks it with an error); one Heartbeat
call keeps every lease it holds while it works. It counts words of the task's
payload: real work that needs no model.

Budgets, as the WorkerService contract asks: a task of a job that declared a budget
comes with a `budget_id`. This worker treats each word as a token it spends: it
reserves them on that budget through LedgerService *before* doing the work, commits
what it used, and reports the figure on Ack. The lease's `grant` goes with both: the
ledger lets a worker's key spend only on the budget its lease names. A budget too small refuses the
reservation, and the worker nacks the task without doing the work. A task with no
budget id may not spend, and this worker spends nothing on it.

SIGTERM/SIGINT drain it: it stops fetching, finishes the task in hand, then exits.
`--max N` exits after N tasks. Prints `worker ready` once connected.
"""

import os
import signal
import sys
import threading

import grpc

from stubs import generate


def main() -> int:
    addr, proto_root = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]

    def opt(name, default):
        return args[args.index(name) + 1] if name in args else default

    queue = opt("--queue", "text.count")
    worker_id = opt("--id", f"py-worker-{os.getpid()}")
    limit = int(opt("--max", "0"))
    generate(proto_root)
    from google.protobuf import duration_pb2, json_format, struct_pb2
    from switchyard.executor.v1 import executor_pb2 as ex
    from switchyard.executor.v1 import executor_pb2_grpc as ex_grpc
    from switchyard.ledger.v1 import ledger_pb2 as lg
    from switchyard.ledger.v1 import ledger_pb2_grpc as lg_grpc

    auth = [("authorization", f"Bearer {os.environ['SWITCHYARD_TOKEN']}")]
    channel = grpc.insecure_channel(addr)
    workers = ex_grpc.WorkerServiceStub(channel)
    ledger = lg_grpc.LedgerServiceStub(channel)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    lease = duration_pb2.Duration(seconds=30)
    in_hand = []  # TaskRefs held, for heartbeats
    lock = threading.Lock()

    def beat():
        while not stopping.wait(10):
            with lock:
                active = list(in_hand)
            try:
                out = workers.Heartbeat(ex.HeartbeatRequest(worker_id=worker_id, active=active,
                                                            visibility_timeout=lease), metadata=auth)
            except grpc.RpcError as e:
                print(f"heartbeat failed: {e.details()}", file=sys.stderr)
                continue
            if out.state == ex.WORKER_STATE_TERMINATE:
                stopping.set()

    threading.Thread(target=beat, daemon=True).start()

    def run(task):
        """Counts the payload's words; spends them as tokens on the job's budget."""
        payload = json_format.MessageToDict(task.payload) if task.HasField("payload") else None
        text = " ".join(str(x) for x in payload) if isinstance(payload, list) else str(payload or "")
        words = len(text.split())
        if not task.budget_id:
            return {"words": words}, 0
        held = ledger.Reserve(lg.ReserveRequest(budget_id=task.budget_id, tokens=words,
                                                idempotency_key=f"{task.task.job_id}/{task.task.attempt}",
                                                note=f"{worker_id} counts {words} words",
                                                invocation_grant=task.grant), metadata=auth)
        ledger.Commit(lg.CommitRequest(reservation_id=held.reservation.reservation_id, tokens=words,
                                       invocation_grant=task.grant),
                      metadata=auth)
        return {"words": words}, words

    print("worker ready", flush=True)
    done = 0
    while not stopping.is_set() and (limit == 0 or done < limit):
        got = workers.Fetch(ex.FetchRequest(queues=[queue], count=1, worker_id=worker_id,
                                            visibility_timeout=lease,
                                            wait=duration_pb2.Duration(seconds=2)), metadata=auth)
        if got.state != ex.WORKER_STATE_RUNNING:
            break  # quiet or terminate: an operator is draining this worker
        for task in got.tasks:
            with lock:
                in_hand.append(task.task)
            try:
                result, tokens = run(task)
                value = struct_pb2.Value()
                json_format.ParseDict(result, value)
                workers.Ack(ex.AckRequest(task=task.task, worker_id=worker_id, result=value,
                                          tokens_used=tokens), metadata=auth)
                print(f"acked {task.task.job_id} words={result['words']} tokens={tokens}", flush=True)
            except grpc.RpcError as e:
                # The ledger refused (budget too small) or the lease was lost: say so.
                err = ex.WorkerError(code=e.code().name, message=e.details() or "", retryable=False)
                try:
                    workers.Nack(ex.NackRequest(task=task.task, worker_id=worker_id, error=err), metadata=auth)
                    print(f"nacked {task.task.job_id}: {e.code().name}", flush=True)
                except grpc.RpcError as e2:
                    print(f"nack refused for {task.task.job_id}: {e2.details()}", file=sys.stderr)
            finally:
                with lock:
                    in_hand.remove(task.task)
            done += 1
    stopping.set()
    print(f"worker stopped after {done} tasks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
