import json
import os
import sys
import time

import toolexec_tool

STEPS = 20

params = json.load(sys.stdin)
resumed = toolexec_tool.last_checkpoint()
state = resumed or {"done": 0, "steps": {}}
parent = os.getppid()
for step in range(state["done"], STEPS):
    with open(params["ledger"], "a") as ledger:
        ledger.write(f"{params['id']} {step}\n")
    state = {"done": step + 1, "steps": {**state["steps"], str(step): f"step {step} done"}}
    toolexec_tool.checkpoint(state)
    toolexec_tool.progress((step + 1) / STEPS, f"step {step + 1} of {STEPS}")
    if resumed is None and step + 1 == params["hold"]:
        # hold here until the executor that started us is gone (SIGKILLed by the test):
        # outside a sandbox that dies with it, an orphan must not go on
        while os.getppid() == parent:
            time.sleep(0.02)
        sys.exit(3)
    time.sleep(0.15)
print(json.dumps({"done": state["done"], "resumed_from": None if resumed is None else resumed["done"]}))
