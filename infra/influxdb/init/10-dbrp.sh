#!/bin/bash
# Maps the InfluxQL database/retention policy the Grafana dashboards query onto the bucket
# Pulse writes to (DBRP), so that InfluxQL reads the bucket through a mapping of ours, not
# through the read-only "virtual" one InfluxDB 2.x derives from the bucket name.
#
#   10-dbrp.sh           create the mapping unless it exists. The image's entrypoint runs it
#                        once, at the end of DOCKER_INFLUXDB_INIT_MODE=setup, with
#                        DOCKER_INFLUXDB_INIT_BUCKET_ID and INFLUX_HOST (the setup instance)
#                        exported.
#   10-dbrp.sh --check   exit 0 if the mapping exists, 1 if not (the compose healthcheck).
#
# Both talk to INFLUX_HOST (default http://localhost:8086) with the configured admin token,
# so a check after a token rotation uses the token the stack is configured with.
set -euo pipefail

mode="${1:-create}"
case "$mode" in
  create | --check) ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

db="${INFLUX_V1_DB:-${DOCKER_INFLUXDB_INIT_BUCKET}}"
rp="${INFLUX_V1_RP:-autogen}"
conn=(--host "${INFLUX_HOST:-http://localhost:8086}" --token "${DOCKER_INFLUXDB_INIT_ADMIN_TOKEN}"
      --org "${DOCKER_INFLUXDB_INIT_ORG}")

# `influx v1 dbrp list` prints the explicit mappings, then a blank line, the title
# "VIRTUAL DBRP MAPPINGS (READ-ONLY)", a row of dashes and the virtual mappings, the title
# and dashes even with --hide-headers (influx CLI 2.x, clients/v1_dbrps). So only a row
# above that title, with our database and retention policy, is a mapping of ours.
# Returns 0 (present), 1 (absent) or 2 (`influx` failed: server down, token refused), which
# is not "absent".
has_mapping() {
  local listing
  if ! listing="$(influx v1 dbrp list "${conn[@]}" --db "$db" --hide-headers)"; then
    echo "10-dbrp: cannot list the DBRP mappings of org ${DOCKER_INFLUXDB_INIT_ORG}" >&2
    return 2
  fi
  awk -v db="$db" -v rp="$rp" '
    /^VIRTUAL DBRP MAPPINGS/ { virtual = 1 }
    !virtual && $2 == db && $4 == rp { found = 1 }
    END { exit !found }' <<<"$listing"
}

status=0
has_mapping || status=$?
if [[ "$mode" == --check || $status -eq 2 ]]; then
  exit "$status"
fi
if [[ $status -eq 0 ]]; then
  echo "10-dbrp: mapping for database $db / rp $rp exists"
  exit 0
fi
influx v1 dbrp create "${conn[@]}" \
  --bucket-id "${DOCKER_INFLUXDB_INIT_BUCKET_ID}" \
  --db "$db" \
  --rp "$rp" \
  --default
echo "10-dbrp: database $db / rp $rp -> bucket ${DOCKER_INFLUXDB_INIT_BUCKET}"
