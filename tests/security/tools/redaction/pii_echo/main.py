import json
import sys

params = json.load(sys.stdin)
print(f"connecting with {params['password']} to {params['dsn']}", file=sys.stderr)
print(json.dumps({
    "said": f"the password is {params['password']}, the dsn {params['dsn']}",
    "size": "1073741824", "host": "127.0.0.1", "zeros": "0000000000000000",
    "contact": "ada@example.com", "card": "4111 1111 1111 1111",
}))
