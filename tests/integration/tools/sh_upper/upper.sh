#!/usr/bin/env bash
set -euo pipefail
input="$(cat)"
printf '{"upper": "%s"}\n' "$(printf '%s' "$input" | tr '[:lower:]' '[:upper:]' | tr -d '"{}' | tr -d '\n')"
