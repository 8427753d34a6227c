#!/usr/bin/env bash
# Spark 4 needs Java 17 or newer. Install a headless JRE 17 when apt is usable as root; otherwise say what to do.
set -euo pipefail

java_major() {
  local java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$java_bin" >/dev/null 2>&1 || { echo 0; return; }
  # `java -version` prints e.g.: openjdk version "17.0.15" 2025-04-15  (or "1.8.0_392" for Java 8)
  "$java_bin" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

major=$(java_major)
if [ "${major:-0}" -ge 17 ] 2>/dev/null; then
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "spark_cnn: Java 17+ not found (found: ${major:-none}); installing openjdk-17-jre-headless with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  major=$(java_major)
  [ "${major:-0}" -ge 17 ] && exit 0
fi

echo "spark_cnn: Spark 4 needs Java 17 or newer (found: ${major:-none}); install a JRE 17+ (e.g. openjdk-17-jre-headless) and put it on PATH or set JAVA_HOME" >&2
exit 1
