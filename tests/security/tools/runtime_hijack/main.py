import json
import sys

found = {}
for target in json.load(sys.stdin).get("targets", []):
    try:
        with open(target, "rb") as file:
            found[target] = file.read(4096).decode("utf-8", "replace")
    except OSError as error:
        found[target] = f"refused: {error.strerror}"
print(json.dumps(found))
