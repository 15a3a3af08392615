"""softcert.cli.wallclock: the watchdog answers at the deadline, the clock counts the
interpreter's start-up."""
import subprocess
import sys
import time


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_watchdog_answers_when_the_solver_overruns():
    t = time.monotonic()
    p = _run("import sys, time; from softcert.cli.wallclock import Watchdog; "
             "w = Watchdog(time.monotonic() + 0.3, lambda: sys.stdout.write('timed-out\\n')); "
             "time.sleep(20); print('late')")
    assert p.returncode == 0 and p.stdout == "timed-out\n" and time.monotonic() - t < 10, p.stdout + p.stderr


def test_claim_first_keeps_the_answer():
    p = _run("import sys, time; from softcert.cli.wallclock import Watchdog; "
             "w = Watchdog(time.monotonic() + 0.5, lambda: sys.stdout.write('timed-out\\n')); "
             "print(w.claim()); time.sleep(1.0); print('done')")
    assert p.returncode == 0 and p.stdout == "True\ndone\n", p.stdout + p.stderr


def test_seconds_since_start_counts_the_interpreter():
    p = _run("import time; t = time.monotonic(); import torch; from softcert.cli.wallclock import "
             "seconds_since_start as s; print(s() - (time.monotonic() - t))")
    assert p.returncode == 0, p.stderr
    # the interpreter's own start-up before the first line, in clock ticks: >= 0, < 2 s
    assert -0.02 <= float(p.stdout) < 2.0, p.stdout


def test_in_process_deadline_counts_from_now():
    from softcert.cli.wallclock import deadline_of

    t = time.monotonic()
    assert t + 4.9 <= deadline_of(5.0, standalone=False) <= time.monotonic() + 5.0
    assert deadline_of(5.0, standalone=True) <= time.monotonic() + 5.0
