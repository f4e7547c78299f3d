"""What the release's install tests share (tests/release/): where the artifacts and the roots are, the version
line every artifact must print, and commands run inside a Debian root (scripts/debian-root.sh: chroot in a
private mount namespace, same network, the given directories bound at the same paths).

The artifacts are scripts/release.sh's, in $DDPRUN_RELEASE_DIST (default <repo>/dist); the roots are the ones
`scripts/release.sh test` makes before it runs these tests ($DDPRUN_RELEASE_CACHE, default
/var/cache/ddprun/release; the torch 2.6 root of scripts/torch26-root.sh). The version line is what the portable
build's own ddprun prints ($DDPRUN_RELEASE_BUILD, default <repo>/build-release). Standard library only.
"""
import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DIST = os.environ.get("DDPRUN_RELEASE_DIST") or os.path.join(REPO, "dist")
CACHE = os.environ.get("DDPRUN_RELEASE_CACHE") or "/var/cache/ddprun/release"
BUILD = os.environ.get("DDPRUN_RELEASE_BUILD") or os.path.join(REPO, "build-release")
DEBIAN11 = os.path.join(CACHE, "bullseye-test")
DEBIAN12 = os.path.join(CACHE, "bookworm-test")
CONTRACT_WORKER = os.path.join(REPO, "tests", "release", "contract_worker.py")
DDP_TRAIN = os.path.join(REPO, "scripts", "examples", "ddp_train.py")
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
JOB_TIMEOUT = 300  # seconds for one short job in a root (torch imports dominate on a loaded 2-core machine)


def version():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        for line in f:
            if line.startswith("project(ddprun VERSION "):
                return line.split()[2]
    raise RuntimeError("no project(ddprun VERSION ...) line in CMakeLists.txt")


def readme_install_line(artifact):
    """The command of README.md's Install section that names `artifact` (the file name, this version), without
    its comment: the install tests run the lines as a reader would copy them."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    start = text.find("\n## Install")
    if start < 0:
        raise AssertionError("README.md has no '## Install' section")
    section = text[start + 1:text.find("\n## ", start + 1)]
    name = artifact.format(v=version())
    lines = [line.split("  #")[0].strip() for line in section.splitlines() if name in line]
    if len(lines) != 1:
        raise AssertionError(f"README.md's Install section should have one line with {name}, has {lines}")
    return lines[0]


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def torch26_root():
    out = subprocess.run([os.path.join(REPO, "scripts", "torch26-root.sh"), "path"], capture_output=True, text=True,
                         timeout=30)
    if out.returncode != 0:
        raise RuntimeError("no torch 2.6 root: scripts/release.sh test makes it (scripts/torch26-root.sh)")
    return out.stdout.strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ReleaseTestCase(unittest.TestCase):
    """A temporary directory (self.tmp) per test, bound into every root it runs commands in."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun-release-test-")
        os.chmod(self.tmp, 0o755)
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def artifact(self, name):
        """dist/<name> (the name with this version), or a failure that says how to make it."""
        path = os.path.join(DIST, name.format(v=version()))
        if not os.path.isfile(path):
            self.fail(f"{path} is missing: run scripts/release.sh first (found: {sorted(os.listdir(DIST)) if os.path.isdir(DIST) else 'no ' + DIST})")
        return path

    def version_line(self, program="ddprun"):
        """What every artifact's `<program> --version` must print: the portable build's own line."""
        built = os.path.join(BUILD, "launcher", program)
        out = subprocess.run([built, "--version"], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        line = out.stdout.strip()
        self.assertRegex(line, rf"^{program} {version()} \(commit ([0-9a-f]{{40}}( with local changes)?|unknown)\)$")
        return line

    def root_command(self, root, argv, binds=(), repo=True):
        """The command line that runs argv inside root with self.tmp, binds and (repo) the repository bound."""
        script = '. "$1"; shift; debian_root_run "$@"'
        return ["bash", "-c", script, "run", os.path.join(REPO, "scripts", "debian-root.sh"), root, self.tmp,
                *([REPO] if repo else []), *binds, "--", *argv]

    def root_env(self, env=None, overlay=None):
        """The environment of a command in a root: a Debian PATH, HOME, a UTF-8 locale, and env on top."""
        environment = {"PATH": ROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        environment.update(env or {})
        if overlay:
            environment["DEBIAN_ROOT_OVERLAY"] = overlay
        return environment

    def in_root(self, root, argv, binds=(), overlay=None, env=None, timeout=120, check=True, repo=True):
        """Runs argv inside root (root_command) in self.tmp and returns the CompletedProcess (text, stdout and
        stderr captured). overlay: a directory that takes the root's changes (scripts/debian-root.sh). check:
        assert exit 0, showing both streams otherwise. repo=False: the root never sees the source tree."""
        out = subprocess.run(self.root_command(root, argv, binds, repo), cwd=self.tmp,
                             env=self.root_env(env, overlay), capture_output=True, text=True, timeout=timeout)
        if check:
            self.assertEqual(out.returncode, 0, f"{argv} in {root} exited {out.returncode}\n--- stdout\n"
                                                f"{out.stdout[-4000:]}\n--- stderr\n{out.stderr[-6000:]}")
        return out

    def results(self, out_dir, world_size):
        """The rank<R>.json files a finished job's workers wrote, one for each of its world_size ranks."""
        results = []
        for path in sorted(glob.glob(os.path.join(out_dir, "rank*.json"))):
            with open(path) as f:
                results.append(json.load(f))
        self.assertEqual(sorted(r["rank"] for r in results), list(range(world_size)), results)
        return results

    def check_contract_job(self, out_dir, world_size):
        """The contract workers' files of a finished job: every rank, no problem, tickets 1..world_size."""
        results = self.results(out_dir, world_size)
        for r in results:
            self.assertEqual(r["problems"], [], r)
        self.assertEqual(sorted(r["ticket"] for r in results), list(range(1, world_size + 1)), results)

    def check_ddp_job(self, out_dir, world_size):
        """scripts/examples/ddp_train.py's --out files: every rank trained and ended with identical parameters."""
        results = self.results(out_dir, world_size)
        for r in results:
            self.assertEqual(r["world_size"], world_size)
            self.assertTrue(r["identical"], r)
        self.assertEqual(len({r["checksum"] for r in results}), 1, results)
