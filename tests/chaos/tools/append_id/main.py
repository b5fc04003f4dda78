import json
import sys
import time

params = json.load(sys.stdin)
time.sleep(0.2)
with open(params["ledger"], "a") as ledger:
    ledger.write(params["id"] + "\n")
print(json.dumps({"ok": True}))
