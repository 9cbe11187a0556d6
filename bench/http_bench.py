"""Boot HTTP server vs nginx, side by side in one run, on loopback.

1. Artefact throughput: one file (default 1 GiB) fetched by 1, 16 and 64 concurrent curl
   clients from each server; aggregate MiB/s and our/nginx ratio (bar: >= 0.8).
2. iPXE scripts: wrk against a node's per-node script (a store lookup, a cached agent token,
   a jinja2 render) vs nginx serving a static script of the same size (bar: >= 5,000 req/s).

    python3 bench/http_bench.py [--size-mib 1024] [--duration-s 10]
Needs Debian's nginx, wrk and curl. Prints a Markdown table for docs/performance.md.
"""

from __future__ import annotations

import _env  # noqa: I001  (first: may re-run this bench in the project's virtualenv)

_env.ensure_project_python()

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

MAC = "52:54:00:be:00:01"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} never answered")


def start_daemon(work: Path, port: int) -> subprocess.Popen[bytes]:
    config = work / "provisioner.toml"
    config.write_text(
        f'state_dir = "{work / "state"}"\n[api]\nlisten = "127.0.0.1:{free_port()}"\n'
        f'[http]\nlisten = "127.0.0.1:{port}"\n[boot]\nartefacts_dir = "{work / "files"}"\n'
        '[log]\nlevel = "WARNING"\n')
    return subprocess.Popen([sys.executable, "-m", "provisioner", "--config", str(config),
                             "serve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_nginx(work: Path, port: int) -> subprocess.Popen[bytes]:
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
error_log {work}/nginx-error.log;
pid {work}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on; tcp_nopush on;
  default_type application/octet-stream;
  client_body_temp_path {work}/nginx-body; proxy_temp_path {work}/nginx-proxy;
  fastcgi_temp_path {work}/nginx-fcgi; uwsgi_temp_path {work}/nginx-uwsgi;
  scgi_temp_path {work}/nginx-scgi;
  server {{
    listen 127.0.0.1:{port}; root {work}/files;
    location /artefacts/ {{ alias {work}/files/; }}
  }}
}}
""")
    return subprocess.Popen(["nginx", "-c", str(conf)], stderr=subprocess.DEVNULL)


def throughput(url: str, streams: int, size: int) -> float:
    """Aggregate MiB/s of ``streams`` concurrent full downloads."""
    started = time.monotonic()
    procs = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-w", "%{size_download}",
                               url], stdout=subprocess.PIPE) for _ in range(streams)]
    total = 0
    for proc in procs:
        out, _ = proc.communicate()
        total += int(out or 0)
    elapsed = time.monotonic() - started
    if total != size * streams:
        raise SystemExit(f"{url}: got {total} bytes, expected {size * streams}")
    return total / elapsed / (1 << 20)


def wrk(url: str, duration_s: int) -> float:
    out = subprocess.run(["wrk", "-t", "1", "-c", "32", "-d", f"{duration_s}s", url],
                         capture_output=True, text=True, check=True).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if match is None or errors is not None:
        raise SystemExit(f"wrk against {url} failed:\n{out}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--duration-s", type=int, default=10)
    args = parser.parse_args()
    for tool in ("nginx", "wrk", "curl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install nginx wrk curl)")
    work = Path(tempfile.mkdtemp(prefix="pv-http-bench-"))
    work.chmod(0o755)  # nginx workers run as an unprivileged user
    files = work / "files"
    files.mkdir()
    size = args.size_mib << 20
    with (files / "image.raw").open("wb") as fh:
        chunk = os.urandom(1 << 20)
        for _ in range(args.size_mib):
            fh.write(chunk)
    ours_port, nginx_port = free_port(), free_port()
    daemon, nginx = start_daemon(work, ours_port), start_nginx(work, nginx_port)
    try:
        ours = f"http://127.0.0.1:{ours_port}"
        theirs = f"http://127.0.0.1:{nginx_port}"
        wait_http(f"{ours}/boot.ipxe")
        wait_http(f"{theirs}/artefacts/image.raw")
        rows = []
        for streams in (1, 16, 64):
            a = throughput(f"{ours}/artefacts/image.raw", streams, size)
            b = throughput(f"{theirs}/artefacts/image.raw", streams, size)
            rows.append((f"{args.size_mib} MiB artefact, {streams} stream(s), MiB/s", a, b))
        with urllib.request.urlopen(f"{ours}/boot/{MAC}.ipxe") as response:
            script = response.read()  # discovers the node; later fetches reuse its token
        (files / "script.ipxe").write_bytes(script)
        time.sleep(1)
        a = wrk(f"{ours}/boot/{MAC}.ipxe", args.duration_s)
        b = wrk(f"{theirs}/script.ipxe", args.duration_s)
        rows.append(("iPXE script (per node vs static file), req/s", a, b))
    finally:
        for proc in (daemon, nginx):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    print("| measure | provisioner | nginx (1 worker) | ratio |\n|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:,.0f} | {b:,.0f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
