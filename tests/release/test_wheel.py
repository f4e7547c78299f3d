"""The wheel into a fresh venv inside the Debian 13 root (torch 2.6 from Debian's python3-torch, seen through
--system-site-packages as a venv next to a system torch sees it): pip installs it from the file alone (no index,
nothing compiled), `ddprun`, `ddprun-store`, `ddprun-launch` and `python -m ddprun` work from the venv, torch's own
`torchrun` is still torch's, `ddprun.state` imports from the venv (off outside a job), a 2-rank gloo DDP job trains
under the venv's ddprun with its state in memory (--state_memory) and exits 0, and `pip uninstall` takes every
program away again."""
import glob
import os
import shutil
import unittest

from release_testlib import (CACHE, DDP_TRAIN, JOB_TIMEOUT, REPO, ReleaseTestCase, read_bytes, readme_install_line,
                             torch26_root)


class Wheel(ReleaseTestCase):
    def setUp(self):
        super().setUp()
        self.root = torch26_root()
        self.wheel = self.artifact("ddprun-{v}-py3-none-manylinux_2_31_x86_64.whl")
        # The root has no pip of its own: Debian 13's (python3-pip-whl, scripts/release.sh) goes into the venv.
        pips = glob.glob(os.path.join(CACHE, "pip", "pip-*.whl"))
        self.assertEqual(len(pips), 1, f"one pip wheel under {CACHE}/pip (scripts/release.sh test puts it there)")
        self.venv = os.path.join(self.tmp, "venv")
        self.binds = [os.path.dirname(self.wheel), os.path.dirname(pips[0])]
        self.run_root(["python3", "-m", "venv", "--system-site-packages", "--without-pip", self.venv])
        self.run_root([self.bin("python"), os.path.join(pips[0], "pip"), "install", "--quiet", "--no-index",
                       "--no-cache-dir", pips[0]])

    def bin(self, name):
        return os.path.join(self.venv, "bin", name)

    def run_root(self, argv, env_extra=None, **kwargs):
        env = {"PATH": f"{self.venv}/bin:/usr/local/bin:/usr/bin:/bin", "VIRTUAL_ENV": self.venv,
               "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env_extra or {})}
        return self.in_root(self.root, argv, binds=self.binds, env=env, **kwargs)

    def test_install_run_train_uninstall(self):
        # README.md's line, as written, in the venv (its bin/ first on PATH, as `activate` does).
        shutil.copy(self.wheel, self.tmp)
        self.run_root(["sh", "-c", readme_install_line("ddprun-{v}-py3-none-manylinux_2_31_x86_64.whl")],
                      env_extra={"PIP_NO_INDEX": "1", "PIP_NO_CACHE_DIR": "1"})
        for program in ("ddprun", "ddprun-store", "ddprun-launch"):
            self.assertTrue(os.access(self.bin(program), os.X_OK), program)
        # The license in the installed .dist-info (the wheel's license-files), as pip records it.
        licenses = glob.glob(os.path.join(self.venv, "lib", "python3*", "site-packages", "ddprun-*.dist-info",
                                          "**", "LICENSE"), recursive=True)
        self.assertEqual(len(licenses), 1, f"one LICENSE in ddprun's .dist-info: {licenses}")
        self.assertEqual(read_bytes(licenses[0]), read_bytes(os.path.join(REPO, "LICENSE")))
        self.assertFalse(os.path.lexists(self.bin("torchrun")), "the wheel must not shadow torch's torchrun")
        line = self.version_line()
        self.assertEqual(self.run_root(["ddprun", "--version"]).stdout.strip(), line)
        self.assertEqual(self.run_root(["python", "-m", "ddprun", "--version"]).stdout.strip(), line)
        self.assertEqual(self.run_root(["ddprun-store", "--version"]).stdout.strip(), self.version_line("ddprun-store"))
        # ddprun-launch is torch.distributed.launch's stand-in: its own flags.
        self.assertIn("--use_env", self.run_root(["ddprun-launch", "--help"]).stdout)
        torchrun = self.run_root(["sh", "-c", "command -v torchrun"], check=False).stdout.strip()
        self.assertNotEqual(os.path.dirname(torchrun), os.path.join(self.venv, "bin"))

        api = self.run_root(["python", "-c", "import ddprun.state as s; from ddprun.state import StorageWriter; "
                             "print(s.__file__, s.enabled(), s.load())"]).stdout.split()
        self.assertEqual(api[1:], ["False", "None"], api)
        self.assertTrue(api[0].startswith(os.path.join(self.venv, "lib")), api)

        out_dir = os.path.join(self.tmp, "out")
        os.mkdir(out_dir)
        self.run_root(["ddprun", "--standalone", "--nproc_per_node", "2", "--state_memory", "64M", DDP_TRAIN,
                       "--steps", "20", "--state-every", "5", "--out", out_dir], timeout=JOB_TIMEOUT)
        self.check_ddp_job(out_dir, world_size=2)

        self.run_root([self.bin("pip"), "uninstall", "--yes", "ddprun"])
        for program in ("ddprun", "ddprun-store", "ddprun-launch"):
            self.assertFalse(os.path.lexists(self.bin(program)), program)
        gone = self.run_root(["python", "-m", "ddprun", "--version"], check=False)
        self.assertNotEqual(gone.returncode, 0)


if __name__ == "__main__":
    unittest.main()
