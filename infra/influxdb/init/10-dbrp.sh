#!/bin/bash
# Runs once, at the end of the image's DOCKER_INFLUXDB_INIT_MODE=setup: maps the InfluxQL
# database/retention policy the Grafana dashboards query onto the bucket Pulse writes to.
# The entrypoint exports DOCKER_INFLUXDB_INIT_BUCKET_ID and an influx CLI config for us.
set -euo pipefail

db="${INFLUX_V1_DB:-${DOCKER_INFLUXDB_INIT_BUCKET}}"
rp="${INFLUX_V1_RP:-autogen}"

if influx v1 dbrp list --org "${DOCKER_INFLUXDB_INIT_ORG}" --db "$db" --hide-headers | grep -q .; then
  echo "10-dbrp: mapping for database $db exists"
  exit 0
fi
influx v1 dbrp create \
  --org "${DOCKER_INFLUXDB_INIT_ORG}" \
  --bucket-id "${DOCKER_INFLUXDB_INIT_BUCKET_ID}" \
  --db "$db" \
  --rp "$rp" \
  --default
echo "10-dbrp: database $db / rp $rp -> bucket ${DOCKER_INFLUXDB_INIT_BUCKET}"
