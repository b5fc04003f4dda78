#!/bin/bash
# SCRAM users and ACLs of the toolexec cluster (docs/broker-security.md).
#
# Runs in the `kafka-init` service (the apache/kafka image), in the broker's network
# namespace, against the loopback-only INTERNAL listener, where it is a super user. Safe
# to run again: passwords are set to the secrets' current values, ACLs already there
# are kept.
set -euo pipefail

BOOTSTRAP=127.0.0.1:19092
BIN=/opt/kafka/bin
ITERATIONS=8192

password() {
  local file="/run/secrets/kafka_$1_password" value
  value=$(<"$file")
  # The SCRAM config syntax ([name=value,...]) has no quoting: keep to URL-safe characters.
  if [[ ! $value =~ ^[A-Za-z0-9._~-]{16,}$ ]]; then
    echo "kafka-init: $file must hold 16 or more of A-Z a-z 0-9 . _ ~ - (openssl rand -hex 32)" >&2
    exit 1
  fi
  printf '%s' "$value"
}

for user in admin toolexec producer reader; do
  secret=$(password "$user")  # an assignment, so that `set -e` stops on a bad secret
  # On the command line of this short-lived container only (its own process list).
  "$BIN/kafka-configs.sh" --bootstrap-server "$BOOTSTRAP" --alter \
    --entity-type users --entity-name "$user" \
    --add-config "SCRAM-SHA-512=[iterations=$ITERATIONS,password=$secret]"
done
unset secret

acl() { "$BIN/kafka-acls.sh" --bootstrap-server "$BOOTSTRAP" --add "$@"; }

# toolexec: the pipeline replicas (`toolexec up`), and operators publishing tools or
# policies. Every toolexec topic (creating them at start), and its consumer groups.
acl --allow-principal User:toolexec \
  --operation Read --operation Write --operation Describe --operation Create \
  --topic toolexec. --resource-pattern-type prefixed
acl --allow-principal User:toolexec --operation Read --operation Describe \
  --group toolexec. --resource-pattern-type prefixed

# producer: sends invocation requests and cancellations, and reads the facts so that it
# can wait for its own results (it sees every invocation's facts: docs/broker-security.md).
acl --allow-principal User:producer --operation Write --operation Describe \
  --topic toolexec.requests
acl --allow-principal User:producer --operation Read --operation Describe \
  --topic toolexec.invocations

# reader: dashboards and read-model rebuilds read every toolexec topic; no writes, no
# consumer groups (these clients assign partitions themselves).
acl --allow-principal User:reader --operation Read --operation Describe \
  --topic toolexec. --resource-pattern-type prefixed

"$BIN/kafka-acls.sh" --bootstrap-server "$BOOTSTRAP" --list
echo "kafka-init: SCRAM users and ACLs in place"
