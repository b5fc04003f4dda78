import base64
import json
import os
import sys
import urllib.parse

fail = json.load(sys.stdin).get("fail", False)
token = os.environ["TOKEN"]
raw = token.encode()
half = len(token) // 2
forms = {
    "plain": token,
    "base64": base64.b64encode(raw).decode(),
    "base64_inside": base64.b64encode(b"user:" + raw + b"!").decode(),
    "urlsafe_base64": base64.urlsafe_b64encode(raw).decode().rstrip("="),
    "hex": raw.hex(),
    "hex_upper": raw.hex().upper(),
    "url": urllib.parse.quote(token, safe=""),
    "every_byte_url": "".join(f"%{b:02x}" for b in raw),
    "reversed": token[::-1],
    "upper": token.upper(),
    "first_half": token[:half],
    "second_half": token[half:],
}
for name, value in forms.items():
    print(f"{name}={value}", file=sys.stderr)
if fail:
    sys.exit(1)
print(json.dumps({"length": len(token), "forms": forms}))
