import json
import sys

raw = sys.stdin.read()
print(json.dumps({"raw": raw, "argv": sys.argv[1:], "cmd": json.loads(raw)["cmd"]}))
