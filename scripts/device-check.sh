#!/usr/bin/env bash
# The GPU checks of the sidecar, as one script for a lent GPU machine (torch, torchvision and pyarrow, no Java,
# no Spark, no network). Runs from the repository root without installing: PYTHONPATH=. . Results go to $OUT
# (or ./device-out). Usage: bash scripts/device-check.sh
# Sized after the first H200 run (2026-12-04, docs/benchmarks.md): five runs of two rounds took more than 580 s,
# and round 0 ran at half of round 1 after a 3 s warm-up (likely cuDNN autotuning each new batch size). Now: an 8 s
# warm-up, one round except resnet50 at R=8, each run cut at 150 s, so the script ends within about 9 minutes.
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $py -c 'import torch, torchvision, pyarrow; print("torch", torch.__version__, "torchvision", torchvision.__version__, "pyarrow", pyarrow.__version__)'
} | tee "$out/machine.txt"
bench() {  # name, then bench-sidecar flags
  local name=$1; shift
  timeout 150 $py -m spark_cnn.cli bench-sidecar --device cuda --rounds 1 --seconds 6 --warmup 8 \
    --json "$out/$name.json" "$@" 2>&1 | tee "$out/$name.log"
}
# The targets: resnet50, record-at-a-time (R=1) and small requests (R=8); on >= 1.5 x off and
# on >= 0.8 x device_only.
bench resnet50-r1 --model resnet50 --clients 4 --request-size 1
bench resnet50-r8 --model resnet50 --clients 4 --request-size 8 --rounds 2
# nvJPEG decode in the sidecar against decoding in the clients.
bench resnet50-r8-gpu-decode --model resnet50 --clients 4 --request-size 8 --decode gpu
# Serving alone (issue 17): a near-free model at 224x224, GB/s of pixels into one sidecar from 8 clients.
bench identity224-r16 --model identity --image-size 224 --clients 8 --request-size 16
# A detector (issue 18): each image at its own size under the model's rule, as `spark-cnn detect` sends it
# (ssdlite: 320 x 320).
bench ssdlite-r4 --model ssdlite320_mobilenet_v3_large --clients 4 --request-size 4
