"""Bytes transferred by `adapterdoc inspect hf://...` against a local Hub-like HTTP server (range support),
beside the file sizes: headers only is the expectation (kilobytes for gigabyte files).

    python benchmarks/remote_bytes.py
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED = {"bytes": 0}


def sparse_file(path: str, n_tensors: int, per_tensor: int, first: int = 0) -> int:
    header = {"__metadata__": {"format": "pt"}}
    for i in range(n_tensors):
        header[f"model.layers.{first + i}.mlp.down_proj.weight"] = {
            "dtype": "BF16",
            "shape": [per_tensor // 2],
            "data_offsets": [i * per_tensor, (i + 1) * per_tensor],
        }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + n_tensors * per_tensor)
    return os.path.getsize(path)


def handler(root: str) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            parts = self.path.split("/resolve/")
            path = (
                os.path.join(root, parts[0].strip("/"), parts[1].split("/", 1)[1]) if len(parts) == 2 else ""
            )
            if not os.path.isfile(path):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            size = os.path.getsize(path)
            a, b = 0, size - 1
            if self.headers.get("Range"):
                lo, hi = self.headers["Range"].removeprefix("bytes=").split("-")
                a, b = int(lo), min(int(hi), size - 1)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {a}-{b}/{size}")
            else:
                self.send_response(200)
            with open(path, "rb") as f:
                f.seek(a)
                body = f.read(b - a + 1)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            SERVED["bytes"] += len(body)

    return H


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "org", "big"))
        os.makedirs(os.path.join(root, "org", "sharded"))
        sizes = {
            "org/big": sparse_file(os.path.join(root, "org", "big", "model.safetensors"), 512, 2 * 2**20)
        }
        wm, total = {}, 0
        for s in range(4):
            name = f"model-0000{s + 1}-of-00004.safetensors"
            total += sparse_file(os.path.join(root, "org", "sharded", name), 256, 4 * 2**20, first=s * 256)
            wm.update({f"model.layers.{s * 256 + i}.mlp.down_proj.weight": name for i in range(256)})
        with open(os.path.join(root, "org", "sharded", "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": wm}, f)
        sizes["org/sharded"] = total
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler(root))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        env = {
            **os.environ,
            "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
            "HF_HUB_OFFLINE": "0",
        }
        print("| repo | file bytes | header bytes | bytes transferred | ratio | exit |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for repo, size in sizes.items():
            SERVED["bytes"] = 0
            proc = subprocess.run(
                [sys.executable, "-m", "adapterdoc", "inspect", f"hf://{repo}", "--json"],
                env=env,
                capture_output=True,
                text=True,
            )
            got = SERVED["bytes"]
            headers = (
                sum(f["header_bytes"] for f in json.loads(proc.stdout)["files"])
                if proc.returncode == 0
                else 0
            )
            print(
                f"| {repo} | {size:,} | {headers:,} | {got:,} | 1 : {size // max(got, 1):,} | {proc.returncode} |"
            )
        server.shutdown()


if __name__ == "__main__":
    main()
