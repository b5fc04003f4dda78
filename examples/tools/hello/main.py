"""hello: read {"name": ...} on stdin, print {"greeting": "Hello, <name>!"} on stdout."""

import json
import sys


def main() -> int:
    params = json.load(sys.stdin)
    print(f"greeting {params['name']!r}", file=sys.stderr)
    json.dump({"greeting": f"Hello, {params['name']}!"}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
