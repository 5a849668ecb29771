"""Python stubs for Switchyard's protos, generated at start-up with grpcio-tools.

The examples here (agent.py, worker.py) call generate(PROTO_ROOT) first, then import
switchyard.<service>.v1 modules: only generated code talks to Switchyard.
"""

import os
import sys
import tempfile

import grpc_tools
from grpc_tools import protoc


def generate(proto_root: str) -> None:
    out = tempfile.mkdtemp(prefix="switchyard_agent_py_")
    wkt = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    files = []
    for base, _, names in os.walk(proto_root):
        files += [os.path.join(base, n) for n in names if n.endswith(".proto")]
    rc = protoc.main(["protoc", f"-I{proto_root}", f"-I{wkt}", f"--python_out={out}", f"--grpc_python_out={out}", *files])
    if rc != 0:
        raise SystemExit(f"protoc failed with {rc}")
    sys.path.insert(0, out)
