#!/bin/bash
# Creates Pulse's Kafka topics with explicit partition counts (the broker's auto-create is
# off), then checks that every topic has the count the Faust app declares: samples and
# hook-events are co-partitioned (same key = node, same count), or a node's batches and its
# operator descriptors would land on different workers.
#
#   create-topics.sh           create what is missing, verify what exists (exit 1 on a mismatch)
#   create-topics.sh --print   print "topic partitions" lines and exit (tests/infra compare
#                              them with what pulse.streams declares)
#
# Reads PULSE_BROKER, PULSE_TOPIC_PREFIX and PULSE_PARTITIONS, the same variables as the
# workers. The table below must match pulse.streams' topic declarations.
set -euo pipefail

prefix="${PULSE_TOPIC_PREFIX:-pulse}"
partitions="${PULSE_PARTITIONS:-8}"
bootstrap="${PULSE_BROKER:-kafka:9092}"
kafka_bin="${KAFKA_BIN:-/opt/kafka/bin}"

case "$partitions" in
  ''|*[!0-9]*|0) echo "create-topics: PULSE_PARTITIONS=$partitions is not a positive integer" >&2; exit 2 ;;
esac

topics() {
  # name                       partitions
  echo "$prefix.samples          $partitions"
  echo "$prefix.hook-events      $partitions"
  echo "$prefix.op-metrics       $partitions"
  echo "$prefix.verdicts         $partitions"
  echo "$prefix.dead-letter      1"
  echo "$prefix.pipeline         1"
  echo "$prefix.incidents        $partitions"
}

# Topics keyed by something whose latest value is all that matters: compacted.
config_of() {
  case "$1" in
    *.incidents) echo "--config cleanup.policy=compact" ;;
    *) echo "" ;;
  esac
}

if [ "${1:-}" = "--print" ]; then
  topics | tr -s ' '
  exit 0
fi

status=0
while read -r name want; do
  # shellcheck disable=SC2046  # the config is zero or two words, split on purpose
  "$kafka_bin/kafka-topics.sh" --bootstrap-server "$bootstrap" --create --if-not-exists \
    --topic "$name" --partitions "$want" --replication-factor 1 $(config_of "$name")
  have=$("$kafka_bin/kafka-topics.sh" --bootstrap-server "$bootstrap" --describe --topic "$name" \
    | grep -o 'PartitionCount: *[0-9]*' | grep -o '[0-9]*$' || true)
  if [ "$have" != "$want" ]; then
    echo "create-topics: $name has ${have:-?} partitions, Pulse needs $want (delete it or change PULSE_PARTITIONS)" >&2
    status=1
  else
    echo "create-topics: $name ok ($have partitions)"
  fi
done < <(topics)
exit $status
