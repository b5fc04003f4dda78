import json
import sys

params = json.load(sys.stdin)
print("echoing", file=sys.stderr)
print(json.dumps({"echo": params["text"] * params.get("times", 1), "keys": len(params)}))
