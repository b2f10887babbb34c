"""The fleet's fault table for the code as it is: runs the fault suite (tests/e2e/test_fleet_faults.py: 2 replicas,
2 workers, real Redis and PostgreSQL, 80 requests at 4 a second, one fault 5 s in) and prints what each fault
cost as a table, from the line each test prints.

    python benchmarks/fleet_faults.py            # about 6 minutes on 2 cores

Needs redis-server and PostgreSQL from the distribution's packages, as the suite does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(?P<fault>[^:\n]+): accepted (?P<accepted>\d+)/(?P<sent>\d+), client errors (?P<errors>\d+) .*?, "
                  r"lost (?P<lost>\d+), duplicated rows (?P<rows>\d+), escalations delivered (?P<delivered>\d+)/"
                  r"(?P<escalated>\d+), duplicated escalations (?P<twice>\d+)$", re.M)


def main() -> int:
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/e2e/test_fleet_faults.py", "-q", "-s",
                           "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)
    rows = list(LINE.finditer(done.stdout))
    print("| fault | accepted | client errors | audit rows lost | duplicated rows | escalations delivered | "
          "duplicated escalations |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['fault']} | {row['accepted']} of {row['sent']} | {row['errors']} | {row['lost']} | "
              f"{row['rows']} | {row['delivered']} of {row['escalated']} | {row['twice']} |")
    if done.returncode != 0 or not rows:
        print(done.stdout[-3000:], done.stderr[-2000:], file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
