"""The tarball in a Debian 11 root (glibc 2.31, minbase and python3, nothing of ddprun's build): README.md's
install line unpacks it there and puts it on PATH, its checksums hold, every program prints the release's version
line, `ddprun --standalone` runs a 2-rank job of plain Python workers that check the environment contract and use
the agent's store, the same job runs with the programs invoked as `torchrun` (a link, as an image puts first on
PATH) from Kubeflow Trainer v2's PET_* variables, and `ddprun-store` serves a torch-less client in both wire
dialects."""
import os
import select
import shutil
import subprocess
import unittest

from release_testlib import (CONTRACT_WORKER, DEBIAN11, REPO, ReleaseTestCase, free_port, read_bytes,
                             readme_install_line, version)


class Tarball(ReleaseTestCase):
    def setUp(self):
        super().setUp()
        # README.md's line, as written, in the root (which never sees the source tree): unpack, PATH, run.
        shutil.copy(self.artifact("ddprun-{v}-linux-x86_64.tar.gz"), self.tmp)
        line = readme_install_line("ddprun-{v}-linux-x86_64.tar.gz")
        out = self.in_root(DEBIAN11, ["sh", "-c", f"{line} && ddprun --version"], repo=False)
        self.assertEqual(out.stdout.strip(), self.version_line())
        self.top = os.path.join(self.tmp, f"ddprun-{version()}-linux-x86_64")
        self.bin = os.path.join(self.top, "bin")

    def test_contents_and_checksums(self):
        self.assertEqual(sorted(os.listdir(self.bin)), ["ddprun", "ddprun-launch", "ddprun-store"])
        self.assertEqual(os.readlink(os.path.join(self.bin, "ddprun-launch")), "ddprun")
        for doc in ("README.md", "LICENSE", "docs/cli.md", "docs/kubernetes.md"):
            self.assertTrue(os.path.isfile(os.path.join(self.top, "share", "doc", "ddprun", doc)), doc)
        # The libuv shim for Debian 13's torch (README.md's "Run your train.py"), as the repository has it.
        self.assertEqual(read_bytes(os.path.join(self.top, "share", "ddprun", "ddprun_torch_no_libuv.py")),
                         read_bytes(os.path.join(REPO, "scripts", "torch26", "ddprun_torch_no_libuv.py")))
        # The license, at the top as well: the repository's own LICENSE, byte for byte.
        self.assertEqual(read_bytes(os.path.join(self.top, "LICENSE")), read_bytes(os.path.join(REPO, "LICENSE")))
        out = self.in_root(DEBIAN11, ["sh", "-c", f'cd "{self.top}" && sha256sum --quiet -c SHA256SUMS'])
        self.assertEqual(out.stdout, "")
        # The root really is glibc 2.31 (what the tarball promises to run on).
        out = self.in_root(DEBIAN11, ["ldd", "--version"])
        self.assertIn("2.31", out.stdout.splitlines()[0])

    def test_version_lines(self):
        for program in ("ddprun", "ddprun-store"):
            out = self.in_root(DEBIAN11, [os.path.join(self.bin, program), "--version"])
            self.assertEqual(out.stdout.strip(), self.version_line(program))
        with open(os.path.join(self.top, "VERSION")) as f:
            line = self.version_line()
            self.assertEqual(f.read().split("\n")[:2], [line.split(" (")[0], line.split("(")[1].rstrip(")")])

    def test_standalone_job_of_plain_workers(self):
        out_dir = os.path.join(self.tmp, "out")
        os.mkdir(out_dir)
        self.in_root(DEBIAN11, [os.path.join(self.bin, "ddprun"), "--standalone", "--nproc_per_node", "2",
                                CONTRACT_WORKER, out_dir, "1", "2"], timeout=120)
        self.check_contract_job(out_dir, world_size=2)

    def test_invoked_as_torchrun_with_kubeflow_variables(self):
        # Kubeflow Trainer v2's torch runtime runs the literal command `torchrun` with these variables.
        os.symlink("ddprun", os.path.join(self.bin, "torchrun"))
        out_dir = os.path.join(self.tmp, "out")
        os.mkdir(out_dir)
        env = {"PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin", "PET_NNODES": "1", "PET_NPROC_PER_NODE": "2",
               "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port())}
        out = self.in_root(DEBIAN11, ["torchrun", "--version"], env=env)
        self.assertEqual(out.stdout.strip(), self.version_line())
        out = self.in_root(DEBIAN11, ["torchrun", CONTRACT_WORKER, out_dir, "1", "2"], env=env, timeout=120)
        self.assertIn("ddprun", out.stderr)  # the launcher's own lines are ddprun's
        self.check_contract_job(out_dir, world_size=2)

    def test_store_serves_a_torchless_client(self):
        client = os.path.join(self.tmp, "client.py")
        with open(client, "w") as f:
            f.write(f"""import sys
sys.path.insert(0, {os.path.join(REPO, "tests", "interop")!r})
from store_wire_trace import RawStore
for dialect in ("legacy", "modern"):
    with RawStore("127.0.0.1", int(sys.argv[1]), dialect) as s:
        assert (s.add(dialect, 1), s.add(dialect, 41)) == (1, 42), dialect
print("ok")
""")
        store = subprocess.Popen(
            self.root_command(DEBIAN11, [os.path.join(self.bin, "ddprun-store"), "--host", "127.0.0.1", "--port", "0"]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.tmp, env=self.root_env())
        try:
            # "ddprun-store listening on ADDR:PORT" once it accepts connections.
            ready, _, _ = select.select([store.stdout], [], [], 60)
            line = store.stdout.readline() if ready else ""
            self.assertIn("listening on", line, f"ddprun-store said {line!r} (exit {store.poll()})")
            out = self.in_root(DEBIAN11, ["python3", client, line.strip().rsplit(":", 1)[1]])
            self.assertEqual(out.stdout.strip(), "ok")
        finally:
            store.terminate()
            store.communicate(timeout=30)


if __name__ == "__main__":
    unittest.main()
