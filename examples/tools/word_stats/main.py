"""word_stats: text statistics. Parameters as JSON on stdin, result as JSON on stdout."""

import json
import sys
from pathlib import Path

# The tool's own files are materialised together; make lib/ importable from here.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib.textstats import text_stats  # noqa: E402


def main() -> int:
    params = json.load(sys.stdin)
    result = text_stats(params["text"], top=int(params.get("top", 3)))
    print(f"analysed {result['words']} words", file=sys.stderr)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
