#!/usr/bin/env bash
# Create or update the Mosquitto password file for PEEP devices and the server.
#
#   make-passwd.sh PASSWD_FILE CRED_DIR NAME[=PASSWORD] [NAME[=PASSWORD] ...]
#
# NAME is a device id (its MQTT username, matched by %u in ./acl) or
# `peep-server`. Without =PASSWORD a random 32-byte password is generated.
# Each password is also written to CRED_DIR/NAME.mqtt-password (mode 0600):
# copy it to the device and load it with systemd, e.g.
#   LoadCredential=mqtt-password:/etc/peep-edge/credentials/mqtt-password
# Passwords never appear on the command line of mosquitto_passwd (-b would
# show them in `ps`); they are piped on stdin.
set -euo pipefail

if [ "$#" -lt 3 ]; then
  echo "usage: $0 PASSWD_FILE CRED_DIR NAME[=PASSWORD] [NAME[=PASSWORD] ...]" >&2
  exit 2
fi
passwd_file=$1
cred_dir=$2
shift 2
command -v mosquitto_passwd >/dev/null 2>&1 || {
  echo "$0: mosquitto_passwd not found (Debian: apt-get install mosquitto)" >&2
  exit 1
}
umask 077
mkdir -p "$cred_dir"
[ -f "$passwd_file" ] || : > "$passwd_file"

for arg in "$@"; do
  name=${arg%%=*}
  if [ "$arg" = "$name" ]; then
    password=$(head -c 32 /dev/urandom | base64 | tr -d '/+=\n' | head -c 40)
  else
    password=${arg#*=}
  fi
  if ! [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}$ ]]; then
    echo "$0: NAME: expected a device id [A-Za-z0-9_.:@-] (no '/', '+', '#'), received '$name'" >&2
    exit 2
  fi
  # mosquitto_passwd (without -b) reads the password and its confirmation from stdin.
  printf '%s\n%s\n' "$password" "$password" | mosquitto_passwd "$passwd_file" "$name" >/dev/null
  printf '%s' "$password" > "$cred_dir/$name.mqtt-password"
  echo "$name: password set; credential in $cred_dir/$name.mqtt-password"
done
