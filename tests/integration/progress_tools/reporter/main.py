"""reporter: appends one progress line per step to $TOOLEXEC_REPORT_FILE (the
tool-side protocol: one JSON object per line, flushed; none with `quiet`), then waits for the `release`
file to appear before it answers {"steps": N}: a test decides when it ends."""

import json
import os
import sys
import time

params = json.load(sys.stdin)
steps = params["steps"]
report = None if params.get("quiet") else os.environ.get("TOOLEXEC_REPORT_FILE")
for step in range(1, steps + 1):
    if report:
        with open(report, "a", encoding="utf-8") as lines:
            lines.write(json.dumps({"progress": step / steps,
                                    "message": f"step {step} of {steps}"}) + "\n")
            lines.flush()
deadline = time.monotonic() + 240
while not os.path.exists(params["release"]) and time.monotonic() < deadline:
    time.sleep(0.05)
json.dump({"steps": steps}, sys.stdout)
