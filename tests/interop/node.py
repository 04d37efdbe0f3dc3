"""`pulsar-core serve` as a child process for the interop scenarios that
need their own server options (soak.py, delayed_buckets.py)."""
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def now_ms():
    return int(time.time() * 1000)


class Serve:
    def __init__(self, binary, workdir, args, rust_log="info"):
        self.binary, self.workdir, self.args = binary, workdir, list(args)
        self.port = free_port()
        self.data = os.path.join(workdir, "data")
        self.rust_log = rust_log
        self.proc = None
        self.boots = 0

    @property
    def url(self):
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def store(self):
        return os.path.join(self.data, "serve.redb")

    def start(self):
        self.boots += 1
        log = open(os.path.join(self.workdir, f"serve-{self.boots}.log"), "w")
        env = dict(os.environ, RUST_LOG=self.rust_log)
        self.proc = subprocess.Popen(
            [self.binary, "serve", "--data-dir", self.data,
             "--listen", f"127.0.0.1:{self.port}"] + self.args,
            stdout=log, stderr=log, env=env)
        with open(os.path.join(self.workdir, "serve.pid"), "w") as f:
            f.write(str(self.proc.pid))
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    sys.exit(f"serve exited with {self.proc.returncode} at start")
                time.sleep(0.05)
        sys.exit("serve did not start listening within 20 s")

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            sys.exit("serve did not stop within 10 s of SIGTERM")

    def logs(self):
        out = ""
        for i in range(1, self.boots + 1):
            with open(os.path.join(self.workdir, f"serve-{i}.log")) as f:
                out += f.read()
        return out
