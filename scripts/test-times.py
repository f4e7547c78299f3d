#!/usr/bin/env python3
"""Where the test suite's time goes: runs every selected CTest test alone, one after the other, and records its
wall time and the CPU time of everything it started (a cgroup per test), then prints a table per module.

    scripts/test-times.py [--build-dir build] [--out times.jsonl] [--jobs-estimate 2] [CTEST SELECTION ...]
    scripts/test-times.py -- -LE 'netns|slurm'           any ctest selection arguments after --
    scripts/test-times.py --table times.jsonl             only the table of an earlier run

A module is an integration module (integration.test_x[.torch26]), a Catch2 executable (all its cases
together), or a test of its own (interop_*, sdk.*). CPU is user + system time of the test's whole process tree,
daemons it started included: the cpuacct cgroup (v1) or cpu.stat (v2) of a cgroup made for the test; without
a writable cgroup hierarchy (not root) the column is empty. Serial on purpose: the wall times are each test's
own, not its share of a parallel run. docs/testing.md holds the tables this printed. Needs nothing but the
standard library and ctest; exit status 1 when a test failed (its row says so), 0 otherwise.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time

CGROUP_ROOTS = ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class Cgroup:
    """A cgroup for one test, or a stand-in that measures nothing when none can be made."""

    def __init__(self, name):
        self.path = None
        for root in CGROUP_ROOTS:
            usage = "cpuacct.usage" if root.endswith("cpuacct") else "cpu.stat"
            if not os.path.exists(os.path.join(root, usage)):
                continue
            path = os.path.join(root, name)
            try:
                os.mkdir(path)
            except OSError:
                continue
            self.path, self.usage = path, usage
            return

    def enter_command(self, argv):
        """argv wrapped so that it runs inside the cgroup."""
        if not self.path:
            return argv
        procs = os.path.join(self.path, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def cpu_seconds(self):
        if not self.path:
            return None
        with open(os.path.join(self.path, self.usage)) as f:
            text = f.read()
        if self.usage == "cpuacct.usage":
            return int(text) / 1e9
        fields = dict(line.split() for line in text.splitlines())
        return int(fields["usage_usec"]) / 1e6

    def remove(self):
        if not self.path:
            return
        parent = os.path.dirname(self.path)
        for _ in range(50):  # anything left over (a daemon) goes back to the parent first
            try:
                with open(os.path.join(self.path, "cgroup.procs")) as f:
                    pids = f.read().split()
                for pid in pids:
                    with open(os.path.join(parent, "cgroup.procs"), "w") as f:
                        f.write(pid)
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def list_tests(build, selection):
    """The selected tests, each with its CTest number (ctest -I N,N runs it alone whatever its name holds)."""
    def show(*args):
        done = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1", *args], check=True,
                              stdout=subprocess.PIPE, text=True)
        return json.loads(done.stdout)["tests"]

    number = {test["name"]: i for i, test in enumerate(show(), 1)}
    tests = []
    for test in show(*selection):
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        tests.append({"name": test["name"], "number": number[test["name"]], "labels": props.get("LABELS", []),
                      "command": test.get("command", [])})
    return tests


def module_of(test):
    name = test["name"]
    if name.startswith("integration.") or name.startswith("interop_") or name.startswith("sdk."):
        return name
    command = test["command"]
    if command:
        return os.path.basename(command[0])
    return name


def run(build, tests, out):
    failed = 0
    with open(out, "w") as log:
        for i, test in enumerate(tests, 1):
            group = Cgroup(f"ddprun-test-times-{os.getpid()}-{i}")
            n = test["number"]
            argv = group.enter_command(["ctest", "--test-dir", build, "--output-on-failure", "-I", f"{n},{n}"])
            started = time.monotonic()
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            wall = time.monotonic() - started
            cpu = group.cpu_seconds()
            group.remove()
            status = "passed" if done.returncode == 0 else "failed"
            if "Skipped" in done.stdout or "Not Run" in done.stdout:
                status = "skipped"
            failed += status == "failed"
            row = {"name": test["name"], "module": module_of(test), "labels": test["labels"], "wall": wall,
                   "cpu": cpu, "status": status}
            log.write(json.dumps(row) + "\n")
            log.flush()
            cpu_text = f"{cpu:7.1f}" if cpu is not None else "      -"
            print(f"[{i}/{len(tests)}] {wall:7.1f} s wall {cpu_text} s cpu  {status:7}  {test['name']}", flush=True)
            if status == "failed":
                print(done.stdout[-4000:], flush=True)
    return failed


def table(path):
    rows = [json.loads(line) for line in open(path)]
    modules = collections.OrderedDict()
    for r in rows:
        m = modules.setdefault(r["module"], {"wall": 0.0, "cpu": 0.0, "tests": 0, "labels": set(), "failed": 0})
        m["wall"] += r["wall"]
        m["cpu"] += r["cpu"] or 0.0
        m["tests"] += 1
        m["labels"].update(r["labels"])
        m["failed"] += r["status"] == "failed"
    total_wall = sum(m["wall"] for m in modules.values())
    total_cpu = sum(m["cpu"] for m in modules.values())
    print("| module | tests | wall s | CPU s | CPU/wall | labels |")
    print("|---|---:|---:|---:|---:|---|")
    for name, m in sorted(modules.items(), key=lambda kv: -kv[1]["wall"]):
        ratio = m["cpu"] / m["wall"] if m["wall"] else 0
        flag = " (FAILED)" if m["failed"] else ""
        print(f"| {name}{flag} | {m['tests']} | {m['wall']:.1f} | {m['cpu']:.1f} | {ratio:.2f} | "
              f"{', '.join(sorted(m['labels']))} |")
    print(f"| **all** | {len(rows)} | {total_wall:.1f} | {total_cpu:.1f} | "
          f"{total_cpu / total_wall if total_wall else 0:.2f} | |")
    by_label = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        for label in r["labels"] or ["(none)"]:
            by_label[label][0] += r["wall"]
            by_label[label][1] += r["cpu"] or 0.0
            by_label[label][2] += 1
    print("\n| label | tests | wall s | CPU s |")
    print("|---|---:|---:|---:|")
    for label, (wall, cpu, count) in sorted(by_label.items(), key=lambda kv: -kv[1][0]):
        print(f"| {label} | {count} | {wall:.1f} | {cpu:.1f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--out", default="test-times.jsonl", help="one JSON line per test (default: %(default)s)")
    p.add_argument("--table", metavar="JSONL", help="print the table of an earlier run and exit")
    p.add_argument("selection", nargs="*", help="ctest selection arguments (after --)")
    args = p.parse_args()
    if args.table:
        table(args.table)
        return 0
    tests = list_tests(args.build_dir, args.selection)
    failed = run(args.build_dir, tests, args.out)
    table(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
