"""The .deb with apt-get into Debian minbase roots (with python3 for the workers): Debian 12 (what the release
promises first), Debian 11 (the glibc floor) and Debian 13 (the torch 2.6 root). Each install goes into an overlay,
so the roots stay as they were. README.md's apt-get line installs it from the file alone (its dependencies are met: nothing to
download), `ddprun --help` and `--version` work from /usr/bin, a 2-rank job of plain workers runs, no `torchrun`
is installed, and `apt-get remove` takes it away."""
import os
import shutil
import unittest

from release_testlib import (CONTRACT_WORKER, DEBIAN11, DEBIAN12, REPO, ReleaseTestCase, read_bytes,
                             readme_install_line, torch26_root)


class Deb(ReleaseTestCase):
    def install_and_run(self, root):
        shutil.copy(self.artifact("ddprun_{v}_amd64.deb"), self.tmp)
        overlay = os.path.join(self.tmp, "overlay-" + os.path.basename(root))

        def run(argv, env_extra=None, **kwargs):
            # One namespace per step, each over the same overlay directory: the steps see each other's changes.
            return self.in_root(root, argv, overlay=overlay,
                                env={"DEBIAN_FRONTEND": "noninteractive", **(env_extra or {})}, **kwargs)

        # README.md's line, as written, in a root that never saw the source tree; apt must download nothing (a
        # proxy that answers nothing would fail any download).
        run(["sh", "-c", readme_install_line("ddprun_{v}_amd64.deb")], timeout=180, repo=False,
            env_extra={"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"})
        status = run(["dpkg-query", "-W", "-f", "${Status} ${Version} ${Depends}", "ddprun"]).stdout
        self.assertTrue(status.startswith("install ok installed"), status)
        self.assertIn("libc6 (>= 2.31)", status)
        self.assertIn("--nproc_per_node", run(["ddprun", "--help"]).stdout)
        self.assertEqual(run(["ddprun", "--version"]).stdout.strip(), self.version_line())
        self.assertEqual(run(["ddprun-store", "--version"]).stdout.strip(), self.version_line("ddprun-store"))
        files = run(["dpkg-query", "-L", "ddprun"]).stdout.split()
        self.assertIn("/usr/bin/ddprun-launch", files)
        self.assertNotIn("/usr/bin/torchrun", files)
        self.assertIn("/usr/share/ddprun/ddprun_torch_no_libuv.py", files)  # the shim, not put in place
        # Debian's copyright file holds the license's full text (LICENSE's lines, as a License stanza).
        copyright_text = run(["cat", "/usr/share/doc/ddprun/copyright"]).stdout
        self.assertIn("\nLicense: BSD-3-Clause\n BSD 3-Clause License\n .\n", copyright_text)
        for line in read_bytes(os.path.join(REPO, "LICENSE")).decode().splitlines():
            self.assertIn(f" {line}" if line else " .", copyright_text.splitlines())
        out_dir = os.path.join(self.tmp, "out-" + os.path.basename(root))
        os.mkdir(out_dir)
        run(["ddprun", "--standalone", "--nproc_per_node", "2", CONTRACT_WORKER, out_dir, "1", "2"])
        self.check_contract_job(out_dir, world_size=2)
        run(["apt-get", "remove", "-y", "-q", "ddprun"], timeout=180)
        self.assertNotEqual(run(["sh", "-c", "command -v ddprun"], check=False).returncode, 0)

    def test_debian12(self):
        self.install_and_run(DEBIAN12)

    def test_debian11(self):
        self.install_and_run(DEBIAN11)

    def test_debian13(self):
        self.install_and_run(torch26_root())


if __name__ == "__main__":
    unittest.main()
