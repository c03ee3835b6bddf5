#!/usr/bin/env bash
# Creates a site certificate authority and certificates for the MQTT broker,
# the PEEP server and each device, with openssl.
#
#   deploy/pki/make-certs.sh OUT_DIR SERVER_HOSTNAME [DEVICE_ID ...]
#
# OUT_DIR/ca.{key,crt}            the site CA (keep ca.key offline)
# OUT_DIR/broker.{key,crt}        Mosquitto's TLS listener (CN/SAN = SERVER_HOSTNAME)
# OUT_DIR/server.{key,crt}        peep serve's gRPC TLS (CN/SAN = SERVER_HOSTNAME)
# OUT_DIR/devices/ID.{key,crt}    per-device client certificates (CN = device id),
#                                 usable for MQTT (use_identity_as_username) and
#                                 gRPC mTLS (the server maps CN -> device id)
# Keys are EC P-256, mode 0600. Re-running adds missing devices and keeps
# existing keys and certificates.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 OUT_DIR SERVER_HOSTNAME [DEVICE_ID ...]" >&2
  exit 2
fi
out=$1; host=$2; shift 2
days=${PEEP_CERT_DAYS:-825}
mkdir -p "$out/devices"
umask 077

if [ ! -f "$out/ca.key" ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -sha256 -days 3650 -subj "/CN=PEEP site CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$out/ca.crt"
  chmod 644 "$out/ca.crt"
fi

issue() {  # issue NAME CN EXTFILE_CONTENT DIR
  local name=$1 cn=$2 ext=$3 dir=$4
  [ -f "$dir/$name.crt" ] && return 0
  openssl ecparam -name prime256v1 -genkey -noout -out "$dir/$name.key"
  openssl req -new -key "$dir/$name.key" -subj "/CN=$cn" -out "$dir/$name.csr"
  printf '%s\n' "$ext" > "$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -days "$days" -sha256 -extfile "$dir/$name.ext" -out "$dir/$name.crt"
  rm -f "$dir/$name.csr" "$dir/$name.ext"
  chmod 600 "$dir/$name.key"; chmod 644 "$dir/$name.crt"
}

san="subjectAltName=DNS:$host,DNS:localhost,IP:127.0.0.1"
issue broker "$host" "$san
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature" "$out"
issue server "$host" "$san
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature" "$out"
for dev in "$@"; do
  case "$dev" in
    *[!A-Za-z0-9_.:@-]*|"") echo "device id '$dev': expected [A-Za-z0-9_.:@-]" >&2; exit 2;;
  esac
  issue "$dev" "$dev" "extendedKeyUsage=clientAuth
keyUsage=critical,digitalSignature" "$out/devices"
done
echo "CA: $out/ca.crt; broker/server certs for $host; devices: ${*:-none}"
