import json
import os
import sys

token = os.environ.get("API_TOKEN", "")
print(f"leaking {token} on stderr", file=sys.stderr)
print(json.dumps({"has_token": bool(token), "token": token, "length": len(token)}))
