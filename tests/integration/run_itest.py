"""Runs integration test modules for ctest and turns the unittest result into an exit code ctest can read.

    python3 run_itest.py NAME...    NAME: a module, module.Class or module.Class.test (unittest names)

Exit codes (tests/integration/CMakeLists.txt sets SKIP_RETURN_CODE 77):
    0   every selected test ran and passed; some may have been skipped (listed at the end), unless
        DDPRUN_REQUIRE_ALL_SUITES=1
    1   a failure or error, no test at all, or - with DDPRUN_REQUIRE_ALL_SUITES=1 - any skip
    77  nothing ran: every test skipped (the machine cannot run this module: no root, no namespaces, ...)
So a module is reported Skipped only when none of it ran: a failure next to a skip is a failure, and a partial
skip passes with its reasons printed. (Matching "skipped '" in the output, as ctest's SKIP_REGULAR_EXPRESSION
did, reported a whole module as Skipped when one test skipped and the others ran - or failed.)

Under DDPRUN_IT_MACHINE_LOCK=FILE the module holds FILE's flock while it runs (waiting up to
ddprun_testlib.LOCK_WAIT s, which CMake adds to its TIMEOUT): a resource of the machine that CTest's
RESOURCE_LOCK orders within one run but not against another checkout's run (torch 1.13's --standalone port 29400).

Under DDPRUN_IT_TORCH (a variant with another torch than the host's: .torch26) only the tests marked
ddprun_testlib.torch_subject run; a module with none selects nothing, which fails.

The test modules skip through ddprun_testlib.skip_unless_required(), which already fails instead of skipping
under DDPRUN_REQUIRE_ALL_SUITES=1; the check here also catches any other skip. Standard library only.
"""
import os
import sys
import time
import unittest

import ddprun_testlib

EXIT_SKIPPED = 77


def exit_code(result):
    """0, 1 or EXIT_SKIPPED for a finished unittest result (see the module comment)."""
    if not result.wasSuccessful():
        return 1
    # A test that skips itself counts in testsRun; a class or module whose set-up skipped runs no test and
    # appears in `skipped` as a placeholder that is not a TestCase.
    executed = result.testsRun - sum(1 for test, _ in result.skipped if isinstance(test, unittest.TestCase))
    if result.skipped:
        print(f"\nrun_itest: {len(result.skipped)} skipped:", flush=True)
        for test, reason in result.skipped:
            print(f"  {test}: {reason}", flush=True)
        if ddprun_testlib.REQUIRE_ALL_SUITES:
            print("run_itest: FAILED - DDPRUN_REQUIRE_ALL_SUITES=1: this machine must run every test of the module",
                  flush=True)
            return 1
        if executed == 0:
            print("run_itest: nothing ran (exit 77: skipped)", flush=True)
            return EXIT_SKIPPED
        return 0
    if executed == 0:
        print("run_itest: FAILED - no test was selected", flush=True)
        return 1
    return 0


class TimedResult(unittest.TextTestResult):
    """Also records how long each test took (set-up and clean-up included), for the table at the end."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.durations = []

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.durations.append((time.monotonic() - self._started, test.id()))


def print_durations(result, total):
    """Each test's seconds, slowest first, and what the module spent outside its tests (class set-up)."""
    print(f"\nrun_itest: {total:.1f} s in all; per test:", flush=True)
    for seconds, name in sorted(result.durations, reverse=True):
        print(f"  {seconds:7.2f} s  {name}", flush=True)
    outside = total - sum(seconds for seconds, _ in result.durations)
    print(f"  {outside:7.2f} s  (module and class set-up, tear-down)", flush=True)


def flatten(suite):
    """The test cases of a (nested) unittest suite, in order."""
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from flatten(item)
        else:
            yield item


def main(names):
    if not names:
        print(__doc__, file=sys.stderr)
        return 2
    machine_lock = os.environ.get("DDPRUN_IT_MACHINE_LOCK")
    if machine_lock:
        waited = time.monotonic()
        held = ddprun_testlib.hold_cluster_lock(f"{' '.join(names)} (run_itest)", ddprun_testlib.LOCK_WAIT,
                                                path=machine_lock, what=f"the machine-wide resource {machine_lock}")
        waited = time.monotonic() - waited
        if waited > 1:
            print(f"run_itest: waited {waited:.0f} s for {machine_lock}", flush=True)
    started = time.monotonic()
    suite = unittest.defaultTestLoader.loadTestsFromNames(names)
    if ddprun_testlib.EXPECTED_TORCH:
        # A variant for another torch (.torch26) runs only what depends on the workers' torch.
        # (A module that failed to import is a test of unittest.loader's that reports the error: kept.)
        suite = unittest.TestSuite(t for t in flatten(suite) if ddprun_testlib.is_torch_subject(t)
                                   or type(t).__module__ == "unittest.loader")
        print(f"run_itest: torch {ddprun_testlib.EXPECTED_TORCH}: only the tests marked torch_subject "
              f"({suite.countTestCases()})", flush=True)
    result = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult).run(suite)
    print_durations(result, time.monotonic() - started)
    if machine_lock:
        held.close()
    return exit_code(result)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
