import json
import socket
import sys
import urllib.error
import urllib.request

params = json.load(sys.stdin)
seen = {}
for url in params.get("urls", []):
    try:
        seen[url] = "reached: " + urllib.request.urlopen(url, timeout=10).read().decode()
    except urllib.error.HTTPError as error:
        seen[url] = f"refused: {error.code}"
    except OSError as error:
        seen[url] = f"failed: {error}"
for target in params.get("direct", []):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        seen[target] = "reached"
    except OSError as error:
        seen[target] = f"failed: {error}"
print(json.dumps(seen))
