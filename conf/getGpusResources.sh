#!/usr/bin/env bash
# Spark GPU discovery script (spark.{worker,executor}.resource.gpu.discoveryScript).
# Prints the ResourceInformation JSON Spark expects, e.g. {"name": "gpu", "addresses": ["0","1"]}.
# With no nvidia-smi (or no GPU) it reports no addresses rather than failing, so Spark says
# "needs 1 gpu, found 0" instead of a script error.
set -u

addresses=""
if command -v nvidia-smi >/dev/null 2>&1; then
  # One index per line; join as "0","1",...
  addresses=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null \
    | tr -d ' \r' | grep -E '^[0-9]+$' | sed 's/.*/"&"/' | paste -sd, -)
fi
echo "{\"name\": \"gpu\", \"addresses\": [${addresses}]}"
