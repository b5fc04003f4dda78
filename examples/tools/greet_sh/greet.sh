#!/usr/bin/env bash
# greet_sh: parameters as one JSON object on stdin, one JSON result on stdout.
# python3 parses and writes the JSON (jq may be absent), so values are never
# spliced into shell code or JSON text by hand.
set -euo pipefail

input="$(cat)"
read_field() {
  python3 -c 'import json, sys; print(json.loads(sys.argv[1]).get(sys.argv[2], sys.argv[3]))' \
    "$input" "$1" "$2"
}

name="$(read_field name world)"
language="$(read_field language en)"
case "$language" in
  fr) word="Bonjour" ;;
  de) word="Hallo" ;;
  *) word="Hello"; language="en" ;;
esac

echo "greeting ${name} in ${language}" >&2
python3 -c 'import json, sys; print(json.dumps({"greeting": sys.argv[1], "language": sys.argv[2]}))' \
  "${word}, ${name}!" "$language"
